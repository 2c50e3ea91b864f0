// Receives posted one computation early (schedule/early_receives.h): the same actions, each
// receive before the compute that preceded it, the lists still valid and still paired by order
// on every channel, and a step that waits for fewer transfers.
#include "schedule/early_receives.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "schedule/p2p_channels.h"
#include "schedule/schedules.h"
#include "schedule/simulator.h"

namespace shardwise::schedule {
namespace {

std::string text(const std::vector<Action>& list) {
  std::string out;
  for (const Action& a : list) out += (out.empty() ? "" : " ") + to_string(a);
  return out;
}

// Every generator at a few sizes (each generator's own constraints: interleaved m % p == 0,
// the V schedules m >= 2p where they need it).
std::vector<std::pair<std::string, PipelineSchedule>> every_schedule() {
  std::vector<std::pair<std::string, PipelineSchedule>> out;
  for (int p : {2, 3, 4}) {
    for (int m : {2 * p, 4 * p}) {
      const std::string at = "p" + std::to_string(p) + " m" + std::to_string(m);
      out.emplace_back("gpipe " + at, gpipe(p, m));
      out.emplace_back("1f1b " + at, one_f_one_b(p, m));
      out.emplace_back("interleaved v2 " + at, interleaved_1f1b(p, m, 2));
      out.emplace_back("kfkb k2 " + at, kfkb(p, m, 2));
      out.emplace_back("zb-h1 " + at, zero_bubble_h1(p, m));
      out.emplace_back("zb-v " + at, zero_bubble_v(p, m));
      out.emplace_back("dualpipev " + at, dual_pipe_v(p, m));
    }
  }
  return out;
}

TEST(EarlyReceives, EachReceiveMovesBeforeTheComputeThatPrecededIt) {
  const PipelineSchedule early = post_receives_early(one_f_one_b(2, 3));
  EXPECT_EQ(text(early.per_rank[1]),
            "RA0@s1<-r0 F0@s1 RA1@s1<-r0 B0@s1 SG0@s1->r0 F1@s1 RA2@s1<-r0 B1@s1 SG1@s1->r0 F2@s1 B2@s1 "
            "SG2@s1->r0 OPT");
  // Rank 0's gradients: each posted before the compute before it (the last one before B1,
  // after the one for B1: a channel's order kept).
  EXPECT_EQ(text(early.per_rank[0]),
            "F0@s0 SA0@s0->r1 RG0@s0<-r1 F1@s0 SA1@s0->r1 B0@s0 RG1@s0<-r1 F2@s0 SA2@s0->r1 RG2@s0<-r1 B1@s0 B2@s0 "
            "OPT");
}

TEST(EarlyReceives, ListsStayValidAndPairedByOrderOnEveryChannel) {
  for (const auto& [name, generated] : every_schedule()) {
    const PipelineSchedule early = post_receives_early(generated);
    for (std::size_t r = 0; r < generated.per_rank.size(); ++r) {
      auto sorted = [](std::vector<Action> list) {
        std::sort(list.begin(), list.end(),
                  [](const Action& a, const Action& b) { return to_string(a) < to_string(b); });
        return list;
      };
      EXPECT_EQ(sorted(early.per_rank[r]), sorted(generated.per_rank[r])) << name << " rank " << r;
      // Each rank's receives, and its other actions, keep their relative order.
      auto only = [](const std::vector<Action>& list, bool receives) {
        std::vector<Action> out;
        std::copy_if(list.begin(), list.end(), std::back_inserter(out),
                     [&](const Action& a) { return a.is_recv() == receives; });
        return out;
      };
      EXPECT_EQ(only(early.per_rank[r], true), only(generated.per_rank[r], true)) << name << " rank " << r;
      EXPECT_EQ(only(early.per_rank[r], false), only(generated.per_rank[r], false)) << name << " rank " << r;
    }
    EXPECT_NO_THROW(validate(early)) << name;
    EXPECT_NO_THROW(check_ordered_transport(early)) << name;
  }
}

TEST(EarlyReceives, TheStepWaitsForNoMoreTransfersAndGPipeForFewer) {
  for (const auto& [name, generated] : every_schedule()) {
    const auto chunks = static_cast<std::size_t>(generated.total_stages());
    bool split = false;
    for (const auto& list : generated.per_rank)
      for (const Action& a : list) split = split || a.kind == ActionKind::WeightGradient;
    SimulationCosts costs;
    costs.forward.assign(chunks, 1.0);
    costs.backward.assign(chunks, split ? 1.0 : 2.0);
    if (split) costs.weight.assign(chunks, 1.0);
    costs.boundary_bytes.assign(chunks - 1, 1.0);
    costs.transfer = constant_transfer(0.25);
    const double late = simulate(generated, costs).step_time;
    const double early = simulate(post_receives_early(generated), costs).step_time;
    EXPECT_LE(early, late + 1e-9) << name;
  }
  // GPipe, p = 4, m = 8, F = 1, B = 2, each transfer 0.25: posted where they are read, every
  // forward after the first waits a transfer on ranks 1 to 3 (and every backward on ranks 0
  // to 2); posted one computation early, only the pipeline's fill and drain wait: 3 hops down,
  // 3 back, (8 + 3) x 3 + 6 x 0.25.
  SimulationCosts costs;
  costs.forward.assign(4, 1.0);
  costs.backward.assign(4, 2.0);
  costs.boundary_bytes.assign(3, 1.0);
  costs.transfer = constant_transfer(0.25);
  EXPECT_DOUBLE_EQ(simulate(post_receives_early(gpipe(4, 8)), costs).step_time, 33 + 6 * 0.25);
  EXPECT_GT(simulate(gpipe(4, 8), costs).step_time, 33 + 12 * 0.25);
}

}  // namespace
}  // namespace shardwise::schedule
