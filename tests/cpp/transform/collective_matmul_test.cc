// Which tensor-parallel collectives the rewrite runs as collective matmuls
// (transform/collective_matmul.h), and the rule it shares with the search
// (search/parameter_collectives.h: collective_matmul_input, collective_matmul_rows). The
// printed program of the same case is tests/golden/sharded_collective_matmul.ir.
#include "transform/collective_matmul.h"

#include <gtest/gtest.h>

#include <string>

#include "ir/parser.h"
#include "search/parameter_collectives.h"
#include "transform/spmd_rewrite.h"

namespace shardwise::transform {
namespace {

using search::MatmulCollective;

// A gated MLP after a norm: up and gate read the norm's output, down's output goes to the
// residual add; `extra` adds nodes before the loss.
ir::Graph gated_mlp(const std::string& extra = "") {
  return ir::parse_graph(R"(graph(%x: f32[b2,8,16]) {
  %ln.weight: f32[16] parameter
  %ln.bias: f32[16] parameter
  %up.weight: f32[32,16] parameter
  %gate.weight: f32[32,16] parameter
  %down.weight: f32[16,32] parameter
  %n: f32[b2,8,16] = aten::layer_norm(%x, %ln.weight, %ln.bias) {cudnn_enable=true, eps=1e-05, normalized_shape=[16]} @ln
  %u: f32[b2,8,32] = aten::linear(%n, %up.weight) {bias=none} @up
  %g: f32[b2,8,32] = aten::linear(%n, %gate.weight) {bias=none} @gate
  %m: f32[b2,8,32] = aten::mul.Tensor(%u, %g) @mlp
  %d: f32[b2,8,16] = aten::linear(%m, %down.weight) {bias=none} @down
  %y: f32[b2,8,16] = aten::add.Tensor(%x, %d) {alpha=1} @mlp
)" + extra + R"(  %loss: f32[] = aten::sum(%y) {dtype=none}
  return (%loss)
})");
}

// Sequence parallelism on the tensor axis of {1, 2}: the norm and the residual cut along the
// sequence, up and gate column-parallel, down row-parallel.
plan::Sharding sequence_parallel(bool collective_matmul) {
  plan::Sharding s;
  s.mesh = {1, 2};
  s.axis_names = {"data", "tensor"};
  s.collective_matmul = collective_matmul;
  s.placements = {{"x", {"R", "S(1)"}},           {"ln.weight", {"R", "R"}},   {"ln.bias", {"R", "R"}},
                  {"up.weight", {"R", "S(0)"}},   {"gate.weight", {"R", "S(0)"}}, {"down.weight", {"R", "S(1)"}},
                  {"n", {"R", "S(1)"}},           {"u", {"R", "S(2)"}},        {"g", {"R", "S(2)"}},
                  {"m", {"R", "S(2)"}},           {"d", {"R", "P(sum)"}},      {"y", {"R", "S(1)"}},
                  {"loss", {"R", "P(sum)"}}};
  s.strategies = {{"n", {"replicate", "split d1"}}, {"u", {"replicate", "split n"}},
                  {"g", {"replicate", "split n"}},  {"m", {"replicate", "split d2"}},
                  {"d", {"replicate", "split k"}},  {"y", {"replicate", "split d1"}},
                  {"loss", {"replicate", "split r1"}}};
  return s;
}

const NodeRewrite& node_of(const ir::Graph& g, const RankProgram& p, const std::string& output) {
  for (const NodeRewrite& rw : p.nodes)
    if (g.value(g.node(rw.node).outputs[0]).name == output) return rw;
  throw std::runtime_error("no node " + output);
}

TEST(CollectiveMatmul, TheFirstReaderRunsTheGatherAndTheRowParallelProductTheScatter) {
  const ir::Graph g = gated_mlp();
  const RankProgram p = rank_program(g, sequence_parallel(true), 1);
  // up reads the gathered norm output first: its ring; gate reads what the ring assembled.
  EXPECT_EQ(node_of(g, p, "u").inputs[0].matmul, MatmulCollective::Gather);
  EXPECT_EQ(node_of(g, p, "g").inputs[0].matmul, MatmulCollective::None);
  EXPECT_EQ(node_of(g, p, "g").inputs[0].forward, node_of(g, p, "u").inputs[0].forward);
  // down's Partial output, reduce-scattered for the add: down runs that ring.
  const NodeRewrite& down = node_of(g, p, "d");
  ASSERT_EQ(down.matmul_scatter_forward.size(), 1u);
  EXPECT_EQ(down.matmul_scatter_forward[0].str(), "reduce_scatter(axis 1, dim 1)");
  ASSERT_EQ(down.matmul_scatter_backward.size(), 1u);
  EXPECT_EQ(down.matmul_scatter_backward[0].str(), "all_gather(axis 1, dim 1)");
  EXPECT_EQ(node_of(g, p, "y").inputs[1].matmul, MatmulCollective::Scatter);
  // The loss' all-reduce has no contraction beside it.
  EXPECT_EQ(p.outputs[0].matmul, MatmulCollective::None);
}

TEST(CollectiveMatmul, NoneWithoutThePlansOption) {
  const ir::Graph g = gated_mlp();
  const RankProgram p = rank_program(g, sequence_parallel(false), 1);
  for (const NodeRewrite& rw : p.nodes) {
    EXPECT_TRUE(rw.matmul_scatter_forward.empty());
    for (const OperandRewrite& op : rw.inputs) EXPECT_EQ(op.matmul, MatmulCollective::None) << op.value;
  }
}

TEST(CollectiveMatmul, AProductReadTwiceKeepsItsScatter) {
  // A second reader of down's output (its own reduce-scatter): the ring would serve one.
  const ir::Graph g = gated_mlp(
      "  %z: f32[b2,8,16] = aten::neg(%d) @mlp\n"
      "  %w: f32[b2,8,16] = aten::add.Tensor(%y, %z) {alpha=1} @mlp\n");
  plan::Sharding s = sequence_parallel(true);
  s.placements["z"] = {"R", "S(1)"};
  s.placements["w"] = {"R", "S(1)"};
  s.strategies["z"] = {"replicate", "split d1"};
  s.strategies["w"] = {"replicate", "split d1"};
  const RankProgram p = rank_program(g, s, 1);
  EXPECT_TRUE(node_of(g, p, "d").matmul_scatter_forward.empty());
  EXPECT_EQ(node_of(g, p, "y").inputs[1].matmul, MatmulCollective::None);
  EXPECT_EQ(node_of(g, p, "u").inputs[0].matmul, MatmulCollective::Gather);  // the gather still rings
}

TEST(CollectiveMatmulRows, OnlyTheContractionsRowsMayBeCut) {
  const ir::Graph g = ir::parse_graph(R"(graph(%x: f32[4,8,16], %a: f32[8,16]) {
  %w: f32[32,16] parameter
  %v: f32[16,32] parameter
  %b: f32[32] parameter
  %c: f32[8,32] parameter
  %l: f32[4,8,32] = aten::linear(%x, %w) {bias=none}
  %m: f32[8,32] = aten::mm(%a, %v)
  %k: f32[8,32] = aten::addmm(%b, %a, %v) {alpha=1, beta=1}
  %k2: f32[8,32] = aten::addmm(%c, %a, %v) {alpha=1, beta=1}
  %t: f32[8,32] = aten::tanh(%m)
  return (%l, %t, %k, %k2)
})");
  const ir::Node& linear = g.node(0);
  const ir::Node& mm = g.node(1);
  const ir::Node& addmm = g.node(2);
  const ir::Node& addmm_matrix_bias = g.node(3);
  const ir::Node& tanh = g.node(4);
  EXPECT_EQ(search::collective_matmul_input(g, linear), 0);
  EXPECT_TRUE(search::collective_matmul_rows(g, linear, 0));
  EXPECT_TRUE(search::collective_matmul_rows(g, linear, 1));
  EXPECT_FALSE(search::collective_matmul_rows(g, linear, 2));  // the contracted dim
  EXPECT_EQ(search::collective_matmul_input(g, mm), 0);
  EXPECT_TRUE(search::collective_matmul_rows(g, mm, 0));
  EXPECT_FALSE(search::collective_matmul_rows(g, mm, 1));
  EXPECT_EQ(search::collective_matmul_input(g, addmm), 1);
  EXPECT_TRUE(search::collective_matmul_rows(g, addmm, 0));
  // A matrix bias would need its rows cut too; not a contraction the ring runs.
  EXPECT_EQ(search::collective_matmul_input(g, addmm_matrix_bias), -1);
  EXPECT_EQ(search::collective_matmul_input(g, tanh), -1);
  EXPECT_FALSE(search::collective_matmul_rows(g, tanh, 0));
}

}  // namespace
}  // namespace shardwise::transform
