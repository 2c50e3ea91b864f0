#include "cost/profiled_cost.h"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "test_clusters.h"
#include "support/error.h"

namespace shardwise::cost {
namespace {

using testing::error_of;
using testing::flat_cluster;
using testing::test_device;

ir::TensorType f32(std::vector<std::int64_t> shape, std::optional<int> batch_dim = std::nullopt) {
  ir::TensorType t;
  t.dtype = ir::DType::F32;
  t.shape = std::move(shape);
  t.batch_dim = batch_dim;
  return t;
}

// Two identical "layers" (gelu then mm), as repeated blocks give, and one odd node.
ir::Graph two_layer_graph() {
  ir::Graph g;
  ir::ValueId x = g.add_value("x", f32({4, 64}, 0), ir::ValueRole::Input);
  ir::ValueId w0 = g.add_value("w0", f32({64, 64}), ir::ValueRole::Parameter);
  ir::ValueId w1 = g.add_value("w1", f32({64, 64}), ir::ValueRole::Parameter);
  ir::NodeId a = g.add_node("aten::gelu", {x}, {{"a0", f32({4, 64}, 0)}}, {{"approximate", std::string("none")}},
                            "layers.0");
  ir::NodeId m = g.add_node("aten::mm", {g.node(a).outputs[0], w0}, {{"m0", f32({4, 64}, 0)}}, {}, "layers.0");
  ir::NodeId b = g.add_node("aten::gelu", {g.node(m).outputs[0]}, {{"a1", f32({4, 64}, 0)}},
                            {{"approximate", std::string("none")}}, "layers.1");
  ir::NodeId n = g.add_node("aten::mm", {g.node(b).outputs[0], w1}, {{"m1", f32({4, 64}, 0)}}, {}, "layers.1");
  ir::NodeId t = g.add_node("aten::tanh", {g.node(n).outputs[0]}, {{"t", f32({4, 64}, 0)}});
  g.set_outputs({g.node(t).outputs[0]});
  return g;
}

Profile hand_profile(const ir::Graph& g) {
  Profile p;
  p.device = "test-cpu";
  p.ops[node_signature(g, g.node(0))] = {2.0e-5, 5.0e-5};  // gelu
  p.ops[node_signature(g, g.node(1))] = {1.0e-4, 2.0e-4};  // mm
  p.skipped[node_signature(g, g.node(4))] = "not rebuilt";
  p.collectives[CollectiveKind::AllReduce][2] = {1.0e-4, 2.0e-9};
  return p;
}

TEST(ProfiledCost, SignatureIgnoresNamesAndModulesButNotShapesOrAttrs) {
  ir::Graph g = two_layer_graph();
  EXPECT_EQ(node_signature(g, g.node(0)), "aten::gelu(f32[4,64])->(f32[4,64]){approximate=\"none\"}");
  EXPECT_EQ(node_signature(g, g.node(0)), node_signature(g, g.node(2)));  // repeated layer: one key
  EXPECT_EQ(node_signature(g, g.node(1)), "aten::mm(f32[4,64],f32[64,64])->(f32[4,64]){}");
  EXPECT_NE(node_signature(g, g.node(0)), node_signature(g, g.node(4)));
}

TEST(ProfiledCost, MeasuredNodesUseTheProfileOthersTheAnalyticModel) {
  ir::Graph g = two_layer_graph();
  ProfiledCostModel model(hand_profile(g));
  AnalyticCostModel analytic;
  DeviceType dev = test_device("dev");
  OpTime gelu = model.node_time(g, g.node(2), dev, Precision::F32, {});
  EXPECT_DOUBLE_EQ(gelu.forward, 2.0e-5);
  EXPECT_DOUBLE_EQ(gelu.backward, 5.0e-5);
  OpTime mm = model.node_time(g, g.node(3), dev, Precision::F32, {});
  EXPECT_DOUBLE_EQ(mm.forward, 1.0e-4);
  EXPECT_TRUE(mm.contraction);  // the report flag still comes from the analytic model
  OpTime tanh = model.node_time(g, g.node(4), dev, Precision::F32, {});
  EXPECT_EQ(tanh, analytic.node_time(g, g.node(4), dev, Precision::F32, {}));

  EXPECT_EQ(model.provenance(g, g.node(0)), Provenance::Measured);
  EXPECT_EQ(model.provenance(g, g.node(4)), Provenance::Analytic);
  ProfileCoverage cov = model.coverage(g);
  EXPECT_EQ(cov.nodes_measured, 4);
  EXPECT_EQ(cov.nodes_analytic, 1);
  ProfileCoverage calls = model.calls();
  EXPECT_EQ(calls.node_calls_measured, 2);
  EXPECT_EQ(calls.node_calls_analytic, 1);
  model.reset_calls();
  EXPECT_EQ(model.calls(), ProfileCoverage{});
}

TEST(ProfiledCost, ContextScalesTheMeasurementByTheAnalyticRatio) {
  ir::Graph g = two_layer_graph();
  ProfiledCostModel model(hand_profile(g));
  AnalyticCostModel analytic;
  DeviceType dev = test_device("dev");
  NodeContext ctx{.batch_scale = 4.0, .shards = 2, .split = TensorSplit::All};
  OpTime base = analytic.node_time(g, g.node(0), dev, Precision::F32, {});
  OpTime scaled = analytic.node_time(g, g.node(0), dev, Precision::F32, ctx);
  OpTime t = model.node_time(g, g.node(0), dev, Precision::F32, ctx);
  EXPECT_NEAR(t.forward, 2.0e-5 * scaled.forward / base.forward, 1e-15);
  EXPECT_NEAR(t.backward, 5.0e-5 * scaled.backward / base.backward, 1e-15);
  EXPECT_NEAR(t.forward, 2.0e-5 * 2.0, 1e-12);  // gelu is memory-bound: x4 batch / 2 shards
}

TEST(ProfiledCost, LocalSignatureIsTheSignatureAtOneRanksShapes) {
  ir::Graph g = two_layer_graph();
  const std::vector<std::vector<std::int64_t>> whole = {{4, 64}, {64, 64}, {4, 64}};
  EXPECT_EQ(local_signature(g, g.node(1), whole), node_signature(g, g.node(1)));
  EXPECT_EQ(local_signature(g, g.node(1), {{{2, 64}, {64, 32}, {2, 32}}}),
            "aten::mm(f32[2,64],f32[64,32])->(f32[2,32]){}");
  EXPECT_NE(error_of<support::ValidationError>([&] { (void)local_signature(g, g.node(1), {{{2, 64}}}); }).find("aten::mm has 3 operands, 1 shapes"),
            std::string::npos);
}

// Measured at the shapes the context gives one rank: taken as is, not scaled by the analytic
// curve; a context at other shapes still scales the whole graph's measurement.
TEST(ProfiledCost, AMeasurementAtTheRanksShapesIsTakenAsMeasured) {
  ir::Graph g = two_layer_graph();
  Profile p = hand_profile(g);
  p.ops[local_signature(g, g.node(1), {{{2, 64}, {64, 64}, {2, 64}}})] = {7.0e-6, 9.0e-6};
  ProfiledCostModel model(p);
  EXPECT_TRUE(model.wants_local_shapes());
  AnalyticCostModel analytic;
  EXPECT_FALSE(analytic.wants_local_shapes());
  DeviceType dev = test_device("dev");
  NodeContext half{.batch_scale = 0.5};
  half.local_shapes = batch_scaled_shapes(g, g.node(1), 0.5);
  ASSERT_EQ(half.local_shapes[0], (std::vector<std::int64_t>{2, 64}));
  OpTime t = model.node_time(g, g.node(3), dev, Precision::F32, half);  // the repeated layer's mm
  EXPECT_DOUBLE_EQ(t.forward, 7.0e-6);
  EXPECT_DOUBLE_EQ(t.backward, 9.0e-6);
  NodeContext quarter{.batch_scale = 0.25};
  quarter.local_shapes = batch_scaled_shapes(g, g.node(1), 0.25);
  OpTime base = analytic.node_time(g, g.node(1), dev, Precision::F32, {});
  OpTime scaled = analytic.node_time(g, g.node(1), dev, Precision::F32, quarter);
  EXPECT_NEAR(model.node_time(g, g.node(1), dev, Precision::F32, quarter).forward,
              1.0e-4 * scaled.forward / base.forward, 1e-15);
}

TEST(ProfiledCost, CollectivesUseTheFitWhenKindAndGroupSizeWereMeasured) {
  ir::Graph g = two_layer_graph();
  ProfiledCostModel model(hand_profile(g));
  Cluster c = flat_cluster(4);
  std::vector<int> pair = {0, 1};
  std::vector<int> four = {0, 1, 2, 3};
  EXPECT_NEAR(model.collective_time(c, CollectiveKind::AllReduce, pair, 1 << 20, Algorithm::Auto),
              1.0e-4 + 2.0e-9 * (1 << 20), 1e-15);
  EXPECT_EQ(model.collective_provenance(CollectiveKind::AllReduce, 2), Provenance::Measured);
  // Another group size, another kind: the analytic alpha-beta model on the cluster.
  EXPECT_DOUBLE_EQ(model.collective_time(c, CollectiveKind::AllReduce, four, 1 << 20, Algorithm::Auto),
                   cost::collective_time(c, CollectiveKind::AllReduce, four, 1 << 20));
  EXPECT_DOUBLE_EQ(model.collective_time(c, CollectiveKind::AllGather, pair, 1 << 20, Algorithm::Auto),
                   cost::collective_time(c, CollectiveKind::AllGather, pair, 1 << 20));
  EXPECT_EQ(model.collective_provenance(CollectiveKind::AllGather, 2), Provenance::Analytic);
  EXPECT_EQ(model.collective_time(c, CollectiveKind::AllReduce, pair, 0, Algorithm::Auto), 0.0);
  ProfileCoverage calls = model.calls();
  EXPECT_EQ(calls.collective_calls_measured, 2);
  EXPECT_EQ(calls.collective_calls_analytic, 2);
}

TEST(ProfiledCost, JsonRoundTrip) {
  ir::Graph g = two_layer_graph();
  Profile p = hand_profile(g);
  Profile back = profile_from_json_string(profile_to_json_string(p, 2));
  EXPECT_EQ(back, p);
  EXPECT_EQ(back.skipped.at(node_signature(g, g.node(4))), "not rebuilt");
  // Optional parts may be left out of a hand-written file.
  Profile minimal = profile_from_json_string(R"({"device": "cpu", "ops": {}})");
  EXPECT_EQ(minimal.device, "cpu");
  EXPECT_TRUE(minimal.collectives.empty());
}

// A measured optimizer step (shardwise.profile.measure_optimizer) round-trips, is refused when
// it is not a positive time, and is what the model answers; without one, nothing (the
// planners' bandwidth rule).
TEST(ProfiledCost, AMeasuredOptimizerStepIsKeptAndAnswered) {
  ir::Graph g = two_layer_graph();
  Profile p = hand_profile(g);
  EXPECT_FALSE(ProfiledCostModel(p).optimizer_seconds_per_element().has_value());
  p.optimizer = MeasuredOptimizer{"AdamW", 3.0e-9};
  EXPECT_EQ(profile_from_json_string(profile_to_json_string(p)), p);
  EXPECT_DOUBLE_EQ(*ProfiledCostModel(p).optimizer_seconds_per_element(), 3.0e-9);
  EXPECT_FALSE(AnalyticCostModel{}.optimizer_seconds_per_element().has_value());
  EXPECT_NE(error_of<support::ValidationError>([] {
              profile_from_json_string(
                  R"({"device": "cpu", "ops": {}, "optimizer": {"name": "AdamW", "seconds_per_element": 0}})");
            }).find("optimizer.seconds_per_element"),
            std::string::npos);
  EXPECT_NE(error_of<support::ParseError>([] {
              profile_from_json_string(R"({"device": "cpu", "ops": {}, "optimizer": {"name": "AdamW", "s": 1}})");
            }).find("optimizer"),
            std::string::npos);
}

// A measured sync wait (profile.py, measure_sync_wait) is what every collective a program
// waits on costs beyond its fit: added once to a fitted call and to an analytic one, not to
// a call that moves nothing; it round-trips, a profile without it reads 0 and writes no key,
// and a negative one is refused by name.
TEST(ProfiledCost, AMeasuredSyncWaitIsAddedToEveryCollectiveCall) {
  ir::Graph g = two_layer_graph();
  Profile p = hand_profile(g);
  const Cluster c = flat_cluster(4);
  const std::vector<int> pair = {0, 1}, four = {0, 1, 2, 3};
  const ProfiledCostModel without(p);
  p.sync_wait = 2.5e-3;
  const ProfiledCostModel with(p);
  for (auto [kind, ranks] : {std::pair{CollectiveKind::AllReduce, pair}, std::pair{CollectiveKind::AllReduce, four},
                             std::pair{CollectiveKind::SendRecv, pair}}) {
    const double before = without.collective_time(c, kind, ranks, 1 << 20, Algorithm::Auto);
    EXPECT_GT(before, 0);
    EXPECT_NEAR(with.collective_time(c, kind, ranks, 1 << 20, Algorithm::Auto) - before, 2.5e-3, 1e-15);
  }
  EXPECT_EQ(with.collective_time(c, CollectiveKind::AllReduce, pair, 0, Algorithm::Auto), 0.0);
  EXPECT_EQ(with.collective_time(c, CollectiveKind::AllGather, pair, 0, Algorithm::Auto), 0.0);
  EXPECT_EQ(profile_from_json_string(profile_to_json_string(p)), p);
  EXPECT_EQ(profile_to_json(hand_profile(g)).count("sync_wait"), 0u);
  EXPECT_EQ(profile_from_json_string(R"({"device": "cpu", "ops": {}})").sync_wait, 0.0);
  EXPECT_NE(error_of<support::ValidationError>([] {
              profile_from_json_string(R"({"device": "cpu", "ops": {}, "sync_wait": -1e-3})");
            }).find("sync_wait"),
            std::string::npos);
}

// The time-slicing factor (profile.py, measure_time_slicing) is folded into the op times by the
// profiler; the profile records it: it round-trips, a profile without it reads 1 and writes no
// key, it prices nothing itself, and a factor outside [1, 2] is refused by name.
TEST(ProfiledCost, ATimeSlicingFactorIsRecordedNotPriced) {
  ir::Graph g = two_layer_graph();
  Profile p = hand_profile(g);
  const DeviceType dev = test_device("dev");
  const ProfiledCostModel plain(p);
  p.time_slicing = 1.07;
  const ProfiledCostModel sliced(p);
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(sliced.node_time(g, g.node(i), dev, Precision::F32, {}),
              plain.node_time(g, g.node(i), dev, Precision::F32, {}));
  EXPECT_EQ(profile_from_json_string(profile_to_json_string(p)), p);
  EXPECT_DOUBLE_EQ(profile_to_json(p).at("time_slicing").get<double>(), 1.07);
  EXPECT_EQ(profile_to_json(hand_profile(g)).count("time_slicing"), 0u);
  EXPECT_EQ(profile_from_json_string(R"({"device": "cpu", "ops": {}})").time_slicing, 1.0);
  for (const char* bad : {R"({"device": "cpu", "ops": {}, "time_slicing": 0.9})",
                          R"({"device": "cpu", "ops": {}, "time_slicing": 2.5})"}) {
    EXPECT_NE(error_of<support::ValidationError>([bad] { profile_from_json_string(bad); }).find("time_slicing"),
              std::string::npos);
  }
}

// An op timed under selective recomputation's policy (profile.py, _selective_seconds) keeps the
// seconds in the JSON and answers OpTime::selective_extra = selective - forward, at the rank's
// shapes as is and scaled like the forward otherwise; an op without it answers -1 (the
// evaluators' rule), a compiled plan's node too (no dispatch mode runs there). A negative or
// non-finite "selective" in a file is refused by name.
TEST(ProfiledCost, AnOpTimedUnderTheSelectivePolicyAnswersItsExtraSeconds) {
  ir::Graph g = two_layer_graph();
  Profile p = hand_profile(g);
  EXPECT_LT(ProfiledCostModel(p).node_time(g, g.node(1), test_device("dev"), Precision::F32, {}).selective_extra, 0);
  MeasuredOp& op = p.ops.at(node_signature(g, g.node(1)));
  op.selective = op.forward + 3.0e-5;
  EXPECT_EQ(profile_from_json_string(profile_to_json_string(p)), p);
  ProfiledCostModel model(p);
  const DeviceType dev = test_device("dev");
  EXPECT_NEAR(model.node_time(g, g.node(1), dev, Precision::F32, {}).selective_extra, 3.0e-5, 1e-15);
  NodeContext quarter{.batch_scale = 0.25};
  const OpTime scaled = model.node_time(g, g.node(1), dev, Precision::F32, quarter);
  EXPECT_NEAR(scaled.selective_extra / 3.0e-5, scaled.forward / op.forward, 1e-12);
  const analysis::FusedValues fused;
  NodeContext compiled{.compiled = &fused};
  EXPECT_LT(model.node_time(g, g.node(1), dev, Precision::F32, compiled).selective_extra, 0);
  EXPECT_NE(error_of<support::ValidationError>([] {
              profile_from_json_string(
                  R"({"device": "cpu", "ops": {"x": {"forward": 1, "backward": 0, "selective": -1}}})");
            }).find("selective"),
            std::string::npos);
}

TEST(ProfiledCost, BadProfilesAreClearErrors) {
  EXPECT_NE(error_of<support::ValidationError>([] {
              profile_from_json_string(R"({"device": "cpu", "ops": {"x": {"forward": -1, "backward": 0}}})");
            }).find("forward"),
            std::string::npos);
  EXPECT_NE(error_of<support::ValidationError>([] {
              profile_from_json_string(
                  R"({"device": "cpu", "ops": {}, "collectives": {"all_reduce": {"2": {"alpha": 0, "beta": -1}}}})");
            }).find("collectives.all_reduce.2.beta"),
            std::string::npos);
  EXPECT_NE(error_of<support::ValidationError>([] {
              profile_from_json_string(R"({"device": "cpu", "ops": {}, "collectives": {"all_sum": {}}})");
            }).find("all_sum"),
            std::string::npos);
  EXPECT_NE(error_of<support::ParseError>([] {
              profile_from_json_string(R"({"device": "cpu", "ops": {}, "colectives": {}})");
            }).find("colectives"),
            std::string::npos);
  EXPECT_NE(error_of<support::ParseError>([] { profile_from_json_string("{"); }).find("malformed"),
            std::string::npos);
  Profile p;
  p.ops["x"] = {1.0, std::nan("")};
  EXPECT_THROW(ProfiledCostModel{p}, support::ValidationError);
}

TEST(ProfiledCost, NumberTooLargeForADoubleIsAParseError) {
  // Found by fuzzing (tests/fuzz/profile_json_fuzz.cc): json::parse throws out_of_range
  // (406), not parse_error, for "1e400"; it escaped as a nlohmann exception.
  EXPECT_NE(error_of<support::ParseError>([] {
              profile_from_json_string(R"({"device": "cpu", "ops": {"x": {"forward": 1e400, "backward": 0}}})");
            }).find("profile: malformed JSON: [json.exception.out_of_range.406] number overflow parsing '1e400'"),
            std::string::npos);
}

TEST(ProfiledCost, VersionIsComparedWithoutNarrowing) {
  // get<int>() turned 4294967297 into 1, which passed as version 1.
  EXPECT_NE(error_of<support::ParseError>([] {
              profile_from_json_string(R"({"version": 4294967297, "device": "cpu", "ops": {}})");
            }).find("profile version: expected 1, found 4294967297"),
            std::string::npos);
  EXPECT_EQ(profile_from_json_string(R"({"version": 1, "device": "cpu", "ops": {}})").device, "cpu");
}

}  // namespace
}  // namespace shardwise::cost
