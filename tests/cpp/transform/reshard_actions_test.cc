#include "transform/reshard_actions.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/error.h"

namespace shardwise::transform {
namespace {

search::ShardingSpec spec(const std::vector<std::string>& texts) {
  search::ShardingSpec out;
  for (const auto& t : texts) out.push_back(search::parse_placement(t));
  return out;
}

std::vector<std::string> steps(const std::vector<std::string>& from, const std::vector<std::string>& to) {
  std::vector<std::string> out;
  for (const auto& a : reshard_actions(spec(from), spec(to))) out.push_back(a.str());
  return out;
}

using Steps = std::vector<std::string>;

TEST(ReshardActions, OneAxis) {
  EXPECT_EQ(steps({"R"}, {"R"}), Steps{});
  EXPECT_EQ(steps({"R"}, {"S(1)"}), Steps{"slice(axis 0, dim 1)"});
  EXPECT_EQ(steps({"R"}, {"S(1,g3)"}), Steps{"slice(axis 0, dim 1, g3)"});
  EXPECT_EQ(steps({"R"}, {"P(sum)"}), Steps{"zero_others(axis 0)"});
  EXPECT_EQ(steps({"R"}, {"P(mean)"}), Steps{});
  EXPECT_EQ(steps({"S(0)"}, {"R"}), Steps{"all_gather(axis 0, dim 0)"});
  EXPECT_EQ(steps({"S(2,g3)"}, {"R"}), Steps{"all_gather(axis 0, dim 2, g3)"});
  EXPECT_EQ(steps({"S(0)"}, {"S(1)"}), Steps{"all_to_all(axis 0, split 1, concat 0)"});
  EXPECT_EQ(steps({"S(0)"}, {"S(1,g3)"}), (Steps{"all_gather(axis 0, dim 0)", "slice(axis 0, dim 1, g3)"}));
  EXPECT_EQ(steps({"S(0)"}, {"P(sum)"}), (Steps{"all_gather(axis 0, dim 0)", "zero_others(axis 0)"}));
  EXPECT_EQ(steps({"P(sum)"}, {"R"}), Steps{"all_reduce(axis 0, sum)"});
  EXPECT_EQ(steps({"P(mean)"}, {"R"}), Steps{"all_reduce(axis 0, mean)"});
  EXPECT_EQ(steps({"P(sum)"}, {"S(1)"}), Steps{"reduce_scatter(axis 0, dim 1)"});
  EXPECT_EQ(steps({"P(mean)"}, {"S(1)"}), (Steps{"all_reduce(axis 0, mean)", "slice(axis 0, dim 1)"}));
  EXPECT_EQ(steps({"P(sum)"}, {"P(mean)"}), Steps{"scale(axis 0, n^1)"});
  EXPECT_EQ(steps({"R"}, {"S(0)[0.25,0.75]"}), Steps{"slice(axis 0, dim 0, ratios 0.25,0.75)"});
}

TEST(ReshardActions, WorkedExamples) {
  EXPECT_EQ(steps({"R", "P(sum)"}, {"R", "S(1)"}), Steps{"reduce_scatter(axis 1, dim 1)"});
  EXPECT_EQ(steps({"S(0)", "S(0)"}, {"R", "S(0)"}),
            (Steps{"all_gather(axis 1, dim 0)", "all_gather(axis 0, dim 0)", "slice(axis 1, dim 0)"}));
  EXPECT_EQ(steps({"S(0)", "R"}, {"S(0)", "R"}), Steps{});
}

TEST(ReshardActions, IndependentAxesTakeDirectSteps) {
  // Data axis batch, tensor axis partial sum -> sequence shard: Megatron-SP's reduce-scatter.
  EXPECT_EQ(steps({"S(0)", "P(sum)"}, {"S(0)", "S(1)"}), Steps{"reduce_scatter(axis 1, dim 1)"});
  EXPECT_EQ(steps({"S(0)", "S(1)"}, {"S(0)", "R"}), Steps{"all_gather(axis 1, dim 1)"});
  // Both axes change, on different dims: each its own collective.
  EXPECT_EQ(steps({"P(sum)", "S(1)"}, {"R", "R"}), (Steps{"all_gather(axis 1, dim 1)", "all_reduce(axis 0, sum)"}));
}

TEST(ReshardActions, InnerShardOfAChangingDimIsUndoneFirst) {
  // The outer axis moves its shard of dim 0 to dim 1: the inner axis' blocks of dim 0 were cut
  // inside the outer ones, so they are gathered first and cut again after.
  EXPECT_EQ(steps({"S(0)", "S(0)"}, {"S(1)", "S(0)"}),
            (Steps{"all_gather(axis 1, dim 0)", "all_to_all(axis 0, split 1, concat 0)", "slice(axis 1, dim 0)"}));
  // A reduce-scatter onto a dim an inner axis shards is not direct either.
  EXPECT_EQ(steps({"P(sum)", "S(0)"}, {"S(0)", "S(0)"}),
            (Steps{"all_gather(axis 1, dim 0)", "reduce_scatter(axis 0, dim 0)", "slice(axis 1, dim 0)"}));
}

TEST(ReshardActions, UnevenShardsAreGatheredAndCutWithTheirRatios) {
  EXPECT_EQ(steps({"S(0)[0.25,0.75]"}, {"R"}), Steps{"all_gather(axis 0, dim 0, ratios 0.25,0.75)"});
  // Different ratios: no direct all-to-all, a gather and a cut.
  EXPECT_EQ(steps({"S(0)[0.25,0.75]"}, {"S(0)"}),
            (Steps{"all_gather(axis 0, dim 0, ratios 0.25,0.75)", "slice(axis 0, dim 0)"}));
  EXPECT_EQ(steps({"P(sum)"}, {"S(0)[0.25,0.75]"}),
            (Steps{"all_reduce(axis 0, sum)", "slice(axis 0, dim 0, ratios 0.25,0.75)"}));
}

TEST(ReshardActions, UnsupportedAndMismatchedSpecsThrow) {
  EXPECT_THROW(reshard_actions(spec({"S(0,g2)[0.25,0.75]"}), spec({"R"})), support::ValidationError);
  EXPECT_THROW(reshard_actions(spec({"R"}), spec({"R", "R"})), support::ValidationError);
}

}  // namespace
}  // namespace shardwise::transform
