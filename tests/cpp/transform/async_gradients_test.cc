// Asynchronous activation gradients as a pass over the rank graph (transform/async_gradients.h):
// which input-gradient all-reduces it runs beside a weight gradient, read back as the binding
// reads them (async_gradient_operand), and the cases it leaves exposed. The printed program of
// the Megatron case is tests/golden/sharded_async_gradient.ir; the pass alone on a rank
// graph, tests/golden/async_gradient_pass.ir.
#include "transform/async_gradients.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "ir/parser.h"
#include "ir/printer.h"
#include "transform/job_rank_graph.h"
#include "transform/rank_graph.h"
#include "transform/rank_passes.h"

namespace shardwise::transform {
namespace {

// Megatron's MLP after a replicated layer: fc1 reads `fc1_input` (t by default).
ir::Graph mlp(const std::string& fc1_input = "%t", const std::string& extra = "",
              const std::string& loss = "%y") {
  return ir::parse_graph(R"(graph(%x: f32[8,16]) {
  %fc0.weight: f32[32,16] parameter
  %fc1.weight: f32[64,32] parameter
  %fc2.weight: f32[16,64] parameter
  %g: f32[8,32] = aten::linear(%x, %fc0.weight) {bias=none} @fc0
  %t: f32[8,32] = aten::tanh(%g) @act0
  %h: f32[8,64] = aten::linear()" + fc1_input + R"(, %fc1.weight) {bias=none} @fc1
  %act: f32[8,64] = aten::gelu(%h) {approximate="none"} @act
  %y: f32[8,16] = aten::linear(%act, %fc2.weight) {bias=none} @fc2
)" + extra + R"(  %loss: f32[] = aten::sum()" + loss + R"() {dtype=none}
  return (%loss)
})");
}

// fc1 column-parallel, fc2 row-parallel on the tensor axis of {1, 2}; `more` adds placements.
plan::Sharding megatron(const std::map<std::string, std::vector<std::string>>& more = {},
                        const std::map<std::string, std::vector<std::string>>& more_strategies = {}) {
  plan::Sharding s;
  s.mesh = {1, 2};
  s.axis_names = {"data", "tensor"};
  s.placements = {{"x", {"R", "R"}},           {"fc0.weight", {"R", "R"}}, {"fc1.weight", {"R", "S(0)"}},
                  {"fc2.weight", {"R", "S(1)"}}, {"g", {"R", "R"}},          {"t", {"R", "R"}},
                  {"h", {"R", "S(1)"}},          {"act", {"R", "S(1)"}},     {"y", {"R", "P(sum)"}},
                  {"loss", {"R", "P(sum)"}}};
  s.strategies = {{"g", {"replicate", "replicate"}}, {"t", {"replicate", "replicate"}},
                  {"h", {"replicate", "split n"}},   {"act", {"replicate", "split d1"}},
                  {"y", {"replicate", "split k"}},   {"loss", {"replicate", "partial"}}};
  for (const auto& [k, v] : more) s.placements[k] = v;
  for (const auto& [k, v] : more_strategies) s.strategies[k] = v;
  return s;
}

const ir::Node& call(const ir::Graph& g, const std::string& output) {
  return g.node(*g.value(*g.find_value(output)).producer);
}

std::string overlap(const ir::Graph& g, const std::string& value) {
  return std::get<std::string>(call(g, value).attrs.at("overlap"));
}

TEST(AsyncGradients, AColumnParallelInputsAllReduceRunsBesideItsWeightGradient) {
  const ir::Graph g = job_rank_graph(mlp(), megatron(), 1).graph;
  EXPECT_EQ(async_gradient_operand(call(g, "h")), 0);
  EXPECT_EQ(overlap(g, "t.r1"), "backward");
  // fc2 reads act as it is (no steps); the loss' all-reduce has no contraction beside it.
  EXPECT_EQ(async_gradient_operand(call(g, "y")), -1);
  EXPECT_EQ(overlap(g, "loss.r1"), "exposed");
}

TEST(AsyncGradients, APlanWithAsyncGradientsOffRunsNoPass) {
  plan::Sharding s = megatron();
  s.async_gradients = false;
  const ir::Graph g = job_rank_graph(mlp(), s, 1).graph;
  EXPECT_EQ(async_gradient_operand(call(g, "h")), -1);
  EXPECT_EQ(overlap(g, "t.r1"), "exposed");  // the all-reduce after fc1's backward, as rewritten
  EXPECT_FALSE(rank_passes()[0].enabled(s));
  EXPECT_TRUE(rank_passes()[0].enabled(megatron()));
}

TEST(AsyncGradients, ThePassMarksTheRewritesGraphAndASecondRunChangesNothing) {
  RankGraph rewritten = rank_graph(mlp(), megatron(), 1);  // the rewrite alone: every collective exposed
  ir::Graph& g = rewritten.graph;
  EXPECT_EQ(async_gradient_operand(call(g, "h")), -1);
  EXPECT_EQ(overlap(g, "t.r1"), "exposed");
  overlap_activation_gradients(g);
  EXPECT_EQ(async_gradient_operand(call(g, "h")), 0);
  EXPECT_EQ(overlap(g, "t.r1"), "backward");
  const std::string once = ir::print_graph(g);
  overlap_activation_gradients(g);
  EXPECT_EQ(ir::print_graph(g), once);
  EXPECT_EQ(once, ir::print_graph(job_rank_graph(mlp(), megatron(), 1).graph));
}

TEST(AsyncGradients, AnInputReadTwiceStaysExposed) {
  // t also feeds the loss: its gradient is the sum of two reads, not fc1's alone.
  const std::string extra = R"(  %ys: f32[] = aten::sum(%y) {dtype=none}
  %ts: f32[] = aten::sum(%t) {dtype=none}
  %z: f32[] = aten::add.Tensor(%ys, %ts) {alpha=1}
)";
  const ir::Graph g =
      job_rank_graph(mlp("%t", extra, "%z"),
                     megatron({{"ys", {"R", "P(sum)"}}, {"ts", {"R", "R"}}, {"z", {"R", "R"}}, {"loss", {"R", "R"}}},
                              {{"ys", {"replicate", "partial"}},
                               {"ts", {"replicate", "replicate"}},
                               {"z", {"replicate", "replicate"}},
                               {"loss", {"replicate", "replicate"}}}),
                     1)
          .graph;
  EXPECT_EQ(async_gradient_operand(call(g, "h")), -1);
  for (const ir::Node& node : g.nodes())
    if (node.op == "shardwise::all_reduce") EXPECT_NE(std::get<std::string>(node.attrs.at("overlap")), "backward");
}

TEST(AsyncGradients, ARegionWithAForwardStepStaysExposed) {
  // t held as a block of its rows: fc1 gathers it first, and its gradient goes back as a
  // reduce-scatter (collective matmul's case, not this pass's).
  const ir::Graph g =
      job_rank_graph(mlp(), megatron({{"t", {"R", "S(0)"}}, {"g", {"R", "S(0)"}}}, {{"g", {"replicate", "split _0"}},
                                                                                  {"t", {"replicate", "split d0"}}}),
                     1)
          .graph;
  EXPECT_EQ(async_gradient_operand(call(g, "h")), -1);
}

TEST(AsyncGradients, ANodeRunWholeIsNotSplit) {
  ir::Graph g = rank_graph(mlp(), megatron(), 1).graph;
  g.mutable_attrs(call(g, "h").id)["shardwise.whole"] = true;
  overlap_activation_gradients(g);
  EXPECT_EQ(async_gradient_operand(call(g, "h")), -1);
  EXPECT_EQ(overlap(g, "t.r1"), "exposed");
}

// A rank graph by hand: mm's input all-reduced in backward, its weight `weight`.
ir::Graph mm_reading(const std::string& weight) {
  return ir::parse_graph(R"(graph(%x: f32[8,32]) {
  %w: f32[32,32] parameter
  %wt: f32[32,32] = aten::t(%w)
  %x.r1: f32[8,32] = shardwise::all_reduce(%x) {axis=1, group=[0,1], overlap="exposed", pass="backward", reduce="sum"}
  %h: f32[8,32] = aten::mm(%x.r1, )" + weight + R"()
  %loss: f32[] = aten::sum(%h) {dtype=none}
  return (%loss)
})");
}

TEST(AsyncGradients, OnlyAParametersProductHidesTheAllReduce) {
  ir::Graph direct = mm_reading("%w");
  overlap_activation_gradients(direct);
  EXPECT_EQ(async_gradient_operand(call(direct, "h")), 0);
  EXPECT_EQ(overlap(direct, "x.r1"), "backward");
  // t(w) is computed: its gradient is not a product the runtime's split backward computes.
  ir::Graph transposed = mm_reading("%wt");
  overlap_activation_gradients(transposed);
  EXPECT_EQ(async_gradient_operand(call(transposed, "h")), -1);
  EXPECT_EQ(overlap(transposed, "x.r1"), "exposed");
}

}  // namespace
}  // namespace shardwise::transform
