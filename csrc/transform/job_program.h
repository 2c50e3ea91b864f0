// The program one rank of a plan runs, as the job runs it, and the hash every rank agrees on
// (issue 47, item 3: one hash of what runs).
//
// A rank's program is its rank graph (job_rank_graph.h: the rewrite, the nodes any rank of its
// mesh runs whole run whole, the feature passes its sharding switches on) and, in a pipelined
// plan, that graph cut into the plan's pipeline x virtual stages (stage_rank_graph.h), each
// stage after its stage passes (rank_passes.h: the B/W split where the schedule splits
// backward, fused accumulation where the plan says). The runtime lowers these graphs; the hash
// covers every one of them, so a change to any pass, or a rank that would run another program,
// changes it. The runtime's rank programs and this hash are made by one function
// (build_rank_program) from the same inputs: the hash was computed before of the rewrite alone
// (without the FP8 marks, the cut's stage passes or the stage graphs), beside a second
// derivation of those inputs in the binding.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "plan/plan.h"
#include "transform/rank_graph.h"
#include "transform/rank_passes.h"
#include "transform/spmd_rewrite.h"

namespace shardwise::transform {

// How a pipelined rank program is cut: `stages` stages (0: not cut), each node's stage by
// search::assign_stages over `layers_per_stage` (empty: balanced by forward FLOPs), and the
// stage passes to run on each.
struct StageCutOptions {
  int stages = 0;
  std::vector<int> layers_per_stage;
  StagePassOptions passes;
};

struct RankProgramGraphs {
  RankGraph rank;                  // the rank's program
  std::vector<int> stage_of_node;  // cut: every captured node's stage
  std::vector<ir::Graph> stages;   // cut: each stage's rank graph, after its stage passes
};

// Every value replicated on a one-rank mesh, each repeated block recomputed as `recompute`
// says: what a pipeline stage of one rank runs (the whole graph, as one device runs it).
plan::Sharding replicated_sharding(const ir::Graph& graph, plan::Recompute recompute = plan::Recompute::None);

// The program `rank` of `sharding`'s mesh runs, cut as `cut` says.
RankProgramGraphs build_rank_program(const ir::Graph& graph, const plan::Sharding& sharding, int rank,
                                     const RewriteOptions& options, const StageCutOptions& cut = {});

// What `rank` (of the plan's world) runs under a complete plan: an SPMD plan's rank graph; a
// pipelined plan's stage sub-mesh program (its stage's layout, plan::stage_plan, or every value
// replicated with the plan's recomputation on a stage of one rank) at its place in its block,
// with micro-batches, FP8 marks where the plan's precision is fp8, and the cut with its stage
// passes. `graph`: captured at the plan's global batch (SPMD) or at one micro-batch of the data
// axis (pipelined). Throws support::ValidationError for a rank outside the plan, or a
// pipelined plan whose stages need a layout it does not carry.
RankProgramGraphs job_program(const ir::Graph& graph, const plan::Plan& plan, int rank);

// FNV-1a 64 of the printed rank graph, continued over each stage's printed graph in order
// (printed_program_hash: of texts printed already, as the runtime's rank_program has them).
std::uint64_t program_hash(const RankProgramGraphs& program);
std::uint64_t printed_program_hash(const std::string& rank_graph, const std::vector<std::string>& stages);

// Every rank's program hash under a complete plan, combined in rank order (plan.h's
// `programs`): ranks that run alike programs (a pipeline's stages of one layout, at one place
// in their blocks) are hashed once.
std::string plan_programs_hash(const ir::Graph& graph, const plan::Plan& plan);

// The per-rank hashes (16 hex digits each), in rank order, as one.
std::string combined_programs_hash(const std::vector<std::string>& per_rank);
std::string hex_hash(std::uint64_t hash);

}  // namespace shardwise::transform
