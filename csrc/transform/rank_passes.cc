#include "transform/rank_passes.h"

#include "transform/async_gradients.h"
#include "transform/collective_matmul.h"
#include "transform/fused_weight_accumulation.h"
#include "transform/weight_gradient_split.h"

namespace shardwise::transform {

const std::vector<RankPass>& rank_passes() {
  static const std::vector<RankPass> passes = {
      {"async-gradient",
       "run a column-parallel contraction's input-gradient all-reduce beside its weight gradient (a rank graph)",
       [](const plan::Sharding& s) { return s.async_gradients; }, overlap_activation_gradients},
      {"collective-matmul",
       "run tensor-parallel all-gathers into and reduce-scatters out of contractions as rings (a rank graph)",
       [](const plan::Sharding& s) { return s.collective_matmul; }, fuse_collective_matmuls},
  };
  return passes;
}

void run_rank_passes(ir::Graph& rank_graph, const plan::Sharding& sharding) {
  for (const RankPass& pass : rank_passes())
    if (pass.enabled(sharding)) pass.run(rank_graph);
}

const std::vector<StagePass>& stage_passes() {
  static const std::vector<StagePass> passes = {
      {"weight-gradient-split",
       "cut a stage's backward into its input (B) and weight (W) gradients at each weight read (a pipeline "
       "stage's rank graph)",
       [](const StagePassOptions& o) { return o.split_backward; }, mark_weight_cuts},
      {"fused-accumulation",
       "accumulate a contraction's or lookup's weight gradient into the parameter's .grad inside the product "
       "(a pipeline stage's rank graph)",
       [](const StagePassOptions& o) { return o.fused_accumulation; }, mark_fused_accumulations},
  };
  return passes;
}

void run_stage_passes(ir::Graph& stage_rank_graph, const StagePassOptions& options) {
  for (const StagePass& pass : stage_passes())
    if (pass.enabled(options)) pass.run(stage_rank_graph);
}

}  // namespace shardwise::transform
