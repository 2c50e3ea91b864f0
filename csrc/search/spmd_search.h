// The SPMD sharding search: from a single-device graph and a cluster to a plan that says
// where every parameter and activation lives on a 2-D device mesh and how every node runs.
//
//   SpmdSearchResult r = search_spmd(graph, cluster, model, {.global_batch = 512});
//   r.plan.sharding->placements.at("h.0.attn.c_attn.weight");   // {"R", "S(1,g3)"}
//
// How (the mechanism is general: nothing here knows an op or a layer name):
//  - Meshes: every {data, tensor} factorisation of the world size whose inner axis fits in a
//    node (so it spans the fastest links); the names only say which axis is outer. Each mesh
//    is searched with and without recomputation of the repeated blocks.
//  - Per mesh axis, every node picks a Strategy (search/strategy.h) from its dimension rule
//    and every leaf (parameter, input, buffer, constant) a placement: Replicate, a Shard one
//    of its readers wants, or, for a parameter, Replicate with its optimizer state sharded
//    over the axis (ZeRO-1, as the runtime runs it: the gradient stays whole). The cost of a choice: the node's forward and
//    backward time at its local shapes (cost model, all axes' shards applied), the all-
//    reduces of its statistics, and, on every producer -> reader edge, the resharding of
//    the value forward and of its gradient backward (search/resharding.h) on the links the
//    axis spans. A parameter's gradient synchronisation is the backward resharding of its
//    Partial gradient: data parallelism, ZeRO and FSDP-style sharding fall out of it. A
//    parameter's collectives share their bucket's latency (25 MB, DDP's default).
//    Memory per rank: parameter states (MemoryConstants::bytes_per_parameter()) and saved
//    activations, divided by their shards; the evaluation adds the largest weight a reader
//    gathers beyond its stored share (FSDP holds one gathered unit at a time), which the
//    per-axis problems, sums over choices, do not see: a plan that fits only without it is
//    reported as not fitting.
//  - Repeated blocks (analysis/repeated_blocks.h, the largest group) share one decision per
//    position: the problem has one set of choice nodes for all of them, costs summed.
//  - The axes are solved one at a time with the other axes' decisions fixed (coordinate
//    descent: one axis, the other, the first again), each as an SpmdProblem
//    (search/spmd_problem.h): `fast` uses solve_fast (sweeping forward and backward,
//    seeded with the axis' current decisions and with pure data parallelism), `thorough`
//    solve_ilp started from
//    solve_fast and also runs the fast search, returning the better: never worse than fast.
//    The descent runs inner axis first, outer axis first, and outer axis first from pure
//    data parallelism with ZeRO-1, and keeps the best (spmd_search.cc says why).
//  - The mesh and recomputation choice with the lowest predicted step time that fits in
//    memory wins; ties go to the earlier candidate (smaller tensor degree; no recompute, then
//    selective, then full).
//  - Heterogeneous clusters: where the batch is sharded along an axis whose ranks differ,
//    the shares come from search/hetero_balance.h and are recorded as uneven placements of
//    the graph's inputs ("S(0)[0.31,0.31,...]").
//
// Predicted step time = compute + activation collectives + statistics + the exposed part of
// the parameter collectives + the optimizer step (every byte of the rank's share of the
// parameter states read and written, as cost/plan_cost.h prices it). Parameter collectives run beside compute (the weight gathers
// beside the forward, the gradient reductions beside the backward, as DDP and FSDP run
// them): exposed = max(0, sync - compute) + overlap_interference x min(sync, compute), per
// phase, the same rule as cost/plan_cost.h. The breakdown: "compute", "activations"
// (forward and backward resharding of activations, on the critical path, with the exposed
// part of the all-reduces run beside weight gradients), "activations_beside_backward_total"
// (those all-reduces before overlap; not part of the sum), "gradient_sync" (exposed),
// "gradient_sync_total" (before overlap; not part of the sum), "statistics",
// "zero_broadcast", "optimizer".
//
// Deterministic: the same graph, cluster, model and options give the same plan, bit for bit.
// Throws support::ValidationError on global_batch < 1, an empty graph, or a mesh option that
// does not multiply to the world size; a model that fits under no candidate returns the
// least-memory candidate with `fits` false (the caller says how much memory it needs).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cost/cluster.h"
#include "cost/constants.h"
#include "cost/memory_cost.h"
#include "cost/op_cost.h"
#include "cost/plan_cost.h"
#include "ir/graph.h"
#include "plan/plan.h"
#include "search/sharding_options.h"
#include "search/spmd_problem.h"

namespace shardwise::search {

enum class SearchLevel : std::uint8_t { Fast, Thorough };
std::string_view search_level_name(SearchLevel level);  // "fast", "thorough"
SearchLevel search_level_from_name(std::string_view name);  // ValidationError on others

// The layout settings (search/sharding_options.h) are every candidate's: its model is built
// with them (collective_matmul: the plan says so too, plan::Sharding::collective_matmul, for the
// rewrite and the runtime; experts_on_first_axis: a plan's expert degree, when completing it;
// step_share: a stage layout at one micro-batch; the memory scales: the graph standing for a
// pipeline stage's share of it, so that its layout is chosen under the memory the stage has).
struct SpmdSearchOptions : LayoutSettings {
  std::int64_t global_batch = 0;  // required
  SearchLevel level = SearchLevel::Fast;
  double memory_fraction = cost::kMemoryFraction;  // of each device's memory the plan may use
  std::optional<std::vector<int>> mesh;  // {data, tensor}; default: searched
  // With a given mesh: whether its tensor axis may split the batch too. False (a mesh the user
  // names as data x tensor: parallelize(mesh=), Plan.manual's degrees) keeps the batch on the
  // data axis and leaves the tensor axis to weights, heads and sequences
  // (ShardingModelOptions::batch_axes); a searched mesh's axes split whatever prices best.
  bool batch_on_tensor_axis = true;
  bool allow_recompute = true;
  // Only this recomputation (every mesh searched with it alone; allow_recompute ignored).
  std::optional<plan::Recompute> recompute;
  // Self-attention's sequence split as ring attention (ShardingModelOptions::ring_attention).
  bool context_parallel = true;
  std::optional<cost::MemoryConstants> memory;  // model states per parameter; none: state_dtype's, else the precision's
  std::string state_dtype;  // plan::Plan::state_dtype: priced so and written into the plan
  // Seconds of step time one second of parameter collectives hidden under compute still
  // costs (cost/constants.h).
  // Unset: the cluster's (cost::overlap_interference: measured, or kOverlapInterference).
  std::optional<double> overlap_interference = std::nullopt;
  // Called after each candidate with (done, total); may throw to stop the search.
  std::function<void(int, int)> progress;
};

struct SpmdCandidate {
  std::vector<int> mesh;
  plan::Recompute recompute = plan::Recompute::None;
  bool fits = false;
  double step_time = 0;
  double memory_per_rank = 0;
};

// The heterogeneous balance of the chosen plan (search/hetero_balance.h), when it has one.
struct BatchBalance {
  int axis = -1;                // mesh axis along which the batch is shared unevenly
  std::vector<int> ranks;       // the ranks of one group along it
  std::vector<double> ratios;   // their shares of the batch
  double step_time = 0;         // predicted with these shares
  double even_step_time = 0;    // predicted with equal shares
  double lp_step_time = 0;      // the LP optimum (continuous shares)
};

struct SpmdSearchResult {
  plan::Plan plan;  // sharding and predicted filled in
  bool fits = false;
  std::optional<BatchBalance> balance;
  std::vector<SpmdCandidate> candidates;  // every candidate tried, in order
  double memory_limit = 0;  // bytes per rank the plan may use (smallest device x memory_fraction)
  double search_seconds = 0;
  // The per-axis problems the fast solver solved, and those met again whose answers it gave
  // again (search/spmd_problem.h, FastSolveMemo: one for the whole search).
  int axis_problems_solved = 0;
  int axis_problems_reused = 0;
};

SpmdSearchResult search_spmd(const ir::Graph& graph, const cost::Cluster& cluster, const cost::CostModel& model,
                             const SpmdSearchOptions& options);

}  // namespace shardwise::search
