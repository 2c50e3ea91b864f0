#include "schedule/simulator.h"

#include <gtest/gtest.h>

#include <iostream>
#include <string>
#include <vector>

#include "schedule/schedules.h"

namespace shardwise::schedule {
namespace {

SimulationCosts equal_stages(int stages, double fwd, double bwd) {
  SimulationCosts c;
  c.forward.assign(static_cast<std::size_t>(stages), fwd);
  c.backward.assign(static_cast<std::size_t>(stages), bwd);
  return c;
}

TEST(SimulatorTest, PeriodicBandwidthMatchesHeaderExample) {
  auto t = periodic_bandwidth({1.0, 1.0}, {100.0, 50.0});
  EXPECT_NEAR(t(0.5, 150.0), 2.0, 1e-12);
  EXPECT_NEAR(t(0.0, 100.0), 1.0, 1e-12);
  EXPECT_NEAR(t(1.0, 100.0), 1.5, 1e-12);
  EXPECT_NEAR(t(0.0, 1500.0), 20.0, 1e-9);  // 10 whole periods of 150 B
}

TEST(SimulatorTest, GpipeAndOneFOneBBubble) {
  for (auto [p, m] : {std::pair{4, 8}, std::pair{8, 32}}) {
    const double expected = static_cast<double>(p - 1) / (m + p - 1);
    const auto costs = equal_stages(p, 1.0, 2.0);
    const auto g = simulate(gpipe(p, m), costs);
    const auto f = simulate(one_f_one_b(p, m), costs);
    std::cout << "p=" << p << " m=" << m << " expected " << expected << " gpipe " << g.bubble_fraction << " (step "
              << g.step_time << ") 1f1b " << f.bubble_fraction << " (step " << f.step_time << ")\n";
    EXPECT_NEAR(g.bubble_fraction, expected, 0.01 * expected);
    EXPECT_NEAR(f.bubble_fraction, expected, 0.01 * expected);
    EXPECT_DOUBLE_EQ(g.step_time, (m + p - 1) * 3.0);
    EXPECT_EQ(g.peak_in_flight[0], m);
    EXPECT_EQ(f.peak_in_flight[0], p);
  }
}

TEST(SimulatorTest, InterleavedCutsBubbleByV) {
  const int p = 4;
  const int m = 8;
  const double base = simulate(one_f_one_b(p, m), equal_stages(p, 1.0, 2.0)).bubble_overhead;
  EXPECT_NEAR(base, (p - 1.0) / m, 1e-9);
  for (int v : {2, 4}) {
    // Same model split into p*v chunks: each chunk does 1/v of a stage's work.
    const auto r = simulate(interleaved_1f1b(p, m, v), equal_stages(p * v, 1.0 / v, 2.0 / v));
    const double expected = (p - 1.0) / (v * m);
    std::cout << "interleaved v=" << v << " overhead " << r.bubble_overhead << " expected " << expected << " (1f1b "
              << base << ") step " << r.step_time << "\n";
    EXPECT_NEAR(r.bubble_overhead, expected, 0.1 * expected);
  }
}

TEST(SimulatorTest, TimelinesTileTheStep) {
  auto costs = equal_stages(4, 1.0, 2.0);
  costs.transfer = constant_transfer(0.25);
  const auto r = simulate(one_f_one_b(4, 8), costs);
  for (const auto& tl : r.timelines) {
    double covered = 0.0;
    for (const auto& iv : tl) {
      EXPECT_LE(iv.start, iv.end);
      if (iv.kind != IntervalKind::Send) covered += iv.end - iv.start;
    }
    EXPECT_NEAR(covered, r.step_time, 1e-9);
  }
}

TEST(SimulatorTest, KfkbUnderPeriodicallyHalvedBandwidth) {
  const int p = 4;
  const int m = 16;
  auto costs = equal_stages(p, 1.0, 2.0);
  costs.boundary_bytes.assign(p - 1, 100.0);
  // 200 B/s for 2 s, then 100 B/s for 2 s: a transfer takes 0.5 s or 1 s.
  costs.transfer = periodic_bandwidth({2.0, 2.0}, {200.0, 100.0});
  const auto one = simulate(one_f_one_b(p, m), costs);
  const auto two = simulate(kfkb(p, m, 2), costs);
  const auto four = simulate(kfkb(p, m, 4), costs);
  std::cout << "halved bandwidth: 1f1b step " << one.step_time << " kfkb(2) " << two.step_time << " kfkb(4) "
            << four.step_time << " free-network ideal " << simulate(one_f_one_b(p, m), equal_stages(p, 1.0, 2.0)).step_time
            << "\n";
  // Measured: 70.03 vs 83.75 (free network: 57). With transfers that started at the send
  // (before the simulator modelled rendezvous) it was 62 vs 76.
  EXPECT_LT(two.step_time, one.step_time);
}

TEST(SimulatorTest, ATransferStartsWhenItsReceiveIsPostedAndTheReadingComputeWaits) {
  // GPipe on 2 ranks, 2 micro-batches, forward = backward = 1, transfers of 0.5. Rank 1 posts
  // RA1 after its F0 ends at 2.5; rank 0 sent micro-batch 1 at 2. The transfer runs 2.5 to
  // 3.0 (rendezvous, as Gloo and NCCL do), so F1 on rank 1 starts at 3.0, not at 2.5.
  auto costs = equal_stages(2, 1.0, 1.0);
  costs.boundary_bytes.assign(1, 1.0);
  costs.transfer = constant_transfer(0.5);
  const auto r = simulate(gpipe(2, 2), costs);
  std::vector<double> forwards;
  for (const Interval& iv : r.timelines[1])
    if (iv.kind == IntervalKind::Forward) forwards.push_back(iv.start);
  ASSERT_EQ(forwards.size(), 2u);
  EXPECT_DOUBLE_EQ(forwards[0], 1.5);  // sent at 1 (F0 on rank 0), RA0 posted at 0
  EXPECT_DOUBLE_EQ(forwards[1], 3.0);
  // The transfer shows on the sender's row from the moment it started.
  bool found = false;
  for (const Interval& iv : r.timelines[0])
    found = found || (iv.kind == IntervalKind::Send && iv.micro_batch == 1 && iv.start == 2.5 && iv.end == 3.0);
  EXPECT_TRUE(found);
}

TEST(SimulatorTest, KfkbPostsAGroupsReceivesBeforeItsFirstComputeSoItsLaterTransfersOverlap) {
  // kFkB's list posts the group's receives together; the runtime waits for each at the
  // forward or backward that reads it, so micro-batch 1's transfer runs beside F0.
  const auto s = kfkb(2, 4, 2);
  EXPECT_TRUE(to_string(s.per_rank[1]).starts_with("RA0@s1<-r0 RA1@s1<-r0 F0@s1 F1@s1 B0@s1"))
      << to_string(s.per_rank[1]);
  EXPECT_TRUE(to_string(s.per_rank[0]).find("RG0@s0<-r1 RG1@s0<-r1 B0@s0 B1@s0") != std::string::npos)
      << to_string(s.per_rank[0]);
  EXPECT_TRUE(to_string(one_f_one_b(2, 4).per_rank[1]).starts_with("RA0@s1<-r0 F0@s1 B0@s1"));
  auto costs = equal_stages(4, 1.0, 2.0);
  costs.boundary_bytes.assign(3, 1.0);
  costs.transfer = constant_transfer(1.0);
  // Equal at a free network (57 for p = 4 above); with sends as long as a forward, the groups
  // hide half the transfers.
  EXPECT_LT(simulate(kfkb(4, 16, 2), costs).step_time, simulate(one_f_one_b(4, 16), costs).step_time);
}

TEST(SimulatorTest, ATransferWaitsForTheOneBeforeItOnItsChannel) {
  // kFkB on 2 ranks, k = 2: rank 1 posts RA0 and RA1 at 0; rank 0 sends micro-batch 0 at 1
  // and micro-batch 1 at 2; transfers take 3. One channel carries both (rank 0 to rank 1,
  // activations: one NCCL communicator, one Gloo connection), so the second runs 4 to 7,
  // after the first (1 to 4), not 2 to 5: F1 on rank 1 starts at 7, not at 5.
  auto costs = equal_stages(2, 1.0, 1.0);
  costs.boundary_bytes.assign(1, 1.0);
  costs.transfer = constant_transfer(3.0);
  const auto r = simulate(kfkb(2, 2, 2), costs);
  std::vector<double> forwards;
  for (const Interval& iv : r.timelines[1])
    if (iv.kind == IntervalKind::Forward) forwards.push_back(iv.start);
  ASSERT_EQ(forwards.size(), 2u);
  EXPECT_DOUBLE_EQ(forwards[0], 4.0);
  EXPECT_DOUBLE_EQ(forwards[1], 7.0);
  // The sender's row shows each transfer from its start: micro-batch 1's from 4 to 7.
  bool found = false;
  for (const Interval& iv : r.timelines[0])
    found = found || (iv.kind == IntervalKind::Send && iv.micro_batch == 1 && iv.start == 4.0 && iv.end == 7.0);
  EXPECT_TRUE(found);
}

TEST(SimulatorTest, EveryGeneratedScheduleTimesEachChannelsTransfersInItsOrder) {
  // The simulator times a transfer when its reader runs and checks that each channel's come in
  // the channel's order (else std::logic_error): every generator, transfers as long as a forward.
  for (int p : {1, 2, 3, 4, 8}) {
    for (int m : {1, 2, 3, 8, 16}) {
      std::vector<PipelineSchedule> all = {gpipe(p, m), one_f_one_b(p, m), kfkb(p, m, 2), kfkb(p, m, 3),
                                           zero_bubble_h1(p, m), zero_bubble_v(p, m)};
      if (m % p == 0) all.push_back(interleaved_1f1b(p, m, 2));
      if (m >= 2 * p) all.push_back(dual_pipe_v(p, m));
      for (const PipelineSchedule& s : all) {
        auto costs = equal_stages(s.total_stages(), 1.0, 2.0);
        bool split = false;
        for (const auto& list : s.per_rank)
          for (const Action& a : list) split = split || a.kind == ActionKind::WeightGradient;
        if (split) costs.weight.assign(static_cast<std::size_t>(s.total_stages()), 1.0);
        costs.boundary_bytes.assign(static_cast<std::size_t>(s.total_stages() - 1), 1.0);
        costs.transfer = constant_transfer(1.0);
        EXPECT_NO_THROW(simulate(s, costs)) << "p " << p << " m " << m << ": " << to_string(s.per_rank[0]);
      }
    }
  }
}

}  // namespace
}  // namespace shardwise::schedule
