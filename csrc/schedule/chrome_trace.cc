#include "schedule/chrome_trace.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <cstddef>
#include <string>

namespace shardwise::schedule {
namespace {

std::string event_name(const Interval& iv) {
  switch (iv.kind) {
    case IntervalKind::Forward: return fmt::format("F{} s{}", iv.micro_batch, iv.stage);
    case IntervalKind::Backward: return fmt::format("B{} s{}", iv.micro_batch, iv.stage);
    case IntervalKind::WeightGradient: return fmt::format("W{} s{}", iv.micro_batch, iv.stage);
    case IntervalKind::Send: return fmt::format("send {} s{}", iv.micro_batch, iv.stage);
    case IntervalKind::RecvWait: return fmt::format("wait {} s{}", iv.micro_batch, iv.stage);
    case IntervalKind::Update: return "update";
    case IntervalKind::Idle: return "idle";
  }
  return "?";
}

}  // namespace

std::size_t chrome_trace_event_count(const SimulationResult& result) {
  std::size_t n = 0;
  for (const auto& tl : result.timelines)
    for (const Interval& iv : tl)
      if (iv.kind != IntervalKind::Idle) ++n;
  return n;
}

std::string chrome_trace(const SimulationResult& result, const PipelineSchedule& schedule,
                         const std::vector<std::string>& rank_labels) {
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", 0}, {"tid", 0},
                    {"args", {{"name", fmt::format("pipeline ({} ranks, {} micro-batches)", schedule.ranks,
                                                   schedule.micro_batches)}}}});
  for (std::size_t r = 0; r < result.timelines.size(); ++r) {
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", 0}, {"tid", r},
                      {"args", {{"name", r < rank_labels.size() && !rank_labels[r].empty()
                                             ? fmt::format("rank {} ({})", r, rank_labels[r])
                                             : fmt::format("rank {}", r)}}}});
    events.push_back({{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", 0}, {"tid", r},
                      {"args", {{"sort_index", r}}}});
  }
  for (std::size_t r = 0; r < result.timelines.size(); ++r) {
    for (const Interval& iv : result.timelines[r]) {
      if (iv.kind == IntervalKind::Idle) continue;
      events.push_back({{"ph", "X"},
                        {"name", event_name(iv)},
                        {"cat", interval_kind_name(iv.kind)},
                        {"pid", 0},
                        {"tid", r},
                        {"ts", iv.start * 1e6},
                        {"dur", (iv.end - iv.start) * 1e6},
                        {"args", {{"micro_batch", iv.micro_batch}, {"stage", iv.stage}}}});
    }
  }
  nlohmann::json doc = {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
  return doc.dump();
}

}  // namespace shardwise::schedule
