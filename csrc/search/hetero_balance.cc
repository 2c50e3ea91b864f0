#include "search/hetero_balance.h"

#include <fmt/format.h>

#include <Highs.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <memory>
#include <numeric>
#include <string>

#include "support/error.h"

namespace shardwise::search {
namespace {

using support::ValidationError;

constexpr double kInf = std::numeric_limits<double>::infinity();

// Relative slack on memory checks: capacities are often computed as fixed + per-sample x n, and that
// sum should fit exactly rather than miss by a rounding error.
constexpr double kMemorySlack = 1e-9;

void check_field(std::size_t rank, const char* name, double value, bool allow_zero, bool allow_inf) {
  const bool bad = std::isnan(value) || value < 0 || (!allow_zero && value == 0) || (!allow_inf && std::isinf(value));
  if (bad) {
    throw ValidationError(fmt::format("balance_shares: rank {} has {} = {} (must be {}{})", rank, name, value,
                                      allow_zero ? ">= 0" : "> 0", allow_inf ? "" : " and finite"));
  }
}

void validate(std::span<const BalanceRank> ranks, std::int64_t global_batch) {
  if (ranks.empty()) throw ValidationError("balance_shares: no ranks to balance");
  if (global_batch < 1) {
    throw ValidationError(fmt::format("balance_shares: global_batch = {} (must be >= 1)", global_batch));
  }
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const BalanceRank& rank = ranks[r];
    check_field(r, "seconds_per_sample", rank.seconds_per_sample, /*allow_zero=*/false, /*allow_inf=*/false);
    check_field(r, "fixed_seconds", rank.fixed_seconds, true, false);
    check_field(r, "memory_per_sample", rank.memory_per_sample, true, false);
    check_field(r, "fixed_memory", rank.fixed_memory, true, false);
    check_field(r, "memory_capacity", rank.memory_capacity, true, /*allow_inf=*/true);
  }
}

double rank_time(const BalanceRank& rank, double samples) {
  return rank.fixed_seconds + rank.seconds_per_sample * samples;
}

bool fits(const BalanceRank& rank, std::int64_t samples) {
  if (std::isinf(rank.memory_capacity)) return true;
  const double used = rank.fixed_memory + rank.memory_per_sample * static_cast<double>(samples);
  return used <= rank.memory_capacity + kMemorySlack * std::max(1.0, rank.memory_capacity);
}

// Most whole samples the rank holds within its memory, at most global_batch; -1 when even its fixed
// memory overflows.
std::int64_t sample_cap(const BalanceRank& rank, std::int64_t global_batch) {
  if (!fits(rank, 0)) return -1;
  if (std::isinf(rank.memory_capacity) || rank.memory_per_sample == 0) return global_batch;
  const double room = (rank.memory_capacity - rank.fixed_memory) / rank.memory_per_sample;
  if (room >= static_cast<double>(global_batch)) return global_batch;
  auto cap = static_cast<std::int64_t>(std::floor(std::max(room, 0.0)));
  // The division may land a hair off an exact fit; settle it with the same check fits() applies.
  while (cap < global_batch && fits(rank, cap + 1)) ++cap;
  while (cap > 0 && !fits(rank, cap)) --cap;
  return cap;
}

double step_time_of(std::span<const BalanceRank> ranks, const std::vector<std::int64_t>& samples) {
  double worst = 0;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    worst = std::max(worst, rank_time(ranks[r], static_cast<double>(samples[r])));
  }
  return worst;
}

std::vector<std::int64_t> even_split(std::size_t n, std::int64_t global_batch) {
  const auto count = static_cast<std::int64_t>(n);
  std::vector<std::int64_t> samples(n, global_batch / count);
  for (std::int64_t r = 0; r < global_batch % count; ++r) ++samples[static_cast<std::size_t>(r)];
  return samples;
}

struct LpSolution {
  bool feasible = false;
  std::vector<double> shares;
  double step_time = 0;
};

// Solves the balance LP with HiGHS's simplex.
LpSolution solve_lp(std::span<const BalanceRank> ranks, std::int64_t global_batch) {
  const int n = static_cast<int>(ranks.size());
  const int t_col = n;
  HighsLp lp;
  lp.num_col_ = n + 1;
  lp.col_cost_.assign(static_cast<std::size_t>(n + 1), 0.0);
  lp.col_cost_[static_cast<std::size_t>(t_col)] = 1.0;
  lp.col_lower_.assign(static_cast<std::size_t>(n + 1), 0.0);
  lp.col_upper_.assign(static_cast<std::size_t>(n + 1), kHighsInf);
  // Rows, written row-wise: the matrix is small and this is how the model reads.
  lp.a_matrix_.format_ = MatrixFormat::kRowwise;
  lp.a_matrix_.start_ = {0};
  auto add_row = [&](std::initializer_list<std::pair<int, double>> entries, double lower, double upper) {
    for (const auto& [col, value] : entries) {
      lp.a_matrix_.index_.push_back(col);
      lp.a_matrix_.value_.push_back(value);
    }
    lp.a_matrix_.start_.push_back(static_cast<HighsInt>(lp.a_matrix_.index_.size()));
    lp.row_lower_.push_back(lower);
    lp.row_upper_.push_back(upper);
  };

  for (int r = 0; r < n; ++r) {
    const BalanceRank& rank = ranks[static_cast<std::size_t>(r)];
    // fixed + s x_r <= T  as  s x_r - T <= -fixed.
    add_row({{r, rank.seconds_per_sample}, {t_col, -1.0}}, -kHighsInf, -rank.fixed_seconds);
  }
  for (int r = 0; r < n; ++r) {
    const BalanceRank& rank = ranks[static_cast<std::size_t>(r)];
    if (std::isinf(rank.memory_capacity)) continue;
    const double room = rank.memory_capacity - rank.fixed_memory;
    if (rank.memory_per_sample == 0) {
      // No variable in the row: it either always holds or makes the problem infeasible outright.
      if (room < 0) return {};
      continue;
    }
    // Divided through by memory_per_sample so byte-sized coefficients do not strain the tolerances.
    add_row({{r, 1.0}}, -kHighsInf, room / rank.memory_per_sample);
  }
  for (int r = 0; r < n; ++r) {
    lp.a_matrix_.index_.push_back(r);
    lp.a_matrix_.value_.push_back(1.0);
  }
  lp.a_matrix_.start_.push_back(static_cast<HighsInt>(lp.a_matrix_.index_.size()));
  lp.row_lower_.push_back(static_cast<double>(global_batch));
  lp.row_upper_.push_back(static_cast<double>(global_batch));
  lp.num_row_ = static_cast<HighsInt>(lp.row_lower_.size());

  Highs highs;
  highs.setOptionValue("output_flag", false);
  highs.setOptionValue("threads", 1);
  if (highs.passModel(std::move(lp)) == HighsStatus::kError) {
    throw support::Error("balance_shares: HiGHS refused the balance LP (a malformed model)");
  }
  highs.run();
  const HighsModelStatus status = highs.getModelStatus();
  if (status == HighsModelStatus::kInfeasible) return {};
  if (status != HighsModelStatus::kOptimal) {
    throw support::Error(fmt::format("balance_shares: the LP solver stopped without an optimum ({})",
                                     highs.modelStatusToString(status)));
  }
  const std::vector<double>& x = highs.getSolution().col_value;
  LpSolution answer;
  answer.feasible = true;
  answer.shares.resize(static_cast<std::size_t>(n));
  for (std::size_t r = 0; r < answer.shares.size(); ++r) answer.shares[r] = std::max(0.0, x[r]);  // drop -1e-12 noise
  answer.step_time = x[static_cast<std::size_t>(t_col)];
  return answer;
}

// Largest remainders first: floors of the LP shares, then one more sample to each rank in order of
// its fractional part (ties to the lower rank) until the batch is met, never past a rank's cap.
// Fractional parts are compared in billionths of a sample: equal ranks' shares can differ in their
// last bits as the LP solver left them, and that noise must not decide a tie.
std::vector<std::int64_t> round_shares(std::span<const BalanceRank> ranks, const std::vector<double>& shares,
                                       const std::vector<std::int64_t>& caps, std::int64_t global_batch) {
  const std::size_t n = ranks.size();
  std::vector<std::int64_t> samples(n);
  std::vector<double> remainder(n);
  std::int64_t assigned = 0;
  for (std::size_t r = 0; r < n; ++r) {
    const double floor_share = std::floor(shares[r]);
    samples[r] = std::clamp(static_cast<std::int64_t>(floor_share), std::int64_t{0}, caps[r]);
    remainder[r] = std::round((shares[r] - floor_share) * 1e9);
    assigned += samples[r];
  }
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return remainder[a] > remainder[b]; });
  for (std::size_t r : order) {
    if (assigned >= global_batch) break;
    if (samples[r] < caps[r]) {
      ++samples[r];
      ++assigned;
    }
  }
  // Solver tolerances can leave the floors more than a rank per sample away from the batch; settle the
  // rest one sample at a time where it finishes earliest (or, when over, where it finishes last).
  while (assigned < global_batch) {
    std::size_t best = n;
    for (std::size_t r = 0; r < n; ++r) {
      if (samples[r] >= caps[r]) continue;
      if (best == n || rank_time(ranks[r], samples[r] + 1.0) < rank_time(ranks[best], samples[best] + 1.0)) best = r;
    }
    ++samples[best];  // the caller checked the caps sum to at least the batch
    ++assigned;
  }
  while (assigned > global_batch) {
    std::size_t worst = n;
    for (std::size_t r = 0; r < n; ++r) {
      if (samples[r] == 0) continue;
      if (worst == n || rank_time(ranks[r], samples[r]) > rank_time(ranks[worst], samples[worst])) worst = r;
    }
    --samples[worst];
    --assigned;
  }
  return samples;
}

// Moves single samples off the slowest rank (the lowest such rank on ties) to the rank that would finish
// earliest with one more (again the lowest on ties) while that lowers the step time and fits memory.
void improve(std::span<const BalanceRank> ranks, const std::vector<std::int64_t>& caps,
             std::vector<std::int64_t>& samples) {
  const std::size_t n = ranks.size();
  if (n < 2) return;
  while (true) {
    std::size_t slowest = 0;
    for (std::size_t r = 1; r < n; ++r) {
      if (rank_time(ranks[r], static_cast<double>(samples[r])) >
          rank_time(ranks[slowest], static_cast<double>(samples[slowest]))) {
        slowest = r;
      }
    }
    if (samples[slowest] == 0) return;  // only fixed time is left on it: no move can help
    std::size_t target = n;
    for (std::size_t r = 0; r < n; ++r) {
      if (r == slowest || samples[r] >= caps[r]) continue;
      if (target == n || rank_time(ranks[r], samples[r] + 1.0) < rank_time(ranks[target], samples[target] + 1.0)) {
        target = r;
      }
    }
    if (target == n) return;
    const double before = step_time_of(ranks, samples);
    --samples[slowest];
    ++samples[target];
    if (step_time_of(ranks, samples) >= before) {
      ++samples[slowest];
      --samples[target];
      return;
    }
  }
}

}  // namespace

std::vector<double> BalanceResult::ratios() const {
  const std::int64_t total = std::accumulate(samples.begin(), samples.end(), std::int64_t{0});
  std::vector<double> out(samples.size(), 0.0);
  if (total == 0) return out;
  for (std::size_t r = 0; r < samples.size(); ++r) {
    out[r] = static_cast<double>(samples[r]) / static_cast<double>(total);
  }
  return out;
}

BalanceResult balance_shares(std::span<const BalanceRank> ranks, std::int64_t global_batch) {
  validate(ranks, global_batch);
  const std::size_t n = ranks.size();

  BalanceResult result;
  const std::vector<std::int64_t> even = even_split(n, global_batch);
  result.even_step_time = step_time_of(ranks, even);
  for (std::size_t r = 0; r < n; ++r) {
    if (!fits(ranks[r], even[r])) result.even_step_time = kInf;
  }

  std::vector<std::int64_t> caps(n);
  std::int64_t total_cap = 0;
  bool some_rank_overflows = false;
  for (std::size_t r = 0; r < n; ++r) {
    caps[r] = sample_cap(ranks[r], global_batch);
    some_rank_overflows = some_rank_overflows || caps[r] < 0;
    total_cap += std::max<std::int64_t>(caps[r], 0);  // each cap is at most the batch: no overflow
  }

  LpSolution lp = solve_lp(ranks, global_batch);
  // The LP can be feasible while whole samples are not (caps of 2.5 and 2.5 for a batch of 5): then no
  // split fits either, and the result says so rather than hand back one that overflows.
  result.feasible = lp.feasible && !some_rank_overflows && total_cap >= global_batch;
  if (!result.feasible) {
    result.samples = even;
    result.step_time = step_time_of(ranks, even);
    if (lp.feasible) {
      result.lp_shares = std::move(lp.shares);
      result.lp_step_time = lp.step_time;
    } else {
      // No LP optimum exists; the even split stands in so the shares still have one entry per rank.
      result.lp_shares.assign(even.begin(), even.end());
      result.lp_step_time = result.step_time;
    }
    return result;
  }

  result.lp_shares = std::move(lp.shares);
  result.lp_step_time = lp.step_time;
  result.samples = round_shares(ranks, result.lp_shares, caps, global_batch);
  improve(ranks, caps, result.samples);
  result.step_time = step_time_of(ranks, result.samples);
  return result;
}

}  // namespace shardwise::search
