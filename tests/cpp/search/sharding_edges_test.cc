// What an edge's reshardings cost on one mesh axis (search/sharding_edges.h), worked out by
// hand on a link of 1e9 bytes/s and 10 us a hop: a ring over n ranks of B bytes takes
// (n-1)/n x B / 1e9 + (n-1) x 1e-5 s, an all-reduce twice that (cost/collective_cost.h).
// The graph: x [b8, 32] -> linear by fc.weight [64, 32] -> y [b8, 64] -> tanh -> add a
// buffer, float32, searched at 16 rows: x is 16 x 32 x 4 = 2,048 bytes, y 16 x 64 x 4 =
// 4,096, fc.weight 64 x 32 x 4 = 8,192.
#include "search/sharding_edges.h"

#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "analysis/saved_for_backward.h"
#include "ir/parser.h"
#include "search/sharding_strategies.h"
#include "sharding_parts.h"

namespace shardwise::search {
namespace {

using namespace testing;  // NOLINT: the parts' graphs, clusters and placements

class ShardingEdgesTest : public ShardingParts {};

// Within a billionth of the hand-computed figure.
void expect_seconds(double actual, double expected) { EXPECT_NEAR(actual, expected, 1e-9 * expected); }

TEST_F(ShardingEdgesTest, EveryReadIsGroupedByItsRepresentatives) {
  const ir::Graph layers = two_layers();
  const Candidate& c = candidate(layers, four, f32_options({4}, 8));
  const int linear = c.producer("h0"), tanh = c.producer("a0");
  // Layer 1 folds into layer 0 (block_folding.h): its weight read and its h1 -> tanh read
  // join layer 0's; its read of a0 is an edge of its own (tanh -> linear); x is read once.
  const std::map<EdgeKey, double> expected = {
      {{static_cast<int>(c.value("x")), true, linear, 0}, 1},
      {{static_cast<int>(c.value("layers.0.fc.weight")), true, linear, 1}, 2},
      {{linear, false, tanh, 0}, 2},
      {{tanh, false, linear, 0}, 1},
  };
  std::map<EdgeKey, double> counts;
  for (const auto& [key, group] : c.facts.edges) counts[key] = group.count;
  EXPECT_EQ(counts, expected);
  EXPECT_EQ(c.facts.edges.at({linear, false, tanh, 0}).value, c.value("h0"));
}

// x.new_empty(size) reads x for its dtype and device only (DimRule::reads_metadata_only): no
// edge, so no placement of x costs that read anything (the rewrite reads x as it is held).
TEST(GroupEdges, AnOperandReadForItsMetadataHasNoEdge) {
  const ir::Graph g = ir::parse_graph(R"(graph(%x: f32[b8,4]) {
  %made: f32[b8,6] = aten::new_empty(%x) {size=[8,6]}
  %filled: f32[b8,6] = aten::slice_scatter(%made, %x) {dim=1, start=0, end=4, step=1}
  return (%filled)
})");
  const auto rules = rules_at_batch(g, 1.0);
  const EdgeGroups edges =
      group_edges(g, fold_repeated_blocks(g, rules, analysis::saved_tensors(g), plan::Recompute::None), rules);
  std::vector<std::pair<int, int>> reads;  // (consumer, operand)
  for (const auto& [key, group] : edges) reads.emplace_back(key.consumer, key.operand);
  EXPECT_EQ(reads, (std::vector<std::pair<int, int>>{{1, 0}, {1, 1}}));  // the slice_scatter's two
}

TEST_F(ShardingEdgesTest, AnActivationGatheredForItsReaderPaysOneAllGather) {
  const Candidate& c = candidate(f32_options({4}, 16));
  // y split by out features (S(1)), read whole by tanh, its gradient whole (the canonical
  // S(1) is a local cut of it): all-gather of 4,096 bytes = 0.75 x 4,096e-9 + 3e-5.
  expect_seconds(c.edges().edge_seconds(0, c.value("y"), c.producer("t"), 0, S(1), R(), R()), 3.3072e-5);
  // Held as read: nothing.
  EXPECT_EQ(c.edges().edge_seconds(0, c.value("y"), c.producer("t"), 0, S(1), S(1), S(1)), 0.0);
}

TEST_F(ShardingEdgesTest, AReplicatedWeightPaysItsBucketsShareOfTheGradientsAllReduce) {
  ShardingModelOptions o = f32_options({4}, 16);
  o.bucket_bytes = 16384;  // fc.weight's 8,192 bytes fill half a bucket
  const Candidate& c = candidate(o);
  // The rows split reads fc.weight whole and gives its gradient as a partial sum: all-reduce
  // of 8,192 bytes = 2 x (0.75 x 8,192e-9 + 3e-5) = 7.2288e-5, less half the latency of the
  // same all-reduce on one byte (2 x (0.75e-9 + 3e-5) = 6.00015e-5): 4.228725e-5.
  const ir::ValueId w = c.value("fc.weight");
  const int linear = c.producer("y");
  expect_seconds(c.edges().edge_seconds(0, w, linear, 1, R(), R(), P()), 4.228725e-5);
  // It runs beside the backward: at the weight the solver gives such a second.
  EXPECT_EQ(c.edges().parameter_gradient_at(0, w, linear, 1, R(), P()), ParameterOverlap::BesideBackward);
  expect_seconds(c.edges().edge_seconds(0, w, linear, 1, R(), R(), P(), 0.5), 2.1143625e-5);
}

TEST_F(ShardingEdgesTest, OneOfAStepsMicroBatchesPaysItsShareOfTheGradientReduction) {
  // A stage layout's graph is one of m micro-batches a step runs before it reduces the
  // gradients once (ShardingModelOptions::step_share = 1/m): the same all-reduce as above,
  // 4.228725e-5 s, a quarter of it at m = 4; an activation's gathers are each micro-batch's.
  ShardingModelOptions o = f32_options({4}, 16);
  o.bucket_bytes = 16384;
  o.step_share = 0.25;
  const Candidate& c = candidate(o);
  const ir::ValueId w = c.value("fc.weight");
  const int linear = c.producer("y");
  expect_seconds(c.edges().edge_seconds(0, w, linear, 1, R(), R(), P()), 4.228725e-5 / 4);
  expect_seconds(c.edges().edge_seconds(0, c.value("y"), c.producer("t"), 0, S(1), R(), R()), 3.3072e-5);
}

// A learned position embedding, x + wpe(arange(8)): pe is made from the model's state alone,
// the same on every rank that holds it whole, so the rewrite reduces the add's partial
// gradient of it where it reaches wpe, in the buckets (transform/spmd_rewrite.cc): priced as
// a replicated weight's gradient of pe's 8 x 16 x 4 = 512 bytes, not an all-reduce exposed.
TEST_F(ShardingEdgesTest, AValueMadeFromTheStateAlonePaysItsBucketsShareOfTheReduction) {
  const ir::Graph g = ir::parse_graph(R"(graph(%x: f32[b8,8,16]) {
  %wpe: f32[8,16] parameter
  %pos: i64[8] = aten::arange() {end=8}
  %pe: f32[8,16] = aten::embedding(%wpe, %pos) {padding_idx=-1, scale_grad_by_freq=false, sparse=false}
  %y: f32[b8,8,16] = aten::add.Tensor(%x, %pe) {alpha=1}
  return (%y)
})");
  ShardingModelOptions o = f32_options({4}, 8);
  o.bucket_bytes = 16384;  // pe's 512 bytes: 1/32 of a bucket
  const Candidate& c = candidate(g, four, o);
  EXPECT_TRUE(c.facts.from_state[static_cast<std::size_t>(c.value("pos"))]);
  EXPECT_TRUE(c.facts.from_state[static_cast<std::size_t>(c.value("pe"))]);
  EXPECT_FALSE(c.facts.from_state[static_cast<std::size_t>(c.value("y"))]);
  const ir::ValueId pe = c.value("pe");
  const int add = c.producer("y");
  EXPECT_TRUE(c.edges().reduced_with_parameters(pe, R(), P()));
  EXPECT_FALSE(c.edges().reduced_with_parameters(c.value("wpe"), R(), P()));  // a parameter's own rule
  EXPECT_FALSE(c.edges().reduced_with_parameters(pe, R(), R()));
  // all-reduce of 512 bytes = 2 x (0.75 x 512e-9 + 3e-5) = 6.0768e-5, less 31/32 of the
  // latency of the same all-reduce on one byte (2 x (0.75e-9 + 3e-5) = 6.00015e-5).
  expect_seconds(c.edges().edge_seconds(0, pe, add, 1, R(), R(), P()), 6.0768e-5 - 31.0 / 32.0 * 6.00015e-5);
  // y, made from the input: an activation's all-reduce, whole.
  EXPECT_FALSE(c.edges().reduced_with_parameters(c.value("y"), R(), P()));
}

TEST_F(ShardingEdgesTest, AShardedWeightIsGatheredAndItsGradientReduceScattered) {
  const Candidate& c = candidate(f32_options({4}, 16));
  const ir::ValueId w = c.value("fc.weight");
  const int linear = c.producer("y");
  // Held S(0), read whole: gathered for the forward (exposed: the graph's one unit is the
  // first, gathered at the program's start with nothing before its read), not again for the
  // backward (its partner x is data: the linear's backward makes no input gradient, so it
  // reads only x), the gradient reduce-scattered beside the backward. Each is a ring over
  // 8,192 bytes = 0.75 x 8,192e-9 + 3e-5 = 3.6144e-5, its whole latency paid (fc.weight is
  // all its unit's matrices).
  EXPECT_EQ(c.edges().forward_passes(w, linear, 1), 1);
  EXPECT_EQ(c.edges().forward_passes(c.value("x"), linear, 0), 1);
  EXPECT_EQ(c.edges().gather_overlap(0, w, linear, 1, S(0), R()), ParameterOverlap::Exposed);
  EXPECT_EQ(c.edges().parameter_gradient_at(0, w, linear, 1, S(0), P()), ParameterOverlap::BesideBackward);
  // Beside-compute seconds at 1: 2 x 3.6144e-5; at 0.25: (1 + 0.25) x 3.6144e-5.
  expect_seconds(c.edges().edge_seconds(0, w, linear, 1, S(0), R(), P()), 7.2288e-5);
  expect_seconds(c.edges().edge_seconds(0, w, linear, 1, S(0), R(), P(), 0.25), 4.518e-5);
}

TEST_F(ShardingEdgesTest, OnlyTheFirstUnitsGatherHasNothingToHideBehind) {
  const ir::Graph stem = stem_two_layers();
  const Candidate& c = candidate(stem, four, f32_options({4}, 16));
  // The stem's weight, read before the blocks: gathered at the program's start, exposed. A
  // layer's weight: prefetched beside the layer before (the stem's compute for layer 0).
  EXPECT_EQ(c.edges().gather_overlap(0, c.value("stem.weight"), c.producer("s"), 1, S(0), R()),
            ParameterOverlap::Exposed);
  EXPECT_EQ(c.edges().gather_overlap(0, c.value("layers.0.fc.weight"), c.producer("h0"), 1, S(0), R()),
            ParameterOverlap::BesideForward);
  EXPECT_EQ(c.facts.units.first_reading, c.facts.units.of_node[static_cast<std::size_t>(c.producer("s"))]);
  // Backward reads a layer's weight (for its input's gradient) and gathers it again; not the
  // stem's, whose input is data.
  EXPECT_EQ(c.edges().forward_passes(c.value("layers.0.fc.weight"), c.producer("h0"), 1), 2);
  EXPECT_EQ(c.edges().forward_passes(c.value("stem.weight"), c.producer("s"), 1), 1);
}

TEST_F(ShardingEdgesTest, ATiedWeightsReadersShareOneReduction) {
  const ir::Graph shared = tied();
  const Candidate& c = candidate(shared, four, f32_options({4}, 16));
  const ir::ValueId w = c.value("w");
  // Read twice, held whole: its two partial gradients are added locally and reduced once,
  // half by each reader; held sharded, each read's gradient is reduce-scattered on its own.
  EXPECT_DOUBLE_EQ(c.edges().gradient_share(w, R(), P()), 0.5);
  EXPECT_DOUBLE_EQ(c.edges().gradient_share(w, S(0), P()), 1.0);
  EXPECT_DOUBLE_EQ(c.edges().gradient_share(w, R(), R()), 1.0);
  // A read whose gradient of it is already whole (its input the same on every rank) hands it
  // to the same reduction, Partial: the rewrite reduces the sum once where any read's is
  // Partial, the whole one added on one rank (spmd_rewrite.cc, reduced_whole). It pays its
  // half like a Partial read: the head's share alone had priced the tied embedding's
  // all-reduce at half of what ran (fidelity run x: 14.87 MB listed, 16.96 measured).
  EXPECT_EQ(c.edges().reduced_gradient(w, R(), R()), P());
  EXPECT_EQ(c.edges().reduced_gradient(w, R(), P()), P());
  EXPECT_EQ(c.edges().reduced_gradient(w, S(0), R()), R());  // sharded: each read its own
  EXPECT_EQ(c.edges().reduced_gradient(c.value("x"), R(), R()), R());  // not a parameter
  const int a = c.producer("y1");
  EXPECT_GT(c.edges().edge_seconds(0, w, a, 1, R(), R(), R()), 0.0);
  expect_seconds(c.edges().edge_seconds(0, w, a, 1, R(), R(), R()), c.edges().edge_seconds(0, w, a, 1, R(), R(), P()));
  // A weight read once keeps a whole gradient whole: nothing to reduce.
  const Candidate& single = candidate(f32_options({4}, 16));
  EXPECT_EQ(single.edges().reduced_gradient(single.value("fc.weight"), R(), R()), R());
  expect_seconds(single.edges().edge_seconds(0, single.value("fc.weight"), single.producer("y"), 1, R(), R(), R()),
                 0.0);
}

TEST_F(ShardingEdgesTest, CollectiveMatmulsPayTheInterferenceOnTheirCollectives) {
  ShardingModelOptions o = f32_options({4}, 16);
  o.collective_matmul = true;
  o.overlap_interference = 0.5;
  const Candidate& c = candidate(o);
  // y, the contraction's partial sum, reduce-scattered by rows into tanh (its only reader),
  // its gradient gathered back: two rings over 4,096 bytes, 2 x 3.3072e-5, at 0.5.
  const ir::ValueId y = c.value("y");
  EXPECT_EQ(c.edges().matmul_collective_at(0, y, c.producer("t"), 0, P(), S(0), S(0)), MatmulCollective::Scatter);
  expect_seconds(c.edges().edge_seconds(0, y, c.producer("t"), 0, P(), S(0), S(0)), 3.3072e-5);
  // x gathered by rows into the linear: one ring over 2,048 bytes = 0.75 x 2,048e-9 + 3e-5,
  // at 0.5 (x has no gradient).
  const ir::ValueId x = c.value("x");
  EXPECT_EQ(c.edges().matmul_collective_at(0, x, c.producer("y"), 0, S(0), R(), P()), MatmulCollective::Gather);
  expect_seconds(c.edges().edge_seconds(0, x, c.producer("y"), 0, S(0), R(), P()), 1.5768e-5);
}

TEST_F(ShardingEdgesTest, UnevenBatchSharesAreGatheredAndCutNotExchanged) {
  const cost::Cluster mixed = one_link(2, /*slow_second=*/true);  // speeds 3:1
  const cost::Cluster even = one_link(2);
  const Candidate& uneven = candidate(graph, mixed, f32_options({2}, 16));
  const Candidate& same = candidate(graph, even, f32_options({2}, 16));
  const ir::ValueId x = uneven.value("x");
  // On the mixed pair the rows go 3/4 and 1/4 (the speeds' shares); other dims stay even.
  Placement shares = S(0);
  shares.ratios = {0.75, 0.25};
  EXPECT_EQ(uneven.edges().as_run(0, x, S(0)), shares);
  EXPECT_EQ(uneven.edges().as_run(0, x, S(1)), S(1));
  EXPECT_EQ(same.edges().as_run(0, x, S(0)), S(0));
  // Rows to features: uneven blocks are all-gathered (0.5 x 2,048e-9 + 1e-5 = 1.1024e-5);
  // even ones exchanged all-to-all, each rank's half (0.5 x 1,024e-9 + 1e-5 = 1.0512e-5).
  expect_seconds(uneven.edges().edge_seconds(0, x, uneven.producer("y"), 0, S(0), S(1), S(1)), 1.1024e-5);
  expect_seconds(same.edges().edge_seconds(0, x, same.producer("y"), 0, S(0), S(1), S(1)), 1.0512e-5);
}

TEST_F(ShardingEdgesTest, AUnitGroupsEachParametersGatherAndScatterOnce) {
  Candidate& c = candidate(f32_options({4}, 16));
  const ir::ValueId w = c.value("fc.weight");
  const int linear = c.producer("y");
  // fc.weight held S(0), the linear splitting rows (reads it whole, its gradient partial): one
  // reduce-scatter beside the backward, of its 64 x 32 = 2,048 elements, in the graph's one
  // unit. Its gather is no prefetched group's: the first unit's is exposed.
  c.decisions.leaves[0][static_cast<std::size_t>(w)].placement = S(0);
  c.decisions.nodes[0][static_cast<std::size_t>(linear)] = c.producing("y", 0, S(0));
  const std::map<UnitGroupKey, double> expected = {{c.edges().unit_group_key(linear, w, 1), 2048}};
  EXPECT_EQ(c.edges().unit_group_elements(0), expected);
  EXPECT_EQ(std::get<0>(c.edges().unit_group_key(linear, w, 1)), 0);
}

}  // namespace
}  // namespace shardwise::search
