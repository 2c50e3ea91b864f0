// The one evaluator (search/plan_price.h): a plan priced again, from its JSON, gets the figures
// the planner that made it recorded.
#include "search/plan_price.h"

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cost/cluster.h"
#include "cost/cluster_presets.h"
#include "cost/layer_structure.h"
#include "cost/profiled_cost.h"
#include "models/gpt.h"
#include "plan/plan.h"
#include "search/spmd_search.h"
#include "search/stage_layout.h"
#include "support/error.h"

namespace shardwise::search {
namespace {

ir::Graph gpt(int batch) {
  models::GptConfig c;
  c.layers = 4;
  c.hidden = 1024;
  c.heads = 16;
  c.seq = 1024;
  c.vocab = 50304;
  c.batch = batch;
  c.dropout = 0;
  return models::build_gpt(c);
}

// The SPMD search's plan for `g` on `mesh` of one DGX A100 node, 8 rows a step.
plan::Plan searched(const ir::Graph& g, const cost::Cluster& cluster, std::vector<int> mesh,
                    std::optional<plan::Recompute> recompute = std::nullopt, bool batch_on_tensor_axis = true) {
  SpmdSearchOptions o;
  o.global_batch = 8;
  o.mesh = std::move(mesh);
  o.recompute = recompute;
  o.batch_on_tensor_axis = batch_on_tensor_axis;
  return search_spmd(g, cluster, cost::AnalyticCostModel{}, o).plan;
}

void expect_same_prediction(const plan::Predicted& recorded, const plan::Predicted& priced, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_DOUBLE_EQ(priced.step_time, recorded.step_time);
  EXPECT_DOUBLE_EQ(priced.memory_per_rank, recorded.memory_per_rank);
  EXPECT_DOUBLE_EQ(priced.tflops_per_device, recorded.tflops_per_device);
  ASSERT_EQ(priced.breakdown.size(), recorded.breakdown.size());
  for (const auto& [key, seconds] : recorded.breakdown) EXPECT_DOUBLE_EQ(priced.breakdown.at(key), seconds) << key;
  for (const auto& [key, bytes] : recorded.memory_breakdown)
    EXPECT_DOUBLE_EQ(priced.memory_breakdown.at(key), bytes) << key;
  EXPECT_EQ(priced.collectives.size(), recorded.collectives.size());
}

struct SearchedCase {
  std::vector<int> mesh;
  plan::Recompute recompute;
  bool collective_matmul;
  bool batch_on_tensor_axis;
};

TEST(PlanPrice, ASearchedShardingPricedFromItsJsonAsTheSearchPricedIt) {
  const ir::Graph g = gpt(8);
  const cost::Cluster cluster = cost::preset("dgx-a100", 1);
  const std::vector<SearchedCase> cases = {
      {{8, 1}, plan::Recompute::None, false, true},      {{2, 4}, plan::Recompute::None, false, false},
      {{4, 2}, plan::Recompute::Selective, false, false}, {{1, 8}, plan::Recompute::Full, false, false},
      {{2, 4}, plan::Recompute::None, true, false},      {{2, 4}, plan::Recompute::Selective, false, true},
  };
  int tensor_split = 0;
  for (const SearchedCase& c : cases) {
    SpmdSearchOptions o;
    o.global_batch = 8;
    o.mesh = c.mesh;
    o.recompute = c.recompute;
    o.collective_matmul = c.collective_matmul;
    o.batch_on_tensor_axis = c.batch_on_tensor_axis;
    const SpmdSearchResult r = search_spmd(g, cluster, cost::AnalyticCostModel{}, o);
    for (const auto& [node, per_axis] : r.plan.sharding->strategies) tensor_split += per_axis[1] != "replicate";
    const plan::Plan read = plan::plan_from_json_string(plan::plan_to_json_string(r.plan));
    const PricedPlan priced = price_plan(g, cluster, cost::AnalyticCostModel{}, read);
    EXPECT_TRUE(priced.sharded);
    EXPECT_EQ(priced.fits, r.fits);
    expect_same_prediction(*r.plan.predicted, *priced.plan.predicted,
                           fmt::format("mesh {}x{} recompute {} collective matmul {}", c.mesh[0], c.mesh[1],
                                       plan::recompute_name(c.recompute), c.collective_matmul));
  }
  EXPECT_GT(tensor_split, 0);  // the cases read strategies other than replicate on the tensor axis
}

// gpt(8)'s 8 rows searched on a tensor axis of 8.
SpmdSearchOptions tensor_axis_of_8() {
  SpmdSearchOptions o;
  o.global_batch = 8;
  o.mesh = {1, 8};
  return o;
}

// A sharding with async_gradients off runs its activation-gradient all-reduces after the
// reader's backward (the pass is off): priced exposed, none beside a weight gradient.
TEST(PlanPrice, AShardingWithAsyncGradientsOffPricesThoseAllReducesExposed) {
  const ir::Graph g = gpt(8);
  const cost::Cluster cluster = cost::preset("dgx-a100", 1);
  const SpmdSearchResult r = search_spmd(g, cluster, cost::AnalyticCostModel{}, tensor_axis_of_8());
  EXPECT_TRUE(r.plan.sharding->async_gradients);
  plan::Plan off = plan::plan_from_json_string(plan::plan_to_json_string(r.plan));
  off.sharding->async_gradients = false;
  const PricedPlan on_priced = price_plan(g, cluster, cost::AnalyticCostModel{}, r.plan);
  const PricedPlan off_priced = price_plan(g, cluster, cost::AnalyticCostModel{}, off);
  const auto& on = on_priced.plan.predicted->breakdown;
  const auto& exposed = off_priced.plan.predicted->breakdown;
  ASSERT_GT(on.at("activations_beside_backward_total"), 0.0);  // the case is present
  EXPECT_EQ(exposed.at("activations_beside_backward_total"), 0.0);
  EXPECT_GT(exposed.at("activations"), on.at("activations"));
  EXPECT_GT(off_priced.plan.predicted->step_time, on_priced.plan.predicted->step_time);
  EXPECT_FALSE(plan::plan_from_json_string(plan::plan_to_json_string(off_priced.plan)).sharding->async_gradients);
}

// An fp8 plan's casts are transients, priced where they peak (runtime/fp8.py; op_cost.h's
// fp8_backward_working_bytes): on one H100 at 8 rows the lm head's backward holds its output
// gradient dY (8 x 1024 x 50304 elements in bf16) beside dY's float32 and float8 copies, 7 bytes
// an element, while the loss' backward before it holds the float32 logits' gradient and their
// log-probabilities', 8 bytes an element. The forward's casts come at another moment and are
// less. So the fp8 plan peaks where the bf16 plan does, at the same bytes (as an H200 measured
// a 1B LLaMA's: 33,574 MiB in fp8, 33,576 in bf16), where the casts were once added on top.
TEST(PlanPrice, AnFp8PlansCastsAreTransientsBesideTheLossBackward) {
  const ir::Graph g = gpt(8);
  const cost::Cluster one = cost::rank_range(cost::preset("dgx-h100", 1), 0, 1);
  SpmdSearchOptions o;
  o.global_batch = 8;
  o.mesh = {1, 1};
  const plan::Plan bf16 = search_spmd(g, one, cost::AnalyticCostModel{}, o).plan;
  plan::Plan fp8 = bf16;
  fp8.precision = "fp8";
  const plan::Predicted as_bf16 = *price_plan(g, one, cost::AnalyticCostModel{}, bf16).plan.predicted;
  const plan::Predicted as_fp8 = *price_plan(g, one, cost::AnalyticCostModel{}, fp8).plan.predicted;
  const double dy = 8.0 * 1024 * 50304;
  const double head = 2 * dy + (4 + 1) * dy, loss = 4 * dy + 4 * dy + 4;  // + the loss' own gradient
  ASSERT_LT(head, loss);
  // That moment holds no parameter's gradient yet (the head's backward comes after it).
  EXPECT_DOUBLE_EQ(as_fp8.memory_breakdown.at("gradients"), 0);
  EXPECT_DOUBLE_EQ(as_fp8.memory_breakdown.at("backward_working"), loss);
  EXPECT_DOUBLE_EQ(as_fp8.memory_breakdown.at("fp8_casts"), 0);
  EXPECT_FALSE(as_bf16.memory_breakdown.contains("fp8_casts"));
  EXPECT_DOUBLE_EQ(as_fp8.memory_per_rank, as_bf16.memory_per_rank);
}

// An fp8 plan's linears whose contraction dim the tensor axis splits take their amaxes' max
// over it: one all-reduce of a float per row of x (8 x 1024 rows) and per row (K split,
// forward: row-parallel) or column (N split, backward: column-parallel) of W (1024), priced
// and listed; the bf16 plan has none.
TEST(PlanPrice, AnFp8PlanAllReducesTheAmaxesOfASplitContraction) {
  const ir::Graph g = gpt(8);
  const cost::Cluster cluster = cost::preset("dgx-h100", 1);
  SpmdSearchOptions o = tensor_axis_of_8();
  o.batch_on_tensor_axis = false;
  const plan::Plan bf16 = search_spmd(g, cluster, cost::AnalyticCostModel{}, o).plan;
  plan::Plan fp8 = bf16;
  fp8.precision = "fp8";
  const double amax_bytes = (8.0 * 1024 + 1024) * 4;
  auto amax_records = [&](const plan::Plan& plan, const char* phase) {
    const PricedPlan priced = price_plan(g, cluster, cost::AnalyticCostModel{}, plan);
    int n = 0;
    for (const auto& c : priced.plan.predicted->collectives)
      n += c.kind == "all_reduce" && c.phase == phase && c.bytes == amax_bytes ? static_cast<int>(c.count) : 0;
    return n;
  };
  // Row-parallel (K split, forward): attention's and the MLP's output projections, 4 layers.
  EXPECT_EQ(amax_records(fp8, "forward"), 8);
  // Column-parallel (N split, backward): the QKV and MLP input projections, and the vocabulary-split head.
  EXPECT_EQ(amax_records(fp8, "backward"), 9);
  EXPECT_EQ(amax_records(bf16, "forward") + amax_records(bf16, "backward"), 0);
}

TEST(PlanPrice, ACompletedPlanIsPricedAsItsSharding) {
  const ir::Graph g = gpt(8);
  const cost::Cluster cluster = cost::preset("dgx-a100", 1);
  plan::Plan p;
  p.data = 2;
  p.tensor = 4;
  p.global_batch = 8;
  p.micro_batch = 4;
  const PricedPlan by_degrees = price_plan(g, cluster, cost::AnalyticCostModel{}, p);
  EXPECT_FALSE(by_degrees.sharded);
  EXPECT_DOUBLE_EQ(by_degrees.plan.predicted->step_time,
                   cost::evaluate(g, cluster, p, cost::AnalyticCostModel{}).step_time);
  const CompletedPlan done = complete_plan(g, cluster, p, SearchLevel::Fast);
  ASSERT_TRUE(done.plan.sharding.has_value());
  const PricedPlan again = price_plan(g, cluster, cost::AnalyticCostModel{}, done.plan);
  expect_same_prediction(*done.plan.predicted, *again.plan.predicted, "completed 2 x 4");
}

// A 2 x 2 x 2 plan of 8 rows a step, priced by its degrees.
plan::Plan pipeline_2x2x2(const ir::Graph& g, const cost::Cluster& cluster, std::int64_t micro_batch,
                          plan::Recompute recompute) {
  plan::Plan p;
  p.data = 2;
  p.tensor = 2;
  p.pipeline = 2;
  p.global_batch = 8;
  p.micro_batch = micro_batch;
  p.recompute = recompute;
  return price_plan(g, cluster, cost::AnalyticCostModel{}, p).plan;
}

// A pipelined plan completed with the layout its stages run (stage_sharding, the SPMD search
// of the {data, tensor} sub-mesh) is priced with that layout's tensor axis, again from its
// JSON; where the joint planner's own {1, t} search finds the same tensor-axis decisions,
// the two price the stages alike.
TEST(PlanPrice, APipelinedPlanIsPricedWithTheStageLayoutItRuns) {
  const ir::Graph g = gpt(4);  // one micro-batch of the data axis: 2 rows x 2 ranks
  const cost::Cluster cluster = cost::preset("dgx-a100", 1);
  const plan::Plan p = pipeline_2x2x2(g, cluster, 2, plan::Recompute::Selective);
  const CompletedPlan done = complete_plan(g, cluster, p, SearchLevel::Fast);
  ASSERT_TRUE(done.plan.stage_sharding.has_value());
  const PricedPlan again =
      price_plan(g, cluster, cost::AnalyticCostModel{}, plan::plan_from_json_string(plan::plan_to_json_string(done.plan)));
  EXPECT_TRUE(again.stage_layout);
  expect_same_prediction(*done.plan.predicted, *again.plan.predicted, "completed pipeline");

  const cost::LayerStructure structure = cost::find_layer_structure(g);
  const auto running = stage_sharding_prices(g, structure, cluster, cost::AnalyticCostModel{}, done.plan);
  ASSERT_TRUE(running.has_value());
  EXPECT_GT(running->layer.forward, 0);
  const auto searched = search_stage_layout(g, structure, cluster, cost::AnalyticCostModel{}, done.plan, {});
  ASSERT_TRUE(searched.has_value());
  bool same = true;
  for (const auto& [name, per_axis] : searched->sharding.strategies)
    same = same && done.plan.stage_sharding->strategies.at(name)[1] == per_axis[1];
  if (same) {
    EXPECT_DOUBLE_EQ(running->layer.forward, searched->prices.layer.forward);
    EXPECT_DOUBLE_EQ(running->layer.collectives, searched->prices.layer.collectives);
    EXPECT_DOUBLE_EQ(running->layer.selective_kept_bytes, searched->prices.layer.selective_kept_bytes);
    EXPECT_DOUBLE_EQ(running->boundary_bytes, searched->prices.boundary_bytes);
  }
  std::printf("stage layouts agree on the tensor axis: %s\n", same ? "yes" : "no");
}

// One row per micro-batch (Megatron's published runs: micro-batch 1): the stage_sharding was
// searched at one micro-batch of the data axis (2 rows), where a flattening view's rule has a
// batch index; at one row that dim is a unit dim and the view's indices shift. The sharding
// is adopted at the rows it was searched at, on its {d, t} mesh, and priced as it runs (it
// was priced with Megatron's layout, and the log said the strategy was not the rule's).
TEST(PlanPrice, AStageLayoutSearchedAtOneRowPerMicroBatchIsPricedAsItRuns) {
  const ir::Graph g = gpt(2);  // one micro-batch of the data axis: 1 row x 2 ranks
  const cost::Cluster cluster = cost::preset("dgx-a100", 1);
  const plan::Plan p = pipeline_2x2x2(g, cluster, 1, plan::Recompute::None);
  const CompletedPlan done = complete_plan(g, cluster, p, SearchLevel::Fast);
  ASSERT_TRUE(done.plan.stage_sharding.has_value());
  const PricedPlan again = price_plan(g, cluster, cost::AnalyticCostModel{}, done.plan);
  expect_same_prediction(*done.plan.predicted, *again.plan.predicted, "one row per micro-batch");
  EXPECT_TRUE(again.stage_layout);
  const auto running = stage_sharding_prices(g, cost::find_layer_structure(g), cluster, cost::AnalyticCostModel{},
                                             done.plan);
  ASSERT_TRUE(running.has_value());
  EXPECT_GT(running->layer.forward, 0);
  EXPECT_NE(again.plan.predicted->step_time, p.predicted->step_time);  // not Megatron's layout's price
}

// A stage layout may split more than the batch on its data axis (the SPMD search of a {d, 1}
// sub-mesh may split an MLP's width there, gathering and scattering its activations every
// micro-batch): those collectives are priced as the runtime runs them. The same layout on the
// data axis of {2, 1} (2 micro-batch rows a rank, 4 rows a micro-batch) and on the tensor axis
// of {1, 2} (4 rows a micro-batch) moves the same bytes: the same collectives a micro-batch.
// (A layout on {d, 1} was priced as plain data parallelism: no collectives at all.)
TEST(PlanPrice, AStageLayoutSplittingMoreThanTheBatchOnTheDataAxisPricesItsCollectives) {
  const ir::Graph g = gpt(4);
  const cost::Cluster cluster = cost::first_ranks(cost::preset("dgx-a100", 1), 4);
  plan::Plan tensor;
  tensor.data = 1;
  tensor.tensor = 2;
  tensor.pipeline = 2;
  tensor.global_batch = 8;
  tensor.micro_batch = 4;
  const CompletedPlan done = complete_plan(g, cluster, price_plan(g, cluster, cost::AnalyticCostModel{}, tensor).plan,
                                           SearchLevel::Fast);
  ASSERT_TRUE(done.plan.stage_sharding.has_value());
  const cost::LayerStructure structure = cost::find_layer_structure(g);
  const auto on_tensor = stage_sharding_prices(g, structure, cluster, cost::AnalyticCostModel{}, done.plan);
  ASSERT_TRUE(on_tensor.has_value());
  ASSERT_GT(on_tensor->layer.collectives, 0);

  // The same layout with its axes swapped, on a plan of data 2 at 2 rows a rank.
  plan::Sharding swapped = *done.plan.stage_sharding;
  auto swap = [](std::map<std::string, std::vector<std::string>>& per_value) {
    for (auto& [name, axes] : per_value) std::swap(axes[0], axes[1]);
  };
  swap(swapped.placements);
  swap(swapped.strategies);
  std::swap(swapped.mesh[0], swapped.mesh[1]);
  ASSERT_TRUE(swapped.zero.empty());
  plan::Plan data = done.plan;
  data.data = 2;
  data.tensor = 1;
  data.micro_batch = 2;
  data.stage_sharding = swapped;
  const auto on_data = stage_sharding_prices(g, structure, cluster, cost::AnalyticCostModel{}, data);
  ASSERT_TRUE(on_data.has_value());
  EXPECT_DOUBLE_EQ(on_data->layer.collectives, on_tensor->layer.collectives);
  EXPECT_DOUBLE_EQ(on_data->layer.forward, on_tensor->layer.forward);
  EXPECT_DOUBLE_EQ(on_data->layer.parameters, on_tensor->layer.parameters);
  const PricedPlan priced = price_plan(g, cluster, cost::AnalyticCostModel{}, data);
  EXPECT_TRUE(priced.stage_layout);
  EXPECT_GT(priced.plan.predicted->breakdown.at("tensor_parallel"), 0);
}

// A profile's measured optimizer step prices the optimizer in both planners: the evaluator's
// degrees and the SPMD model's plan, each rank's parameter elements x the measured seconds.
TEST(PlanPrice, AMeasuredOptimizerStepPricesTheOptimizer) {
  const ir::Graph g = gpt(8);
  const cost::Cluster cluster = cost::preset("dgx-a100", 1);
  double elements = 0;
  for (const ir::Value& v : g.values())
    if (v.role == ir::ValueRole::Parameter) elements += static_cast<double>(v.type.numel());
  cost::Profile profile;
  profile.device = "test";
  profile.optimizer = cost::MeasuredOptimizer{"AdamW", 2.0e-9};
  const cost::ProfiledCostModel measured(profile);
  plan::Plan p;
  p.data = 8;
  p.global_batch = 8;
  p.micro_batch = 1;
  const PricedPlan by_degrees = price_plan(g, cluster, measured, p);
  EXPECT_NEAR(by_degrees.plan.predicted->breakdown.at("optimizer"), elements * 2.0e-9, 1e-9 * elements * 2.0e-9);
  const plan::Plan sharded = searched(g, cluster, {8, 1});
  ASSERT_TRUE(sharded.sharding.has_value());
  const PricedPlan again = price_plan(g, cluster, measured, sharded);
  const PricedPlan analytic = price_plan(g, cluster, cost::AnalyticCostModel{}, sharded);
  EXPECT_NE(again.plan.predicted->breakdown.at("optimizer"), analytic.plan.predicted->breakdown.at("optimizer"));
  if (sharded.sharding->zero.empty())
    EXPECT_NEAR(again.plan.predicted->breakdown.at("optimizer"), elements * 2.0e-9, 1e-9 * elements * 2.0e-9);
}

// 4 A100 + 4 V100: the batch shared unevenly by the balance LP. The search records the step
// its plan's evaluation prices with those shares (it used to record the LP's step patched onto
// the even evaluation, and memory without the gathered weights), and the plan read back prices
// the same.
TEST(PlanPrice, UnevenBatchSharesArePricedAsTheBalanceLpPricesThem) {
  const ir::Graph g = gpt(64);
  const cost::Cluster cluster = cost::preset("mixed-a100-v100", 1);
  SpmdSearchOptions o;
  o.global_batch = 64;
  o.mesh = std::vector<int>{8, 1};
  const SpmdSearchResult r = search_spmd(g, cluster, cost::AnalyticCostModel{}, o);
  ASSERT_TRUE(r.balance.has_value());
  // The LP holds the collectives at the even split's; the plan's evaluation prices them with
  // the shares too (uneven blocks, the largest share): 0.14% here.
  EXPECT_NEAR(r.plan.predicted->step_time, r.balance->step_time, 0.01 * r.balance->step_time);
  EXPECT_LT(r.plan.predicted->step_time, r.balance->even_step_time);
  const PricedPlan priced =
      price_plan(g, cluster, cost::AnalyticCostModel{}, plan::plan_from_json_string(plan::plan_to_json_string(r.plan)));
  EXPECT_EQ(priced.fits, r.fits);
  expect_same_prediction(*r.plan.predicted, *priced.plan.predicted, "uneven shares");
}

// ZeRO as the runtime runs it (runtime/optim.py: ZeRO-1): every rank holds the weight and its
// all-reduced gradient whole; only the optimizer state is divided over the data axis.
// A cluster whose collectives slow the compute beside them (Node::overlap_interference,
// measured by Cluster.detect on CPU processes) prices the hidden gradient sync of a data-
// parallel plan so, in the search's model and in the degrees evaluator alike.
TEST(PlanPrice, TheClustersOverlapInterferencePricesTheHiddenGradientSync) {
  const ir::Graph g = gpt(8);
  cost::Cluster cluster = cost::preset("dgx-a100", 1);
  auto with_interference = [&](double k) {
    nlohmann::json doc = cost::cluster_to_json(cluster);
    for (auto& node : doc["nodes"]) node["overlap_interference"] = k;
    return cost::cluster_from_json(doc);
  };
  const plan::Plan data = searched(g, cluster, {8, 1});
  const cost::Cluster calm = with_interference(0.0), busy = with_interference(1.0);
  const PricedPlan a = price_plan(g, calm, cost::AnalyticCostModel{}, data);
  const PricedPlan b = price_plan(g, busy, cost::AnalyticCostModel{}, data);
  const double sync = a.plan.predicted->breakdown.at("gradient_sync_total");
  ASSERT_GT(sync, 0);
  EXPECT_GT(b.plan.predicted->step_time, a.plan.predicted->step_time);
  EXPECT_LE(b.plan.predicted->step_time - a.plan.predicted->step_time, sync * (1 + 1e-9));
  plan::Plan manual;
  manual.data = 8;
  manual.global_batch = 8;
  manual.micro_batch = 1;
  const PricedPlan c = price_plan(g, calm, cost::AnalyticCostModel{}, manual);
  const PricedPlan d = price_plan(g, busy, cost::AnalyticCostModel{}, manual);
  EXPECT_GT(d.degrees.step_time, c.degrees.step_time);
}

TEST(PlanPrice, ZeroDividesTheOptimizerStateAndLeavesTheGradientsWhole) {
  const ir::Graph g = gpt(8);
  const cost::Cluster cluster = cost::preset("dgx-a100", 1);
  plan::Plan plain = searched(g, cluster, {8, 1});
  plain.sharding->zero.clear();
  plan::Plan zero = plain;
  double replicated = 0, sharded = 0;  // parameter elements whose weight is whole / split over the 8
  for (const ir::Value& v : g.values()) {
    if (v.role != ir::ValueRole::Parameter) continue;
    if (plain.sharding->placements.at(v.name).at(0) == "R") {
      zero.sharding->zero[v.name] = {0};
      replicated += static_cast<double>(v.type.numel());
    } else {
      sharded += static_cast<double>(v.type.numel());
    }
  }
  ASSERT_GT(replicated, 0);
  const auto without = price_plan(g, cluster, cost::AnalyticCostModel{}, plain).plan.predicted->memory_breakdown;
  const auto with = price_plan(g, cluster, cost::AnalyticCostModel{}, zero).plan.predicted->memory_breakdown;
  EXPECT_GT(without.at("optimizer"), 0);
  EXPECT_DOUBLE_EQ(with.at("gradients"), without.at("gradients"));
  EXPECT_DOUBLE_EQ(with.at("weights"), without.at("weights"));
  // Every element's state on 1/8 of the ranks, where without ZeRO the whole weights' is on all.
  const double expected = (replicated / 8 + sharded / 8) / (replicated + sharded / 8);
  EXPECT_NEAR(with.at("optimizer") / without.at("optimizer"), expected, 1e-12);
}

// A recomputed block's forward runs again in backward up to its last node that saves for
// backward, where torch.utils.checkpoint stops (its early stop): the reshards into the block run
// again, but not the last projection's reduce-scatter, which only the save-free residual add
// after it reads (measured on 4 Gloo processes: 8.39 MB of reduce_scatter a step, not 16.78).
TEST(PlanPrice, RecomputationReshardsAgainUpToTheBlocksLastSave) {
  const ir::Graph g = gpt(8);
  const cost::Cluster cluster = cost::preset("dgx-a100", 1);
  const plan::Plan none = searched(g, cluster, {2, 4}, plan::Recompute::None, false);
  plan::Plan full = none;
  full.sharding->recompute = plan::Recompute::Full;
  using Calls = std::map<std::pair<std::string, std::string>, double>;  // (kind, value) -> calls a step
  auto calls = [&](const plan::Plan& p, const std::string& phase) {
    Calls out;
    const PricedPlan priced = price_plan(g, cluster, cost::AnalyticCostModel{}, p);
    for (const auto& c : priced.plan.predicted->collectives)
      if (c.phase == phase) out[{c.kind, c.value}] += c.count;
    return out;
  };
  const Calls forward = calls(none, "forward"), before = calls(none, "backward"), after = calls(full, "backward");
  Calls again;
  for (const auto& [key, n] : after) {
    const double extra = n - (before.contains(key) ? before.at(key) : 0.0);
    if (extra > 0) again[key] = extra;
  }
  // The sequence-parallel layout the search takes here: the blocks' norms gathered, both
  // projections' partial sums reduce-scattered.
  const std::pair<std::string, std::string> attention{"reduce_scatter", "addmm_1"}, mlp{"reduce_scatter", "addmm_3"};
  ASSERT_EQ(forward.at(attention), 4);
  ASSERT_EQ(forward.at(mlp), 4);
  EXPECT_EQ(again.at(attention), 4);  // read by the residual add before ln_2, which saves
  EXPECT_FALSE(again.contains(mlp));  // read only by the block's last, save-free residual add
  EXPECT_EQ(again.at(std::pair<std::string, std::string>{"all_gather", "layer_norm"}), 4);
  EXPECT_EQ(again.at(std::pair<std::string, std::string>{"all_gather", "layer_norm_1"}), 4);
  EXPECT_EQ(again.size(), 3u);
}

// A tied embedding (one value, read by the lookup and by the head) held sharded: each read that
// gathers it reduce-scatters its gradient there, whole (the rewrite's backward step at the read);
// only a replicated leaf's partial sums add up first and are reduced once, in the buckets.
TEST(PlanPrice, ASharedLeafHeldShardedReducesItsGradientAtEachRead) {
  const ir::Graph g = gpt(8);
  const cost::Cluster cluster = cost::preset("dgx-a100", 1);
  const plan::Plan p = searched(g, cluster, {2, 4}, std::nullopt, false);
  const std::string wte = "transformer.wte.weight";
  ASSERT_TRUE(p.sharding->placements.at(wte).at(0).starts_with("S("));  // FSDP-style on the data axis
  double gathers = 0, scatters = 0;
  for (const auto& c : p.predicted->collectives) {
    if (c.value != wte || c.axis != 0) continue;
    if (c.phase == "forward" && c.kind == "all_gather") gathers += c.count;
    if (c.phase == "step" && c.kind == "reduce_scatter") scatters += c.count;
  }
  EXPECT_GE(gathers, 1);
  EXPECT_DOUBLE_EQ(scatters, gathers);  // not 1/2 each: the value has two reads
}

TEST(PlanPrice, AShardingTheGraphCannotTakeIsRefusedByName) {
  const ir::Graph g = gpt(8);
  const cost::Cluster cluster = cost::preset("dgx-a100", 1);
  plan::Plan p = searched(g, cluster, {2, 4});
  const std::string victim = p.sharding->strategies.begin()->first;
  p.sharding->strategies.begin()->second[1] = "split zz";
  try {
    price_plan(g, cluster, cost::AnalyticCostModel{}, p);
    FAIL() << "an unknown strategy was priced";
  } catch (const support::ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find(victim), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("split zz"), std::string::npos) << e.what();
  }
  // The model that refused it keeps its decisions: it prices as before.
  const plan::Plan good = searched(g, cluster, {2, 4});
  const cost::AnalyticCostModel analytic;  // the model keeps a reference to it
  ShardingModel model(g, cluster, analytic, sharding_model_options(good, *good.sharding, cluster, cost::kMemoryFraction));
  model.adopt(*good.sharding);
  const double before = model.evaluate().step_time;
  EXPECT_DOUBLE_EQ(before, good.predicted->step_time);
  EXPECT_THROW(model.adopt(*p.sharding), support::ValidationError);
  EXPECT_DOUBLE_EQ(model.evaluate().step_time, before);
  EXPECT_EQ(model.sharding("fast").strategies, good.sharding->strategies);
  p.sharding->strategies.erase(victim);
  EXPECT_THROW(price_plan(g, cluster, cost::AnalyticCostModel{}, p), support::ValidationError);
}

}  // namespace
}  // namespace shardwise::search
