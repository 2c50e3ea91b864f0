#include "search/hetero_balance.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "support/error.h"

namespace shardwise::search {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

BalanceRank rank(double seconds_per_sample, double fixed_seconds = 0) {
  BalanceRank r;
  r.seconds_per_sample = seconds_per_sample;
  r.fixed_seconds = fixed_seconds;
  return r;
}

BalanceRank with_memory(BalanceRank r, double per_sample, double fixed, double capacity) {
  r.memory_per_sample = per_sample;
  r.fixed_memory = fixed;
  r.memory_capacity = capacity;
  return r;
}

std::int64_t sum(const std::vector<std::int64_t>& v) { return std::accumulate(v.begin(), v.end(), std::int64_t{0}); }

double sum(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0); }

double step_time(const std::vector<BalanceRank>& ranks, const std::vector<std::int64_t>& samples) {
  double worst = 0;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    worst = std::max(worst, ranks[r].fixed_seconds + ranks[r].seconds_per_sample * static_cast<double>(samples[r]));
  }
  return worst;
}

// The message of the ValidationError `fn` throws, or a marker that it threw none.
template <typename Fn>
std::string validation_message(Fn fn) {
  try {
    fn();
  } catch (const support::ValidationError& e) {
    return e.what();
  }
  return "<no ValidationError>";
}

TEST(HeteroBalance, WorkedExampleFromTheHeader) {
  const std::vector<BalanceRank> ranks = {rank(1.0), rank(2.0)};
  const BalanceResult result = balance_shares(ranks, 12);
  EXPECT_TRUE(result.feasible);
  ASSERT_EQ(result.lp_shares.size(), 2u);
  EXPECT_NEAR(result.lp_shares[0], 8.0, 1e-6);
  EXPECT_NEAR(result.lp_shares[1], 4.0, 1e-6);
  EXPECT_NEAR(result.lp_step_time, 8.0, 1e-6);
  EXPECT_EQ(result.samples, (std::vector<std::int64_t>{8, 4}));
  EXPECT_DOUBLE_EQ(result.step_time, 8.0);
  EXPECT_DOUBLE_EQ(result.even_step_time, 12.0);
  const std::vector<double> ratios = result.ratios();
  ASSERT_EQ(ratios.size(), 2u);
  EXPECT_DOUBLE_EQ(ratios[0], 8.0 / 12.0);
  EXPECT_DOUBLE_EQ(ratios[1], 4.0 / 12.0);
}

// Four A100-like ranks and four V100-like ones (2.6x slower per sample), with the same fixed time
// (optimizer step, gradient all-reduce) on every rank: the shares follow speed.
TEST(HeteroBalance, FastAndSlowRanksSplitInProportionToSpeed) {
  std::vector<BalanceRank> ranks;
  for (int i = 0; i < 4; ++i) ranks.push_back(rank(1.0e-3, 0.05));
  for (int i = 0; i < 4; ++i) ranks.push_back(rank(2.6e-3, 0.05));
  const std::int64_t batch = 1024;
  const BalanceResult result = balance_shares(ranks, batch);
  ASSERT_TRUE(result.feasible);
  ASSERT_EQ(result.lp_shares.size(), 8u);
  ASSERT_EQ(result.samples.size(), 8u);
  EXPECT_NEAR(sum(result.lp_shares), static_cast<double>(batch), 1e-6);
  EXPECT_EQ(sum(result.samples), batch);

  // With equal fixed times the optimum is exactly proportional to speed (1 / seconds_per_sample).
  const double total_speed = 4 / 1.0e-3 + 4 / 2.6e-3;
  const double fast_share = batch * (1 / 1.0e-3) / total_speed;
  const double slow_share = batch * (1 / 2.6e-3) / total_speed;
  for (std::size_t r = 0; r < 8; ++r) {
    const double expected = r < 4 ? fast_share : slow_share;
    EXPECT_NEAR(result.lp_shares[r], expected, 1e-6 * batch) << "rank " << r;
    // The integer split stays within 5% of the LP optimum.
    EXPECT_NEAR(static_cast<double>(result.samples[r]), result.lp_shares[r], 0.05 * result.lp_shares[r])
        << "rank " << r;
  }
  EXPECT_NEAR(result.lp_step_time, 0.05 + 1.0e-3 * fast_share, 1e-9);
  EXPECT_LT(result.step_time, result.even_step_time);
  EXPECT_DOUBLE_EQ(result.even_step_time, 0.05 + 2.6e-3 * 128);
  const std::vector<double> ratios = result.ratios();
  EXPECT_NEAR(sum(ratios), 1.0, 1e-12);
  EXPECT_GT(ratios[0], 2.0 * ratios[7]);
}

// Rank 0 is the fastest but only holds 100 samples: the LP respects its cap and hands the rest to the
// other ranks in proportion to their speed.
TEST(HeteroBalance, MemoryCapsAFastRanksShare) {
  // Unconstrained, the split would be (200, 200, 100, 100) at T = 200.
  std::vector<BalanceRank> ranks = {with_memory(rank(1.0), 2.0, 10.0, 210.0), rank(1.0), rank(2.0), rank(2.0)};
  const BalanceResult result = balance_shares(ranks, 600);
  ASSERT_TRUE(result.feasible);
  EXPECT_LE(result.lp_shares[0], 100.0 + 1e-6);
  EXPECT_NEAR(result.lp_shares[0], 100.0, 1e-6);  // the cap binds: time is what it saves
  EXPECT_NEAR(result.lp_shares[1], 250.0, 1e-6);
  EXPECT_NEAR(result.lp_shares[2], 125.0, 1e-6);
  EXPECT_NEAR(result.lp_shares[3], 125.0, 1e-6);
  EXPECT_NEAR(result.lp_step_time, 250.0, 1e-6);
  EXPECT_LE(result.samples[0], 100);
  EXPECT_EQ(sum(result.samples), 600);
  EXPECT_EQ(result.samples, (std::vector<std::int64_t>{100, 250, 125, 125}));
  EXPECT_DOUBLE_EQ(result.step_time, 250.0);
  // The even split (150 each) overflows rank 0.
  EXPECT_EQ(result.even_step_time, kInf);

  // Without the cap the same ranks balance at T = 200.
  ranks[0].memory_capacity = kInf;
  const BalanceResult free = balance_shares(ranks, 600);
  EXPECT_NEAR(free.lp_step_time, 200.0, 1e-6);
  EXPECT_EQ(free.samples, (std::vector<std::int64_t>{200, 200, 100, 100}));
}

TEST(HeteroBalance, MemoryTooSmallForTheBatchIsInfeasible) {
  // 40 + 40 + 40 samples fit, the batch is 128.
  const std::vector<BalanceRank> ranks = {with_memory(rank(1.0, 0.5), 1.0, 0.0, 40.0),
                                          with_memory(rank(1.0, 0.5), 1.0, 0.0, 40.0),
                                          with_memory(rank(2.0, 0.5), 1.0, 0.0, 40.0)};
  const BalanceResult result = balance_shares(ranks, 128);
  EXPECT_FALSE(result.feasible);
  // The even split still comes back, with its time; it overflows memory, so even_step_time is +inf.
  EXPECT_EQ(result.samples, (std::vector<std::int64_t>{43, 43, 42}));
  EXPECT_EQ(sum(result.samples), 128);
  EXPECT_DOUBLE_EQ(result.step_time, 0.5 + 2.0 * 42);
  EXPECT_EQ(result.even_step_time, kInf);
  EXPECT_EQ(result.lp_shares.size(), 3u);
  EXPECT_EQ(result.ratios().size(), 3u);
}

TEST(HeteroBalance, FixedMemoryOverCapacityIsInfeasible) {
  const std::vector<BalanceRank> ranks = {rank(1.0), with_memory(rank(1.0), 0.0, 50.0, 40.0)};
  const BalanceResult result = balance_shares(ranks, 8);
  EXPECT_FALSE(result.feasible);
  EXPECT_EQ(result.samples, (std::vector<std::int64_t>{4, 4}));
  EXPECT_EQ(result.even_step_time, kInf);
}

// Whole samples cannot fit although fractional ones can (2.5 + 2.5 = 5): no split fits memory.
TEST(HeteroBalance, LpFeasibleButNoWholeSampleSplitIsInfeasible) {
  const std::vector<BalanceRank> ranks = {with_memory(rank(1.0), 2.0, 0.0, 5.0), with_memory(rank(1.0), 2.0, 0.0, 5.0)};
  const BalanceResult result = balance_shares(ranks, 5);
  EXPECT_FALSE(result.feasible);
  EXPECT_EQ(sum(result.samples), 5);
  EXPECT_EQ(result.even_step_time, kInf);
}

TEST(HeteroBalance, ExactMemoryFitIsFeasible) {
  // Capacity exactly fixed + 0.1 x 30: floating point must not turn the exact fit into an overflow.
  const std::vector<BalanceRank> ranks = {with_memory(rank(1.0), 0.1, 0.7, 0.7 + 0.1 * 30), rank(3.0)};
  const BalanceResult result = balance_shares(ranks, 40);
  ASSERT_TRUE(result.feasible);
  EXPECT_EQ(result.samples, (std::vector<std::int64_t>{30, 10}));
}

// Integer splits across awkward speeds, fixed times, memory caps and batch sizes: they sum to the batch,
// fit memory, and finish within one sample's time of the LP optimum.
TEST(HeteroBalance, IntegerSplitIsWithinOneSampleOfTheLp) {
  const std::vector<double> speeds = {1.0, 2.6, 1.7, 0.9, 3.3, 1.25, 2.0};
  const std::vector<double> fixed = {0.0, 3.0, 0.5, 7.25, 1.0, 0.0, 2.0};
  for (std::size_t n = 1; n <= speeds.size(); ++n) {
    for (std::int64_t batch : {1, 2, 7, 13, 64, 97, 1000, 4099}) {
      std::vector<BalanceRank> ranks;
      for (std::size_t r = 0; r < n; ++r) {
        BalanceRank b = rank(speeds[r], fixed[r]);
        if (r % 3 == 1) b = with_memory(b, 1.5, 4.0, 4.0 + 1.5 * static_cast<double>(batch) / 3.0);
        ranks.push_back(b);
      }
      const BalanceResult result = balance_shares(ranks, batch);
      SCOPED_TRACE("ranks " + std::to_string(n) + ", batch " + std::to_string(batch));
      ASSERT_TRUE(result.feasible);
      ASSERT_EQ(result.samples.size(), n);
      EXPECT_EQ(sum(result.samples), batch);
      EXPECT_NEAR(sum(result.lp_shares), static_cast<double>(batch), 1e-6 * static_cast<double>(batch));
      double slowest_sample = 0;
      for (std::size_t r = 0; r < n; ++r) {
        EXPECT_GE(result.samples[r], 0);
        EXPECT_GE(result.lp_shares[r], 0.0);
        const BalanceRank& b = ranks[r];
        EXPECT_LE(b.fixed_memory + b.memory_per_sample * static_cast<double>(result.samples[r]),
                  b.memory_capacity * (1 + 1e-9))
            << "rank " << r;
        slowest_sample = std::max(slowest_sample, b.seconds_per_sample);
      }
      EXPECT_DOUBLE_EQ(result.step_time, step_time(ranks, result.samples));
      EXPECT_GE(result.step_time, result.lp_step_time - 1e-6);
      EXPECT_LE(result.step_time, result.lp_step_time + slowest_sample + 1e-6);
      EXPECT_LE(result.step_time, result.even_step_time);
    }
  }
}

TEST(HeteroBalance, SingleRankTakesTheWholeBatch) {
  const std::vector<BalanceRank> ranks = {rank(0.5, 1.0)};
  const BalanceResult result = balance_shares(ranks, 33);
  ASSERT_TRUE(result.feasible);
  EXPECT_EQ(result.samples, (std::vector<std::int64_t>{33}));
  EXPECT_DOUBLE_EQ(result.step_time, 17.5);
  EXPECT_NEAR(result.lp_step_time, 17.5, 1e-6);
  EXPECT_DOUBLE_EQ(result.even_step_time, 17.5);
  EXPECT_EQ(result.ratios(), (std::vector<double>{1.0}));
}

TEST(HeteroBalance, TiesGoToTheLowerRank) {
  const std::vector<BalanceRank> ranks = {rank(1.0), rank(1.0), rank(1.0)};
  const BalanceResult result = balance_shares(ranks, 10);
  ASSERT_TRUE(result.feasible);
  EXPECT_EQ(result.samples, (std::vector<std::int64_t>{4, 3, 3}));
  EXPECT_DOUBLE_EQ(result.step_time, 4.0);
}

TEST(HeteroBalance, Deterministic) {
  std::vector<BalanceRank> ranks;
  for (int i = 0; i < 6; ++i) ranks.push_back(rank(1.0 + 0.37 * i, 0.1 * (i % 2)));
  ranks[2] = with_memory(ranks[2], 3.0, 1.0, 200.0);
  const BalanceResult first = balance_shares(ranks, 777);
  for (int i = 0; i < 5; ++i) {
    const BalanceResult again = balance_shares(ranks, 777);
    EXPECT_EQ(again.feasible, first.feasible);
    EXPECT_EQ(again.samples, first.samples);
    EXPECT_EQ(again.lp_shares, first.lp_shares);
    EXPECT_EQ(again.lp_step_time, first.lp_step_time);
    EXPECT_EQ(again.step_time, first.step_time);
    EXPECT_EQ(again.even_step_time, first.even_step_time);
  }
}

TEST(HeteroBalance, SolverPrintsNothing) {
  const std::vector<BalanceRank> feasible = {rank(1.0), rank(2.0)};
  const std::vector<BalanceRank> infeasible = {with_memory(rank(1.0), 1.0, 0.0, 1.0)};
  testing::internal::CaptureStdout();
  balance_shares(feasible, 12);
  balance_shares(infeasible, 12);
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "");
}

TEST(HeteroBalance, ValidationErrorsNameTheRank) {
  const std::vector<BalanceRank> none;
  EXPECT_THROW(balance_shares(none, 8), support::ValidationError);

  const std::vector<BalanceRank> two = {rank(1.0), rank(2.0)};
  EXPECT_NE(validation_message([&] { balance_shares(two, 0); }).find("global_batch = 0"), std::string::npos);
  EXPECT_NE(validation_message([&] { balance_shares(two, -4); }).find("-4"), std::string::npos);

  auto message_for = [](std::size_t bad_rank, auto mutate) {
    std::vector<BalanceRank> ranks = {rank(1.0), rank(2.0), rank(3.0)};
    mutate(ranks[bad_rank]);
    return validation_message([&] { balance_shares(ranks, 8); });
  };
  std::string msg = message_for(2, [](BalanceRank& r) { r.seconds_per_sample = 0; });
  EXPECT_NE(msg.find("rank 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("seconds_per_sample = 0"), std::string::npos) << msg;

  msg = message_for(1, [](BalanceRank& r) { r.seconds_per_sample = -1.5; });
  EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("-1.5"), std::string::npos) << msg;

  msg = message_for(0, [](BalanceRank& r) { r.fixed_seconds = std::nan(""); });
  EXPECT_NE(msg.find("rank 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("fixed_seconds = nan"), std::string::npos) << msg;

  msg = message_for(1, [](BalanceRank& r) { r.memory_per_sample = -2; });
  EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("memory_per_sample = -2"), std::string::npos) << msg;

  msg = message_for(2, [](BalanceRank& r) { r.fixed_memory = -1; });
  EXPECT_NE(msg.find("rank 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("fixed_memory"), std::string::npos) << msg;

  msg = message_for(0, [](BalanceRank& r) { r.memory_capacity = std::nan(""); });
  EXPECT_NE(msg.find("rank 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("memory_capacity"), std::string::npos) << msg;

  msg = message_for(1, [](BalanceRank& r) { r.seconds_per_sample = kInf; });
  EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("seconds_per_sample = inf"), std::string::npos) << msg;
}

}  // namespace
}  // namespace shardwise::search
