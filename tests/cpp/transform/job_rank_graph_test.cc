#include "transform/job_rank_graph.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "ir/parser.h"
#include "ir/printer.h"
#include "megatron_mlp_plan.h"

namespace shardwise::transform {
namespace {

using Names = std::set<std::string>;

Names whole(const RankGraph& r) { return {r.whole.begin(), r.whole.end()}; }

// A batch of 8 rows in uneven shares 0.3 / 0.2 / 0.25 / 0.25 (2 rows each: the bounds
// round) viewed as 32 rows of 16: the view's output takes the same shares of its 32 rows
// (10, 6, 8 and 8). The last two ranks' local views fit (2 x 4 = 8 rows); the first two run
// the view whole, each deciding on its own.
constexpr const char* kUnevenView = R"(graph(%x: f32[b8,4,16]) {
  %flat: f32[b32,16] = aten::view(%x) {size=[-1,16]}
  %sum: f32[] = aten::sum(%flat) {dtype=none}
  return (%sum)
})";

plan::Sharding uneven_view_plan() {
  plan::Sharding s;
  s.mesh = {4};
  s.axis_names = {"data"};
  s.placements = {{"x", {"S(0)[0.3,0.2,0.25,0.25]"}}, {"flat", {"S(0)"}}, {"sum", {"P(sum)"}}};
  s.strategies = {{"flat", {"split i0"}}, {"sum", {"split r0"}}};
  s.leaves = {"x"};
  return s;
}


TEST(WholeNodeRanks, AnEvenPlanIsDecidedByTheRankAlone) {
  const ir::Graph g = testing_plans::megatron_mlp_graph();
  const plan::Sharding s = testing_plans::megatron_mlp();  // mesh {2, 2}, no ratios
  for (int rank = 0; rank < 4; ++rank) EXPECT_EQ(whole_node_ranks(g, s, rank), std::vector<int>{rank});
}

TEST(WholeNodeRanks, OneRankForEachSetOfBlockSizesAlongAnUnevenAxis) {
  const ir::Graph g = ir::parse_graph(kUnevenView);
  plan::Sharding s = uneven_view_plan();
  // x's blocks are 2 rows on every rank, flat's (the shares spread over its batch dim) 10, 6,
  // 8 and 8: ranks 2 and 3 hold blocks of the same sizes, each standing for the other.
  EXPECT_EQ(whole_node_ranks(g, s, 0), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(whole_node_ranks(g, s, 3), (std::vector<int>{0, 1, 3}));
  s.placements["x"] = {"S(0)[0.25,0.25,0.25,0.25]"};  // ratios, but every block alike
  EXPECT_EQ(whole_node_ranks(g, s, 2), (std::vector<int>{2}));
}

TEST(WholeNodeRanks, EveryCombinationOfSeveralUnevenAxes) {
  const ir::Graph g = testing_plans::megatron_mlp_graph();
  plan::Sharding s = testing_plans::megatron_mlp();
  s.placements["x"] = {"S(0)[0.25,0.75]", "R"};
  s.placements["fc1.weight"] = {"R", "S(0)[0.75,0.25]"};
  EXPECT_EQ(whole_node_ranks(g, s, 3), (std::vector<int>{0, 1, 2, 3}));
}

TEST(JobRankGraph, ANodeOneRankRunsWholeRunsWholeOnEveryRank) {
  const ir::Graph g = ir::parse_graph(kUnevenView);
  const plan::Sharding s = uneven_view_plan();
  std::vector<Names> alone;
  for (int rank = 0; rank < 4; ++rank) alone.push_back(whole(rank_graph(g, s, rank)));
  ASSERT_EQ(alone, (std::vector<Names>{{"flat"}, {"flat"}, {}, {}}));  // the case: each rank alone differs
  for (int rank = 0; rank < 4; ++rank) {
    const RankGraph r = job_rank_graph(g, s, rank);
    EXPECT_EQ(whole(r), Names{"flat"}) << rank;
    EXPECT_EQ(r.rank, rank);
    EXPECT_NE(ir::print_graph(r.graph).find("shardwise.whole"), std::string::npos) << ir::print_graph(r.graph);
  }
}

TEST(JobRankGraph, WhatEveryRankDecidesAloneIsTheJobsGraph) {
  const ir::Graph g = testing_plans::megatron_mlp_graph();
  const plan::Sharding s = testing_plans::megatron_mlp();
  for (int rank = 0; rank < 4; ++rank)
    EXPECT_EQ(ir::print_graph(job_rank_graph(g, s, rank).graph), ir::print_graph(rank_graph(g, s, rank).graph)) << rank;
}

}  // namespace
}  // namespace shardwise::transform
