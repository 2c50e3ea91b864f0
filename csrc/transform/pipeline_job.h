// A pipeline job as one rank runs it (issue 47, item 3: the job is the core's).
//
// A pipelined plan (pipeline > 1, or pipeline 1 accumulating over micro-batches) runs as stage
// programs driven by the schedule's action lists. Which block of ranks is this rank's, which
// sub-mesh coordinate it holds, how many micro-batches a step runs, where each virtual stage
// sits, what this rank does in what order, which channels carry the cuts' values and which
// groups every rank makes for them: all follow from the plan and the rank alone, so every rank
// derives them here, alike, and the runtime reads them as one value (runtime/README.md). The
// runtime derived them in five calls (the blocks twice, the schedule's simulation, its channels,
// the sub-mesh and channel groups) and checked the world's size itself.
//
// What depends on the captured graph (the stage cut, what each stage reads, the leaves several
// pipeline ranks read and so their gradient groups) is not here: the rank program says it
// (stage_rank_graph.h, job_groups.h: shared_leaf_groups).
#pragma once

#include <vector>

#include "plan/plan.h"
#include "schedule/action.h"
#include "schedule/p2p_channels.h"
#include "transform/job_groups.h"

namespace shardwise::transform {

struct PipelineJob {
  PipelineBlocks blocks;   // every pipeline rank's global ranks, sub-mesh and layout number
  int pipeline_rank = 0;   // the block that holds this rank
  int local = 0;           // this rank's place in its block: its rank on the stage's sub-mesh
  int micro_batches = 1;   // per step (plan::Plan::num_micro_batches)
  // Every virtual stage's pipeline rank (round-robin, or ZB-V's V: schedule/action.h).
  std::vector<int> stage_ranks;
  // This pipeline rank's compute, send and receive actions, in order (the optimizer step and
  // the gradient sync are the engine's own, left out).
  std::vector<schedule::Action> actions;
  // Whether any rank's list splits a stage's backward into B and W (zero bubble).
  bool split_backward = false;
  // The channels the schedule's transfers travel on (p2p_channels.h: proven to run in order).
  std::vector<schedule::P2PChannel> channels;
  // Every group this job makes beyond torch's DeviceMesh, in the order every rank makes them:
  // with stage_meshes (blocks of their own sizes, some of more than one rank), each block's
  // sub-mesh groups (sub_mesh_groups); then one group per link of each channel.
  std::vector<JobGroup> groups;
};

// Whether any rank's action list of the plan's schedule splits a stage's backward into B and W.
bool schedule_splits_backward(const plan::Plan& plan);

// The job `rank` (of `world`) runs under a pipelined `plan`. Throws support::ValidationError
// when the plan's stages hold another number of ranks than the job, when `rank` is outside it,
// or when the schedule's lists cannot run on channels (p2p_channels.h).
PipelineJob make_pipeline_job(const plan::Plan& plan, int world, int rank);

}  // namespace shardwise::transform
