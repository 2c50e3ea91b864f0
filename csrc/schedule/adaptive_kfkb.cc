#include "schedule/adaptive_kfkb.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "schedule/schedules.h"
#include "support/error.h"

namespace shardwise::schedule {

AdaptiveChoice choose_k(const AdaptiveKfkbInput& input) {
  if (input.ranks <= 0 || input.micro_batches <= 0)
    throw support::ValidationError(
        fmt::format("choose_k: need positive ranks and micro-batches, got {} and {}", input.ranks, input.micro_batches));
  std::vector<int> ks = input.candidates;
  std::sort(ks.begin(), ks.end());
  ks.erase(std::unique(ks.begin(), ks.end()), ks.end());

  AdaptiveChoice choice;
  bool found = false;
  for (int k : ks) {
    if (k < 1 || k > input.micro_batches) continue;
    const PipelineSchedule s = kfkb(input.ranks, input.micro_batches, k);
    AdaptiveCandidate c;
    c.k = k;
    int peak = 0;
    for (const auto& actions : s.per_rank) peak = std::max(peak, peak_in_flight(actions));
    c.peak_memory = peak * input.memory_per_micro_batch;
    c.fits = input.memory_limit <= 0.0 || c.peak_memory <= input.memory_limit;
    if (c.fits) {
      c.step_time = simulate(s, input.costs).step_time;
      if (!found || c.step_time < choice.step_time * (1.0 - std::max(input.min_gain, 1e-9))) {
        choice.k = k;
        choice.step_time = c.step_time;
        choice.peak_memory = c.peak_memory;
        found = true;
      }
    }
    choice.candidates.push_back(c);
  }
  if (!found)
    throw support::ValidationError(fmt::format(
        "choose_k: no group size fits the memory limit {} ({} per in-flight micro-batch, {} ranks, {} micro-batches)",
        input.memory_limit, input.memory_per_micro_batch, input.ranks, input.micro_batches));
  return choice;
}

}  // namespace shardwise::schedule
