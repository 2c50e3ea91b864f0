// The bytes a rank holds (search/sharding_memory.h), worked out by hand. Model states in
// float32: 4 bytes of weight, 4 of gradient and 8 of Adam's moments per parameter. The graph:
// x [b8, 32] -> linear by fc.weight [64, 32] (2,048 elements) -> y [b8, 64] -> tanh -> t ->
// add the buffer shift [64] -> z, searched at 16 rows: y and t are 16 x 64 x 4 = 4,096 bytes.
#include "search/sharding_memory.h"

#include <gtest/gtest.h>

#include "cost/cluster_presets.h"
#include "sharding_parts.h"

namespace shardwise::search {
namespace {

using namespace testing;  // NOLINT: the parts' graphs, clusters and placements

class ShardingMemoryTest : public ShardingParts {};

void expect_states(const cost::ModelStateBytes& bytes, double weights, double gradients, double optimizer) {
  EXPECT_DOUBLE_EQ(bytes.weights, weights);
  EXPECT_DOUBLE_EQ(bytes.gradients, gradients);
  EXPECT_DOUBLE_EQ(bytes.optimizer, optimizer);
}

TEST_F(ShardingMemoryTest, AWeightsStatesAsItIsHeldOnFourRanks) {
  const Candidate& c = candidate(f32_options({4}, 16));
  const ShardingMemory memory = c.memory();
  const ir::ValueId w = c.value("fc.weight");
  // Whole: 2,048 x 4, 2,048 x 4, 2,048 x 8.
  expect_states(memory.leaf_memory_by_kind(w, 0, {R(), false}), 8192, 8192, 16384);
  // Split over 4: a quarter of each (2,048 bytes of weight per rank).
  expect_states(memory.leaf_memory_by_kind(w, 0, {S(0), false}), 2048, 2048, 4096);
  // ZeRO: whole weight and gradient, a quarter of the optimizer state.
  expect_states(memory.leaf_memory_by_kind(w, 0, {R(), true}), 8192, 8192, 4096);
  EXPECT_DOUBLE_EQ(memory.leaf_memory(w, 0, {R(), true}), 20480);
  // The buffer: 64 x 4 bytes of weight, no gradient or state; the input: nothing.
  expect_states(memory.leaf_memory_by_kind(c.value("shift"), 0, {R(), false}), 256, 0, 0);
  expect_states(memory.leaf_memory_by_kind(c.value("x"), 0, {S(0), false}), 0, 0, 0);
}

TEST_F(ShardingMemoryTest, AStagesShareScalesItsStates) {
  ShardingModelOptions o = f32_options({4}, 16);
  o.parameter_memory_scale = 0.5;
  const Candidate& c = candidate(o);
  expect_states(c.memory().leaf_memory_by_kind(c.value("fc.weight"), 0, {S(0), false}), 1024, 1024, 2048);
}

TEST_F(ShardingMemoryTest, ZeroOnOneAxisDividesTheStateTheOtherAxisSplit) {
  Candidate& c = candidate(f32_options({2, 2}, 16));
  const ir::ValueId w = c.value("fc.weight");
  c.decisions.leaves[0][static_cast<std::size_t>(w)].placement = S(0);
  // S(0) on axis 0 holds half; ZeRO on axis 1 halves the state again: a quarter.
  const LeafShares shares = c.memory().leaf_held(w, 1, {R(), true});
  EXPECT_DOUBLE_EQ(shares.held, 0.5);
  EXPECT_DOUBLE_EQ(shares.state_held, 0.25);
  expect_states(c.memory().leaf_memory_by_kind(w, 1, {R(), true}), 4096, 4096, 4096);
  // Split on both axes: a quarter of everything.
  expect_states(c.memory().leaf_memory_by_kind(w, 1, {S(0), false}), 2048, 2048, 4096);
}

TEST_F(ShardingMemoryTest, SavedOutputsAsAutogradKeepsThem) {
  ShardingModelOptions o = f32_options({4}, 16);
  const Candidate& c = candidate(o);
  const ShardingMemory memory = c.memory();
  const ir::NodeId linear = c.producer("y"), tanh = c.producer("t");
  const Strategy rows = c.producing("t", 0, S(0));
  // tanh keeps its output: 4,096 bytes whole, 1,024 split by rows over 4.
  EXPECT_DOUBLE_EQ(memory.node_memory(tanh, 0, c.producing("t", 0, R())), 4096);
  EXPECT_DOUBLE_EQ(memory.node_memory(tanh, 0, rows), 1024);
  // Nothing keeps y (the linear saves its input), unless it is kept whole.
  EXPECT_DOUBLE_EQ(memory.node_memory(linear, 0, c.producing("y", 0, R())), 0);
  EXPECT_DOUBLE_EQ(memory.output_memory(linear, 0, c.producing("y", 0, R()), /*whole=*/true), 4096);
  // Summed over the decisions: everything replicated, tanh's 4,096; tanh split by rows, 1,024.
  EXPECT_DOUBLE_EQ(memory.activation_bytes(), 4096);
  Candidate& split = candidate(o);
  split.decisions.nodes[0][static_cast<std::size_t>(tanh)] = rows;
  EXPECT_DOUBLE_EQ(split.memory().activation_bytes(), 1024);
  // A stage's share of the activations scales them.
  o.activation_memory_scale = 2;
  EXPECT_DOUBLE_EQ(candidate(o).memory().node_memory(tanh, 0, rows), 2048);
}

TEST_F(ShardingMemoryTest, ABackwardHoldsItsLargestNodesGradientsBeyondTheSavedTensors) {
  Candidate& c = candidate(f32_options({4}, 16));
  // tanh's backward reads t's gradient and makes y's: 4,096 + 4,096 bytes (add's reads z's and
  // makes t's: as many; the shift is a buffer, no gradient). The linear's makes none for its
  // input x and reads y's: 4,096. The largest: 8,192.
  EXPECT_DOUBLE_EQ(c.memory().backward_working_bytes(), 8192);
  // Every node split by rows over 4: a quarter of each gradient.
  for (const char* value : {"y", "t", "z"})
    c.decisions.nodes[0][static_cast<std::size_t>(c.producer(value))] = c.producing(value, 0, S(0));
  EXPECT_DOUBLE_EQ(c.memory().backward_working_bytes(), 2048);
  // Not part of the saved activations: tanh's output alone, split.
  EXPECT_DOUBLE_EQ(c.memory().activation_bytes(), 1024);
}

TEST_F(ShardingMemoryTest, AnFp8LinearsCastsHoldFiveBytesAnElementOfWhatTheyCast) {
  // fc in an fp8 plan: x [16, 32] (512 elements) and fc.weight [64, 32] (2,048) cast in forward,
  // y's gradient [16, 64] (1,024) and the weight's transpose in backward. A cast holds the
  // operand's scaled float32 copy and its float8 one at once (|t| is freed before them): 5
  // bytes an element; the weight is cast beside the first operand's float8 copy.
  ShardingModelOptions o = f32_options({4}, 16);
  o.precision = cost::Precision::FP8;
  const cost::Cluster h100s = cost::first_ranks(cost::preset("dgx-h100", 1), 4);  // FP8 units
  Candidate& c = candidate(graph, h100s, o);
  EXPECT_DOUBLE_EQ(c.memory().fp8_cast_bytes(), 512 + 5 * 2048);
  // Backward, beside y's float32 gradient (4,096 bytes): dY's copies, then the weight's beside
  // dY's float8 one; more than tanh's two gradients (8,192).
  const double linear = 4096 + 1024 + 5 * 2048;
  EXPECT_DOUBLE_EQ(c.memory().node_backward_working_bytes(c.producer("y")), linear);
  EXPECT_DOUBLE_EQ(c.memory().backward_working_bytes(), linear);
  // The rows split over 4: a quarter of x and of dY, the weight whole.
  c.decisions.nodes[0][static_cast<std::size_t>(c.producer("y"))] = c.producing("y", 0, S(0));
  EXPECT_DOUBLE_EQ(c.memory().fp8_cast_bytes(), 128 + 5 * 2048);
  EXPECT_DOUBLE_EQ(c.memory().node_backward_working_bytes(c.producer("y")), 1024 + 256 + 5 * 2048);
}

TEST_F(ShardingMemoryTest, ACrossEntropysBackwardHoldsItsLogProbabilitiesGradientAndItsInputs) {
  // A language model's head: h [b8, 32] -> linear by head.weight [1000, 32] -> logits [b8, 1000]
  // -> cross-entropy against the labels. At 16 rows the logits are 16 x 1,000 x 4 = 64,000 bytes.
  const ir::Graph head = ir::parse_graph(R"(graph(%h: f32[b8,32], %labels: i64[b8]) {
  %head.weight: f32[1000,32] parameter
  %logits: f32[b8,1000] = aten::linear(%h, %head.weight) @head
  %loss: f32[] = aten::cross_entropy_loss(%logits, %labels) @loss
  return (%loss)
})");
  const Candidate& c = candidate(head, four, f32_options({4}, 16));
  // The cross-entropy's backward: the log-probabilities' gradient and the logits', 2 x 64,000
  // (the loss' own, a scalar, 4 more); the linear's reads the logits' alone.
  EXPECT_DOUBLE_EQ(c.memory().backward_working_bytes(), 2 * 64000 + 4);
  // Saved: the log-probabilities, logits-sized (the linear keeps h too, but a batch input is the
  // caller's, counted by no node).
  EXPECT_DOUBLE_EQ(c.memory().activation_bytes(), 64000);
}

TEST_F(ShardingMemoryTest, ABf16ModelsFloat32UpcastIsHeldInFloat32) {
  // transformers' loss: the bf16 logits cast to float32 before the cross-entropy. At 16 rows
  // the logits are 16 x 1,000 x 2 = 32,000 bytes, their float32 copy 64,000.
  const ir::Graph head = ir::parse_graph(R"(graph(%h: bf16[b8,32], %labels: i64[b8]) {
  %head.weight: bf16[1000,32] parameter
  %logits: bf16[b8,1000] = aten::linear(%h, %head.weight) @head
  %up: f32[b8,1000] = aten::to.dtype(%logits) {dtype="torch.float32"} @loss
  %loss: f32[] = aten::cross_entropy_loss(%up, %labels) @loss
  return (%loss)
})");
  ShardingModelOptions o = f32_options({4}, 16);
  o.precision = cost::Precision::BF16;
  const Candidate& c = candidate(head, four, o);
  // The log-probabilities autograd keeps are float32: 64,000 bytes, not bf16's 32,000.
  EXPECT_DOUBLE_EQ(c.memory().activation_bytes(), 64000);
  // The cross-entropy's backward: two float32 gradients and the scalar loss'.
  EXPECT_DOUBLE_EQ(c.memory().backward_working_bytes(), 2 * 64000 + 4);
  // The same graph priced in float32: its bf16 values twice their size, the float32 ones theirs.
  o.precision = cost::Precision::F32;
  EXPECT_DOUBLE_EQ(candidate(head, four, o).memory().activation_bytes(), 64000);
  EXPECT_DOUBLE_EQ(candidate(head, four, o).facts.value_bytes(candidate(head, four, o).value("logits")), 64000);
}

TEST_F(ShardingMemoryTest, TheDecisionsStatesAndTheWeightsTheyGather) {
  Candidate& c = candidate(f32_options({4}, 16));
  // Everything whole: fc.weight's 8,192 / 8,192 / 16,384 and shift's 256 bytes of weight.
  expect_states(c.memory().parameter_bytes_by_kind(), 8448, 8192, 16384);
  EXPECT_DOUBLE_EQ(c.memory().gathered_parameter_bytes(), 0);
  // fc.weight held S(0) but read whole by the rows split: stored 2,048, gathered 8,192 - 2,048.
  const ir::ValueId w = c.value("fc.weight");
  c.decisions.leaves[0][static_cast<std::size_t>(w)].placement = S(0);
  c.decisions.nodes[0][static_cast<std::size_t>(c.producer("y"))] = c.producing("y", 0, S(0));
  expect_states(c.memory().parameter_bytes_by_kind(), 2048 + 256, 2048, 4096);
  EXPECT_DOUBLE_EQ(c.memory().gathered_parameter_bytes(), 6144);
  // Read as held by the out-features split: nothing gathered.
  c.decisions.nodes[0][static_cast<std::size_t>(c.producer("y"))] = c.producing("y", 0, S(1));
  EXPECT_DOUBLE_EQ(c.memory().gathered_parameter_bytes(), 0);
  EXPECT_DOUBLE_EQ(c.memory().fp8_cast_bytes(), 0);  // float32, not fp8
}

TEST_F(ShardingMemoryTest, FullRecomputationKeepsOneLayerAndTheCheckpoints) {
  const ir::Graph layers = two_layers();
  // Two layers of linear -> tanh on [8, 64] float32 (2,048 bytes each activation): each
  // tanh keeps its output.
  const Candidate& plain = candidate(layers, four, f32_options({4}, 8));
  EXPECT_DOUBLE_EQ(plain.memory().recompute_checkpoint_bytes(), 0);
  EXPECT_DOUBLE_EQ(plain.memory().activation_bytes(), 2 * 2048);
  // Recomputed: one layer's tanh output at a time, plus the checkpoint of the activation
  // layer 1 reads (a0; layer 0 reads the input x, which is no checkpoint).
  ShardingModelOptions o = f32_options({4}, 8);
  o.recompute = plan::Recompute::Full;
  const Candidate& full = candidate(layers, four, o);
  EXPECT_DOUBLE_EQ(full.memory().recompute_checkpoint_bytes(), 2048);
  EXPECT_DOUBLE_EQ(full.memory().activation_bytes(), 2048 + 2048);
}

// The step's peak by liveness (ShardingMemory::step_peak) on stem_two_layers: x -> stem linear
// -> s -> (linear, tanh) -> a0 -> (linear, tanh) -> a1, float32, every rank holding every row.
// Saved: s (the first layer's linear keeps its input), a0 and a1 (each tanh keeps its output);
// a tanh's or a linear's backward holds its output's gradient and its input's (the stem's: its
// output's only: x is a batch input). Each weight's gradient: 64 x 64 x 4 = 16,384 bytes.
TEST_F(ShardingMemoryTest, TheStepPeaksAtOneMomentOfTheBackwardNotAtTheSumOfItsParts) {
  const ir::Graph g = stem_two_layers();
  // At 16 rows an activation is 4,096 bytes. Backward, in reverse: tanh1 holds 12,288 saved +
  // 8,192 in flight; linear1 8,192 + 16,384 of gradient + 8,192; tanh0 the same; linear0 4,096
  // + 32,768 + 8,192; the stem 4,096 (s) + 49,152 + 4,096 = 57,344, the most; the end 49,152.
  const StepPeak small = candidate(g, four, f32_options({4}, 16)).memory().step_peak();
  EXPECT_DOUBLE_EQ(small.saved, 4096);
  EXPECT_DOUBLE_EQ(small.gradients, 3 * 16384);
  EXPECT_DOUBLE_EQ(small.working, 4096);
  EXPECT_DOUBLE_EQ(small.total(), 57344);  // every saved activation and gradient: 61,440
  // At 256 rows (65,536 bytes an activation) tanh1's moment is the most: every saved
  // activation, no gradient yet, and its two gradients in flight.
  const StepPeak large = candidate(g, four, f32_options({4}, 256)).memory().step_peak();
  EXPECT_DOUBLE_EQ(large.saved, 3 * 65536);
  EXPECT_DOUBLE_EQ(large.gradients, 0);
  EXPECT_DOUBLE_EQ(large.working, 2 * 65536);
  // A rank with twice the rows (an uneven share) holds twice what scales with them, the same
  // gradients.
  EXPECT_DOUBLE_EQ(candidate(g, four, f32_options({4}, 256)).memory().step_peak(2).total(), 2 * 5 * 65536);
}

TEST_F(ShardingMemoryTest, ARecomputedBlockIsRebuiltAtItsBackwardBesideTheCheckpoints) {
  const ir::Graph g = stem_two_layers();
  ShardingModelOptions o = f32_options({4}, 256);
  o.recompute = plan::Recompute::Full;
  const Candidate& full = candidate(g, four, o);
  // The forward ends holding s (which the stem's output keeps: the first layer's checkpoint is
  // that tensor, not a second one) and a0 (layer 1's checkpoint); layer 1's backward rebuilds a1
  // beside them and holds its tanh's two gradients: 3 x 65,536 + 2 x 65,536, where the sum of
  // the parts (the checkpoints, one layer rebuilt, the stem's s, every gradient and the working
  // set beyond them) came to 393,216.
  const StepPeak peak = full.memory().step_peak();
  EXPECT_DOUBLE_EQ(peak.saved, 3 * 65536);
  EXPECT_DOUBLE_EQ(peak.gradients, 0);
  EXPECT_DOUBLE_EQ(peak.total(), 5 * 65536);
  EXPECT_DOUBLE_EQ(full.memory().activation_bytes() + 3 * 16384 + (2 * 65536 - 3 * 16384), 393216);
  // Later moments hold less: layer 0's backward rebuilds a0 after layer 1's checkpoint (that
  // same a0, kept from the forward) is freed: s, a0 and 16,384 of gradient, 131,072 in flight.
}

// A saved value is charged at the largest share a reader of it, or of a view of it, holds: here
// a row-split h, flattened, read whole by a second linear that saves what it reads (the
// all-gathered copy, as a sequence-parallel norm's output is gathered for the projection).
TEST_F(ShardingMemoryTest, AValueSavedThroughAViewIsChargedAtTheShareItsReaderHolds) {
  const ir::Graph g = ir::parse_graph(R"(graph(%x: f32[b8,64]) {
  %w0: f32[64,64] parameter
  %w1: f32[64,64] parameter
  %h: f32[b8,64] = aten::linear(%x, %w0) @a
  %flat: f32[b8,64] = aten::view(%h) {size=[8,64]}
  %y: f32[b8,64] = aten::linear(%flat, %w1) @b
  return (%y)
})");
  Candidate& c = candidate(g, four, f32_options({4}, 16));
  c.decisions.nodes[0][static_cast<std::size_t>(c.producer("h"))] = c.producing("h", 0, S(0));
  c.decisions.nodes[0][static_cast<std::size_t>(c.producer("flat"))] = c.producing("flat", 0, S(0));
  c.decisions.nodes[0][static_cast<std::size_t>(c.producer("y"))] = c.producing("y", 0, R());
  // h: 16 x 64 x 4 = 4,096 bytes whole, as the second linear reads (and keeps) it, where its
  // producer holds a quarter. The peak is the first linear's moment: h, both weights' gradients
  // (2 x 16,384) and h's quarter of gradient in flight.
  const StepPeak peak = c.memory().step_peak();
  EXPECT_DOUBLE_EQ(peak.saved, 4096);
  EXPECT_DOUBLE_EQ(peak.gradients, 2 * 16384);
  EXPECT_DOUBLE_EQ(peak.working, 1024);
}

}  // namespace
}  // namespace shardwise::search
