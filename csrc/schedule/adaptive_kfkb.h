// Adaptive kFkB (Ada-Grouper): pick the group size k of kfkb(p, m, k) from the network
// condition within a memory limit.
//
// For each candidate k (ascending, k <= m): peak memory = max_r peak_in_flight(rank r)
// * memory_per_micro_batch; a k whose peak exceeds memory_limit is skipped; the others
// are simulated (simulator.h) and the fastest step wins; a larger k must beat the best
// smaller k by more than `min_gain` (relative) to be chosen, since it costs k times the
// activation memory -- ties and near-ties go to the smaller k. k = 1 is 1F1B, so on a free or fast network (nothing to hide)
// k = 1 wins; on a slow or fluctuating one, larger groups overlap k transfers with k
// computes and win despite k times the activation memory.
//
// Example: p = 4, m = 16, forward 1 s, backward 2 s, 100 B per boundary over a link of
// 200 B/s for 2 s then 100 B/s for 2 s: picks k > 1 (see adaptive_kfkb_test.cc for the
// figures); the same with a free or 0.01 s constant transfer picks k = 1 (there k = 2 is only 0.4%
// faster: 57.06 s vs 57.28 s, below min_gain).
#pragma once

#include <vector>

#include "schedule/simulator.h"

namespace shardwise::schedule {

struct AdaptiveCandidate {
  int k = 1;
  double peak_memory = 0.0;  // bytes (or whatever unit memory_per_micro_batch uses)
  bool fits = false;
  double step_time = 0.0;    // 0 when it does not fit (not simulated)
};

struct AdaptiveChoice {
  int k = 1;
  double step_time = 0.0;
  double peak_memory = 0.0;
  std::vector<AdaptiveCandidate> candidates;  // every candidate considered, in order
};

struct AdaptiveKfkbInput {
  int ranks = 0;
  int micro_batches = 0;
  SimulationCosts costs;                // forward / backward per stage, boundary_bytes, transfer
  double memory_per_micro_batch = 0.0;  // activation memory one in-flight micro-batch holds
  double memory_limit = 0.0;            // <= 0: no limit
  std::vector<int> candidates = {1, 2, 4, 8};
  double min_gain = 0.01;               // relative step-time gain a larger k must bring
};

// Throws support::ValidationError if no candidate fits the memory limit.
AdaptiveChoice choose_k(const AdaptiveKfkbInput& input);

}  // namespace shardwise::schedule
