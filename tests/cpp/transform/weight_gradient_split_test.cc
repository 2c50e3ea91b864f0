#include "transform/weight_gradient_split.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ir/parser.h"
#include "ir/printer.h"
#include "transform/rank_passes.h"
#include "transform/stage_split.h"

namespace shardwise::transform {
using analysis::weight_gradient_split;
using analysis::WeightGradientSplit;
namespace {

// A linear layer as torch.export decomposes it (t + addmm), a weight-only positional
// embedding of constant positions added to a token embedding, and a frozen buffer.
constexpr const char* kEmbedThenLinear = R"(graph(%ids: i64[b2,4]) {
  %wte: f32[16,8] parameter
  %wpe: f32[4,8] parameter
  %w: f32[8,8] parameter
  %b: f32[8] parameter
  %scale: f32[8] buffer
  %pos: i64[4] = aten::arange() {end=4} @pos
  %tok: f32[b2,4,8] = aten::embedding(%wte, %ids) @wte
  %pe: f32[4,8] = aten::embedding(%wpe, %pos) @wpe
  %h: f32[b2,4,8] = aten::add.Tensor(%tok, %pe) {alpha=1} @emb
  %wt: f32[8,8] = aten::t(%w) @fc
  %y: f32[b2,4,8] = aten::matmul(%h, %wt) @fc
  %z: f32[b2,4,8] = aten::add.Tensor(%y, %b) {alpha=1} @fc
  %s: f32[b2,4,8] = aten::mul.Tensor(%z, %scale) @out
  return (%s)
})";

TEST(WeightGradientSplit, BoundariesAreTheWeightReadsOfActivationNodes) {
  const ir::Graph g = ir::parse_graph(kEmbedThenLinear);
  const WeightGradientSplit split = weight_gradient_split(g);
  ASSERT_EQ(split.boundaries.size(), 4u);
  EXPECT_EQ(split.boundaries[0].node, "tok");  // embedding(wte, ids): the table is read at 0
  EXPECT_EQ(split.boundaries[0].inputs, (std::vector<int>{0}));
  EXPECT_EQ(split.boundaries[1].node, "h");  // the weight-only positional embedding, added
  EXPECT_EQ(split.boundaries[1].inputs, (std::vector<int>{1}));
  EXPECT_EQ(split.boundaries[2].node, "y");  // the transposed weight, not t() itself
  EXPECT_EQ(split.boundaries[2].inputs, (std::vector<int>{1}));
  EXPECT_EQ(split.boundaries[3].node, "z");
  EXPECT_EQ(split.boundaries[3].inputs, (std::vector<int>{1}));
  EXPECT_TRUE(split.weight_outputs.empty());  // a buffer is no weight: mul(%z, %scale) has none
}

// Cut after relu, stage 0 sends the transposed weight to stage 1 (a tied head reading it there).
constexpr const char* kSentTransposedWeight = R"(graph(%x: f32[b2,8]) {
  %w: f32[8,8] parameter
  %wt: f32[8,8] = aten::t(%w) @fc
  %a: f32[b2,8] = aten::relu(%x) @act
  %y: f32[b2,8] = aten::mm(%a, %wt) @head
  return (%y)
})";

TEST(WeightGradientSplit, AReceivedValueIsAnActivationAndASentWeightValueAWeightOutput) {
  const ir::Graph g = ir::parse_graph(kSentTransposedWeight);
  const std::vector<ir::Graph> stages = split_stages(g, {0, 0, 1}, 2);
  const WeightGradientSplit first = weight_gradient_split(stages[0]);
  EXPECT_TRUE(first.boundaries.empty());
  EXPECT_EQ(first.weight_outputs, (std::vector<std::string>{"wt"}));
  const WeightGradientSplit second = weight_gradient_split(stages[1]);
  // Both operands are received: activations on this stage, their gradients B's to send back.
  EXPECT_TRUE(second.boundaries.empty());
  EXPECT_TRUE(second.weight_outputs.empty());
}

// The pass marks what the analysis finds, on the node by the boundary's inputs; a second run
// changes nothing; and it runs as a stage pass only where the schedule splits backward.
TEST(WeightCutPass, MarksEachBoundaryNodeWithItsWeightOperands) {
  ir::Graph g = ir::parse_graph(kEmbedThenLinear);
  const WeightGradientSplit split = weight_gradient_split(g);
  mark_weight_cuts(g);
  std::size_t marked = 0;
  for (const ir::Node& node : g.nodes()) {
    const std::vector<std::int64_t> cut = weight_cut_operands(node);
    if (cut.empty()) continue;
    const std::string& name = g.value(node.outputs[0]).name;
    ASSERT_LT(marked, split.boundaries.size());
    EXPECT_EQ(name, split.boundaries[marked].node);
    EXPECT_EQ(cut, std::vector<std::int64_t>(split.boundaries[marked].inputs.begin(),
                                             split.boundaries[marked].inputs.end()));
    ++marked;
  }
  EXPECT_EQ(marked, split.boundaries.size());
  const std::string once = ir::print_graph(g);
  mark_weight_cuts(g);
  EXPECT_EQ(ir::print_graph(g), once);
}

// What a split backward holds from B to W (analysis::weight_gradient_held_bytes): the gradients
// at the boundaries' outputs, one tensor where an add passes its gradient on unchanged.
TEST(WeightGradientSplit, HeldBytesCountAGradientTheAddPassesOnOnce) {
  const ir::Graph g = ir::parse_graph(kEmbedThenLinear);
  const std::vector<std::int64_t> held = analysis::weight_gradient_held_bytes(g);
  auto of = [&](const char* name) { return held[static_cast<std::size_t>(*g.value(*g.find_value(name)).producer)]; };
  EXPECT_EQ(of("tok"), 256);  // f32[2,4,8]
  EXPECT_EQ(of("h"), 0);      // tok + pe: tok's gradient, passed on
  EXPECT_EQ(of("y"), 256);
  EXPECT_EQ(of("z"), 0);      // y + b: y's
  EXPECT_EQ(of("wt"), 0);     // a weight value: W's, not held
  EXPECT_EQ(of("s"), 0);      // reads a buffer: no boundary
  std::int64_t total = 0;
  for (std::int64_t b : held) total += b;
  EXPECT_EQ(total, 512);
}

TEST(WeightGradientSplit, AnAddWhoseOperandHasASecondReaderHoldsItsOwnGradient) {
  // y is read by the add and by the tanh: y's gradient is the sum of both, a new tensor.
  const ir::Graph g = ir::parse_graph(R"(graph(%x: f32[b2,8]) {
  %w: f32[8,8] parameter
  %b: f32[8] parameter
  %y: f32[b2,8] = aten::mm(%x, %w) @fc
  %z: f32[b2,8] = aten::add.Tensor(%y, %b) {alpha=1} @fc
  %u: f32[b2,8] = aten::tanh(%y) @act
  %s: f32[b2,8] = aten::mul.Tensor(%z, %u) @out
  return (%s)
})");
  const std::vector<std::int64_t> held = analysis::weight_gradient_held_bytes(g);
  auto of = [&](const char* name) { return held[static_cast<std::size_t>(*g.value(*g.find_value(name)).producer)]; };
  EXPECT_EQ(of("y"), 64);
  EXPECT_EQ(of("z"), 64);
  EXPECT_EQ(of("u"), 0);
}

TEST(WeightCutPass, MarksTheSendOfAWeightOutput) {
  // Stage 0 of kSentTransposedWeight: the send of wt is marked, the activation's is not
  // (stage 1 receives both; its gradient of wt goes to the weight in W).
  const ir::Graph g = ir::parse_graph(kSentTransposedWeight);
  ir::Graph first = split_stages(g, {0, 0, 1}, 2)[0];
  mark_weight_cuts(first);
  std::vector<std::string> marked, unmarked;
  for (const ir::Node& node : first.nodes())
    if (node.op == "shardwise::send")
      (sends_weight_output(node) ? marked : unmarked).push_back(first.value(node.inputs[0]).name);
  EXPECT_EQ(marked, (std::vector<std::string>{"wt"}));
  EXPECT_EQ(unmarked, (std::vector<std::string>{"a"}));
  const std::string once = ir::print_graph(first);
  mark_weight_cuts(first);
  EXPECT_EQ(ir::print_graph(first), once);
}

TEST(WeightCutPass, RunsAsAStagePassOnlyUnderASplitBackward) {
  ASSERT_EQ(stage_passes().size(), 2u);
  EXPECT_EQ(stage_passes()[0].name, "weight-gradient-split");
  ir::Graph plain = ir::parse_graph(kEmbedThenLinear);
  run_stage_passes(plain, {.split_backward = false, .fused_accumulation = false});
  EXPECT_EQ(ir::print_graph(plain), ir::print_graph(ir::parse_graph(kEmbedThenLinear)));
  ir::Graph split = ir::parse_graph(kEmbedThenLinear);
  run_stage_passes(split, {.split_backward = true, .fused_accumulation = false});
  EXPECT_EQ(weight_cut_operands(split.node(*split.value(*split.find_value("tok")).producer)),
            (std::vector<std::int64_t>{0}));
}

}  // namespace
}  // namespace shardwise::transform
