#include "search/stage_partition.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "../analysis/gpt2_like_graph.h"
#include "analysis/repeated_blocks.h"
#include "support/error.h"

namespace shardwise::search {
namespace {

ir::TensorType f32(std::vector<std::int64_t> shape) { return ir::TensorType{ir::DType::F32, std::move(shape), {}}; }

// A chain x -> n0 -> n1 -> ... of `n` pointwise nodes on f32[2,8] (64 bytes per value).
ir::Graph chain(int n) {
  ir::Graph g;
  auto x = g.add_value("x", f32({2, 8}), ir::ValueRole::Input);
  for (int i = 0; i < n; ++i) {
    const auto node = g.add_node("aten::relu", {x}, {{"r" + std::to_string(i), f32({2, 8})}});
    x = g.node(node).outputs[0];
  }
  g.set_outputs({x});
  return g;
}

StagePartitionProblem chain_problem(std::vector<double> cost, int stages) {
  const auto g = chain(static_cast<int>(cost.size()));
  std::vector<double> mem(cost.size(), 1.0);
  auto p = problem_from_graph(g, std::move(cost), std::move(mem));
  p.stages = stages;
  return p;
}

// Two branches and a skip:
//   n0 a = relu(x)        f32[2,8]   64 B
//   n1 b = tanh(a)
//   n2 c = tanh(b)
//   n3 p = sigmoid(x)     f32[2,4]   32 B   (parallel branch)
//   n4 s = add(c, a)                        (skip from a)
//   n5 d = relu(s)
//   n6 out = cat(d, p)    f32[2,12]
ir::Graph two_branch() {
  ir::Graph g;
  const auto x = g.add_value("x", f32({2, 8}), ir::ValueRole::Input);
  auto out = [&](ir::NodeId n) { return g.node(n).outputs[0]; };
  const auto a = out(g.add_node("aten::relu", {x}, {{"a", f32({2, 8})}}));
  const auto b = out(g.add_node("aten::tanh", {a}, {{"b", f32({2, 8})}}));
  const auto c = out(g.add_node("aten::tanh", {b}, {{"c", f32({2, 8})}}));
  const auto p = out(g.add_node("aten::sigmoid", {x}, {{"p", f32({2, 4})}}));
  const auto s = out(g.add_node("aten::add.Tensor", {c, a}, {{"s", f32({2, 8})}}));
  const auto d = out(g.add_node("aten::relu", {s}, {{"d", f32({2, 8})}}));
  const auto o = out(g.add_node("aten::cat", {d, p}, {{"out", f32({2, 12})}}, {{"dim", std::int64_t{1}}}));
  g.set_outputs({o});
  return g;
}

TEST(StagePartition, EqualChainSplitsEvenly) {
  const auto result = partition_stages(chain_problem(std::vector<double>(8, 1.0), 4));
  EXPECT_EQ(result.stage_of_node, (std::vector<int>{0, 0, 1, 1, 2, 2, 3, 3}));
  EXPECT_EQ(result.cuts, (std::vector<int>{2, 4, 6}));
  EXPECT_EQ(result.stage_cost, (std::vector<double>{2, 2, 2, 2}));
  EXPECT_EQ(result.stage_memory, (std::vector<double>{2, 2, 2, 2}));
  EXPECT_DOUBLE_EQ(result.bottleneck, 2.0);
  ASSERT_EQ(result.cross_edges.size(), 3u);
  EXPECT_EQ(result.cross_edges[0], (CrossStageEdge{2, "r1", 0, 1, 64.0}));  // value 0 is x
  EXPECT_EQ(result.stage_recv_bytes, (std::vector<double>{0, 64, 64, 64}));
}

TEST(StagePartition, UnequalChainExactBalance) {
  // Prefix sums 3,4,6,10,12,13,16,18: the only bottleneck-6 cut is after 6 and 12.
  const auto result = partition_stages(chain_problem({3, 1, 2, 4, 2, 1, 3, 2}, 3));
  EXPECT_EQ(result.cuts, (std::vector<int>{3, 5}));
  EXPECT_EQ(result.stage_cost, (std::vector<double>{6, 6, 6}));
  EXPECT_DOUBLE_EQ(result.bottleneck, 6.0);
}

TEST(StagePartition, UnequalChainMinMax) {
  // 16 in 3 stages: 5 cannot share with more than one 1 ({5,1} = 6), and the rest
  // [1,1,1,1,4,2] splits into 4 and 6, so 6 is optimal (5.33 is the average).
  const auto result = partition_stages(chain_problem({5, 1, 1, 1, 1, 1, 4, 2}, 3));
  EXPECT_DOUBLE_EQ(result.bottleneck, 6.0);
  EXPECT_DOUBLE_EQ(*std::max_element(result.stage_cost.begin(), result.stage_cost.end()), 6.0);
  double total = 0;
  for (const double c : result.stage_cost) total += c;
  EXPECT_DOUBLE_EQ(total, 16.0);
}

TEST(StagePartition, TwoBranchNetworkWithSkip) {
  const auto g = two_branch();
  auto p = problem_from_graph(g, {2, 2, 2, 2, 1, 1, 2}, std::vector<double>(7, 1.0));
  // Edges: one per (activation, reader); graph input x is not an edge.
  ASSERT_EQ(p.edges.size(), 7u);
  EXPECT_EQ(p.edges[0], (Edge{0, 1, 64.0, g.find_value("a").value(), "a"}));
  p.stages = 3;
  const auto result = partition_stages(p);
  // Prefix sums 2,4,6,8,9,10,12: the balanced cut is {n0,n1} {n2,n3} {n4,n5,n6}.
  EXPECT_EQ(result.stage_of_node, (std::vector<int>{0, 0, 1, 1, 2, 2, 2}));
  EXPECT_EQ(result.stage_cost, (std::vector<double>{4, 4, 4}));
  EXPECT_DOUBLE_EQ(result.bottleneck, 4.0);
  const auto id = [&](const char* name) { return g.find_value(name).value(); };
  const std::vector<CrossStageEdge> expected{
      {id("a"), "a", 0, 2, 64.0},  // the skip jumps over stage 1
      {id("b"), "b", 0, 1, 64.0},
      {id("c"), "c", 1, 2, 64.0},
      {id("p"), "p", 1, 2, 32.0},  // the parallel branch
  };
  EXPECT_EQ(result.cross_edges, expected);
  // Forwarding: a crosses both cuts (received and passed on by stage 1).
  EXPECT_EQ(result.stage_recv_bytes, (std::vector<double>{0, 128, 160}));
}

TEST(StagePartition, ValueReadTwiceInOneStageCountsOnce) {
  const auto g = two_branch();
  auto p = problem_from_graph(g, {1, 1, 1, 1, 1, 1, 1}, std::vector<double>(7, 1.0));
  p.stages = 2;
  p.cut_candidates = {1};  // a goes to n1 and n4, both in stage 1
  const auto result = partition_stages(p);
  ASSERT_EQ(result.cross_edges.size(), 1u);
  EXPECT_EQ(result.cross_edges[0], (CrossStageEdge{g.find_value("a").value(), "a", 0, 1, 64.0}));
  EXPECT_EQ(result.stage_recv_bytes, (std::vector<double>{0, 64}));
}

TEST(StagePartition, BandwidthAvoidsLargeCut) {
  StagePartitionProblem p;
  p.node_cost = {1, 1, 1, 1};
  p.node_memory = {0, 0, 0, 0};
  p.edges = {{0, 1, 8, 0, "v0"}, {1, 2, 1000, 1, "v1"}, {2, 3, 8, 2, "v2"}};
  p.stages = 2;
  EXPECT_EQ(partition_stages(p).cuts, (std::vector<int>{2}));  // communication free
  p.bandwidth = 100;                                           // the cut at 2 now costs 10
  const auto result = partition_stages(p);
  EXPECT_EQ(result.cuts, (std::vector<int>{3}));  // max(3, 1 + 0.08) beats max(1, 3 + 0.08)
  EXPECT_DOUBLE_EQ(result.bottleneck, 3.0);
}

TEST(StagePartition, MemoryLimitForcesDifferentCut) {
  auto p = chain_problem(std::vector<double>(8, 1.0), 4);
  p.node_memory = {1, 1, 1, 1, 1, 1, 6, 6};
  p.memory_limit = 7;
  const auto result = partition_stages(p);
  EXPECT_NE(result.stage_of_node[6], result.stage_of_node[7]);
  EXPECT_EQ(result.stage_of_node[7], 3);
  EXPECT_DOUBLE_EQ(result.bottleneck, 3.0);  // 7 nodes left for 3 stages
  for (const double m : result.stage_memory) EXPECT_LE(m, 7.0);
}

TEST(StagePartition, InfeasibleMemoryNamesMinimum) {
  auto p = chain_problem(std::vector<double>(4, 1.0), 2);
  p.node_memory = {5, 5, 5, 5};
  p.memory_limit = 9;
  try {
    partition_stages(p);
    FAIL() << "expected ValidationError";
  } catch (const support::ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find("the best cut needs 10 per stage"), std::string::npos) << e.what();
  }
}

TEST(StagePartition, TooFewNodes) {
  EXPECT_THROW(partition_stages(chain_problem({1, 1}, 3)), support::ValidationError);
  EXPECT_THROW(problem_from_graph(chain(3), {1, 1}, {1, 1, 1}), support::ValidationError);
}

TEST(StagePartition, Deterministic) {
  const auto g = two_branch();
  auto p = problem_from_graph(g, std::vector<double>(7, 1.0), std::vector<double>(7, 1.0));
  p.stages = 3;
  const auto first = partition_stages(p);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(partition_stages(p), first);
  EXPECT_DOUBLE_EQ(first.bottleneck, 3.0);
}

TEST(StagePartition, RepeatedBlockBoundaries) {
  analysis::testing::Gpt2Config config;
  config.layers = 4;
  config.hidden = 64;
  config.heads = 4;
  const auto g = analysis::testing::Gpt2Builder(config).build();
  const auto cuts = block_boundary_cuts(g);
  ASSERT_FALSE(cuts.empty());
  const auto groups = analysis::find_repeated_blocks(g);
  ASSERT_EQ(groups.size(), 1u);
  const auto n = g.nodes().size();
  auto p = problem_from_graph(g, std::vector<double>(n, 1.0), std::vector<double>(n, 0.0));
  p.stages = 2;
  p.cut_candidates = cuts;
  const auto result = partition_stages(p);
  ASSERT_EQ(result.cuts.size(), 1u);
  // The cut falls at the start of a layer: layer 2 of 4 (equal layers, balanced).
  EXPECT_EQ(result.cuts[0], groups[0].nodes[2].front());
}

}  // namespace
}  // namespace shardwise::search
