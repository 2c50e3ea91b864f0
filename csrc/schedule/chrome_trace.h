// The timeline of a simulated pipeline step as Chrome trace JSON (chrome://tracing,
// https://ui.perfetto.dev open it).
//
// Format: {"traceEvents": [...], "displayTimeUnit": "ms"} with
//   - one "M" thread_name metadata event per rank (pid 0, tid r, name "rank r") and one
//     process_name event (pid 0, "pipeline");
//   - one "X" (complete) event per simulated interval whose kind is forward, backward,
//     send, recv_wait or update -- every interval except Idle (idle is the absence of
//     events). Zero-length intervals are kept (dur 0) so the count is exact.
//     name: "F3 s1" / "B3 s1" (micro-batch 3, virtual stage 1), "send 3 s1",
//     "wait 3 s1", "update"; cat: interval_kind_name(); pid 0; tid = rank;
//     ts / dur in microseconds (simulated seconds * 1e6); args: micro_batch, stage.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "schedule/action.h"
#include "schedule/simulator.h"

namespace shardwise::schedule {

// `rank_labels`: per rank, what its thread is named after "rank r" (a heterogeneous
// pipeline's device type: "rank 1 (a100-half)"); empty: "rank r" alone.
std::string chrome_trace(const SimulationResult& result, const PipelineSchedule& schedule,
                         const std::vector<std::string>& rank_labels = {});

// Number of "X" events chrome_trace() emits for `result` (non-Idle intervals).
std::size_t chrome_trace_event_count(const SimulationResult& result);

}  // namespace shardwise::schedule
