// Which strategies a node and which choices a leaf may take on one mesh axis
// (search/sharding_strategies.h), on x [b8, 32] -> linear by fc.weight [64, 32] -> tanh -> add
// a buffer, captured at 8 rows and searched at 16.
#include "search/sharding_strategies.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "sharding_parts.h"

namespace shardwise::search {
namespace {

using namespace testing;  // NOLINT: the parts' graphs, clusters and placements

class ShardingStrategiesTest : public ShardingParts {};

// The size of the rule index that dim `dim` of input `operand` carries (its major factor).
std::int64_t index_size(const ops::DimRule& rule, std::size_t operand, std::size_t dim) {
  return rule.indices[static_cast<std::size_t>(rule.inputs[operand][dim].front())].size;
}

bool offers(const std::vector<Strategy>& strategies, const std::vector<Placement>& inputs,
            const std::vector<Placement>& input_grads, const std::vector<Placement>& outputs) {
  for (const Strategy& s : strategies)
    if (s.inputs == inputs && s.input_grads == input_grads && s.outputs == outputs) return true;
  return false;
}

TEST_F(ShardingStrategiesTest, RulesAtTheGlobalBatchScaleTheBatchIndex) {
  const Candidate& c = candidate(f32_options({4}, 16));
  const ops::DimRule& linear = *c.facts.rules[static_cast<std::size_t>(c.producer("y"))];
  // Captured at 8 rows, searched at 16: the rows index is 8 x 16 / 8 = 16; fc.weight's out
  // features (64) and in features (32) stay.
  EXPECT_EQ(index_size(linear, 0, 0), 16);
  EXPECT_EQ(index_size(linear, 1, 0), 64);
  EXPECT_EQ(index_size(linear, 1, 1), 32);
  EXPECT_DOUBLE_EQ(c.facts.batch_scale, 2.0);
}

TEST_F(ShardingStrategiesTest, ALinearOnFourRanksSplitsItsRowsItsOutFeaturesOrItsContraction) {
  const Candidate& c = candidate(f32_options({4}, 16));
  const std::vector<Strategy> strategies = c.strategies().node_strategies(c.producer("y"), 0);
  // linear(x [16, 32], W [64, 32]) -> y [16, 64]: whole; rows split (W's gradient a partial
  // sum); out features split (x's gradient a partial sum); in features split (y a partial sum).
  // 4 divides 16, 64 and 32: no uneven split; no strided sizes in this graph.
  ASSERT_EQ(strategies.size(), 4u);
  EXPECT_TRUE(offers(strategies, {R(), R()}, {R(), R()}, {R()}));
  EXPECT_TRUE(offers(strategies, {S(0), R()}, {S(0), P()}, {S(0)}));
  EXPECT_TRUE(offers(strategies, {R(), S(0)}, {P(), S(0)}, {S(1)}));
  EXPECT_TRUE(offers(strategies, {S(1), S(1)}, {S(1), S(1)}, {P()}));
  // tanh is not linear: no partial passthrough; whole, rows or features.
  EXPECT_EQ(c.strategies().node_strategies(c.producer("t"), 0).size(), 3u);
}

TEST_F(ShardingStrategiesTest, AnAxisThatMayNotCarryTheBatchOffersNoRowSplit) {
  ShardingModelOptions o = f32_options({4}, 16);
  o.batch_axes = {false};
  const Candidate& c = candidate(o);
  const std::vector<Strategy> strategies = c.strategies().node_strategies(c.producer("y"), 0);
  ASSERT_EQ(strategies.size(), 3u);
  EXPECT_FALSE(offers(strategies, {S(0), R()}, {S(0), P()}, {S(0)}));
  EXPECT_TRUE(offers(strategies, {R(), S(0)}, {P(), S(0)}, {S(1)}));
}

TEST_F(ShardingStrategiesTest, AnotherAxisSplitLeavesTheRuleItsShare) {
  Candidate& c = candidate(f32_options({2, 2}, 16));
  const ir::NodeId linear = c.producer("y");
  // Both axes split the 64 out features.
  c.decisions.nodes[0][static_cast<std::size_t>(linear)] = c.producing("y", 0, S(1));
  c.decisions.nodes[1][static_cast<std::size_t>(linear)] = c.producing("y", 1, S(1));
  // Axis 1 sees axis 0's half, 32, whether it asks for every other axis or the outer ones.
  EXPECT_EQ(index_size(c.strategies().rule_except(linear, 1), 1, 0), 32);
  EXPECT_EQ(index_size(c.strategies().rule_except(linear, 1, /*outer_only=*/true), 1, 0), 32);
  // Axis 0 sees axis 1's half among the other axes (32), and nothing outer to it (64).
  EXPECT_EQ(index_size(c.strategies().rule_except(linear, 0), 1, 0), 32);
  EXPECT_EQ(index_size(c.strategies().rule_except(linear, 0, /*outer_only=*/true), 1, 0), 64);
}

TEST_F(ShardingStrategiesTest, ALeafTakesTheSplitsItsReadersWant) {
  const Candidate& c = candidate(f32_options({4}, 16));
  const AxisChoices choices = c.strategies().axis_choices(0);
  auto leaf = [&](const char* name) { return choices.leaf_choices[static_cast<std::size_t>(c.value(name))]; };
  // fc.weight: whole; then as its readers' strategies read it, in their order (by rule index:
  // rows, in features, out features): S(1) for the contraction split, S(0) for the
  // out-features split; last, whole with its optimizer state sharded (ZeRO).
  EXPECT_EQ(leaf("fc.weight"), (std::vector<LeafChoice>{{R(), false}, {S(1), false}, {S(0), false}, {R(), true}}));
  // x: whole, rows (the row split), in features (the contraction split); an input has no
  // optimizer state.
  EXPECT_EQ(leaf("x"), (std::vector<LeafChoice>{{R(), false}, {S(0), false}, {S(1), false}}));
  // shift, added along the 64 features: whole or split with them; a buffer has no gradient.
  EXPECT_EQ(leaf("shift"), (std::vector<LeafChoice>{{R(), false}, {S(0), false}}));
  EXPECT_TRUE(leaf("y").empty());
  EXPECT_DOUBLE_EQ(choices.leaf_instances[static_cast<std::size_t>(c.value("fc.weight"))], 1.0);
  EXPECT_EQ(choices.strategies[static_cast<std::size_t>(c.producer("y"))].size(), 4u);

  ShardingModelOptions no_zero = f32_options({4}, 16);
  no_zero.allow_zero = false;
  const AxisChoices without = candidate(no_zero).strategies().axis_choices(0);
  EXPECT_EQ(without.leaf_choices[static_cast<std::size_t>(c.value("fc.weight"))].size(), 3u);
}

TEST_F(ShardingStrategiesTest, ALeafDimAnotherAxisCutsMustDivideAgain) {
  // Searched at 2 rows: axis 0 cuts x's 2 rows into 1 each, which axis 1 cannot cut in 2.
  Candidate& c = candidate(f32_options({2, 2}, 2));
  const ir::ValueId x = c.value("x");
  c.decisions.leaves[0][static_cast<std::size_t>(x)].placement = S(0);
  EXPECT_FALSE(c.strategies().leaf_placement_fits(x, 1, S(0)));
  EXPECT_TRUE(c.strategies().leaf_placement_fits(x, 1, S(1)));  // 32 features / 2
  EXPECT_TRUE(c.strategies().leaf_placement_fits(x, 0, S(0)));  // axis 0 itself: 2 rows / 2
  // fc.weight's 64 rows: 2 groups x 2 ranks divide them; 3 groups do not.
  EXPECT_TRUE(c.strategies().leaf_placement_fits(c.value("fc.weight"), 0, S(0, 2)));
  EXPECT_FALSE(c.strategies().leaf_placement_fits(c.value("fc.weight"), 0, S(0, 3)));
}

// One sequence of 64 tokens, 4 heads of 16, its attention causal (or with a dropout).
ir::Graph causal_attention(const std::string& dropout) {
  return ir::parse_graph(R"(graph(%q: f32[b1,4,64,16], %k: f32[b1,4,64,16], %v: f32[b1,4,64,16]) {
  %a: f32[b1,4,64,16] = aten::scaled_dot_product_attention(%q, %k, %v) {attn_mask=none, dropout_p=)" +
                         dropout + R"(, is_causal=true, scale=none} @attn
  return (%a)
})");
}

TEST_F(ShardingStrategiesTest, CausalAttentionSplitsItsSequenceOnlyAsARingOnAnAxisThatMayCarryTheBatch) {
  const ir::Graph g = causal_attention("0.0");
  const cost::Cluster two = one_link(2);
  const Candidate& c = candidate(g, two, f32_options({2}, 1));
  const std::vector<Strategy> strategies = c.strategies().node_strategies(c.producer("a"), 0);
  // The query, key and value rows split together (ring attention), the output's rows with them;
  // the heads as before. No local split of the query rows alone (causal).
  EXPECT_TRUE(offers(strategies, {S(2), S(2), S(2)}, {S(2), S(2), S(2)}, {S(2)}));
  EXPECT_TRUE(offers(strategies, {S(1), S(1), S(1)}, {S(1), S(1), S(1)}, {S(1)}));
  EXPECT_FALSE(offers(strategies, {S(2), R(), R()}, {S(2), P(), P()}, {S(2)}));
  // Kept off an axis the user gave the model (the ring replicates the weights over it), and
  // off an attention that draws a dropout (the kernel would not draw one device's).
  ShardingModelOptions model_axis = f32_options({2}, 1);
  model_axis.batch_axes = {false};
  const Candidate& m = candidate(g, two, model_axis);
  EXPECT_FALSE(offers(m.strategies().node_strategies(m.producer("a"), 0), {S(2), S(2), S(2)}, {S(2), S(2), S(2)},
                      {S(2)}));
  const ir::Graph dropped = causal_attention("0.1");
  const Candidate& d = candidate(dropped, two, f32_options({2}, 1));
  EXPECT_FALSE(offers(d.strategies().node_strategies(d.producer("a"), 0), {S(2), S(2), S(2)}, {S(2), S(2), S(2)},
                      {S(2)}));
  // 64 tokens do not split unevenly as a ring: not over 3 ranks (the heads, 4, do not either).
  const cost::Cluster three = one_link(3);
  const Candidate& t = candidate(g, three, f32_options({3}, 1));
  for (const Strategy& s : t.strategies().node_strategies(t.producer("a"), 0)) EXPECT_FALSE(s.inputs[1].is_shard());
}

// A language model's loss over 1,000 classes on a 2 x 2 mesh. The rewrite runs a node on one
// combining kernel over one axis (transform/spmd_rewrite.cc, decide_kernels): with the classes
// split on axis 0 (the vocabulary-parallel loss), axis 1 is not offered that split again,
// which would run the loss whole on gathered logits where it was priced split four ways; the
// loss' rows still split on axis 1. With axis 0 replicated, axis 1 offers the class split.
TEST_F(ShardingStrategiesTest, AVocabularyParallelLossSplitsItsClassesOnOneAxisOnly) {
  const ir::Graph head = ir::parse_graph(R"(graph(%logits: f32[b8,1000], %labels: i64[b8]) {
  %loss: f32[] = aten::cross_entropy_loss(%logits, %labels) @loss
  return (%loss)
})");
  Candidate& c = candidate(head, four, f32_options({2, 2}, 16));
  const ir::NodeId loss = c.producer("loss");
  // Whether `axis` offers a strategy reading the logits as `logits`.
  auto reads = [&](int axis, const Placement& logits) {
    return std::ranges::any_of(c.strategies().node_strategies(loss, axis),
                               [&](const Strategy& s) { return s.inputs[0] == logits; });
  };
  ASSERT_TRUE(reads(0, S(1)));
  ASSERT_TRUE(reads(1, S(1)));
  for (const Strategy& s : c.strategies().node_strategies(loss, 0))
    if (s.inputs[0] == S(1)) c.decisions.nodes[0][static_cast<std::size_t>(loss)] = s;
  EXPECT_FALSE(reads(1, S(1)));
  EXPECT_TRUE(reads(1, S(0)));
  EXPECT_TRUE(reads(0, S(1)));  // axis 0's own choices are its own
}

}  // namespace
}  // namespace shardwise::search
