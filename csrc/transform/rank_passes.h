// The feature passes over a rank graph (rank_graph.h), in the order they run. A rank graph
// as the job runs it (job_rank_graph.h) is the rewrite, then the whole-node union, then each
// pass here that its plan switches on; shardwise-opt registers each under its name after
// rank-graph (tools/pass_pipeline.cc), so a golden may run one alone on a rank graph.
//
// A feature pass reads and writes only the rank graph (no plan, no rewrite data), marks what
// the runtime runs differently as attributes or named ops, keeps node and value ids (the
// binding maps the rewrite's nodes to the graph's by id: RankGraph::nodes), and runs again
// without change. Adding one: its x.h + x.cc, a C++ test and a golden, a row below, and the
// runtime's emitter for its marks (one of python/shardwise/runtime/lower.py's FEATURES).
//
// The order, and why:
//   1. async-gradient (transform/async_gradients.h; sharding.async_gradients, on by
//      default): an activation gradient's
//      all-reduce under its reader's weight gradient. It reads the collectives as the rewrite
//      emitted them (exposed); a region it takes is not collective-matmul's (an all-reduce).
//   2. collective-matmul (transform/collective_matmul.h; sharding.collective_matmul): the
//      exposed all-gathers and reduce-scatters beside contractions, as rings; a contraction
//      async-gradient marked keeps its collectives (the runtime runs a call as one module or
//      the other: a ring there dropped the all-reduce).
#pragma once

#include <string_view>
#include <vector>

#include "ir/graph.h"
#include "plan/plan.h"

namespace shardwise::transform {

struct RankPass {
  std::string_view name;     // as shardwise-opt names it
  std::string_view summary;  // one line, for --help
  bool (*enabled)(const plan::Sharding&);
  void (*run)(ir::Graph&);
};

const std::vector<RankPass>& rank_passes();

// Runs the passes the plan's sharding switches on, in order, on `rank_graph`.
void run_rank_passes(ir::Graph& rank_graph, const plan::Sharding& sharding);

// The feature passes over each pipeline stage's rank graph, after the cut
// (stage_rank_graph.h: a stage reads a weight another stage made through a recv, which only
// the stage's graph shows), in order; what a pipelined job switches on:
//   1. weight-gradient-split (transform/weight_gradient_split.h; a schedule that splits
//      backward into B and W: the zero-bubble ones);
//   2. fused-accumulation (transform/fused_weight_accumulation.h; the plan's
//      fused_accumulation, on by default).
// The two marks are independent (a marked contraction serves B and W alike:
// runtime/fused_accumulation.py); the order only fixes the printed program.
struct StagePassOptions {
  bool split_backward = false;
  bool fused_accumulation = true;
};
struct StagePass {
  std::string_view name;
  std::string_view summary;
  bool (*enabled)(const StagePassOptions&);
  void (*run)(ir::Graph&);
};

const std::vector<StagePass>& stage_passes();

// Runs the stage passes `options` switch on, in order, on `stage_rank_graph`.
void run_stage_passes(ir::Graph& stage_rank_graph, const StagePassOptions& options);

}  // namespace shardwise::transform
