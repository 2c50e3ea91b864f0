#include "transform/rank_graph.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "ir/parser.h"
#include "ir/printer.h"
#include "support/error.h"
#include "batch_norm_plan.h"
#include "megatron_mlp_plan.h"

namespace shardwise::transform {
namespace {

using Shape = std::vector<std::int64_t>;

constexpr const char* kMlp = R"(graph(%x: f32[b8,16]) {
  %fc1.weight: f32[32,16] parameter
  %fc2.weight: f32[16,32] parameter
  %h: f32[b8,32] = aten::linear(%x, %fc1.weight) @fc1
  %act: f32[b8,32] = aten::gelu(%h) {approximate="none"} @act
  %y: f32[b8,16] = aten::linear(%act, %fc2.weight) @fc2
  %loss: f32[] = aten::mean(%y) {dtype=none}
  return (%loss)
})";

plan::Sharding megatron() { return testing_plans::megatron_mlp(); }

const ir::Value& value(const ir::Graph& g, const std::string& name) { return g.value(*g.find_value(name)); }

TEST(RankGraph, EveryRankHoldsItsShardsAndTheCollectivesAreNodes) {
  const ir::Graph g = ir::parse_graph(kMlp);
  for (int rank = 0; rank < 4; ++rank) {
    const RankGraph r = rank_graph(g, megatron(), rank);
    EXPECT_NO_THROW(verify_rank_graph(r.graph, g, megatron(), rank)) << rank;
    EXPECT_EQ(value(r.graph, "x").type.shape, (Shape{4, 16}));
    EXPECT_EQ(value(r.graph, "fc1.weight").type.shape, (Shape{16, 16}));
    EXPECT_EQ(value(r.graph, "h").type.shape, (Shape{4, 16}));
    EXPECT_TRUE(r.whole.empty());
    // The loss made whole: a sum over the tensor axis, a mean over the data axis, and the
    // mean's backward share, in that order, each naming its group.
    std::vector<std::string> steps;
    for (const ir::Node& n : r.graph.nodes())
      if (n.op.starts_with("shardwise::") && !n.outputs.empty()) steps.push_back(n.op + " " + ir::attr_str(n.attrs.at("group")));
    const int data = rank / 2, tensor = rank % 2;
    EXPECT_EQ(steps, (std::vector<std::string>{
                         "shardwise::all_reduce [" + std::to_string(data * 2) + "," + std::to_string(data * 2 + 1) + "]",
                         "shardwise::all_reduce [" + std::to_string(tensor) + "," + std::to_string(tensor + 2) + "]",
                         "shardwise::scale [" + std::to_string(tensor) + "," + std::to_string(tensor + 2) + "]"}));
  }
}

TEST(RankGraph, ItsRegionsReadBackAsTheRewritesSteps) {
  // step_regions and step_action give back, region by region, the steps of the operands the
  // graph was emitted from (one region per resharding_region_key, in emission order).
  const ir::Graph g = ir::parse_graph(kMlp);
  for (int rank = 0; rank < 4; ++rank) {
    const RankGraph r = rank_graph(g, megatron(), rank);
    std::vector<std::tuple<std::string, std::vector<ReshardAction>, std::vector<ReshardAction>>> expected, read;
    std::set<std::string> seen;
    auto add = [&](const OperandRewrite& op) {
      if ((op.forward.empty() && op.backward.empty()) || !seen.insert(resharding_region_key(op)).second) return;
      expected.emplace_back(op.value, op.forward, op.backward);
    };
    for (const NodeRewrite& node : r.program.nodes)
      for (const OperandRewrite& op : node.inputs) add(op);
    for (const OperandRewrite& op : r.program.outputs) add(op);
    for (const StepRegion& region : step_regions(r.graph)) {
      std::vector<ReshardAction> forward, backward;
      for (ir::NodeId id : region.forward) forward.push_back(step_action(r.graph.node(id)));
      for (auto it = region.backward.rbegin(); it != region.backward.rend(); ++it)
        backward.push_back(step_action(r.graph.node(*it)));
      read.emplace_back(r.graph.value(region.source).name, forward, backward);
    }
    ASSERT_FALSE(expected.empty());
    EXPECT_EQ(read, expected) << rank;
  }
  // Not a step: a node without a mesh axis and group.
  EXPECT_THROW(step_action(ir::parse_graph(kMlp).node(0)), support::ValidationError);
}

TEST(RankGraph, TheTextParsesBackToTheSameGraph) {
  const ir::Graph g = ir::parse_graph(kMlp);
  const RankGraph r = rank_graph(g, megatron(), 1);
  const std::string text = ir::print_graph(r.graph);
  EXPECT_EQ(ir::parse_graph(text), r.graph);
  EXPECT_NE(text.find("shardwise::reduce_gradient(%fc1.weight) {axes=[0], overlap=\"backward\", reduce=\"sum\"}"), std::string::npos) << text;
}

TEST(RankGraph, ItsOwnNamesDoNotTakeTheModels) {
  // A model value already named as the rank graph would name a resharding ("loss.r1"): the
  // rank graph's gets a suffix instead of failing on a taken name.
  std::string text = kMlp;
  text.replace(text.find("%act: "), 6, "%loss.r1: ");
  for (std::size_t at; (at = text.find("(%act,")) != std::string::npos;) text.replace(at, 6, "(%loss.r1,");
  const ir::Graph g = ir::parse_graph(text);
  plan::Sharding s = megatron();
  s.placements["loss.r1"] = s.placements.at("act");
  s.placements.erase("act");
  s.strategies["loss.r1"] = s.strategies.at("act");
  s.strategies.erase("act");
  const RankGraph r = rank_graph(g, s, 0);
  EXPECT_TRUE(r.graph.find_value("loss.r1") && r.graph.find_value("loss.r1_1")) << ir::print_graph(r.graph);
  EXPECT_EQ(r.graph.value(r.graph.outputs()[0]).name, "loss.r1_1");
  EXPECT_NO_THROW(verify_rank_graph(r.graph, g, s, 0));
}

TEST(RankGraph, ShapeArgumentsAreMadeLocal) {
  const ir::Graph g = ir::parse_graph(R"(graph(%x: f32[b8,4,16]) {
  %flat: f32[b32,16] = aten::view(%x) {size=[-1,16]}
  %back: f32[b8,4,16] = aten::view(%flat) {size=[8,4,16]}
  %s0: f32[b8,4,8], %s1: f32[b8,4,8] = aten::split.Tensor(%back) {dim=2, split_size=8}
  %sum: f32[] = aten::sum(%s0) {dtype=none}
  return (%sum)
})");
  plan::Sharding s;
  s.mesh = {2};
  s.axis_names = {"data"};
  s.placements = {{"x", {"S(0)"}}, {"flat", {"S(0)"}}, {"back", {"S(0)"}}, {"s0", {"S(0)"}}, {"s1", {"S(0)"}},
                  {"sum", {"P(sum)"}}};
  s.strategies = {{"flat", {"split i0"}}, {"back", {"split i0"}}, {"s0", {"split d0"}}, {"sum", {"split r0"}}};
  const RankGraph r = rank_graph(g, s, 0);
  const ir::Graph& l = r.graph;
  EXPECT_EQ(ir::attr_str(l.node(value(l, "back").producer.value()).attrs.at("size")), "[4,4,16]");
  EXPECT_EQ(ir::attr_str(l.node(value(l, "flat").producer.value()).attrs.at("size")), "[-1,16]");  // -1 kept
  EXPECT_EQ(value(l, "flat").type.shape, (Shape{16, 16}));
  EXPECT_NO_THROW(verify_rank_graph(l, g, s, 0));
}

// The verifier refuses a rank graph that disagrees with the plan, naming what and where.
class RankGraphVerifier : public testing::Test {
 protected:
  void expect_refused(const std::string& from, const std::string& to, const std::string& message) {
    const ir::Graph g = ir::parse_graph(kMlp);
    std::string text = ir::print_graph(rank_graph(g, megatron(), 3).graph);
    const auto at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from << " not in\n" << text;
    text.replace(at, from.size(), to);
    const ir::Graph bad = ir::parse_graph(text);
    try {
      verify_rank_graph(bad, g, megatron(), 3);
      FAIL() << "accepted:\n" << text;
    } catch (const support::ValidationError& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
};

TEST_F(RankGraphVerifier, ALeafShardOfTheWrongSize) {
  expect_refused("%fc1.weight: f32[16,16] parameter", "%fc1.weight: f32[32,16] parameter",
                 "rank graph of rank 3: 'fc1.weight' is [32,16] but its placement [R, S(0)] on mesh [2,2] gives [16,16]");
}

TEST_F(RankGraphVerifier, AnotherRanksGroup) {
  expect_refused("group=[2,3]", "group=[0,1]", "its group is not rank 3's on mesh axis 1 ([2,3])");
}

TEST_F(RankGraphVerifier, ACollectiveOfTheWrongShape) {
  expect_refused("%loss.r1.s1: f32[] = shardwise::all_reduce(%loss) {axis=1",
                 "%loss.r1.s1: f32[2] = shardwise::all_reduce(%loss) {axis=1",
                 "shardwise::all_reduce node 'loss.r1.s1': gives [2] from [] but 2 ranks make []");
}

TEST_F(RankGraphVerifier, ACollectiveWithoutItsOverlapMark) {
  expect_refused("group=[2,3], overlap=\"exposed\", ", "group=[2,3], ",
                 "shardwise::all_reduce node 'loss.r1.s1': a collective without its overlap mark");
}

TEST_F(RankGraphVerifier, AnOpWhoseOutputItsOperandsDoNotGive) {
  expect_refused("%act: f32[b4,16]", "%act: f32[b4,8]", "'act' is [4,8] but its placement [S(0), S(1)]");
}

TEST_F(RankGraphVerifier, ALeafOfAnotherDtype) {
  expect_refused("graph(%x: f32[b4,16])", "graph(%x: f64[b4,16])", "'x' is f64[b4,16] but the model's is f32[b8,16]");
}

TEST(RankGraph, AnOpWhoseLocalCallDoesNotFitRunsWhole) {
  // unflatten's `sizes` are the split dim's factors, not an output shape: with the dim cut in
  // half, the local call would unflatten 8 columns as [4,4]. The op's shape rule refuses that
  // local call, so the rank graph gathers the operand and runs the node whole.
  const ir::Graph g = ir::parse_graph(R"(graph(%x: f32[b8,16]) {
  %w: f32[16,16] parameter
  %h: f32[b8,16] = aten::linear(%x, %w) @fc
  %u: f32[b8,4,4] = aten::unflatten(%h) {dim=1, sizes=[4,4]} @fc
  %sum: f32[] = aten::sum(%u) {dtype=none}
  return (%sum)
})");
  plan::Sharding s;
  s.mesh = {2};
  s.axis_names = {"tensor"};
  s.placements = {{"x", {"R"}}, {"w", {"S(0)"}}, {"h", {"S(1)"}}, {"u", {"S(1)"}}, {"sum", {"P(sum)"}}};
  s.strategies = {{"h", {"split n"}}, {"u", {"split i1"}}, {"sum", {"split r1"}}};
  const RankGraph r = rank_graph(g, s, 1);
  EXPECT_EQ(r.whole, (std::vector<std::string>{"u"})) << ir::print_graph(r.graph);
  const ir::Node& node = r.graph.node(*value(r.graph, "u").producer);
  EXPECT_TRUE(node.attrs.contains("shardwise.whole"));
  EXPECT_EQ(r.graph.value(node.inputs[0]).type.shape, (Shape{8, 16}));  // h gathered first
  EXPECT_NO_THROW(verify_rank_graph(r.graph, g, s, 1));
}

using testing_plans::batch_norm_channels_split;
using testing_plans::batch_norm_graph;
using testing_plans::kBatchNorm;

TEST(RankGraph, AStateTheCallWritesOnABlockIsGatheredBackIntoTheBuffer) {
  const ir::Graph g = batch_norm_graph();
  const plan::Sharding s = batch_norm_channels_split("R", "split d0");
  const RankGraph r = rank_graph(g, s, 1);
  const ir::Graph& l = r.graph;
  std::vector<const ir::Node*> writes;
  for (const ir::Node& node : l.nodes())
    if (node.op == "shardwise::write_state") writes.push_back(&node);
  ASSERT_EQ(writes.size(), 2u) << ir::print_graph(l);
  const ir::Node& mean = *writes[0];
  EXPECT_EQ(l.value(mean.inputs[0]).name, "bn.running_mean");
  // What it writes back: the block the call read, all-gathered to the buffer's whole [4].
  const StepRegion back = region_ending_at(l, mean.inputs[1]);
  EXPECT_EQ(l.value(back.source).name, "bn.running_mean.r1");
  ASSERT_EQ(back.forward.size(), 1u);
  EXPECT_TRUE(back.backward.empty());
  EXPECT_EQ(step_action(l.node(back.forward[0])).str(), "all_gather(axis 0, dim 0)") << ir::print_graph(l);
  EXPECT_TRUE(is_write_back_step(l.node(back.forward[0])));
  EXPECT_EQ(l.value(mean.inputs[1]).type.shape, (Shape{4}));
  // Its own region: the read's (the slice) is not continued into it, and both are listed.
  const StepRegion read = region_ending_at(l, back.source);
  EXPECT_EQ(l.value(read.source).name, "bn.running_mean");
  EXPECT_EQ(read.forward.size(), 1u);
  EXPECT_FALSE(is_write_back_step(l.node(read.forward[0])));
  int write_back_regions = 0, read_regions = 0;
  for (const StepRegion& region : step_regions(l))
    (is_write_back_step(l.node(region.forward.at(0))) ? write_back_regions : read_regions) += 1;
  EXPECT_EQ(write_back_regions, 2);
  EXPECT_EQ(read_regions, 4);  // x, the two statistics, the loss
  EXPECT_NO_THROW(verify_rank_graph(l, g, s, 1));
  EXPECT_EQ(ir::parse_graph(ir::print_graph(l)), l);
}

TEST(RankGraph, AStateTheCallReadsWholeIsWrittenInPlace) {
  // Batch norm replicated: it reads the buffers themselves, and writes them there.
  const ir::Graph g = batch_norm_graph();
  plan::Sharding s = batch_norm_channels_split("R", "replicate");
  s.placements["bn.weight"] = s.placements["bn.bias"] = s.placements["y"] = {"R"};
  s.placements["loss"] = {"R"};
  s.strategies = {{"y", {"replicate"}}, {"loss", {"replicate"}}};
  const RankGraph r = rank_graph(g, s, 0);
  int writes = 0;
  for (const ir::Node& node : r.graph.nodes()) {
    if (node.op != "shardwise::write_state") continue;
    ++writes;
    EXPECT_EQ(node.inputs[0], node.inputs[1]) << ir::print_graph(r.graph);
  }
  EXPECT_EQ(writes, 2);
}

TEST(RankGraph, AWritesMarkThatNamesNoOperandsIsRefused) {
  // The rank graph cannot place a write it cannot read: refused, never dropped.
  std::string text = kBatchNorm;
  const std::string mark = "shardwise.writes=[3,4]";
  for (const std::string& bad : {std::string("shardwise.writes=\"running\""), std::string("shardwise.writes=[7]")}) {
    std::string changed = text;
    changed.replace(changed.find(mark), mark.size(), bad);
    EXPECT_THROW((void)rank_graph(ir::parse_graph(changed), batch_norm_channels_split("R", "split d0"), 1),
                 support::ValidationError)
        << bad;
  }
}

TEST(RankGraph, AStateWrittenAsAPartialSumIsRefused) {
  // An addmm split over its contracted index reads its additive operand as a partial sum
  // (strategy.h: Reduced): were that operand a buffer the call writes, no rank's copy would
  // be the state.
  const ir::Graph g = ir::parse_graph(R"(graph(%a: f32[b8,6]) {
  %w: f32[6,4] parameter
  %acc: f32[4] buffer
  %y: f32[b8,4] = aten::addmm(%acc, %a, %w) {alpha=1, beta=1, shardwise.writes=[0]} @fc
  %loss: f32[] = aten::sum(%y) {dtype=none}
  return (%loss)
})");
  plan::Sharding s;
  s.mesh = {2};
  s.axis_names = {"tensor"};
  s.placements = {{"a", {"S(1)"}}, {"w", {"S(0)"}}, {"acc", {"R"}}, {"y", {"P(sum)"}}, {"loss", {"P(sum)"}}};
  s.strategies = {{"y", {"split k"}}, {"loss", {"replicate"}}};
  try {
    const RankGraph r = rank_graph(g, s, 0);
    FAIL() << "a write of a Partial buffer was emitted:\n" << ir::print_graph(r.graph);
  } catch (const support::ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find("writes 'acc' in place as a partial sum"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardwise::transform
