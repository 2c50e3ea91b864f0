#include "transform/spmd_rewrite.h"

#include <gtest/gtest.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <optional>
#include <string>
#include <vector>

#include "analysis/state_values.h"
#include "ops/node_rule.h"
#include "ir/printer.h"
#include "ops/op_table.h"
#include "support/error.h"
#include "transform/local_shard.h"
#include "transform/rank_graph.h"
#include "megatron_mlp_plan.h"

namespace shardwise::transform {
namespace {

using Shape = std::vector<std::int64_t>;
using Steps = std::vector<std::string>;

ir::Graph mlp() { return testing_plans::megatron_mlp_graph(); }

using testing_plans::megatron_mlp;

Steps str(const std::vector<ReshardAction>& actions) {
  Steps out;
  for (const auto& a : actions) out.push_back(a.str());
  return out;
}

TEST(SpmdRewrite, MegatronMlpOnATwoByTwoMesh) {
  ir::Graph g = mlp();
  RankProgram p = rank_program(g, megatron_mlp(), 3);  // coordinates (1, 1)
  ASSERT_EQ(p.leaves.size(), 3u);
  EXPECT_EQ(p.leaves[0].local_shape, (Shape{4, 16}));  // x: half the batch
  EXPECT_EQ(p.leaves[1].local_shape, (Shape{16, 16}));  // fc1 rows (output features)
  EXPECT_EQ(p.leaves[2].local_shape, (Shape{16, 16}));  // fc2 columns (input features)
  // Parameters: gradients Partial over the data axis (every rank's batch contributes), left to
  // the engine's bucketed reduction; sharded and exact on the tensor axis.
  EXPECT_EQ(p.leaves[1].reduce_axes, (std::vector<int>{0}));
  EXPECT_EQ(search::spec_str(p.leaves[1].gradient), "[P(sum), S(0)]");
  EXPECT_TRUE(p.leaves[0].reduce_axes.empty());

  ASSERT_EQ(p.nodes.size(), 4u);
  const NodeRewrite& fc1 = p.nodes[0];
  EXPECT_EQ(fc1.mode, NodeMode::Local);
  // x is replicated on the tensor axis; fc1's gradient of it is Partial there: Megatron's f
  // (identity forward, all-reduce backward).
  EXPECT_EQ(str(fc1.inputs[0].forward), Steps{});
  EXPECT_EQ(str(fc1.inputs[0].backward), Steps{});  // x is an input: no gradient
  EXPECT_EQ(fc1.outputs[0].local_shape, (Shape{4, 16}));
  const NodeRewrite& fc2 = p.nodes[2];
  EXPECT_EQ(str(fc2.inputs[0].forward), Steps{});
  EXPECT_EQ(str(fc2.inputs[0].backward), Steps{});
  EXPECT_EQ(search::spec_str(fc2.outputs[0].produced), "[S(0), P(sum)]");
  // The loss: the mean over the data axis of partial sums over the tensor axis, made whole on
  // every rank; each data rank's loss counts 1/2 of the mean, so its gradient is halved.
  ASSERT_EQ(p.outputs.size(), 1u);
  EXPECT_EQ(str(p.outputs[0].forward), (Steps{"all_reduce(axis 1, sum)", "all_reduce(axis 0, mean)"}));
  EXPECT_EQ(str(p.outputs[0].backward), Steps{"scale(axis 0, n^-1)"});
}

TEST(SpmdRewrite, AReplicatedActivationReadByAColumnSplitGetsItsGradientReduced) {
  ir::Graph g = mlp();
  plan::Sharding s = megatron_mlp();
  // fc1 replicated on the tensor axis, gelu too; fc2 stays row-parallel, so gelu's output is
  // cut locally and fc2's gradient of it (sharded) is gathered back in backward.
  s.strategies["h"] = {"split _0", "replicate"};
  s.strategies["act"] = {"split d0", "replicate"};
  s.placements["fc1.weight"] = {"R", "R"};
  s.placements["h"] = s.placements["act"] = {"S(0)", "R"};
  RankProgram p = rank_program(g, s, 0);
  EXPECT_EQ(str(p.nodes[2].inputs[0].forward), Steps{"slice(axis 1, dim 1)"});
  EXPECT_EQ(str(p.nodes[2].inputs[0].backward), Steps{"all_gather(axis 1, dim 1)"});
  // fc1's weight: replicated on both axes; the replicated product gives its whole gradient on
  // the tensor axis (every rank computed the same), a Partial one over the data axis.
  EXPECT_EQ(p.leaves[1].reduce_axes, (std::vector<int>{0}));
  EXPECT_EQ(search::spec_str(p.leaves[1].gradient), "[P(sum), R]");
}

// w read twice (a tied weight): by x's rows, split over the data axis (a Partial gradient of
// w), and by c, the same on every rank (a whole gradient).
TEST(SpmdRewrite, ATiedWeightsWholeAndPartialGradientsAreReducedOnceInTheBuckets) {
  ir::Graph g;
  auto f32 = [](std::vector<std::int64_t> shape, std::optional<int> batch = std::nullopt) {
    return ir::TensorType{ir::DType::F32, std::move(shape), batch};
  };
  const ir::ValueId x = g.add_value("x", f32({8, 16}, 0), ir::ValueRole::Input);
  const ir::ValueId c = g.add_value("c", f32({4, 16}), ir::ValueRole::Input);
  const ir::ValueId w = g.add_value("w", f32({32, 16}), ir::ValueRole::Parameter);
  const ir::NodeId a = g.add_node("aten::linear", {x, w}, {{"h", f32({8, 32}, 0)}}, {}, "rows");
  const ir::NodeId b = g.add_node("aten::linear", {c, w}, {{"k", f32({4, 32})}}, {}, "whole");
  g.set_outputs({g.node(a).outputs[0], g.node(b).outputs[0]});
  plan::Sharding s;
  s.mesh = {2};
  s.axis_names = {"data"};
  s.level = "manual";
  s.placements = {{"x", {"S(0)"}}, {"c", {"R"}}, {"w", {"R"}}, {"h", {"S(0)"}}, {"k", {"R"}}};
  s.strategies = {{"h", {"split _0"}}, {"k", {"replicate"}}};
  s.leaves = {"x", "c", "w"};
  for (int rank = 0; rank < 2; ++rank) {
    RankProgram p = rank_program(g, s, rank);
    ASSERT_EQ(p.leaves.size(), 3u);
    ASSERT_EQ(p.leaves[2].value, "w");
    // The sum of the two reads' gradients reduced once, whole, by the engine's buckets: the
    // whole one kept on rank 0 (the others add zeros), the Partial one as it is. Before, the
    // Partial read's gradient was all-reduced at its read, in backward.
    EXPECT_EQ(p.leaves[2].reduce_axes, (std::vector<int>{0}));
    EXPECT_EQ(search::spec_str(p.leaves[2].gradient), "[P(sum)]");
    EXPECT_EQ(str(p.nodes[0].inputs[1].backward), Steps{});
    EXPECT_EQ(str(p.nodes[1].inputs[1].backward), Steps{"zero_others(axis 0)"});
  }
  // Both reads whole: nothing to reduce.
  s.placements["x"] = s.placements["h"] = {"R"};
  s.strategies["h"] = {"replicate"};
  RankProgram whole = rank_program(g, s, 0);
  EXPECT_TRUE(whole.leaves[2].reduce_axes.empty());
  EXPECT_EQ(search::spec_str(whole.leaves[2].gradient), "[R]");
  EXPECT_EQ(str(whole.nodes[1].inputs[1].backward), Steps{});
}

// x + wpe(arange(4)): a learned position embedding, the same on every data rank, added to
// each row of a batch split over the data axis (TinyGPT's, GPT-2's).
ir::Graph learned_positions_graph() {
  ir::Graph g;
  auto out = [&](ir::NodeId n) { return g.node(n).outputs[0]; };
  const ir::ValueId wpe = g.add_value("wpe", ir::TensorType{ir::DType::F32, {4, 8}, {}}, ir::ValueRole::Parameter);
  const ir::ValueId x = g.add_value("x", ir::TensorType{ir::DType::F32, {2, 4, 8}, 0}, ir::ValueRole::Input);
  const ir::ValueId positions =
      out(g.add_node("aten::arange", {}, {{"positions", {ir::DType::I64, {4}, {}}}}, {{"end", std::int64_t{4}}}, ""));
  const ir::ValueId pe = out(g.add_node("aten::embedding", {wpe, positions}, {{"pe", {ir::DType::F32, {4, 8}, {}}}},
                                        {{"padding_idx", std::int64_t{-1}}, {"scale_grad_by_freq", false},
                                         {"sparse", false}},
                                        "wpe"));
  const ir::NodeId add = g.add_node("aten::add.Tensor", {x, pe}, {{"y", {ir::DType::F32, {2, 4, 8}, 0}}},
                                    {{"alpha", std::int64_t{1}}}, "");
  g.set_outputs({out(add)});
  return g;
}

TEST(SpmdRewrite, AReplicatedValueMadeFromParametersHasItsGradientReducedWithTheirs) {
  ir::Graph g = learned_positions_graph();
  const auto add_rule = ops::dim_rule_for(ops::OpTable::builtin(), g, g.node(2));
  plan::Sharding s;
  s.mesh = {2};
  s.axis_names = {"data"};
  s.level = "manual";
  s.placements = {{"wpe", {"R"}}, {"x", {"S(0)"}}, {"positions", {"R"}}, {"pe", {"R"}}, {"y", {"S(0)"}}};
  s.strategies = {{"positions", {"replicate"}}, {"pe", {"replicate"}},
                  {"y", {"split " + add_rule->indices[0].label}}};
  s.leaves = {"wpe", "x"};
  RankProgram p = rank_program(g, s, 1);
  // The add gives pe's gradient Partial (each rank's rows' sum); pe is the same on both ranks,
  // so the embedding's backward of that partial gradient is wpe's partial gradient: no
  // all-reduce of pe's gradient in backward, wpe's reduced after it in the buckets, as DDP does.
  EXPECT_EQ(str(p.nodes[2].inputs[1].backward), Steps{});
  EXPECT_EQ(str(p.nodes[1].inputs[0].backward), Steps{});
  ASSERT_EQ(p.leaves[0].value, "wpe");
  EXPECT_EQ(p.leaves[0].reduce_axes, (std::vector<int>{0}));
  EXPECT_EQ(search::spec_str(p.leaves[0].gradient), "[P(sum)]");
  // pe read whole by a second, replicated reader too (its gradient whole there): the partial
  // one is reduced where pe's gradients meet, and wpe's is whole.
  const ir::ValueId pe = g.node(1).outputs[0];
  g.add_node("aten::relu", {pe}, {{"r", {ir::DType::F32, {4, 8}, {}}}}, {}, "");
  g.set_outputs({g.node(2).outputs[0], g.node(3).outputs[0]});
  s.placements["r"] = {"R"};
  s.strategies["r"] = {"replicate"};
  p = rank_program(g, s, 1);
  EXPECT_EQ(str(p.nodes[2].inputs[1].backward), Steps{"all_reduce(axis 0, sum)"});
  EXPECT_TRUE(p.leaves[0].reduce_axes.empty());
}

// A float64 weight cast to float32 before a batch-split add (DeepSeek-V3's router reads its
// weight so): one device sums the batch's share of the cast's gradient in float32, so the
// rewrite reduces it there, as it did, not after the cast back to float64.
TEST(SpmdRewrite, AReplicatedCastOfAWeightHasItsGradientReducedInTheCastsDtype) {
  ir::Graph g;
  const ir::ValueId w = g.add_value("w", ir::TensorType{ir::DType::F64, {4, 8}, {}}, ir::ValueRole::Parameter);
  const ir::ValueId x = g.add_value("x", ir::TensorType{ir::DType::F32, {2, 4, 8}, 0}, ir::ValueRole::Input);
  const ir::NodeId cast = g.add_node("aten::to.dtype", {w}, {{"w32", {ir::DType::F32, {4, 8}, {}}}},
                                     {{"dtype", std::string{"f32"}}}, "");
  const ir::NodeId add = g.add_node("aten::add.Tensor", {x, g.node(cast).outputs[0]},
                                    {{"y", {ir::DType::F32, {2, 4, 8}, 0}}}, {{"alpha", std::int64_t{1}}}, "");
  g.set_outputs({g.node(add).outputs[0]});
  EXPECT_FALSE(analysis::state_values(g)[static_cast<std::size_t>(g.node(cast).outputs[0])]);
  const auto add_rule = ops::dim_rule_for(ops::OpTable::builtin(), g, g.node(add));
  plan::Sharding s;
  s.mesh = {2};
  s.axis_names = {"data"};
  s.level = "manual";
  s.placements = {{"w", {"R"}}, {"x", {"S(0)"}}, {"w32", {"R"}}, {"y", {"S(0)"}}};
  s.strategies = {{"w32", {"replicate"}}, {"y", {"split " + add_rule->indices[0].label}}};
  s.leaves = {"w", "x"};
  const RankProgram p = rank_program(g, s, 1);
  EXPECT_EQ(str(p.nodes[1].inputs[1].backward), Steps{"all_reduce(axis 0, sum)"});
  ASSERT_EQ(p.leaves[0].value, "w");
  EXPECT_TRUE(p.leaves[0].reduce_axes.empty());
}

TEST(SpmdRewrite, WholeNodesRunOnGatheredOperands) {
  ir::Graph g = mlp();
  RewriteOptions options;
  options.whole_nodes = {"act"};
  RankProgram p = rank_program(g, megatron_mlp(), 1, options);
  const NodeRewrite& act = p.nodes[1];
  EXPECT_EQ(act.mode, NodeMode::Whole);
  EXPECT_EQ(str(act.inputs[0].forward), (Steps{"all_gather(axis 1, dim 1)", "all_gather(axis 0, dim 0)"}));
  EXPECT_EQ(str(act.inputs[0].backward), (Steps{"slice(axis 0, dim 0)", "slice(axis 1, dim 1)"}));
  EXPECT_EQ(act.outputs[0].local_shape, (Shape{8, 32}));
  // fc2 cuts what it needs from the whole activation.
  EXPECT_EQ(str(p.nodes[2].inputs[0].forward), (Steps{"slice(axis 0, dim 0)", "slice(axis 1, dim 1)"}));
}

// logits [8, 10] and labels [8] -> cross entropy (mean over the labels not ignored).
ir::Graph classifier() {
  ir::Graph g;
  ir::ValueId x = g.add_value("x", ir::TensorType{ir::DType::F32, {8, 16}, 0}, ir::ValueRole::Input);
  ir::ValueId y = g.add_value("y", ir::TensorType{ir::DType::I64, {8}, 0}, ir::ValueRole::Input);
  ir::ValueId w = g.add_value("fc.weight", ir::TensorType{ir::DType::F32, {10, 16}, {}}, ir::ValueRole::Parameter);
  ir::NodeId a = g.add_node("aten::linear", {x, w}, {{"logits", {ir::DType::F32, {8, 10}, 0}}}, {}, "fc");
  ir::NodeId b = g.add_node("aten::cross_entropy_loss", {g.node(a).outputs[0], y}, {{"loss", {ir::DType::F32, {}, {}}}},
                            {{"reduction", std::int64_t{1}}, {"ignore_index", std::int64_t{-100}}}, "");
  g.set_outputs({g.node(b).outputs[0]});
  return g;
}

TEST(SpmdRewrite, ACountedMeanSplitOverTheBatchIsMarkedWithItsShares) {
  ir::Graph g = classifier();
  plan::Sharding s;
  s.mesh = {2, 2};
  s.axis_names = {"data", "tensor"};
  s.level = "manual";
  s.placements = {{"x", {"S(0)", "R"}},           {"y", {"S(0)", "R"}},        {"fc.weight", {"R", "R"}},
                  {"logits", {"S(0)", "R"}}, {"loss", {"P(mean)", "R"}}};
  s.strategies = {{"logits", {"split _0", "replicate"}}, {"loss", {"split n", "replicate"}}};
  s.leaves = {"x", "y", "fc.weight"};
  RankProgram p = rank_program(g, s, 1);
  EXPECT_FALSE(p.nodes[0].counted.has_value());
  ASSERT_TRUE(p.nodes[1].counted.has_value());
  EXPECT_EQ(p.nodes[1].counted->shares, 2);  // the data axis splits its rows, the tensor axis does not
  EXPECT_EQ(p.nodes[1].counted->target, 1);
  EXPECT_EQ(p.nodes[1].counted->weight, -1);
  // Uneven shares: the count of the whole batch weighs each rank's rows, so no share scale.
  s.placements["x"] = s.placements["y"] = {"S(0)[0.75,0.25]", "R"};
  p = rank_program(g, s, 2);
  EXPECT_EQ(p.nodes[1].counted->shares, 2);
  EXPECT_EQ(p.nodes[1].outputs[0].scale, 1.0);
  // Replicated: still counted (a pipeline's micro-batches split its rows), one share.
  s.strategies["loss"] = {"replicate", "replicate"};
  s.placements["loss"] = {"R", "R"};
  p = rank_program(g, s, 0);
  ASSERT_TRUE(p.nodes[1].counted.has_value());
  EXPECT_EQ(p.nodes[1].counted->shares, 1);
}

TEST(SpmdRewrite, AnOuterAxisSplittingAMinorIndexIsStridedWhateverTheInnerAxesSplit) {
  // x [b=2, s=16, 8] viewed as [32, 8]: the outer axis 0 splits s, the inner axis 1 splits b
  // (a plan with the batch on the inner axis). Rank (a0, a1) holds sequence a1, positions
  // [8 a0, 8 a0 + 8): rows 16 a1 + 8 a0 + [0, 8) of the view, which is [S(0,g2), S(0)] (axis 0
  // cuts first). [S(0), S(0)] would be rows 8 (2 a0 + a1) + [0, 8): another rank's rows
  // wherever a0 != a1, and every reshard of the view would move the wrong rows.
  ir::Graph g;
  const ir::TensorType in{ir::DType::F32, {2, 16, 8}, 0}, out{ir::DType::F32, {32, 8}, 0};
  ir::ValueId x = g.add_value("x", in, ir::ValueRole::Input);
  ir::Attributes size;
  size["size"] = std::vector<std::int64_t>{32, 8};
  ir::NodeId v = g.add_node("aten::view", {x}, {{"v", out}}, size, "");
  g.set_outputs({g.node(v).outputs[0]});
  plan::Sharding s;
  s.mesh = {2, 2};
  s.axis_names = {"data", "tensor"};
  s.level = "manual";
  s.placements = {{"x", {"S(1)", "S(0)"}}, {"v", {"S(0,g2)", "S(0)"}}};
  s.strategies = {{"v", {"split i1", "split i0"}}};
  s.leaves = {"x"};
  for (int rank = 0; rank < 4; ++rank) {
    RankProgram p = rank_program(g, s, rank);
    ASSERT_EQ(p.nodes.size(), 1u);
    const auto& o = p.nodes[0].outputs[0];
    EXPECT_EQ(search::spec_str(o.produced), "[S(0,g2), S(0)]");
    EXPECT_EQ(o.local_shape, (Shape{8, 8}));
    const int a0 = rank / 2, a1 = rank % 2;
    const LocalShard local = local_shard({32, 8}, {"S(0,g2)", "S(0)"}, s.mesh, rank);
    const std::int64_t first = 16 * a1 + 8 * a0;
    EXPECT_EQ(local.dims[0], (std::vector<IndexRun>{{first, first + 8}})) << "rank " << rank;
  }
}

// logits [8, 1001] (1001 classes: uneven on 4 ranks), targets (and class weights) -> cross entropy.
ir::Graph cross_entropy(ir::Attributes attrs = {}, bool weighted = false) {
  ir::Graph g;
  ir::ValueId logits = g.add_value("logits", ir::TensorType{ir::DType::F32, {8, 1001}, 0}, ir::ValueRole::Input);
  ir::ValueId target = g.add_value("target", ir::TensorType{ir::DType::I64, {8}, 0}, ir::ValueRole::Input);
  std::vector<ir::ValueId> inputs = {logits, target};
  if (weighted)
    inputs.push_back(g.add_value("weight", ir::TensorType{ir::DType::F32, {1001}, std::nullopt}, ir::ValueRole::Buffer));
  ir::NodeId n = g.add_node("aten::cross_entropy_loss", inputs,
                            {{"loss", ir::TensorType{ir::DType::F32, {}, std::nullopt}}}, std::move(attrs), "loss");
  g.set_outputs({g.node(n).outputs[0]});
  return g;
}

TEST(SpmdRewrite, CrossEntropyOverSplitClassesCombinesStatistics) {
  plan::Sharding s;
  s.mesh = {4};
  s.axis_names = {"tensor"};
  s.level = "manual";
  const std::string classes =
      search::Placement{search::PlacementKind::Shard, 1, 1, search::uneven_ratios(1001, 4)}.str();
  s.placements = {{"logits", {classes}}, {"target", {"R"}}, {"weight", {"R"}}, {"loss", {"R"}}};
  s.strategies = {{"loss", {"split C"}}};
  for (const ir::Attributes& attrs : {ir::Attributes{}, ir::Attributes{{"label_smoothing", 0.1}}}) {
    RankProgram p = rank_program(cross_entropy(attrs), s, 1);
    ASSERT_EQ(p.nodes.size(), 1u);
    EXPECT_EQ(p.nodes[0].mode, NodeMode::Statistics);
    EXPECT_EQ(p.nodes[0].statistics_axis, 0);
    EXPECT_TRUE(p.nodes[0].inputs[0].forward.empty());            // no gather of the logits
    EXPECT_EQ(p.nodes[0].inputs[0].local_shape, (Shape{8, 250}));  // 251 250 250 250
  }
  // Class weights have no kernel: whole, on gathered logits.
  RankProgram weighted = rank_program(cross_entropy({}, true), s, 1);
  EXPECT_EQ(weighted.nodes[0].mode, NodeMode::Whole);
  EXPECT_EQ(weighted.nodes[0].statistics_axis, -1);
  EXPECT_FALSE(weighted.nodes[0].inputs[0].forward.empty());
  // Without the op in statistics_ops (a runtime with no kernel), whole too.
  RewriteOptions none;
  none.statistics_ops.clear();
  EXPECT_EQ(rank_program(cross_entropy(), s, 1, none).nodes[0].mode, NodeMode::Whole);
}

// x + arange(...): i64[12] on the second axis of a 2 x 3 mesh.
ir::Graph positions_graph(const std::string& op, const ir::Attributes& attrs) {
  ir::Graph g;
  ir::ValueId x = g.add_value("x", ir::TensorType{ir::DType::I64, {12}, {}}, ir::ValueRole::Input);
  ir::NodeId a = g.add_node(op, {}, {{"positions", {ir::DType::I64, {12}, {}}}}, attrs, "");
  ir::NodeId b = g.add_node("aten::add.Tensor", {x, g.node(a).outputs[0]}, {{"y", {ir::DType::I64, {12}, {}}}},
                            {{"alpha", std::int64_t{1}}}, "");
  g.set_outputs({g.node(b).outputs[0]});
  return g;
}

plan::Sharding positions_plan(const ir::Graph& g, const std::string& placement) {
  auto split = [&](int node) {
    const auto rule = ops::dim_rule_for(ops::OpTable::builtin(), g, g.node(node));
    return placement == "R" ? std::string("replicate") : "split " + rule->indices[0].label;
  };
  plan::Sharding s;
  s.mesh = {2, 3};
  s.axis_names = {"data", "tensor"};
  s.level = "manual";
  s.placements = {{"x", {"R", placement}}, {"positions", {"R", placement}}, {"y", {"R", placement}}};
  s.strategies = {{"positions", {"replicate", split(0)}}, {"y", {"replicate", split(1)}}};
  s.leaves = {"x"};
  return s;
}

// x.new_empty(size) reads x for its dtype and device only (DimRule::reads_metadata_only): x is
// read as it is held, with no resharding into the strategy's placement of it (Replicate: its
// metadata index is not split) and no gradient, and the search prices no edge for the read
// (search::group_edges); the made tensor is created at its local size.
TEST(SpmdRewrite, AnOperandReadForItsMetadataIsReadAsItIsHeld) {
  ir::Graph g;
  const ir::ValueId x = g.add_value("x", ir::TensorType{ir::DType::F32, {8, 4}, 0}, ir::ValueRole::Input);
  auto out = [&](ir::NodeId n) { return g.node(n).outputs[0]; };
  const ir::ValueId a = out(g.add_node("aten::relu", {x}, {{"a", {ir::DType::F32, {8, 4}, 0}}}, {}, ""));
  const ir::ValueId made = out(g.add_node("aten::new_empty", {a}, {{"made", {ir::DType::F32, {8, 6}, 0}}},
                                          {{"size", std::vector<std::int64_t>{8, 6}}}, ""));
  const ir::ValueId filled = out(g.add_node("aten::slice_scatter", {made, a}, {{"filled", {ir::DType::F32, {8, 6}, 0}}},
                                            {{"dim", std::int64_t{1}}, {"start", std::int64_t{0}},
                                             {"end", std::int64_t{4}}, {"step", std::int64_t{1}}},
                                            ""));
  g.set_outputs({filled});
  // Each node split on the index its output's dim 0 carries, on the tensor axis of {1, 2}.
  auto rows = [&](int node) {
    const auto rule = ops::dim_rule_for(ops::OpTable::builtin(), g, g.node(node));
    EXPECT_TRUE(rule->reads_metadata_only(0) == (node == 1));
    return "split " + rule->indices[static_cast<std::size_t>(rule->outputs[0][0][0])].label;
  };
  plan::Sharding s;
  s.mesh = {1, 2};
  s.axis_names = {"data", "tensor"};
  s.level = "manual";
  s.placements = {{"x", {"R", "S(0)"}}, {"a", {"R", "S(0)"}}, {"made", {"R", "S(0)"}}, {"filled", {"R", "S(0)"}}};
  s.strategies = {{"a", {"replicate", rows(0)}}, {"made", {"replicate", rows(1)}}, {"filled", {"replicate", rows(2)}}};
  s.leaves = {"x"};
  const RankProgram p = rank_program(g, s, 1);
  const NodeRewrite& create = p.nodes[1];
  ASSERT_EQ(create.op, "aten::new_empty");
  EXPECT_EQ(create.inputs[0].required, create.inputs[0].produced);
  EXPECT_TRUE(create.inputs[0].forward.empty());
  EXPECT_FALSE(create.inputs[0].gradient);
  EXPECT_EQ(create.inputs[0].local_shape, (Shape{4, 4}));
  EXPECT_EQ(std::get<std::vector<std::int64_t>>(create.attrs.at("size")), (Shape{4, 6}));
  // The slice_scatter reads a as its source: that read is data, split as held.
  EXPECT_TRUE(p.nodes[2].inputs[1].forward.empty());
}

TEST(SpmdRewrite, AnArangeSplitIntoBlocksStartsAtItsBlock) {
  // arange(start 3, end 27, step 2): 12 values split 3 ways; rank 5 (coordinates 1, 2) holds
  // indices [8, 12), the values 19 .. 25.
  ir::Graph g = positions_graph("aten::arange.start_step",
                                {{"start", std::int64_t{3}}, {"end", std::int64_t{27}}, {"step", std::int64_t{2}}});
  RankProgram p = rank_program(g, positions_plan(g, "S(0)"), 5);
  const NodeRewrite& positions = p.nodes[0];
  EXPECT_EQ(positions.mode, NodeMode::Local);
  EXPECT_EQ(positions.op, "aten::arange.start_step");
  EXPECT_EQ(std::get<std::int64_t>(positions.attrs.at("start")), 19);
  EXPECT_EQ(std::get<std::int64_t>(positions.attrs.at("end")), 27);
  EXPECT_EQ(std::get<std::int64_t>(positions.attrs.at("step")), 2);
  EXPECT_EQ(positions.outputs[0].local_shape, (Shape{4}));
  // Float bounds: the end half a step past the block's last value. Rank 1: indices [4, 8).
  g = positions_graph("aten::arange.start_step", {{"start", 0.5}, {"end", 12.5}, {"step", 1.0}});
  p = rank_program(g, positions_plan(g, "S(0)"), 1);
  EXPECT_EQ(std::get<double>(p.nodes[0].attrs.at("start")), 4.5);
  EXPECT_EQ(std::get<double>(p.nodes[0].attrs.at("end")), 8.0);
  // arange(end) becomes arange.start_step from its block: rank 4 (coordinates 1, 1), [4, 8).
  g = positions_graph("aten::arange", {{"end", std::int64_t{12}}});
  p = rank_program(g, positions_plan(g, "S(0)"), 4);
  EXPECT_EQ(p.nodes[0].op, "aten::arange.start_step");
  EXPECT_EQ(std::get<std::int64_t>(p.nodes[0].attrs.at("start")), 4);
  EXPECT_EQ(std::get<std::int64_t>(p.nodes[0].attrs.at("end")), 8);
  EXPECT_EQ(std::get<std::int64_t>(p.nodes[0].attrs.at("step")), 1);
  // Replicated: the node as captured.
  p = rank_program(g, positions_plan(g, "R"), 1);
  EXPECT_EQ(p.nodes[0].op, "aten::arange");
  EXPECT_FALSE(p.nodes[0].attrs.contains("start"));
}

TEST(SpmdRewrite, EveryRanksArangeBlockRunsLocallyInItsRankGraph) {
  // The rank graph calls the overload the rewrite chose (arange.start_step): its shape rule
  // reads the block's start. Calling the captured arange(end) there gave the ranks past the
  // first block a length of end, not end - start, so they alone ran it whole and skipped the
  // gather the others ran: a deadlock on the first collective.
  ir::Graph g = positions_graph("aten::arange", {{"end", std::int64_t{12}}});
  const plan::Sharding plan = positions_plan(g, "S(0)");
  for (int rank = 0; rank < 6; ++rank) {
    const RankGraph r = rank_graph(g, plan, rank);
    EXPECT_TRUE(r.whole.empty()) << rank << ": " << fmt::format("{}", fmt::join(r.whole, ", "));
    const std::string text = ir::print_graph(r.graph);
    EXPECT_NE(text.find("aten::arange.start_step()"), std::string::npos) << text;
    EXPECT_NO_THROW(verify_rank_graph(r.graph, g, plan, rank)) << rank;
  }
}

// h = linear(x, w) [8, 32] -> r = op(h) on a tensor axis of 2: h split over its columns
// (x replicated, w's rows split) or a Partial sum (x's and w's columns split).
ir::Graph random_graph(const std::string& op, const ir::Attributes& attrs) {
  ir::Graph g;
  auto f32 = [](Shape shape) { return ir::TensorType{ir::DType::F32, std::move(shape), std::nullopt}; };
  ir::ValueId x = g.add_value("x", f32({8, 16}), ir::ValueRole::Input);
  ir::ValueId w = g.add_value("w", f32({32, 16}), ir::ValueRole::Parameter);
  ir::NodeId a = g.add_node("aten::linear", {x, w}, {{"h", f32({8, 32})}}, {}, "fc");
  ir::NodeId b = g.add_node(op, {g.node(a).outputs[0]}, {{"r", f32({8, 32})}}, attrs, "noise");
  g.set_outputs({g.node(b).outputs[0]});
  return g;
}

plan::Sharding random_plan(const ir::Graph& g, bool partial) {
  plan::Sharding s;
  s.mesh = {2};
  s.axis_names = {"tensor"};
  s.level = "manual";
  if (partial) {
    s.placements = {{"x", {"S(1)"}}, {"w", {"S(1)"}}, {"h", {"P(sum)"}}, {"r", {"P(sum)"}}};
    s.strategies = {{"h", {"split k"}}, {"r", {"partial"}}};
  } else {
    const auto rule = ops::dim_rule_for(ops::OpTable::builtin(), g, g.node(1));
    s.placements = {{"x", {"R"}}, {"w", {"S(0)"}}, {"h", {"S(1)"}}, {"r", {"S(1)"}}};
    s.strategies = {{"h", {"split n"}}, {"r", {"split " + rule->indices[1].label}}};
  }
  s.leaves = {"x"};
  return s;
}

TEST(SpmdRewrite, RandomOpsOnBlocksDrawAsOneDeviceOrRunWhole) {
  struct Case {
    std::string op;
    ir::Attributes attrs;
    bool partial;
    NodeMode mode;
    bool one_device;
  };
  const ir::Attributes dropout{{"p", 0.1}, {"train", true}};
  const std::vector<Case> cases = {
      // A dropout's mask drawn whole and cut, on a block or on a Partial sum (a linear op).
      {"aten::dropout", dropout, false, NodeMode::Local, true},
      {"aten::dropout", dropout, true, NodeMode::Local, true},
      // No draws: the plain local call.
      {"aten::dropout", {{"p", 0.0}, {"train", true}}, false, NodeMode::Local, false},
      {"aten::dropout", {{"p", 0.1}, {"train", false}}, false, NodeMode::Local, false},
      // rand_like's values drawn whole and cut; on a Partial operand its output would be a
      // Partial sum of random values, so it runs whole.
      {"aten::randn_like", {}, false, NodeMode::Local, true},
      {"aten::randn_like", {}, true, NodeMode::Whole, false},
      // Any other seeded op on a block would draw fewer values than one device: whole.
      {"aten::bernoulli.p", {{"p", 0.5}}, false, NodeMode::Whole, false},
  };
  for (const Case& c : cases) {
    ir::Graph g = random_graph(c.op, c.attrs);
    const plan::Sharding plan = random_plan(g, c.partial);
    for (int rank = 0; rank < 2; ++rank) {
      const std::string what = fmt::format("{} {} partial={} rank {}", c.op, ir::attr_str(c.attrs.empty()
          ? ir::AttrValue{ir::NoneAttr{}} : c.attrs.begin()->second), c.partial, rank);
      RankProgram p = rank_program(g, plan, rank);
      ASSERT_EQ(p.nodes.size(), 2u) << what;
      EXPECT_EQ(p.nodes[1].mode, c.mode) << what;
      EXPECT_EQ(p.nodes[1].one_device_random, c.one_device) << what;
      const RankGraph r = rank_graph(g, plan, rank);
      const std::string text = ir::print_graph(r.graph);
      EXPECT_EQ(text.find("shardwise.one_device_random=true") != std::string::npos, c.one_device) << what << text;
      EXPECT_NO_THROW(verify_rank_graph(r.graph, g, plan, rank)) << what;
    }
  }
}

TEST(SpmdRewrite, BadPlansNameWhatIsWrong) {
  ir::Graph g = mlp();
  plan::Sharding s = megatron_mlp();
  s.strategies["h"] = {"split _0", "split q"};
  try {
    rank_program(g, s, 0);
    FAIL() << "expected a ValidationError";
  } catch (const support::ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find("node 'h' (aten::linear, module 'fc1') on mesh axis 1"), std::string::npos)
        << e.what();
  }
  s = megatron_mlp();
  s.placements.erase("fc2.weight");
  EXPECT_THROW(rank_program(g, s, 0), support::ValidationError);
  EXPECT_THROW(rank_program(g, megatron_mlp(), 4), support::ValidationError);
}

}  // namespace
}  // namespace shardwise::transform
