// Collective matmul as a pass over the rank graph (transform/collective_matmul.h): which
// tensor-parallel collectives it runs as rings, read back as the binding reads them
// (operand_ring, scatter_ring), and the rule it shares with the search
// (search/parameter_collectives.h: collective_matmul_input, collective_matmul_rows). The
// printed program of the same case is tests/golden/sharded_collective_matmul.ir; the pass
// alone on a rank graph, tests/golden/collective_matmul_pass.ir.
#include "transform/collective_matmul.h"

#include <gtest/gtest.h>

#include <string>

#include "ir/parser.h"
#include "ir/printer.h"
#include "search/parameter_collectives.h"
#include "transform/job_rank_graph.h"
#include "transform/rank_graph.h"
#include "transform/rank_passes.h"
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

const ir::Node& call(const ir::Graph& g, const std::string& output) {
  return g.node(*g.value(*g.find_value(output)).producer);
}

std::string overlap(const ir::Graph& g, const std::string& value) {
  return std::get<std::string>(call(g, value).attrs.at("overlap"));
}

TEST(CollectiveMatmul, TheFirstReaderRunsTheGatherAndTheRowParallelProductTheScatter) {
  const ir::Graph g = job_rank_graph(gated_mlp(), sequence_parallel(true), 1).graph;
  // up reads the gathered norm output first: its ring; gate reads what the ring assembled.
  EXPECT_EQ(std::get<std::int64_t>(call(g, "u").attrs.at("shardwise.gather_matmul")), 0);
  EXPECT_EQ(operand_ring(g, call(g, "u"), 0), MatmulCollective::Gather);
  EXPECT_EQ(operand_ring(g, call(g, "g"), 0), MatmulCollective::None);
  EXPECT_EQ(call(g, "g").inputs[0], call(g, "u").inputs[0]);
  EXPECT_EQ(overlap(g, "n.r1.s1"), "matmul");
  EXPECT_EQ(overlap(g, "n.r1"), "matmul");
  // down's Partial output, reduce-scattered for the add: down runs that ring.
  const auto ring = scatter_ring(g, call(g, "d"));
  ASSERT_TRUE(ring.has_value());
  ASSERT_EQ(ring->forward.size(), 1u);
  EXPECT_EQ(ring->forward[0].str(), "reduce_scatter(axis 1, dim 1)");
  ASSERT_EQ(ring->backward.size(), 1u);
  EXPECT_EQ(ring->backward[0].str(), "all_gather(axis 1, dim 1)");
  EXPECT_EQ(operand_ring(g, call(g, "y"), 1), MatmulCollective::Scatter);
  EXPECT_EQ(operand_ring(g, call(g, "y"), 0), MatmulCollective::None);
  EXPECT_FALSE(scatter_ring(g, call(g, "u")).has_value());
  // The loss' all-reduce has no contraction beside it.
  EXPECT_EQ(overlap(g, "loss.r1"), "exposed");
}

TEST(CollectiveMatmul, NoneWithoutThePlansOption) {
  const ir::Graph g = job_rank_graph(gated_mlp(), sequence_parallel(false), 1).graph;
  for (const ir::Node& node : g.nodes()) {
    EXPECT_FALSE(node.attrs.contains("shardwise.gather_matmul"));
    EXPECT_FALSE(node.attrs.contains("shardwise.matmul_scatter"));
    if (auto it = node.attrs.find("overlap"); it != node.attrs.end())
      EXPECT_NE(std::get<std::string>(it->second), "matmul");
    for (std::size_t i = 0; i < node.inputs.size(); ++i) EXPECT_EQ(operand_ring(g, node, i), MatmulCollective::None);
  }
}

TEST(CollectiveMatmul, ThePassOnTheRewritesGraphIsWhatTheJobRuns) {
  // The rewrite emits no ring: the pass alone, on the graph of a plan without the option,
  // gives the job's graph of the plan with it, and a second run changes nothing.
  ir::Graph plain = job_rank_graph(gated_mlp(), sequence_parallel(false), 1).graph;
  const std::string job = ir::print_graph(job_rank_graph(gated_mlp(), sequence_parallel(true), 1).graph);
  EXPECT_NE(ir::print_graph(plain), job);
  fuse_collective_matmuls(plain);
  EXPECT_EQ(ir::print_graph(plain), job);
  fuse_collective_matmuls(plain);
  EXPECT_EQ(ir::print_graph(plain), job);
  // Registered after async-gradient (an all-reduce region is never a ring), on the plan's option.
  ASSERT_EQ(rank_passes().size(), 2u);
  EXPECT_EQ(rank_passes()[0].name, "async-gradient");
  EXPECT_EQ(rank_passes()[1].name, "collective-matmul");
  EXPECT_TRUE(rank_passes()[1].enabled(sequence_parallel(true)));
  EXPECT_FALSE(rank_passes()[1].enabled(sequence_parallel(false)));
}

TEST(CollectiveMatmul, AProductReadTwiceKeepsItsScatter) {
  // A second reader of down's output (its own reduce-scatter): the ring would serve one.
  const ir::Graph global = gated_mlp(
      "  %z: f32[b2,8,16] = aten::neg(%d) @mlp\n"
      "  %w: f32[b2,8,16] = aten::add.Tensor(%y, %z) {alpha=1} @mlp\n");
  plan::Sharding s = sequence_parallel(true);
  s.placements["z"] = {"R", "S(1)"};
  s.placements["w"] = {"R", "S(1)"};
  s.strategies["z"] = {"replicate", "split d1"};
  s.strategies["w"] = {"replicate", "split d1"};
  const ir::Graph g = job_rank_graph(global, s, 1).graph;
  EXPECT_FALSE(call(g, "d").attrs.contains("shardwise.matmul_scatter"));
  EXPECT_EQ(operand_ring(g, call(g, "y"), 1), MatmulCollective::None);
  EXPECT_EQ(operand_ring(g, call(g, "u"), 0), MatmulCollective::Gather);  // the gather still rings
}

TEST(CollectiveMatmul, OnlyOneEvenExposedCollectiveAlongARowRings) {
  // Hand-written rank graphs of a tensor axis of 2: each gather but the first is refused.
  const ir::Graph before = ir::parse_graph(R"(graph(%x: f32[4,16], %y: f32[4,16], %z: f32[4,16]) {
  %w: f32[8,16] parameter
  %v: f32[16,8] parameter
  %a: f32[4,16] = aten::tanh(%x)
  %a.r1.s1: f32[8,16] = shardwise::all_gather(%a) {axis=0, dim=0, group=[0,1], overlap="exposed"}
  %a.r1: f32[8,16] = shardwise::reduce_scatter(%a.r1.s1) {axis=0, dim=0, group=[0,1], overlap="exposed", pass="backward"}
  %ok: f32[8,8] = aten::linear(%a.r1, %w) {bias=none}
  %b: f32[4,16] = aten::tanh(%y)
  %b.r1.s1: f32[8,16] = shardwise::all_gather(%b) {axis=0, dim=0, group=[0,1], overlap="exposed", ratios=[0.25,0.75]}
  %b.r1: f32[8,16] = shardwise::reduce_scatter(%b.r1.s1) {axis=0, dim=0, group=[0,1], overlap="exposed", pass="backward"}
  %uneven: f32[8,8] = aten::linear(%b.r1, %w) {bias=none}
  %c: f32[4,16] = aten::tanh(%z)
  %c.r1.s1: f32[4,32] = shardwise::all_gather(%c) {axis=0, dim=1, group=[0,1], overlap="exposed"}
  %c.r1: f32[4,32] = shardwise::reduce_scatter(%c.r1.s1) {axis=0, dim=1, group=[0,1], overlap="exposed", pass="backward"}
  %contracted: f32[4,8] = aten::mm(%c.r1, %v)
  %d: f32[4,16] = aten::neg(%x)
  %d.r1.s1: f32[8,16] = shardwise::all_gather(%d) {axis=0, dim=0, group=[0,1], overlap="exposed"}
  %d.r1: f32[8,16] = shardwise::all_reduce(%d.r1.s1) {axis=0, group=[0,1], overlap="backward", pass="backward", reduce="sum"}
  %async: f32[8,8] = aten::linear(%d.r1, %w) {bias=none}
  %e: f32[4,16] = aten::sin(%x)
  %e.r1: f32[8,16] = shardwise::all_gather(%e) {axis=0, dim=0, group=[0,1], overlap="exposed"}
  %whole: f32[8,8] = aten::linear(%e.r1, %w) {bias=none, shardwise.whole=true}
  return (%ok, %uneven, %contracted, %async, %whole)
})");
  ir::Graph g = before;
  fuse_collective_matmuls(g);
  EXPECT_EQ(operand_ring(g, call(g, "ok"), 0), MatmulCollective::Gather);
  EXPECT_EQ(overlap(g, "a.r1.s1"), "matmul");
  for (const char* refused : {"uneven", "contracted", "async", "whole"}) {
    EXPECT_EQ(operand_ring(g, call(g, refused), 0), MatmulCollective::None) << refused;
    EXPECT_EQ(call(g, refused).attrs, call(before, refused).attrs) << refused;
  }
  for (const char* step : {"b.r1.s1", "c.r1.s1", "d.r1.s1", "e.r1"}) EXPECT_EQ(overlap(g, step), "exposed") << step;
}

TEST(CollectiveMatmul, AProductWhoseInputGradientIsReducedBesideItsWeightsHasNoRing) {
  // GPT-NeoX's attention output under ZeRO and selective recomputation on 2 x 2 (found by
  // test_lowered_programs.py): the product's input gradient all-reduces on the data axis in
  // its backward (async-gradient's mark) and its output reduce-scatters on the tensor axis.
  // The runtime runs a marked call as one module of its own, so a ring there dropped the
  // all-reduce: the product keeps its exposed reduce-scatter.
  const ir::Graph before = ir::parse_graph(R"(graph(%x: f32[8,16]) {
  %w: f32[16,16] parameter
  %v: f32[16,16] parameter
  %a: f32[8,16] = aten::tanh(%x)
  %a.r1: f32[8,16] = shardwise::all_reduce(%a) {axis=0, group=[0,2], overlap="backward", pass="backward", reduce="sum"}
  %async: f32[8,16] = aten::linear(%a.r1, %w) {bias=none, shardwise.async_gradient=0}
  %async.r1: f32[4,16] = shardwise::reduce_scatter(%async) {axis=1, dim=0, group=[0,1], overlap="exposed"}
  %async.r1.b: f32[4,16] = shardwise::all_gather(%async.r1) {axis=1, dim=0, group=[0,1], overlap="exposed", pass="backward"}
  %y: f32[4,16] = aten::neg(%async.r1.b)
  %plain: f32[8,16] = aten::linear(%x, %v) {bias=none}
  %plain.r1: f32[4,16] = shardwise::reduce_scatter(%plain) {axis=1, dim=0, group=[0,1], overlap="exposed"}
  %plain.r1.b: f32[4,16] = shardwise::all_gather(%plain.r1) {axis=1, dim=0, group=[0,1], overlap="exposed", pass="backward"}
  %z: f32[4,16] = aten::neg(%plain.r1.b)
  return (%y, %z)
})");
  ir::Graph g = before;
  fuse_collective_matmuls(g);
  EXPECT_EQ(call(g, "async").attrs, call(before, "async").attrs);
  EXPECT_FALSE(scatter_ring(g, call(g, "async")).has_value());
  EXPECT_EQ(overlap(g, "async.r1"), "exposed");
  // The same product without the mark rings (the case above is refused for the mark alone).
  EXPECT_TRUE(call(g, "plain").attrs.contains("shardwise.matmul_scatter"));
  EXPECT_EQ(overlap(g, "plain.r1"), "matmul");
}

TEST(CollectiveMatmul, AnFp8LinearRingsAsAnyProduct) {
  // A plan in fp8 marks its linears (transform/fp8_axes.h); the runtime runs their float8
  // products block by block inside the ring (runtime/collective_matmul.py, Fp8Products), so the pass marks
  // them as any contraction, keeping the FP8 marks.
  const ir::Graph before = ir::parse_graph(R"(graph(%x: f32[8,16]) {
  %w: f32[16,16] parameter
  %fp8: f32[8,16] = aten::linear(%x, %w) {bias=none, shardwise.fp8_k_axes=[1], shardwise.fp8_n_axes=[]}
  %fp8.r1: f32[4,16] = shardwise::reduce_scatter(%fp8) {axis=1, dim=0, group=[0,1], overlap="exposed"}
  %fp8.r1.b: f32[4,16] = shardwise::all_gather(%fp8.r1) {axis=1, dim=0, group=[0,1], overlap="exposed", pass="backward"}
  %y: f32[4,16] = aten::neg(%fp8.r1.b)
  return (%y)
})");
  ir::Graph g = before;
  fuse_collective_matmuls(g);
  EXPECT_TRUE(call(g, "fp8").attrs.contains("shardwise.matmul_scatter"));
  EXPECT_TRUE(call(g, "fp8").attrs.contains("shardwise.fp8_k_axes"));
  EXPECT_EQ(overlap(g, "fp8.r1"), "matmul");
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
