#include "schedule/schedules.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <random>

#include "schedule/simulator.h"

#include <gtest/gtest.h>

#include <string>

#include "support/error.h"
#include "validation_error.h"

namespace shardwise::schedule {
namespace {

using testing::validation_error_of;

TEST(ActionTest, TextForm) {
  EXPECT_EQ(to_string(Action::forward(1, 3)), "F3@s1");
  EXPECT_EQ(to_string(Action::backward(0, 0)), "B0@s0");
  EXPECT_EQ(to_string(Action{ActionKind::SendActivation, 1, 2, 1}), "SA2@s1->r1");
  EXPECT_EQ(to_string(Action{ActionKind::RecvGradient, 0, 2, 1}), "RG2@s0<-r1");
  EXPECT_EQ(to_string(Action::optimizer_step()), "OPT");
  EXPECT_EQ(Action::forward(1, 3), Action::forward(1, 3));
  EXPECT_NE(Action::forward(1, 3), Action::backward(1, 3));
}

TEST(SchedulesTest, OneFOneBRankZeroMatchesHeaderExample) {
  EXPECT_EQ(to_string(one_f_one_b(2, 3).per_rank[0]),
            "F0@s0 SA0@s0->r1 F1@s0 SA1@s0->r1 RG0@s0<-r1 B0@s0 F2@s0 SA2@s0->r1 RG1@s0<-r1 B1@s0 RG2@s0<-r1 B2@s0 OPT");
  EXPECT_EQ(to_string(gpipe(2, 1).per_rank[0]), "F0@s0 SA0@s0->r1 RG0@s0<-r1 B0@s0 OPT");
}

TEST(SchedulesTest, AllGeneratorsValidate) {
  for (int p : {1, 2, 4, 8}) {
    for (int m : {1, 3, 8, 32}) {
      EXPECT_NO_THROW(validate(gpipe(p, m))) << p << " " << m;
      EXPECT_NO_THROW(validate(one_f_one_b(p, m))) << p << " " << m;
      for (int k : {1, 2, 3, 5}) EXPECT_NO_THROW(validate(kfkb(p, m, k))) << p << " " << m << " " << k;
      if (m % p == 0) {
        for (int v : {1, 2, 3, 4}) EXPECT_NO_THROW(validate(interleaved_1f1b(p, m, v))) << p << " " << m << " " << v;
      }
    }
  }
}

TEST(SchedulesTest, KfkbWithKOneIsOneFOneB) {
  for (int p : {1, 2, 4, 8}) {
    for (int m : {1, 5, 8, 32}) {
      EXPECT_EQ(kfkb(p, m, 1).per_rank, one_f_one_b(p, m).per_rank) << p << " " << m;
    }
  }
}

TEST(SchedulesTest, PeakInFlight) {
  const int p = 4;
  const int m = 8;
  EXPECT_EQ(peak_in_flight(one_f_one_b(p, m).per_rank[0]), p);
  EXPECT_EQ(peak_in_flight(one_f_one_b(p, m).per_rank[3]), 1);
  EXPECT_EQ(peak_in_flight(gpipe(p, m).per_rank[0]), m);
  for (int k : {2, 3, 4}) EXPECT_GE(peak_in_flight(kfkb(p, m, k).per_rank[0]), k) << k;
  EXPECT_EQ(peak_in_flight(kfkb(p, m, 2).per_rank[0]), 2 * p);
}

TEST(SchedulesTest, InterleavedNeedsWholeRounds) {
  EXPECT_EQ(validation_error_of([] { interleaved_1f1b(4, 6, 2); }),
            "interleaved_1f1b: micro_batches (6) must be a multiple of ranks (4)");
}

TEST(ValidateTest, RejectsMissingBackward) {
  auto s = gpipe(2, 2);
  auto& r0 = s.per_rank[0];
  std::erase(r0, Action::backward(0, 1));
  EXPECT_EQ(validation_error_of([&] { validate(s); }),
            "rank 0: backward of micro-batch 1 at stage 0 runs 0 times (expected once)");
}

TEST(ValidateTest, RejectsUnmatchedSend) {
  auto s = gpipe(2, 2);
  std::erase(s.per_rank[1], Action{ActionKind::RecvActivation, 1, 0, 0});
  EXPECT_EQ(validation_error_of([&] { validate(s); }), "rank 0: SA0@s0->r1: no matching receive on rank 1");
}

TEST(ValidateTest, RejectsOutOfOrderAndDeadlock) {
  auto s = gpipe(2, 1);
  std::swap(s.per_rank[0][0], s.per_rank[0][1]);  // send before forward
  EXPECT_EQ(validation_error_of([&] { validate(s); }),
            "rank 0: SA0@s0->r1: sends an activation before its forward ran");
  auto d = gpipe(2, 1);
  // Rank 0 runs its backward before it sends the activation (F0 RG0 B0 SA0): B0 waits for a
  // gradient that rank 1 computes from that activation, so neither side moves. (Receives are
  // posted, not blocking: F0 RG0 SA0 B0, the receive before the send, runs.)
  auto posted_first = d;
  std::swap(posted_first.per_rank[0][1], posted_first.per_rank[0][2]);
  EXPECT_EQ(validation_error_of([&] { validate(posted_first); }), "<no error>");
  d.per_rank[0] = {Action::forward(0, 0), Action{ActionKind::RecvGradient, 0, 0, 1}, Action::backward(0, 0),
                   Action{ActionKind::SendActivation, 0, 0, 1}, Action::optimizer_step()};
  EXPECT_EQ(validation_error_of([&] { validate(d); }),
            "rank 0: B0@s0: deadlock: waits for a received value whose send can never be issued");
}

}  // namespace
}  // namespace shardwise::schedule

namespace shardwise::schedule {
namespace {

// ZB-H1 with F = B = W = 1 and free communication, against 1F1B (whose backward is B + W).
// The formulas it checks (Qi et al., ICLR 2024, section 3): 1F1B's step is
// (m + p - 1)(F + B + W); ZB-H1's is at least m (F + B + W) + (p - 1)(F + B - W) (the last
// rank's work after its first input arrives: the paper's bubble) and is exactly that at
// m = p. At p = 8, m = 16 it is at least 15% shorter than 1F1B (the bar), with no
// more activation memory: the pipeline's peak (the most any rank holds) is 1F1B's.
SimulationResult run_unit_costs(const PipelineSchedule& s, bool split) {
  SimulationCosts c;
  const auto stages = static_cast<std::size_t>(s.total_stages());
  c.forward.assign(stages, 1.0);
  c.backward.assign(stages, split ? 1.0 : 2.0);
  if (split) c.weight.assign(stages, 1.0);
  return simulate(s, c);
}

TEST(ZeroBubbleH1, MatchesThePapersBubbleAndHolds1F1BsPeakMemory) {
  for (auto [p, m] : {std::pair{8, 16}, std::pair{8, 8}, std::pair{4, 4}, std::pair{4, 12}}) {
    const PipelineSchedule zb = zero_bubble_h1(p, m);
    ASSERT_NO_THROW(validate(zb));
    const SimulationResult a = run_unit_costs(zb, true), b = run_unit_costs(one_f_one_b(p, m), false);
    const double paper = m * 3.0 + (p - 1) * (1.0 + 1.0 - 1.0);
    EXPECT_DOUBLE_EQ(b.step_time, (m + p - 1) * 3.0) << p << " " << m;
    EXPECT_GE(a.step_time, paper) << p << " " << m;
    if (m == p) EXPECT_DOUBLE_EQ(a.step_time, paper) << p;
    if (p == 8 && m == 16) EXPECT_LE(a.step_time, 0.85 * b.step_time);
    EXPECT_LT(a.step_time, b.step_time) << p << " " << m;
    EXPECT_LE(*std::max_element(a.peak_in_flight.begin(), a.peak_in_flight.end()),
              *std::max_element(b.peak_in_flight.begin(), b.peak_in_flight.end()))
        << p << " " << m;
    for (int r = 0; r < p; ++r) EXPECT_DOUBLE_EQ(a.busy[static_cast<std::size_t>(r)], 3.0 * m) << r;
  }
}

TEST(ZeroBubbleH1, EveryBackwardHasItsWeightGradientAfterIt) {
  for (int p : {1, 2, 4}) {
    for (int m : {1, 3, 8}) {
      const PipelineSchedule zb = zero_bubble_h1(p, m);
      ASSERT_NO_THROW(validate(zb)) << p << " " << m;
      int weights = 0;
      for (const auto& list : zb.per_rank)
        for (const Action& a : list) weights += a.kind == ActionKind::WeightGradient;
      EXPECT_EQ(weights, p * m);
    }
  }
  // The validator refuses a W before its B, and a split schedule missing one W.
  PipelineSchedule bad = zero_bubble_h1(2, 2);
  auto& list = bad.per_rank[1];
  auto w = std::find_if(list.begin(), list.end(), [](const Action& a) { return a.kind == ActionKind::WeightGradient; });
  ASSERT_NE(w, list.end());
  const Action moved = *w;
  list.erase(w);
  EXPECT_THROW(validate(bad), support::ValidationError);
  list.insert(list.begin(), moved);
  EXPECT_THROW(validate(bad), support::ValidationError);
}

// ZB-V: 2p chunks in a V, each half a stage (F = B = W = 1/2 per chunk, so a whole stage's
// are 1 as for ZB-H1 above). Measured by the simulator (the list schedule of schedules.h):
// its bubble is (p - 1)(F + B - W) / 2, half ZB-H1's bound, at p = 2, 4 and at p = 8, m = 8,
// and 4.5 against that 3.5 at p = 8, m = 16; always shorter than ZB-H1 (which it beats by
// splitting each rank's share in two), with the same peak memory: 2p chunk activations held
// from F to W on every rank, p whole-stage micro-batches, 1F1B's first rank's.
TEST(DualPipeV, ReachesTheHalvedZeroBubbleBoundWithOneChunkMoreThanZeroBubbleV) {
  // Chunks of half a stage: F = B = W = 0.5, a full backward (B then W) 1.
  for (auto [p, m] : {std::pair{1, 2}, std::pair{2, 4}, std::pair{2, 7}, std::pair{4, 8}, std::pair{4, 16},
                      std::pair{8, 16}, std::pair{8, 32}}) {
    const PipelineSchedule d = dual_pipe_v(p, m);
    ASSERT_NO_THROW(validate(d)) << p << " " << m;
    ASSERT_TRUE(d.v_shape);
    SimulationCosts c;
    c.forward.assign(static_cast<std::size_t>(2 * p), 0.5);
    c.backward = c.forward;
    c.weight = c.forward;
    const SimulationResult dv = simulate(d, c);
    // The bubble it reaches: (p - 1)(F + B - W) / 2 in whole-stage units (ZB-V's bound,
    // which ZB-V itself misses at p = 8, m = 16), below DualPipe's published
    // (PP/2 - 1)(F&B + B - 3W) with PP = 2p chunks, F&B = F + B run one after the other
    // (no communication here to overlap): (p - 1)(0.5 + 1 + 1 - 1.5) = p - 1.
    const double ideal = 3.0 * m, bubble = (p - 1) * (1.0 + 1.0 - 1.0) / 2.0;
    EXPECT_DOUBLE_EQ(dv.step_time, ideal + bubble) << p << " " << m;
    EXPECT_LE(dv.step_time - ideal, (p - 1) * (0.5 + 1.0 + 1.0 - 3 * 0.5)) << p << " " << m;
    if (p > 1) EXPECT_LE(dv.step_time, simulate(zero_bubble_v(p, m), c).step_time) << p << " " << m;
    for (int r = 0; r < p; ++r) {
      // DualPipe's activation memory, PP + 1 chunks (2p + 1: ZB-V's 2p and one more).
      EXPECT_EQ(dv.peak_in_flight[static_cast<std::size_t>(r)], 2 * p + 1) << p << " " << r;
      EXPECT_DOUBLE_EQ(dv.busy[static_cast<std::size_t>(r)], 3.0 * m) << r;
    }
  }
  // Its phases (schedules.h), rank 0 of 2 ranks, 4 micro-batches: stages 0 (down) and 3 (back).
  std::vector<std::string> compute;
  const PipelineSchedule small = dual_pipe_v(2, 4);
  for (const Action& a : small.per_rank[0])
    if (a.is_compute()) compute.push_back(fmt::format("{}{}.{}", a.kind == ActionKind::Forward    ? "F"
                                                                : a.kind == ActionKind::Backward ? "B"
                                                                                                 : "W",
                                                      a.stage, a.micro_batch));
  EXPECT_EQ(fmt::format("{}", fmt::join(compute, " ")),
            "F0.0 F0.1 F0.2 F3.0 B3.0 W3.0 F3.1 "              // 1: two F(first); 2: F F; 3: B W F
            "F0.3 B3.1 W3.1 F3.2 B0.0 W0.0 "                  // 4: one steady pair each way
            "B3.2 W3.2 F3.3 B0.1 W0.1 "                      // 5
            "B3.3 W3.3 B0.2 "                                // 6: the second half's B alone
            "W0.2 B0.3 W0.3");                               // 7, 8
  EXPECT_THROW(dual_pipe_v(4, 7), support::ValidationError);  // fewer micro-batches than stages
}

TEST(ZeroBubbleV, TwoChunksPerRankInAVBeatZeroBubbleH1AtTheSameMemory) {
  for (auto [p, m] : {std::pair{2, 4}, std::pair{4, 4}, std::pair{4, 8}, std::pair{8, 8}, std::pair{8, 16},
                      std::pair{2, 8}, std::pair{4, 16}, std::pair{8, 32}}) {
    const PipelineSchedule v = zero_bubble_v(p, m);
    ASSERT_NO_THROW(validate(v)) << p << " " << m;
    ASSERT_TRUE(v.v_shape);
    EXPECT_EQ(v.rank_of_stage(0), 0);
    EXPECT_EQ(v.rank_of_stage(p - 1), p - 1);
    EXPECT_EQ(v.rank_of_stage(p), p - 1);
    EXPECT_EQ(v.rank_of_stage(2 * p - 1), 0);
    SimulationCosts c;
    c.forward.assign(static_cast<std::size_t>(2 * p), 0.5);
    c.backward = c.forward;
    c.weight = c.forward;
    const SimulationResult zv = simulate(v, c);
    const SimulationResult h1 = run_unit_costs(zero_bubble_h1(p, m), true);
    const double ideal = 3.0 * m, bound = (p - 1) * (1.0 + 1.0 - 1.0) / 2.0;
    EXPECT_GE(zv.step_time, ideal + bound) << p << " " << m;
    // The list schedule below 2p micro-batches, torch's order from there: both at the bound
    // (the list schedule alone took 4.5 units over it at p = 8, m = 16).
    EXPECT_DOUBLE_EQ(zv.step_time, ideal + bound) << p << " " << m;
    EXPECT_LT(zv.step_time, h1.step_time) << p << " " << m;
    for (int r = 0; r < p; ++r) {
      EXPECT_LE(zv.peak_in_flight[static_cast<std::size_t>(r)], 2 * p) << r;  // chunks: half a stage each
      EXPECT_DOUBLE_EQ(zv.busy[static_cast<std::size_t>(r)], 3.0 * m) << r;
    }
  }
  // Every chunk's backward has its W after it, on its rank, and no send joins the two
  // chunks of rank p - 1 (the V turns there) or leaves the last stage.
  const PipelineSchedule v = zero_bubble_v(4, 8);
  int weights = 0, sends = 0;
  for (const auto& list : v.per_rank)
    for (const Action& a : list) {
      weights += a.kind == ActionKind::WeightGradient;
      if (a.kind == ActionKind::SendActivation) {
        ++sends;
        EXPECT_NE(a.stage, 3);  // stage p - 1 hands on to stage p on its own rank
        EXPECT_NE(a.stage, 7);
      }
    }
  EXPECT_EQ(weights, 8 * 8);
  EXPECT_EQ(sends, (8 - 2) * 8);  // 2p - 1 hops less the turn
}

// Liveness with held gradients (peak_bytes_held): without them it is peak_in_flight's count,
// and a fused schedule holds none. ZB-H1 at p = 4, m = 8 (compute order, F/B/W then micro-batch):
//   rank 0  F0 F1 F2 F3 B0 W0 B1 F4 B2 W1 ...   B0 W0 fused: 3 + 1 held, F4, B2: 4 + 2 held
//   rank 1  F0 F1 F2 F3 B0 W0 B1 W1 B2 F4 B3 W2 ...   two fused: 4 at most, or 3 + 2 held
//   rank 2  F0 F1 F2 B0 F3 B1 W0 ...   4 + 2 held
//   rank 3  F0 B0 F1 B1 F2 B2 F3 B3 W0 ...   4 + 4 held
// benchmarks/pipeline_memory.py measured those counts on TinyGPT (2026-12-02): saved tensors
// and held gradients at once 43.61, 35.07, 43.09 and 58.37 MiB, which are 4 x 8.03 + 2 x 5.75,
// 3 x 8.02 + 2 x 5.5, 4 x 8.02 + 2 x 5.5 and 4 x 8.59 + 4 x 6.0.
TEST(Schedules, PeakBytesHeldCountsGradientsFromBToWOnlyWhereTheyRunApart) {
  const int p = 4, m = 8;
  const std::vector<double> one(static_cast<std::size_t>(2 * p), 1.0), half(static_cast<std::size_t>(2 * p), 0.5);
  for (const PipelineSchedule& s : {gpipe(p, m), one_f_one_b(p, m), zero_bubble_h1(p, m), zero_bubble_v(p, m),
                                    dual_pipe_v(p, m), interleaved_1f1b(p, m, 2)})
    for (const auto& actions : s.per_rank) {
      EXPECT_DOUBLE_EQ(peak_bytes_held(actions, one, {}), peak_in_flight(actions));
      if (std::none_of(actions.begin(), actions.end(),
                       [](const Action& a) { return a.kind == ActionKind::WeightGradient; }))
        EXPECT_DOUBLE_EQ(peak_bytes_held(actions, one, half), peak_in_flight(actions));
    }
  const PipelineSchedule zb = zero_bubble_h1(p, m);
  const std::vector<double> expected = {4 + 2 * 0.5, 4, 4 + 2 * 0.5, 4 + 4 * 0.5};
  for (int r = 0; r < p; ++r)
    EXPECT_DOUBLE_EQ(peak_bytes_held(zb.per_rank[static_cast<std::size_t>(r)], one, half),
                     expected[static_cast<std::size_t>(r)])
        << r;
  // Rank 1 with held gradients as large as the saved tensors: 3 + 2 x 1 beats 4.
  EXPECT_DOUBLE_EQ(peak_bytes_held(zb.per_rank[1], one, one), 5);
}

// The liveness as counts (liveness_moments): a search prices one list thousands of times, so
// the moments are made once and a pricing is a few dot products. Each pricing equals the
// running total's largest value over the list, for any bytes; a steady schedule keeps as few
// moments at 960 micro-batches as at 16, and the same peak.
TEST(Schedules, LivenessMomentsPriceAsTheListDoesAndStayFewAsMicroBatchesGrow) {
  const int p = 4;
  std::mt19937 random(7);
  std::uniform_real_distribution<double> bytes(0.0, 10.0);
  auto running_peak = [](const std::vector<Action>& list, const std::vector<double>& saved,
                         const std::vector<double>& held) {  // the list walked, B/W pairs matched by hand
    double now = 0, peak = 0;
    std::vector<std::pair<int, int>> apart;
    for (std::size_t i = 0; i < list.size(); ++i) {
      const Action& a = list[i];
      if (!a.is_compute()) continue;
      const double s = saved[static_cast<std::size_t>(a.stage)], h = held[static_cast<std::size_t>(a.stage)];
      auto next = std::find_if(list.begin() + static_cast<std::ptrdiff_t>(i) + 1, list.end(),
                               [](const Action& b) { return b.is_compute(); });
      const bool has_w = std::any_of(list.begin(), list.end(),
                                     [](const Action& b) { return b.kind == ActionKind::WeightGradient; });
      const bool whole = !has_w || (next != list.end() && next->kind == ActionKind::WeightGradient &&
                                    next->stage == a.stage && next->micro_batch == a.micro_batch);
      if (a.kind == ActionKind::Forward) now += s;
      if (a.kind == ActionKind::Backward && whole) now -= s;
      if (a.kind == ActionKind::Backward && !whole) now += h, apart.emplace_back(a.stage, a.micro_batch);
      if (a.kind == ActionKind::WeightGradient) {
        auto it = std::find(apart.begin(), apart.end(), std::pair{a.stage, a.micro_batch});
        if (it != apart.end()) now -= s + h, apart.erase(it);
      }
      peak = std::max(peak, now);
    }
    return peak;
  };
  auto schedules = [&](int m) {
    return std::vector<PipelineSchedule>{gpipe(p, m), one_f_one_b(p, m), zero_bubble_h1(p, m), zero_bubble_v(p, m),
                                         dual_pipe_v(p, m), interleaved_1f1b(p, m, 2)};
  };
  const std::vector<PipelineSchedule> few = schedules(16), many = schedules(960);
  for (int trial = 0; trial < 5; ++trial) {
    std::vector<double> saved(2 * p), held(2 * p);
    for (int g = 0; g < 2 * p; ++g) saved[static_cast<std::size_t>(g)] = bytes(random), held[static_cast<std::size_t>(g)] = bytes(random);
    for (std::size_t k = 0; k < few.size(); ++k)
      for (int r = 0; r < p; ++r) {
        const auto& list = few[k].per_rank[static_cast<std::size_t>(r)];
        const auto& long_list = many[k].per_rank[static_cast<std::size_t>(r)];
        const LivenessMoments moments = liveness_moments(list), long_moments = liveness_moments(long_list);
        EXPECT_NEAR(peak_bytes_held(moments, saved, held), running_peak(list, saved, held), 1e-9) << k << " " << r;
        if (k == 0) continue;  // GPipe holds every micro-batch: its peak grows with m
        EXPECT_NEAR(peak_bytes_held(long_moments, saved, held), peak_bytes_held(moments, saved, held), 1e-9)
            << k << " " << r;
        EXPECT_LE(long_moments.moments.size(), 4u * p) << k << " " << r << ": of " << long_list.size();
      }
  }
  EXPECT_THROW(peak_bytes_held(liveness_moments(few[1].per_rank[0]), {-1.0}, {}), support::ValidationError);
}

}  // namespace
}  // namespace shardwise::schedule
