#include "transform/local_shard.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "support/error.h"

namespace shardwise::transform {
namespace {

using Runs = std::vector<IndexRun>;

std::vector<std::int64_t> expand(const Runs& runs) {
  std::vector<std::int64_t> out;
  for (auto [begin, end] : runs)
    for (auto i = begin; i < end; ++i) out.push_back(i);
  return out;
}

TEST(LocalShard, WorkedExample) {
  LocalShard s = local_shard({4, 6}, {"S(1,g3)", "S(0)"}, {2, 2}, 3);
  EXPECT_EQ(s.dims[0], (Runs{{2, 4}}));
  EXPECT_EQ(s.dims[1], (Runs{{1, 2}, {3, 4}, {5, 6}}));
  EXPECT_EQ(s.shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_FALSE(s.partial);
}

TEST(LocalShard, ReplicateAndPartialHoldEverything) {
  LocalShard s = local_shard({3, 5}, {"R", "P(sum)"}, {2, 4}, 6);
  EXPECT_EQ(s.dims[0], (Runs{{0, 3}}));
  EXPECT_EQ(s.dims[1], (Runs{{0, 5}}));
  EXPECT_TRUE(s.partial);
}

TEST(LocalShard, EveryElementIsHeldByExactlyOneRank) {
  // [8, 12] sharded S(0) on the outer axis and S(1,g3) on the inner: over the 2 x 2 mesh
  // each element is held by exactly one rank.
  std::multiset<std::pair<std::int64_t, std::int64_t>> seen;
  for (int rank = 0; rank < 4; ++rank) {
    LocalShard s = local_shard({8, 12}, {"S(0)", "S(1,g3)"}, {2, 2}, rank);
    for (auto i : expand(s.dims[0]))
      for (auto j : expand(s.dims[1])) seen.emplace(i, j);
  }
  EXPECT_EQ(seen.size(), 96u);
  for (std::int64_t i = 0; i < 8; ++i)
    for (std::int64_t j = 0; j < 12; ++j) EXPECT_EQ(seen.count({i, j}), 1u) << i << "," << j;
}

TEST(LocalShard, StridedQkvKeepsTheSameHeads) {
  // GPT-2's c_attn weight [h, 3h] with h = 8 and 4 heads of 2, on 4 ranks: rank r holds
  // columns of head r in q (0..7), k (8..15) and v (16..23).
  for (int rank = 0; rank < 4; ++rank) {
    LocalShard s = local_shard({8, 24}, {"S(1,g3)"}, {4}, rank);
    const std::int64_t h = 2 * rank;
    EXPECT_EQ(s.dims[1], (Runs{{h, h + 2}, {8 + h, 8 + h + 2}, {16 + h, 16 + h + 2}})) << rank;
  }
}

TEST(LocalShard, NestedShardsOfOneDimSplitWhatTheOuterAxisLeft) {
  // S(0) on both axes of a 2 x 2 mesh: four consecutive quarters, outer axis first.
  for (int rank = 0; rank < 4; ++rank)
    EXPECT_EQ(local_shard({8}, {"S(0)", "S(0)"}, {2, 2}, rank).dims[0], (Runs{{2 * rank, 2 * rank + 2}}));
}

TEST(LocalShard, UnevenRatios) {
  EXPECT_EQ(local_shard({10}, {"S(0)[0.6,0.4]"}, {2}, 0).dims[0], (Runs{{0, 6}}));
  EXPECT_EQ(local_shard({10}, {"S(0)[0.6,0.4]"}, {2}, 1).dims[0], (Runs{{6, 10}}));
}

TEST(BlockBounds, HalfWayTiesGoAwayFromZero) {
  // 0.3 x 15 = 4.5: rank 0 takes five rows (the runtime's slice reads this rule too).
  EXPECT_EQ(block_bounds(15, 2, 0, {0.3, 0.7}), (std::pair<std::int64_t, std::int64_t>{0, 5}));
  EXPECT_EQ(block_bounds(15, 2, 1, {0.3, 0.7}), (std::pair<std::int64_t, std::int64_t>{5, 15}));
  EXPECT_EQ(local_shard({15}, {"S(0)[0.3,0.7]"}, {2}, 0).dims[0], (Runs{{0, 5}}));
}

TEST(BlockBounds, EvenBlocksAndTheirErrors) {
  EXPECT_EQ(block_bounds(12, 4, 3, {}), (std::pair<std::int64_t, std::int64_t>{9, 12}));
  EXPECT_THROW(block_bounds(7, 2, 0, {}), support::ValidationError);
  EXPECT_THROW(block_bounds(8, 2, 2, {}), support::ValidationError);
  EXPECT_THROW(block_bounds(8, 2, 0, {1.0}), support::ValidationError);
}

TEST(LocalShard, ErrorsNameThePlacement) {
  EXPECT_THROW(local_shard({4}, {"S(0)"}, {2, 2}, 0), support::ValidationError);
  EXPECT_THROW(local_shard({4}, {"S(1)"}, {2}, 0), support::ValidationError);
  EXPECT_THROW(local_shard({4}, {"S(0)"}, {2}, 2), support::ValidationError);
  EXPECT_THROW(local_shard({4}, {"S(0)[0.5,0.25,0.25]"}, {2}, 0), support::ValidationError);
  try {
    local_shard({6}, {"S(0)"}, {4}, 1);
    FAIL() << "6 elements do not split over 4 ranks";
  } catch (const support::ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find("S(0)"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardwise::transform
