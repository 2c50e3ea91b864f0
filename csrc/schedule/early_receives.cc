#include "schedule/early_receives.h"

#include <cstddef>
#include <optional>
#include <vector>

namespace shardwise::schedule {
namespace {

std::vector<Action> receives_early(const std::vector<Action>& list) {
  std::vector<Action> out;
  out.reserve(list.size());
  std::optional<std::size_t> last_compute;  // where, in `out`, the latest compute action stands
  for (const Action& a : list) {
    if (a.is_recv() && last_compute) {
      // Before that compute, after the receives already moved there: their order is kept.
      out.insert(out.begin() + static_cast<std::ptrdiff_t>(*last_compute), a);
      ++*last_compute;
      continue;
    }
    out.push_back(a);
    if (a.is_compute()) last_compute = out.size() - 1;
  }
  return out;
}

}  // namespace

PipelineSchedule post_receives_early(PipelineSchedule schedule) {
  for (auto& list : schedule.per_rank) list = receives_early(list);
  return schedule;
}

}  // namespace shardwise::schedule
