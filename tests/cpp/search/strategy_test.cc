#include "search/strategy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "../ops/one_node_graph.h"
#include "ops/node_rule.h"
#include "ops/op_table.h"
#include "support/error.h"

namespace shardwise::search {
namespace {

using ops::testing::f32;
using ops::testing::i64;
using ops::testing::one_node;
using Ints = std::vector<std::int64_t>;

ops::DimRule rule_of(std::string op, std::vector<ir::TensorType> inputs, std::vector<ir::TensorType> outputs,
                     ir::Attributes attrs = {}) {
  const auto g = one_node(std::move(op), std::move(inputs), std::move(outputs), std::move(attrs));
  auto rule = ops::dim_rule_for(ops::OpTable::builtin(), g.graph, g.node());
  if (!rule) throw std::runtime_error("no rule for " + g.node().op);
  return *rule;
}

std::string join(const std::vector<Placement>& ps) {
  std::string out;
  for (const auto& p : ps) out += (out.empty() ? "" : " ") + p.str();
  return out;
}

// One line per strategy: "split k | in S(1) S(0) | grad S(1) S(0) | out P(sum)" (and
// " | stats N" when it all-reduces statistics).
std::vector<std::string> describe(const ops::DimRule& rule, const std::vector<Strategy>& strategies) {
  std::vector<std::string> out;
  for (const auto& s : strategies) {
    std::string line =
        s.str(rule) + " | in " + join(s.inputs) + " | grad " + join(s.input_grads) + " | out " + join(s.outputs);
    if (s.statistics_elements != 0) line += " | stats " + std::to_string(s.statistics_elements);
    out.push_back(line);
  }
  return out;
}

std::vector<std::string> labels(const ops::DimRule& rule, const std::vector<Strategy>& strategies) {
  std::vector<std::string> out;
  for (const auto& s : strategies) out.push_back(s.str(rule));
  return out;
}

using Lines = std::vector<std::string>;

ops::DimRule mm_rule() { return rule_of("aten::mm", {f32({32, 768}), f32({768, 2304})}, {f32({32, 2304})}); }

TEST(StrategyTest, MmWorkedExample) {
  const auto rule = mm_rule();
  ASSERT_EQ(rule.str(), "m k, k n -> m n  [m=32, k=768 reduced, n=2304]");
  const auto strategies = enumerate_strategies(rule, 8);
  EXPECT_EQ(describe(rule, strategies), (Lines{
                                            "replicate | in R R | grad R R | out R",
                                            "split m | in S(0) R | grad S(0) P(sum) | out S(0)",
                                            "split k | in S(1) S(0) | grad S(1) S(0) | out P(sum)",
                                            "split n | in R S(1) | grad P(sum) S(1) | out S(1)",
                                        }));
  EXPECT_EQ(strategies[0].index, -1);
  EXPECT_EQ(strategies[1].index, 0);
  EXPECT_EQ(strategies[2].index, 1);
  EXPECT_EQ(strategies[3].index, 2);
  for (const auto& s : strategies) {
    EXPECT_EQ(s.groups, 1);
    EXPECT_EQ(s.statistics_elements, 0);
  }
}

TEST(StrategyTest, AddmmSplitsKWithThePartialBiasAddedOnce) {
  const auto rule = rule_of("aten::addmm", {f32({2304}), f32({32, 768}), f32({768, 2304})}, {f32({32, 2304})});
  ASSERT_EQ(rule.str(), "n, m k, k n -> m n  [n=2304, m=32, k=768 reduced]");
  EXPECT_EQ(describe(rule, enumerate_strategies(rule, 8)),
            (Lines{
                "replicate | in R R R | grad R R R | out R",
                "split n | in S(0) R S(1) | grad S(0) P(sum) S(1) | out S(1)",
                "split m | in R S(0) R | grad P(sum) S(0) P(sum) | out S(0)",
                "split k | in P(sum) S(1) S(0) | grad R S(1) S(0) | out P(sum)",
            }));
}

TEST(StrategyTest, AFactorWithoutTheSummedIndexMultipliesEachPartialSumWhole) {
  // out[i] = sum_j x[i, j] y[j] z[i]: z is a factor of every term, not a term added to the
  // sum, so a split of j leaves it whole on each rank (zeroing it on all ranks but one would
  // zero their partial sums), and each rank's gradient of it is a share of the sum.
  const auto rule = rule_of("aten::einsum", {f32({8, 16}), f32({16}), f32({8})}, {f32({8})},
                            {{"equation", std::string("ij,j,i->i")}});
  ASSERT_TRUE(rule.added.empty());
  const auto lines = describe(rule, enumerate_strategies(rule, 2));
  EXPECT_NE(std::find(lines.begin(), lines.end(), "split j | in S(1) S(0) R | grad S(1) S(0) P(sum) | out P(sum)"),
            lines.end())
      << ::testing::PrintToString(lines);
}

// shardwise_moe::experts: hidden [t=64, H=32], top-k index and weights [t, K=2], gate_up
// [E, 2I=128, H], down [E, H, I=64], expert ids [E].
ops::DimRule experts_rule(std::int64_t experts) {
  return rule_of("shardwise_moe::experts",
                 {f32({64, 32}), i64({64, 2}), f32({64, 2}), f32({experts, 128, 32}), f32({experts, 32, 64}),
                  i64({experts})},
                 {f32({64, 32})}, {{"act", std::string("silu")}});
}

// `line` (describe's form) is one of the strategies `rule` offers on an axis of n ranks.
void expect_offered(const ops::DimRule& rule, int n, const std::string& line) {
  const auto lines = describe(rule, enumerate_strategies(rule, n));
  EXPECT_NE(std::find(lines.begin(), lines.end(), line), lines.end()) << ::testing::PrintToString(lines);
}

TEST(StrategyTest, TheExpertsSplitLeavesTheTokensWholeOnEachRank) {
  // shardwise_moe::experts: hidden [t, H], top-k index and weights [t, K], gate_up [E, 2I, H],
  // down [E, H, I], expert ids [E]. Each rank sums its own experts over every token.
  expect_offered(experts_rule(4), 2,
                 "split e | in R R R S(0) S(0) S(0) | grad P(sum) P(sum) P(sum) S(0) S(0) S(0) | out P(sum)");
}

TEST(StrategyTest, TheExpertsDispatchSplitsTheTokensAndTheExpertsTogether) {
  // dispatch t: each rank its block of the tokens and its block of the experts (the tokens
  // travel to their experts by all-to-all): no Partial anywhere, the weights' gradients
  // complete on their rank. Offered only where the axis divides both.
  const auto rule = experts_rule(4);
  expect_offered(rule, 2, "dispatch t | in S(0) S(0) S(0) S(0) S(0) S(0) | grad S(0) S(0) S(0) S(0) S(0) S(0) | out S(0)");
  // After it, one rank's rule: both indices cut, and no second dispatch.
  const auto strategies = enumerate_strategies(rule, 2);
  const auto it = std::find_if(strategies.begin(), strategies.end(), [](const Strategy& s) { return s.dispatch; });
  ASSERT_NE(it, strategies.end());
  const ops::DimRule local = local_rule(rule, *it, 2);
  EXPECT_EQ(local.indices[static_cast<std::size_t>(local.find("t"))].size, 32);
  EXPECT_EQ(local.indices[static_cast<std::size_t>(local.find("e"))].size, 2);
  EXPECT_EQ(local.indices[static_cast<std::size_t>(local.find("t"))].dispatch, -1);
  // 3 experts on 2 ranks: no equal blocks, no dispatch (the experts' own split remains).
  const auto odd = experts_rule(3);
  for (const auto& label : labels(odd, enumerate_strategies(odd, 2))) EXPECT_NE(label, "dispatch t");
}

TEST(StrategyTest, MeanReductionLeavesPartialMean) {
  const auto rule = rule_of("aten::mean.dim", {f32({4, 16})}, {f32({4})}, {{"dim", Ints{1}}});
  ASSERT_EQ(rule.str(), "d0 r0 -> d0  [d0=4, r0=16 reduced(mean)]");
  EXPECT_EQ(describe(rule, enumerate_strategies(rule, 4)), (Lines{
                                                               "replicate | in R | grad R | out R",
                                                               "split d0 | in S(0) | grad S(0) | out S(0)",
                                                               "split r0 | in S(1) | grad S(1) | out P(mean)",
                                                           }));
}

TEST(StrategyTest, MaxAndMinReductionsNeverSplit) {
  const auto rule = rule_of("aten::amax", {f32({8, 16})}, {f32({})});
  ASSERT_EQ(rule.str(), "r0 r1 -> ()  [r0=8 reduced(max), r1=16 reduced(max)]");
  EXPECT_EQ(labels(rule, enumerate_strategies(rule, 4)), (Lines{"replicate"}));
}

TEST(StrategyTest, ViewSplitsHeadsAndHeadDim) {
  const auto rule = rule_of("aten::view", {f32({2, 8, 768})}, {f32({2, 8, 12, 64})}, {{"size", Ints{2, 8, 12, 64}}});
  ASSERT_EQ(rule.inputs[0][2], (ops::DimIndices{2, 3}));
  EXPECT_EQ(describe(rule, enumerate_strategies(rule, 4)), (Lines{
                                                               // i0 (2) is too small for 4 ranks.
                                                               "replicate | in R | grad R | out R",
                                                               "split i1 | in S(1) | grad S(1) | out S(1)",
                                                               "split i2 | in S(2) | grad S(2) | out S(2)",
                                                               "split i3 | in S(2,g12) | grad S(2,g12) | out S(3)",
                                                           }));
}

TEST(StrategyTest, EqualSplitGivesTheStridedQkvShard) {
  const auto rule =
      rule_of("aten::split.Tensor", {f32({2, 8, 2304})}, {f32({2, 8, 768}), f32({2, 8, 768}), f32({2, 8, 768})},
              {{"split_size", std::int64_t{768}}, {"dim", std::int64_t{2}}});
  ASSERT_EQ(rule.str(), "d0 d1 (P c) -> d0 d1 c, d0 d1 c, d0 d1 c  [d0=2, d1=8, P=3 whole, c=768]");
  EXPECT_EQ(describe(rule, enumerate_strategies(rule, 2)),
            (Lines{
                // P is Whole without statistics: never split.
                "replicate | in R | grad R | out R R R",
                "split d0 | in S(0) | grad S(0) | out S(0) S(0) S(0)",
                "split d1 | in S(1) | grad S(1) | out S(1) S(1) S(1)",
                "split c | in S(2,g3) | grad S(2,g3) | out S(2) S(2) S(2)",
            }));
}

TEST(StrategyTest, StridedVariantsOnlyForListedPairs) {
  const auto rule = mm_rule();
  StrategyOptions options;
  // (2304, 6) is listed before (2304, 3) but groups come out ascending; (768, 5) does not
  // divide (768 % 40 != 0); (32, 3) has no index of size 32 divisible by 24; (1000, 2) matches
  // no index.
  options.strided = {{2304, 6}, {768, 5}, {2304, 3}, {32, 3}, {1000, 2}};
  const auto strategies = enumerate_strategies(rule, 8, options);
  EXPECT_EQ(describe(rule, strategies), (Lines{
                                            "replicate | in R R | grad R R | out R",
                                            "split m | in S(0) R | grad S(0) P(sum) | out S(0)",
                                            "split k | in S(1) S(0) | grad S(1) S(0) | out P(sum)",
                                            "split n | in R S(1) | grad P(sum) S(1) | out S(1)",
                                            "split n g3 | in R S(1,g3) | grad P(sum) S(1,g3) | out S(1,g3)",
                                            "split n g6 | in R S(1,g6) | grad P(sum) S(1,g6) | out S(1,g6)",
                                        }));
  EXPECT_EQ(strategies[4].index, 2);
  EXPECT_EQ(strategies[4].groups, 3);

  // Without the pair for 2304, n gets no strided variant, even where the groups would divide.
  options.strided = {{768, 3}};
  EXPECT_EQ(labels(rule, enumerate_strategies(rule, 8, options)),
            (Lines{"replicate", "split m", "split k", "split k g3", "split n"}));
}

TEST(StrategyTest, StridedGroupsMultiplyTheMajorFactors) {
  // The split's part index c (768) strided by 2 inside (P c): groups 3 x 2.
  const auto rule =
      rule_of("aten::split.Tensor", {f32({2, 8, 2304})}, {f32({2, 8, 768}), f32({2, 8, 768}), f32({2, 8, 768})},
              {{"split_size", std::int64_t{768}}, {"dim", std::int64_t{2}}});
  StrategyOptions options;
  options.strided = {{768, 2}};
  const auto strategies = enumerate_strategies(rule, 2, options);
  EXPECT_EQ(describe(rule, strategies).back(), "split c g2 | in S(2,g6) | grad S(2,g6) | out S(2,g2) S(2,g2) S(2,g2)");
}

TEST(StrategyTest, SoftmaxDimSplitsWithStatistics) {
  const auto rule =
      rule_of("aten::softmax.int", {f32({2, 12, 16, 16})}, {f32({2, 12, 16, 16})}, {{"dim", std::int64_t{-1}}});
  ASSERT_EQ(rule.str(), "d0 d1 d2 W0 -> d0 d1 d2 W0  [d0=2, d1=12, d2=16, W0=16 whole]");
  EXPECT_EQ(describe(rule, enumerate_strategies(rule, 4)), (Lines{
                                                               "replicate | in R | grad R | out R",
                                                               "split d1 | in S(1) | grad S(1) | out S(1)",
                                                               "split d2 | in S(2) | grad S(2) | out S(2)",
                                                               // max and sum for each of the 2 x 12 x 16 rows.
                                                               "split W0 | in S(3) | grad S(3) | out S(3) | stats 768",
                                                           }));
}

TEST(StrategyTest, CumsumDimNeverSplits) {
  const auto rule = rule_of("aten::cumsum", {f32({4, 16})}, {f32({4, 16})}, {{"dim", std::int64_t{-1}}});
  EXPECT_EQ(labels(rule, enumerate_strategies(rule, 2)), (Lines{"replicate", "split d0"}));
}

TEST(StrategyTest, LayerNormHiddenSplitReplicatesNothingElse) {
  const auto rule = rule_of("aten::layer_norm", {f32({2, 16, 768}), f32({768}), f32({768})}, {f32({2, 16, 768})},
                            {{"normalized_shape", Ints{768}}});
  EXPECT_EQ(describe(rule, enumerate_strategies(rule, 4)),
            (Lines{
                "replicate | in R R R | grad R R R | out R",
                "split d1 | in S(1) R R | grad S(1) P(sum) P(sum) | out S(1)",
                "split W0 | in S(2) S(0) S(0) | grad S(2) S(0) S(0) | out S(2) | stats 64",
            }));
}

TEST(StrategyTest, CrossEntropyVocabularyParallel) {
  const auto rule = rule_of("aten::cross_entropy_loss", {f32({32, 1000}), i64({32})}, {f32({})});
  ASSERT_EQ(rule.str(), "n C, n -> ()  [n=32 reduced(mean), C=1000 whole]");
  EXPECT_EQ(describe(rule, enumerate_strategies(rule, 8)), (Lines{
                                                               "replicate | in R R | grad R R | out R",
                                                               "split n | in S(0) S(0) | grad S(0) S(0) | out P(mean)",
                                                               // No output carries n, so the row product is 1.
                                                               "split C | in S(1) R | grad S(1) R | out R | stats 3",
                                                           }));
  // Unreduced: every row keeps its own three statistics.
  const auto none =
      rule_of("aten::cross_entropy_loss", {f32({32, 1000}), i64({32})}, {f32({32})}, {{"reduction", std::int64_t{0}}});
  EXPECT_EQ(describe(none, enumerate_strategies(none, 8)).back(),
            "split C | in S(1) R | grad S(1) R | out R | stats 96");
}

TEST(StrategyTest, StatisticsCountEachRowIndexOnce) {
  // native_layer_norm's three outputs all carry d0; the rows are d0 alone.
  const auto rule = rule_of("aten::native_layer_norm", {f32({4, 8}), f32({8})}, {f32({4, 8}), f32({4, 1}), f32({4, 1})},
                            {{"normalized_shape", Ints{8}}});
  const auto strategies = enumerate_strategies(rule, 2);
  ASSERT_EQ(labels(rule, strategies), (Lines{"replicate", "split d0", "split W0"}));
  EXPECT_EQ(strategies[2].statistics_elements, 2 * 4);
  EXPECT_EQ(join(strategies[2].outputs), "S(1) R R");
}

TEST(StrategyTest, DivisibilityAndSize) {
  const auto rule = rule_of("aten::mm", {f32({6, 12}), f32({12, 5})}, {f32({6, 5})});
  EXPECT_EQ(labels(rule, enumerate_strategies(rule, 2)), (Lines{"replicate", "split m", "split k"}));  // n=5 odd
  EXPECT_EQ(labels(rule, enumerate_strategies(rule, 3)), (Lines{"replicate", "split m", "split k"}));  // 5 % 3
  EXPECT_EQ(labels(rule, enumerate_strategies(rule, 4)), (Lines{"replicate", "split k"}));             // 6 % 4
  EXPECT_EQ(labels(rule, enumerate_strategies(rule, 6)), (Lines{"replicate", "split m", "split k"}));  // 6 >= 6
  EXPECT_EQ(labels(rule, enumerate_strategies(rule, 12)), (Lines{"replicate", "split k"}));            // 6 < 12
  EXPECT_EQ(labels(rule, enumerate_strategies(rule, 24)), (Lines{"replicate"}));
  // Strided needs size % (n x g) == 0 as well.
  StrategyOptions options;
  options.strided = {{12, 2}, {12, 3}, {12, 4}};
  EXPECT_EQ(labels(rule, enumerate_strategies(rule, 3, options)),
            (Lines{"replicate", "split m", "split k", "split k g2", "split k g4"}));
  EXPECT_EQ(labels(rule, enumerate_strategies(rule, 6, options)),
            (Lines{"replicate", "split m", "split k", "split k g2"}));
}

TEST(StrategyTest, DropsStrategiesWithEqualPlacements) {
  const auto rule = mm_rule();
  // (2304, 1) is the contiguous split again and a repeated pair adds nothing.
  StrategyOptions options;
  options.strided = {{2304, 1}, {2304, 3}, {2304, 3}};
  EXPECT_EQ(labels(rule, enumerate_strategies(rule, 8, options)),
            (Lines{"replicate", "split m", "split k", "split n", "split n g3"}));

  // Two indices that no operand carries place every operand alike: the second is dropped.
  ops::DimRule loose;
  loose.indices = {{"a", 4}, {"u", 4}, {"v", 4}};
  loose.inputs = {{{0}}};
  loose.outputs = {{{0}}};
  const auto strategies = enumerate_strategies(loose, 2);
  EXPECT_EQ(labels(loose, strategies), (Lines{"replicate", "split a", "split u"}));
  EXPECT_EQ(describe(loose, strategies)[2], "split u | in R | grad P(sum) | out R");
}

TEST(StrategyTest, OneRankOnlyReplicates) {
  const auto rule = mm_rule();
  StrategyOptions options;
  options.strided = {{2304, 3}};
  const auto strategies = enumerate_strategies(rule, 1, options);
  ASSERT_EQ(strategies.size(), 1u);
  EXPECT_EQ(describe(rule, strategies), (Lines{"replicate | in R R | grad R R | out R"}));
  EXPECT_THROW(enumerate_strategies(rule, 0), support::ValidationError);
  EXPECT_THROW(enumerate_strategies(rule, -4), support::ValidationError);
}

TEST(StrategyTest, Deterministic) {
  const auto rule = rule_of("aten::view", {f32({2, 8, 768})}, {f32({2, 8, 12, 64})}, {{"size", Ints{2, 8, 12, 64}}});
  StrategyOptions options;
  options.strided = {{768, 3}, {64, 2}, {12, 3}};
  EXPECT_EQ(enumerate_strategies(rule, 2, options), enumerate_strategies(rule, 2, options));
}

TEST(StrategyTest, Str) {
  const auto rule = mm_rule();
  Strategy s;
  EXPECT_EQ(s.str(rule), "replicate");
  s.index = 1;
  EXPECT_EQ(s.str(rule), "split k");
  s.index = 2;
  s.groups = 3;
  EXPECT_EQ(s.str(rule), "split n g3");
  s.index = 7;
  EXPECT_THROW(s.str(rule), support::ValidationError);
}

TEST(StrategyTest, LocalRule) {
  const auto rule = mm_rule();
  const auto strategies = enumerate_strategies(rule, 8);
  EXPECT_EQ(local_rule(rule, strategies[0], 8), rule);
  const auto k = local_rule(rule, strategies[2], 8);
  EXPECT_EQ(k.str(), "m k, k n -> m n  [m=32, k=96 reduced, n=2304]");
  EXPECT_EQ(local_rule(rule, strategies[3], 8).str(), "m k, k n -> m n  [m=32, k=768 reduced, n=288]");
  // A strided split divides the index the same way.
  StrategyOptions options;
  options.strided = {{2304, 3}};
  const auto strided = enumerate_strategies(rule, 8, options).back();
  ASSERT_EQ(strided.groups, 3);
  EXPECT_EQ(local_rule(rule, strided, 8).str(), "m k, k n -> m n  [m=32, k=768 reduced, n=288]");
  // The next mesh axis sees the local sizes: k=768 splits 64 ways, its local 96 does not.
  EXPECT_EQ(labels(rule, enumerate_strategies(rule, 64)), (Lines{"replicate", "split k", "split n"}));
  EXPECT_EQ(labels(k, enumerate_strategies(k, 64)), (Lines{"replicate", "split n"}));
  Strategy bad;
  bad.index = 9;
  EXPECT_THROW(local_rule(rule, bad, 8), support::ValidationError);
  EXPECT_THROW(local_rule(rule, strategies[2], 0), support::ValidationError);
  // 768 on 5 ranks is uneven (154 x 3, 153 x 2): the next axis sees the largest share and
  // may not split it again. An index smaller than the axis does not split at all.
  const auto uneven_k = local_rule(rule, enumerate_strategies(rule, 5)[1], 5);
  EXPECT_EQ(uneven_k.str(), "m k, k n -> m n  [m=32, k=154 reduced, n=2304]");
  EXPECT_TRUE(uneven_k.indices[1].uneven);
  EXPECT_EQ(labels(uneven_k, enumerate_strategies(uneven_k, 2)), (Lines{"replicate", "split m", "split n"}));
  EXPECT_THROW(local_rule(rule, strategies[1], 64), support::ValidationError);  // m = 32 < 64
}

TEST(StrategyTest, GroupsCountTheMajorIndicesAsTheOuterAxesLeaveThem) {
  // [b=2, s=16, 64] -> [32, 64] (dim 0 = b s) on a {2, 2} mesh: the inner axis 1 splits b, the
  // outer axis 0 splits s. Axis 0 cuts first: its rank k holds s-block k of both sequences,
  // Shard(0, g2). The rule as axis 1 leaves it (b cut to 1) would say Shard(0): the rows of
  // one sequence, which is where axis 1's blocks lie, not axis 0's.
  const auto rule = rule_of("aten::view", {f32({2, 16, 64})}, {f32({32, 64})}, {{"size", Ints{32, 64}}});
  ASSERT_EQ(rule.inputs[0], (ops::OperandDims{{0}, {1}, {2}}));
  ASSERT_EQ(rule.outputs[0], (ops::OperandDims{{0, 1}, {2}}));
  auto line = [&](const ops::DimRule& local, const ops::DimRule* layout, const std::string& label) {
    for (const auto& text : describe(rule, enumerate_strategies(local, 2, {}, layout)))
      if (text.rfind(label + " |", 0) == 0) return text;
    return std::string("(none)");
  };
  const auto after_b = local_rule(rule, enumerate_strategies(rule, 2)[1], 2);  // axis 1 split i0
  ASSERT_EQ(after_b.indices[0].size, 1);
  // Without a layout rule, the sizes axis 1 left: the wrong groups.
  EXPECT_EQ(line(after_b, nullptr, "split i1"), "split i1 | in S(1) | grad S(1) | out S(0)");
  // Axis 0's layout is the whole rule (no axis is outer to it).
  EXPECT_EQ(line(after_b, &rule, "split i1"), "split i1 | in S(1) | grad S(1) | out S(0,g2)");
  // Axis 1 (inner) after axis 0 split s: b is major and nothing outer cut it.
  const auto after_s = local_rule(rule, enumerate_strategies(rule, 2)[2], 2);  // axis 0 split i1
  ASSERT_EQ(after_s.indices[1].size, 8);
  EXPECT_EQ(line(after_s, &after_s, "split i0"), "split i0 | in S(0) | grad S(0) | out S(0)");
  // The other nesting, axis 0 on b, axis 1 on s: axis 1's groups count the b axis 0 left (1).
  EXPECT_EQ(line(after_b, &after_b, "split i1"), "split i1 | in S(1) | grad S(1) | out S(0)");
  // An uneven split under a major index would be a strided uneven shard: not offered.
  const auto odd = rule_of("aten::view", {f32({2, 17, 64})}, {f32({34, 64})}, {{"size", Ints{34, 64}}});
  const auto odd_after_b = local_rule(odd, enumerate_strategies(odd, 2)[1], 2);
  EXPECT_EQ(labels(odd, enumerate_strategies(odd_after_b, 2)), (Lines{"replicate", "split i1", "split i2"}));
  EXPECT_EQ(labels(odd, enumerate_strategies(odd_after_b, 2, {}, &odd)), (Lines{"replicate", "split i2"}));
  // A layout rule of another node is a programming error.
  const auto mm = mm_rule();
  EXPECT_THROW(enumerate_strategies(rule, 2, {}, &mm), support::ValidationError);
}

TEST(StrategyTest, UnevenSplitsCutAsEvenlyAsWholeElementsAllow) {
  // GPT-2's LM head: 50257 words on 8 ranks, 6283 on the first, 6282 on the other seven.
  const auto rule = rule_of("aten::mm", {f32({32, 768}), f32({768, 50257})}, {f32({32, 50257})});
  const auto strategies = enumerate_strategies(rule, 8);
  ASSERT_EQ(labels(rule, strategies), (Lines{"replicate", "split m", "split k", "split n"}));
  const Strategy& n = strategies[3];
  const std::vector<double> ratios = uneven_ratios(50257, 8);
  ASSERT_EQ(ratios.size(), 8u);
  EXPECT_DOUBLE_EQ(ratios[0], 6283.0 / 50257);
  for (std::size_t r = 1; r < 8; ++r) EXPECT_DOUBLE_EQ(ratios[r], 6282.0 / 50257);
  EXPECT_EQ(n.inputs[1].ratios, ratios);
  EXPECT_EQ(n.input_grads[1].ratios, ratios);
  EXPECT_EQ(n.outputs[0].ratios, ratios);
  EXPECT_TRUE(n.inputs[0].is_replicate());
  EXPECT_EQ(parse_placement(n.outputs[0].str()), n.outputs[0]);  // the plan's text reads back
  EXPECT_DOUBLE_EQ(held_fraction(n.outputs[0], 8), 6283.0 / 50257);
  EXPECT_TRUE(uneven_ratios(50256, 8).empty());
  EXPECT_THROW(uneven_ratios(7, 8), support::ValidationError);
  // Fewer than 8 elements on some rank: not offered (m = 32 on 5 ranks leaves 6).
  const auto five = enumerate_strategies(mm_rule(), 5);
  EXPECT_EQ(labels(mm_rule(), five), (Lines{"replicate", "split k", "split n"}));
  // No strided uneven shard: [b, s, 12 x 100] -> [b, s, 12, 100] on 8 ranks; head_dim (100,
  // minor in the merged dim) would be a strided uneven cut of the input: not offered.
  const auto view =
      rule_of("aten::view", {f32({2, 16, 1200})}, {f32({2, 16, 12, 100})}, {{"size", Ints{2, 16, 12, 100}}});
  for (const Strategy& s : enumerate_strategies(view, 8))
    for (const Placement& p : s.inputs) EXPECT_TRUE(p.ratios.empty()) << s.str(view);
}

TEST(StrategyTest, PartialPassthroughKeepsPartialSums) {
  // A view [m, n] -> [b, s, n] of a row-parallel product's partial sums stays partial; the
  // gradient of a sum reaches each term whole.
  const auto rule = rule_of("aten::view", {f32({8, 16})}, {f32({2, 4, 16})}, {{"size", Ints{2, 4, 16}}});
  Strategy s = partial_strategy(rule);
  EXPECT_TRUE(s.partial);
  EXPECT_EQ(s.index, -1);
  EXPECT_EQ(s.str(rule), "partial");
  EXPECT_EQ(join(s.inputs), "P(sum)");
  EXPECT_EQ(join(s.input_grads), "R");
  EXPECT_EQ(join(s.outputs), "P(sum)");
  // It is not one of the rule's strategies, and the next axis sees the rule unchanged.
  for (const Strategy& t : enumerate_strategies(rule, 4)) EXPECT_FALSE(t.partial);
  EXPECT_EQ(local_rule(rule, s, 4), rule);
}

TEST(StrategyTest, EmbeddingSplitsItsVocabularyIntoPartialSums) {
  // Megatron's vocabulary-parallel embedding, from the rule's lookup index: each rank holds
  // a slice of the table, looks up the ids in its rows, zeros elsewhere, and the outputs sum.
  const auto rule = rule_of("aten::embedding", {f32({1000, 64}), i64({2, 16})}, {f32({2, 16, 64})});
  ASSERT_TRUE(rule.indices[0].lookup);
  bool found = false;
  for (const Strategy& s : enumerate_strategies(rule, 8)) {
    if (s.str(rule) != "split V") continue;
    found = true;
    EXPECT_EQ(join(s.inputs), "S(0) R");
    EXPECT_EQ(join(s.outputs), "P(sum)");
    EXPECT_EQ(join(s.input_grads), "S(0) R");
    EXPECT_EQ(s.statistics_elements, 0);
  }
  EXPECT_TRUE(found);
  // index_select's dim is a lookup too.
  const auto select = rule_of("aten::index_select", {f32({1000, 64}), i64({32})}, {f32({32, 64})},
                              {{"dim", std::int64_t{0}}});
  EXPECT_TRUE(select.indices[static_cast<std::size_t>(select.inputs[0][0].front())].lookup);
}

}  // namespace
}  // namespace shardwise::search
