#include "schedule/adaptive_kfkb.h"

#include <gtest/gtest.h>

#include <iostream>

#include "schedule/schedules.h"
#include "support/error.h"

namespace shardwise::schedule {
namespace {

AdaptiveKfkbInput base(TransferTime transfer) {
  AdaptiveKfkbInput in;
  in.ranks = 4;
  in.micro_batches = 16;
  in.costs.forward.assign(4, 1.0);
  in.costs.backward.assign(4, 2.0);
  in.costs.boundary_bytes.assign(3, 100.0);
  in.costs.transfer = std::move(transfer);
  in.memory_per_micro_batch = 1.0;
  in.memory_limit = 0.0;  // unlimited
  in.candidates = {1, 2, 4, 8};
  return in;
}

void print(const char* what, const AdaptiveChoice& c) {
  std::cout << what << ": chose k=" << c.k << " step " << c.step_time << " peak memory " << c.peak_memory << " |";
  for (const auto& cand : c.candidates)
    std::cout << " k=" << cand.k << (cand.fits ? "" : "(no fit)") << " step " << cand.step_time << " mem "
              << cand.peak_memory << ";";
  std::cout << "\n";
}

TEST(AdaptiveKfkbTest, FreeNetworkPicksOne) {
  const auto c = choose_k(base(constant_transfer(0.0)));
  print("free network", c);
  EXPECT_EQ(c.k, 1);
  const auto fast = choose_k(base(constant_transfer(0.01)));
  print("fast constant network", fast);
  EXPECT_EQ(fast.k, 1);
}

TEST(AdaptiveKfkbTest, HalvedBandwidthPicksLargerK) {
  // Same profile as simulator_test.cc: 200 B/s for 2 s, then 100 B/s for 2 s.
  const auto in = base(periodic_bandwidth({2.0, 2.0}, {200.0, 100.0}));
  const auto c = choose_k(in);
  print("periodically halved bandwidth", c);
  const double one_f_one_b_step = simulate(one_f_one_b(4, 16), in.costs).step_time;
  std::cout << "1F1B step " << one_f_one_b_step << "\n";
  EXPECT_GT(c.k, 1);
  EXPECT_LT(c.step_time, one_f_one_b_step);
  EXPECT_DOUBLE_EQ(c.candidates.front().step_time, one_f_one_b_step);  // k = 1 is 1F1B
}

TEST(AdaptiveKfkbTest, TightMemoryForcesOne) {
  auto in = base(periodic_bandwidth({2.0, 2.0}, {200.0, 100.0}));
  in.memory_limit = 4.0;  // 1F1B keeps p = 4 micro-batches in flight on rank 0
  const auto c = choose_k(in);
  print("tight memory", c);
  EXPECT_EQ(c.k, 1);
  EXPECT_LE(c.peak_memory, 4.0);
  in.memory_limit = 1.0;
  EXPECT_THROW(choose_k(in), support::ValidationError);
}

}  // namespace
}  // namespace shardwise::schedule
