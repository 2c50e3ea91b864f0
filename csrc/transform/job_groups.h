// Every process group a job makes beyond the mesh torch's DeviceMesh makes, in the order every
// rank makes them (issue 47, item 3: the job is the core's).
//
// Why the core lists them: making a group is collective. c10d's new_group is called by every
// rank of the job, member or not, in one order, so a list two ranks derive differently pairs
// the wrong ranks or hangs at the first collective. The runtime made these groups in three
// loops of its own (the sub-meshes of a plan's stage_meshes, the schedule's channels, the
// leaves several pipeline ranks read); it now makes each list as given here
// (runtime/groups.py), and looks a group up by what it is for.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "plan/plan.h"
#include "schedule/p2p_channels.h"

namespace shardwise::transform {

// Per axis of `mesh`, every group of mesh ranks that differ only in their coordinate on it:
// each in coordinate order, the groups in order of their first rank. These are the groups
// the rank IR's group= attributes name (rank_graph.h: axis_group).
std::vector<std::vector<std::vector<int>>> mesh_axis_groups(const std::vector<int>& mesh);

// A pipeline job's blocks of ranks, one per pipeline rank.
struct PipelineBlocks {
  std::vector<std::vector<int>> ranks;   // its global ranks, in sub-mesh order
  std::vector<std::vector<int>> meshes;  // its sub-mesh's sizes ({data, tensor}); product = its rank count
  // Blocks with equal numbers run one layout (the same sub-mesh and sharding): a value crosses
  // between them by coordinate (runtime/stage_links.py). Empty: every block one layout.
  std::vector<int> layouts;
};

enum class JobGroupKind {
  Axis,        // one axis' group of a block's sub-mesh
  SubMesh,     // a block's whole sub-mesh
  Channel,     // two ranks carrying one direction and kind of a schedule's transfers
  SharedLeaf,  // the ranks summing the gradient of a leaf several pipeline ranks read
};
const char* job_group_kind_name(JobGroupKind kind);

struct JobGroup {
  JobGroupKind kind = JobGroupKind::Axis;
  std::vector<int> ranks;          // global ranks, in the group's order
  int block = -1;                  // Axis, SubMesh: the pipeline rank whose sub-mesh
  int axis = -1;                   // Axis: the sub-mesh axis
  schedule::P2PChannel channel;    // Channel: between pipeline ranks
  std::string leaf;                // SharedLeaf: the parameter or buffer
  bool whole = false;              // SharedLeaf: its readers' layouts differ, so its gradient
                                   // is summed whole over all their ranks, not by coordinate
};

// A pipelined plan's blocks: stage s's ranks (plan.h: stage_first_rank, stage_size), its
// sub-mesh (stage_mesh: {data x context, tensor}, or its stage_meshes entry) and its layout
// number: with stage_meshes, stages of one sub-mesh and one layout (stage_shardings; a stage of
// one rank has none) share a number, in order of first appearance; else every stage 0.
PipelineBlocks pipeline_blocks(const plan::Plan& plan);

// The checked form of `blocks`: every block non-empty, its sub-mesh's product its rank count,
// no rank in two blocks, one layout number per block. Throws support::ValidationError.
void check_blocks(const PipelineBlocks& blocks);

// Blocks of their own sizes (a plan's stage_meshes): for each block of more than one rank,
// each axis' groups (mesh_axis_groups, axis by axis), then the block whole. Blocks of one rank
// have no group. Every rank makes every block's groups, in block order.
std::vector<JobGroup> sub_mesh_groups(const PipelineBlocks& blocks);

// One two-rank group per link of each channel (schedule/p2p_channels.h: one per direction
// and kind), in the channels' order: receiver k of the receiving block with the sender that
// serves it, the sending block's rank k mod its size (by coordinate where the sizes agree).
std::vector<JobGroup> channel_groups(const PipelineBlocks& blocks, const std::vector<schedule::P2PChannel>& channels);

// The groups summing the gradients of leaves read on several pipeline ranks (`owners`: leaf
// -> the pipeline ranks whose stages read it), leaves in name order, a leaf of one reader
// left out. Readers of one layout: per sub-mesh coordinate, the readers' ranks at it, in
// pipeline-rank order. Readers of layouts that differ: all their ranks, one group (whole).
std::vector<JobGroup> shared_leaf_groups(const PipelineBlocks& blocks,
                                         const std::map<std::string, std::set<int>>& owners);

}  // namespace shardwise::transform
