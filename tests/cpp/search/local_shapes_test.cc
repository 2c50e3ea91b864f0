// Per-rank shapes (issue 46, item 7): a plan priced with a RecordingCostModel names every
// node at the shapes one rank runs it, and a profile holding exactly those measurements
// prices the same plan from them alone (cost/recording_cost.h, cost/profiled_cost.h).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cost/cluster_presets.h"
#include "cost/profiled_cost.h"
#include "cost/recording_cost.h"
#include "models/gpt.h"
#include "plan/plan.h"
#include "search/plan_price.h"
#include "search/spmd_search.h"

namespace shardwise::search {
namespace {

ir::Graph gpt8() {
  models::GptConfig c;
  c.layers = 2;
  c.hidden = 256;
  c.heads = 8;
  c.seq = 128;
  c.vocab = 4096;
  c.batch = 8;
  c.dropout = 0;
  return models::build_gpt(c);
}

plan::Plan searched(const ir::Graph& g, const cost::Cluster& cluster, std::vector<int> mesh,
                    plan::Recompute recompute = plan::Recompute::None) {
  SpmdSearchOptions o;
  o.global_batch = 8;
  o.mesh = std::move(mesh);
  o.recompute = recompute;
  o.batch_on_tensor_axis = false;  // the tensor axis splits weights
  return search_spmd(g, cluster, cost::AnalyticCostModel{}, o).plan;
}

std::map<std::string, cost::LocalOp> recorded(const ir::Graph& g, const cost::Cluster& cluster, const plan::Plan& p) {
  const cost::AnalyticCostModel analytic;
  const cost::RecordingCostModel recorder(analytic);
  (void)price_plan(g, cluster, recorder, p);
  return recorder.records();
}

TEST(LocalShapes, ADataSplitPlanIsRecordedAtEachRanksRowsAndWholeWeights) {
  const ir::Graph g = gpt8();
  const cost::Cluster cluster = cost::preset("dgx-a100", 1);
  const auto records = recorded(g, cluster, searched(g, cluster, {8, 1}));
  ASSERT_FALSE(records.empty());
  int one_row = 0;
  for (const auto& [signature, op] : records) {
    const ir::Node& node = g.node(op.node);
    ASSERT_EQ(op.shapes.size(), node.inputs.size() + node.outputs.size()) << signature;
    EXPECT_EQ(signature, cost::local_signature(g, node, op.shapes));
    for (std::size_t i = 0; i < node.inputs.size(); ++i) {
      const ir::Value& v = g.value(node.inputs[i]);
      if (v.role == ir::ValueRole::Parameter) EXPECT_EQ(op.shapes[i], v.type.shape) << signature;
    }
    for (std::size_t o = 0; o < node.outputs.size(); ++o) {
      const ir::TensorType& type = g.value(node.outputs[o]).type;
      if (type.batch_dim) one_row += op.shapes[node.inputs.size() + o][static_cast<std::size_t>(*type.batch_dim)] == 1;
    }
  }
  EXPECT_GT(one_row, 0);  // 8 rows over 8 ranks: one row each
}

TEST(LocalShapes, ATensorSplitPlanIsRecordedWithItsWeightsShards) {
  const ir::Graph g = gpt8();
  const cost::Cluster cluster = cost::preset("dgx-a100", 1);
  const plan::Plan p = searched(g, cluster, {1, 8});
  int split_weights = 0;
  for (const auto& [signature, op] : recorded(g, cluster, p)) {
    const ir::Node& node = g.node(op.node);
    for (std::size_t i = 0; i < node.inputs.size(); ++i) {
      const ir::Value& v = g.value(node.inputs[i]);
      if (v.role != ir::ValueRole::Parameter || op.shapes[i] == v.type.shape) continue;
      std::int64_t whole = 1, local = 1;
      for (std::size_t d = 0; d < v.type.shape.size(); ++d) {
        whole *= v.type.shape[d];
        local *= op.shapes[i][d];
      }
      EXPECT_EQ(local * 8, whole) << signature;  // one eighth of the weight, split along one dim
      ++split_weights;
    }
  }
  EXPECT_GT(split_weights, 0);
}

// A profile holding the recorded signatures only prices every node of the plan from its
// measurements: the recorder and the model agree on the keys (a key the model made otherwise
// would find nothing and fall back to the analytic model).
TEST(LocalShapes, AProfileOfTheRecordedShapesPricesEveryNodeMeasured) {
  const ir::Graph g = gpt8();
  const cost::Cluster cluster = cost::preset("dgx-a100", 1);
  for (const auto& [mesh, recompute] : std::vector<std::pair<std::vector<int>, plan::Recompute>>{
           {{8, 1}, plan::Recompute::None}, {{2, 4}, plan::Recompute::None}, {{4, 2}, plan::Recompute::Selective}}) {
    SCOPED_TRACE(fmt::format("mesh {}x{}", mesh[0], mesh[1]));
    const plan::Plan p = searched(g, cluster, mesh, recompute);
    cost::Profile profile;
    profile.device = "test";
    for (const auto& [signature, op] : recorded(g, cluster, p)) profile.ops[signature] = {1e-3, 2e-3};
    const cost::ProfiledCostModel model(profile);
    const PricedPlan priced = price_plan(g, cluster, model, p);
    EXPECT_GT(model.calls().node_calls_measured, 0);
    EXPECT_EQ(model.calls().node_calls_analytic, 0);
    EXPECT_GT(priced.plan.predicted->step_time, 0);
  }
}

// Selective recomputation's policy runs every op of a recomputed block under a Python dispatch
// mode, which costs more than the ops it recomputes on a CPU (profile.py, _selective_seconds). A
// profile that measured an op so ("selective") prices its extra seconds (selective - forward) in
// the backward of every node run again, kept or not, in both evaluators (the SPMD search's
// tally and the degrees evaluator's layers); without it, the rule stands (a kept node 0, any
// other its forward); a plan recomputed in full never reads it.
TEST(LocalShapes, AMeasuredSelectivePolicyIsPricedInTheBackwardOfEveryNodeRunAgain) {
  const ir::Graph g = gpt8();
  const cost::Cluster cluster = cost::preset("dgx-a100", 1);
  plan::Plan pipeline;  // the degrees evaluator's
  pipeline.data = 4;
  pipeline.pipeline = 2;
  pipeline.global_batch = 8;
  pipeline.micro_batch = 1;
  pipeline.recompute = plan::Recompute::Selective;
  plan::Plan full_pipeline = pipeline;
  full_pipeline.recompute = plan::Recompute::Full;
  const std::vector<std::pair<std::string, plan::Plan>> cases = {
      {"spmd 8 x 1 selective", searched(g, cluster, {8, 1}, plan::Recompute::Selective)},
      {"spmd 4 x 2 selective", searched(g, cluster, {4, 2}, plan::Recompute::Selective)},
      {"pipeline 2 x data 4 selective", pipeline},
      {"spmd 8 x 1 full", searched(g, cluster, {8, 1}, plan::Recompute::Full)},
      {"pipeline 2 x data 4 full", full_pipeline}};
  for (const auto& [name, p] : cases) {
    SCOPED_TRACE(name);
    const bool selective = name.find("selective") != std::string::npos;
    const auto records = recorded(g, cluster, p);
    const auto priced = [&](double extra) {  // extra < 0: the profile has no "selective" entries
      cost::Profile profile;
      profile.device = "test";
      for (const auto& [signature, op] : records) profile.ops[signature] = {1e-3, 2e-3, extra < 0 ? -1 : 1e-3 + extra};
      const cost::ProfiledCostModel model(profile);
      return *price_plan(g, cluster, model, p).plan.predicted;
    };
    const auto step = [&](double extra) { return priced(extra).step_time; };
    const double rule = step(-1), none = step(0), one = step(1e-4), two = step(2e-4);
    if (!selective) {  // full recomputation runs every forward again, measured or not
      EXPECT_DOUBLE_EQ(none, rule);
      EXPECT_DOUBLE_EQ(two, rule);
      continue;
    }
    EXPECT_LT(none, rule);  // the rule runs the forward (1 ms) of what is not kept again
    EXPECT_GT(one, none);   // every node run again pays the measured extra, in proportion
    // In proportion in the compute; a pipeline's bubble follows its stages' times (their ratio,
    // pipeline_transfers.h), not in proportion.
    const auto compute = [&](double extra) { return priced(extra).breakdown.at("compute"); };
    EXPECT_NEAR(compute(2e-4) - compute(0), 2 * (compute(1e-4) - compute(0)), 1e-9 * two);
    EXPECT_GT(step(1e-3), rule);  // kept nodes pay it too: above the rule where extra = forward
  }
}

// An fp8 plan's FP8 linears are recorded and found under "fp8:" keys only: a measurement of
// the linear in the model's dtype, at the same shapes, does not price its float8 run.
TEST(LocalShapes, AnFp8PlansLinearsAreMeasuredAsTheyRunInFloat8) {
  const ir::Graph g = gpt8();  // float32: its FP8 plan's other nodes run in float32
  const cost::Cluster cluster = cost::preset("dgx-h100", 1);
  SpmdSearchOptions o;
  o.global_batch = 8;
  o.mesh = {8, 1};
  o.precision = cost::Precision::FP8;
  const plan::Plan p = search_spmd(g, cluster, cost::AnalyticCostModel{}, o).plan;
  const auto records = recorded(g, cluster, p);
  cost::Profile fp8, plain;
  fp8.device = plain.device = "test";
  int fp8_keys = 0;
  for (const auto& [signature, op] : records) {
    fp8.ops[signature] = {1e-3, 2e-3};
    const bool is_fp8 = signature.starts_with(cost::kFp8SignaturePrefix);
    fp8_keys += is_fp8;
    EXPECT_EQ(op.fp8, is_fp8) << signature;  // the mark Python measures by says the same as the key
    if (is_fp8) EXPECT_EQ(signature, cost::fp8_signature(g, g.node(op.node), op.shapes));
    plain.ops[is_fp8 ? signature.substr(cost::kFp8SignaturePrefix.size()) : signature] = {1e-3, 2e-3};
  }
  EXPECT_GT(fp8_keys, 0);
  const cost::ProfiledCostModel measured(fp8);
  (void)price_plan(g, cluster, measured, p);
  EXPECT_EQ(measured.calls().node_calls_analytic, 0);
  const cost::ProfiledCostModel in_f32(plain);
  (void)price_plan(g, cluster, in_f32, p);
  EXPECT_GE(in_f32.calls().node_calls_analytic, fp8_keys);
}

}  // namespace
}  // namespace shardwise::search
