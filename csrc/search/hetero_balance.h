// Uneven batch shares for heterogeneous clusters (HAP's load balancing): given how long
// each rank of a data-parallel group takes per sample and how much memory a sample costs
// it, split a global batch so every rank finishes together within its memory.
//
// Linear programme over the shares x_r (samples, continuous), solved by HiGHS's simplex:
//   minimise   T
//   subject to fixed_seconds_r + seconds_per_sample_r x_r <= T        every rank
//              fixed_memory_r + memory_per_sample_r x_r <= memory_capacity_r
//              sum_r x_r = global_batch,  x_r >= 0
// then rounded to whole samples (largest remainders first, then moving single samples
// from the slowest rank to the one that would finish earliest while that lowers the
// maximum and fits memory), so the integer split's step time is within one sample's time
// of the LP optimum.
//
// Worked example: two ranks, 1 s and 2 s per sample, no fixed time, memory no object,
// batch 12: LP x = (8, 4), T = 8; samples (8, 4); even split (6, 6) takes 12 s.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace shardwise::search {

struct BalanceRank {
  double seconds_per_sample = 0;  // > 0
  double fixed_seconds = 0;       // >= 0: time that does not depend on the share
  double memory_per_sample = 0;   // >= 0
  double fixed_memory = 0;        // >= 0
  double memory_capacity = std::numeric_limits<double>::infinity();
};

struct BalanceResult {
  bool feasible = false;             // some split fits every rank's memory
  std::vector<double> lp_shares;     // LP optimum, samples per rank (sum = global_batch)
  double lp_step_time = 0;           // T of the LP
  std::vector<std::int64_t> samples; // integer split (sum = global_batch)
  double step_time = 0;              // max_r of fixed + per_sample x samples
  double even_step_time = 0;         // the same for the even split (global_batch / ranks, the
                                     // remainder to the first ranks); +inf if it overflows memory
  std::vector<double> ratios() const;  // samples / global_batch
};

// Throws support::ValidationError on no ranks, global_batch < 1, or a negative, zero
// (seconds_per_sample) or NaN field, naming the rank.
BalanceResult balance_shares(std::span<const BalanceRank> ranks, std::int64_t global_batch);

}  // namespace shardwise::search
