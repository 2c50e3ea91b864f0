#include "schedule/chrome_trace.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstddef>
#include <set>
#include <string>

#include "schedule/schedules.h"
#include "schedule/simulator.h"

namespace shardwise::schedule {
namespace {

TEST(ChromeTraceTest, OneCompleteEventPerNonIdleInterval) {
  const int p = 4;
  const int m = 8;
  const auto s = one_f_one_b(p, m);
  SimulationCosts costs;
  costs.forward.assign(p, 1.0);
  costs.backward.assign(p, 2.0);
  costs.transfer = constant_transfer(0.25);
  costs.optimizer_step = 0.5;
  const auto r = simulate(s, costs);

  // Expected X events: every interval of kind forward, backward, send, recv_wait, update.
  std::size_t expected = 0;
  std::size_t compute = 0;
  for (const auto& tl : r.timelines)
    for (const auto& iv : tl) {
      expected += iv.kind == IntervalKind::Forward || iv.kind == IntervalKind::Backward || iv.kind == IntervalKind::Send ||
                  iv.kind == IntervalKind::RecvWait || iv.kind == IntervalKind::Update;
      compute += iv.kind == IntervalKind::Forward || iv.kind == IntervalKind::Backward;
    }
  EXPECT_EQ(compute, static_cast<std::size_t>(2 * p * m));
  EXPECT_EQ(chrome_trace_event_count(r), expected);

  const auto doc = nlohmann::json::parse(chrome_trace(r, s));
  ASSERT_TRUE(doc.contains("traceEvents"));
  std::size_t x = 0;
  std::set<int> named_threads;
  double last_end = 0.0;
  bool saw_f3_s1 = false;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "X") {
      ++x;
      EXPECT_EQ(e["pid"], 0);
      const int tid = e["tid"].get<int>();
      EXPECT_GE(tid, 0);
      EXPECT_LT(tid, p);
      EXPECT_GE(e["dur"].get<double>(), 0.0);
      last_end = std::max(last_end, e["ts"].get<double>() + e["dur"].get<double>());
      if (e["name"] == "F3 s1") {
        saw_f3_s1 = true;
        EXPECT_EQ(tid, 1);
        EXPECT_EQ(e["cat"], "forward");
      }
    } else if (e["ph"] == "M" && e["name"] == "thread_name") {
      named_threads.insert(e["tid"].get<int>());
    }
  }
  EXPECT_EQ(x, expected);
  EXPECT_EQ(named_threads.size(), static_cast<std::size_t>(p));
  EXPECT_TRUE(saw_f3_s1);
  EXPECT_NEAR(last_end, r.step_time * 1e6, 1e-3);
}

}  // namespace
}  // namespace shardwise::schedule
