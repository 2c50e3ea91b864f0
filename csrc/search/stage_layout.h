// The layout of a pipeline stage's tensor-parallel ranks as the SPMD search finds it, priced
// by part for the plan evaluator (cost::StageLayoutPrices), so the joint planner prices a
// candidate by the layout its stages will run rather than by Megatron's.
//
//   std::optional<StageLayout> l = search_stage_layout(graph, structure, cluster, model, plan, options);
//   cost::evaluate(structure, graph, cluster, plan, model, {}, &l->prices);
//
// What is searched: the whole graph at one micro-batch (plan.micro_batch rows) on a mesh
// {1, t} of t devices of one node (the tensor axis of any stage: the evaluator's data axis of d
// ranks and its pipeline stay as they are), recomputation as the plan says, no ZeRO on the
// tensor axis (the plan's ZeRO is over its data ranks). Memory as the plan's first stage holds
// it: parameter states x its share of the layers (and / d where ZeRO shards them), saved
// activations x its micro-batches in flight x its share of the layers, against the smallest
// device's memory x memory_fraction. The decisions found are summed by part, as the evaluator
// prices them: the first layer's nodes, the nodes before the layers, the nodes after them.
// One rank's share of the layers' input is what crosses a stage boundary.
//
// The layout depends on (t, micro-batch, recomputation) and, through memory, on the plan's
// first stage: StageLayoutKey says which plans may share one.
//
// A graph captured at batch 1 is searched at b rows all the same: its costs scale to the
// micro-batch, only its batch cannot be split over the t ranks (a layout seldom wants that).
// Empty when the graph has no layers, or when t = 1 (nothing to lay out).
#pragma once

#include <cstdint>
#include <optional>
#include <tuple>

#include "cost/cluster.h"
#include "cost/constants.h"
#include "cost/layer_structure.h"
#include "cost/op_cost.h"
#include "cost/plan_cost.h"
#include "ir/graph.h"
#include "plan/plan.h"
#include "search/spmd_search.h"

namespace shardwise::search {

struct StageLayoutOptions {
  SearchLevel level = SearchLevel::Fast;
  double memory_fraction = cost::kMemoryFraction;
};

struct StageLayout {
  cost::StageLayoutPrices prices;
  plan::Sharding sharding;  // of the {1, t} mesh, for reports
  double memory_per_rank = 0;  // the search's estimate of the first stage's
  bool fits = false;
};

// Plans with one key share one layout: tensor degree, micro-batch, recomputation, and the
// memory shares (rounded to 1e-3) that set the search's memory.
using StageLayoutKey = std::tuple<int, std::int64_t, int, long long, long long>;  // (.., plan::Recompute, ..)
StageLayoutKey stage_layout_key(const cost::LayerStructure& structure, const plan::Plan& plan);

std::optional<StageLayout> search_stage_layout(const ir::Graph& graph, const cost::LayerStructure& structure,
                                               const cost::Cluster& cluster, const cost::CostModel& model,
                                               const plan::Plan& plan, const StageLayoutOptions& options);

// The prices of the layout a pipelined plan's stages run (its stage_sharding) as the
// evaluator takes them (cost::StageLayoutPrices): the sharding adopted as it runs, on the {d,
// t} sub-mesh at one micro-batch of the data axis (micro_batch x data rows, the rows it was
// searched at: ShardingModel::adopt), and its tensor axis priced by part (a rank's compute and
// saved bytes at its micro-batch, the tensor axis' collectives and splits; the data axis is
// the evaluator's: data parallelism, ZeRO and the optimizer over d ranks). What
// search/plan_price.h prices such a plan with. Empty without a stage_sharding, at tensor 1,
// with stage_meshes, for a graph without layers, or when the model cannot take the graph or
// adopt the sharding (a sharding searched on another capture; logged at info: Megatron's
// layout is priced). Assumes the sharding's data axis splits the batch and nothing else (what
// complete_stage_sharding's search leaves it: the batch stays off the tensor axis); a weight
// it splits is priced whole.
std::optional<cost::StageLayoutPrices> stage_sharding_prices(const ir::Graph& graph,
                                                             const cost::LayerStructure& structure,
                                                             const cost::Cluster& cluster, const cost::CostModel& model,
                                                             const plan::Plan& plan);

// The layout a pipelined plan's stages run (plan.h's stage_sharding): the SPMD search on the
// graph at one micro-batch of the data axis (micro_batch x data rows), on the {data, tensor}
// mesh of the cluster's first data x tensor ranks (every stage's sub-mesh is alike), in the
// plan's precision and with its recomputation (what the stages run), under the memory of the
// plan's first stage (its share of the parameter states and of the activations in flight, as
// search_stage_layout: not the whole graph's on d x t devices). What completes a plan, so that the runtime searches nothing; the same
// search parallelize ran for a plan without one. Empty when data x tensor is 1 (every stage
// holds its part of the graph whole), the plan is sharded (pipeline 1, one micro-batch), or
// the graph was captured at another batch than those rows (it may not be the graph the runtime
// captures at one micro-batch: the runtime completes the plan on its capture). Its ZeRO is
// the plan's zero_stage, as the evaluator prices it, not the search's own choice: zero_stage 1
// shards the optimizer state of every floating parameter held whole on the data axis over it;
// zero_stage 2 or 3 is refused (support::ValidationError naming plan.zero_stage): a stage
// shards nothing more at run time. complete_stage_shardings does the same per stage mesh.
std::optional<plan::Sharding> complete_stage_sharding(const ir::Graph& graph, const cost::Cluster& cluster,
                                                      const plan::Plan& plan, SearchLevel level,
                                                      double memory_fraction = cost::kMemoryFraction,
                                                      const cost::CostModel* model = nullptr);

// A plan with stage_meshes: each stage's layout (plan.stage_shardings), the SPMD search on
// the graph at one micro-batch (micro_batch rows) on that stage's mesh of its own ranks of the
// cluster (plan.stage_first_rank), stages of one mesh on alike devices searched once. Empty
// without stage_meshes, or when the graph was captured at another batch than micro_batch rows.
std::vector<plan::Sharding> complete_stage_shardings(const ir::Graph& graph, const cost::Cluster& cluster,
                                                    const plan::Plan& plan, SearchLevel level,
                                                    double memory_fraction = cost::kMemoryFraction,
                                                    const cost::CostModel* model = nullptr);

// The plan with everything its run needs (plan.h), so the runtime searches nothing: a
// pipelined plan (pipeline > 1, or micro-batches on one stage) with its stage_sharding (and,
// when it had predictions, priced again with that layout: search/plan_price.h), a
// plan of pipeline 1 and one micro-batch replaced by the SPMD search's plan on its {data,
// tensor} mesh at its global batch (priced as that layout: the plan the runtime runs), in
// its precision. Unchanged when it has a sharding, or when the graph was captured at batch 1
// (pipelined: at another batch than one micro-batch's rows; complete_stage_sharding).
// `fits`: the SPMD search's verdict when it ran (whether its plan fits in memory), else empty.
struct CompletedPlan {
  plan::Plan plan;
  std::optional<bool> fits;
};
// `model`: what the searches price with, and a pipelined plan is priced again with (nullptr
// for each of these: the analytic model).
CompletedPlan complete_plan(const ir::Graph& graph, const cost::Cluster& cluster, const plan::Plan& plan,
                            SearchLevel level, double memory_fraction = cost::kMemoryFraction,
                            const cost::CostModel* model = nullptr);

}  // namespace shardwise::search
