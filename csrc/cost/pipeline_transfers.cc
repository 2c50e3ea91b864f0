#include "cost/pipeline_transfers.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "schedule/early_receives.h"
#include "schedule/schedules.h"

namespace shardwise::cost {
namespace {

// The generator's lists, each receive just before the compute that reads it.
schedule::PipelineSchedule generated_schedule(plan::Schedule schedule, int ranks, int micro_batches,
                                              int virtual_stages, int kfkb_k) {
  switch (schedule) {
    case plan::Schedule::GPipe: return schedule::gpipe(ranks, micro_batches);
    case plan::Schedule::Interleaved1F1B: return schedule::interleaved_1f1b(ranks, micro_batches, virtual_stages);
    case plan::Schedule::KFKB: return schedule::kfkb(ranks, micro_batches, kfkb_k);
    case plan::Schedule::ZeroBubbleH1: return schedule::zero_bubble_h1(ranks, micro_batches);
    case plan::Schedule::ZeroBubbleV: return schedule::zero_bubble_v(ranks, micro_batches);
    case plan::Schedule::DualPipeV: return schedule::dual_pipe_v(ranks, micro_batches);
    case plan::Schedule::OneFOneB: break;
  }
  return schedule::one_f_one_b(ranks, micro_batches);
}

// The step's growth, in units of a stage's forward (a micro-batch is 3), when every send takes
// `transfer` units: the simulation with the sends against the one without.
double exact_exposed(plan::Schedule kind, int p, int m, int v, int k, double transfer) {
  const schedule::PipelineSchedule lists = pipeline_schedule(kind, p, m, v, k);
  schedule::SimulationCosts costs = micro_batch_costs(kind, p * v, v, 3.0);  // forward 1 / v a chunk
  costs.boundary_bytes.assign(static_cast<std::size_t>(p * v - 1), 1.0);
  const double free = schedule::simulate(lists, costs).step_time;
  costs.transfer = schedule::constant_transfer(transfer);
  return schedule::simulate(lists, costs).step_time - free;
}

// Exact transfers on the critical path at m micro-batches: the step's slope in a transfer time
// far below every slack of the unit costs (the smallest is a fraction of a chunk's forward),
// rounded (a path's transfer count is a whole number).
double exact_transfers(plan::Schedule kind, int p, int m, int v, int k) {
  constexpr double kTransfer = 1e-6;
  return std::round(exact_exposed(kind, p, m, v, k, kTransfer) / kTransfer);
}

// `exact` (a figure of the lists at a micro-batch count) at m micro-batches of a schedule whose
// lists repeat every `period` (p k: whole interleaved rounds and kFkB groups): exact up to 16
// periods, beyond them the steady state's slope over 4 periods of m's residue, extended.
template <typename Exact>
double at_micro_batches(int period, int m, Exact exact) {
  if (m <= 16 * period) return exact(m);
  const int upper = 15 * period + m % period, lower = upper - 4 * period;
  const double at_upper = exact(upper), at_lower = exact(lower);
  return at_upper + (at_upper - at_lower) / (4 * period) * (m - upper);
}

double exposed_at(plan::Schedule kind, int p, int m, int v, int k, double transfer) {
  return at_micro_batches(p * k, m, [&](int n) { return exact_exposed(kind, p, n, v, k, transfer); });
}

// A send up to an eighth of a chunk's forward is short: every send on the critical path at
// zero waits its whole length and no other path overtakes it (the count is exact there; the
// first kinks in the schedules tried, 1F1B, interleaved, ZB-H1, ZB-V and DualPipeV at p 4, 8
// and 16: DualPipeV's between an eighth and a quarter of a chunk's forward, interleaved
// 1F1B's (v 6, p 16) beyond three quarters, 1F1B's none up to two stage forwards).
constexpr double kShortOfAChunk = 1.0 / 8;
// The grid the longer sends are simulated at: 8 points an octave (9% apart).
constexpr double kGridPerOctave = 8;

// Per (schedule, p, m, v, k): the simulated growth at each grid point asked for, and the
// largest point at which it was the count's (the step is convex in the send's length and
// linear from zero to there, so every shorter send is the count's too).
struct ExposedCurve {
  std::map<int, double> at;
  int linear_to = std::numeric_limits<int>::min();
};

}  // namespace

double exposed_transfer_seconds(plan::Schedule schedule, int ranks, int micro_batches, int virtual_stages,
                                int kfkb_k, double transfer_seconds, double per_micro_batch_seconds) {
  if (ranks <= 1 || transfer_seconds <= 0) return 0.0;
  const double count = critical_transfers(schedule, ranks, micro_batches, virtual_stages, kfkb_k);
  if (!(per_micro_batch_seconds > 0)) return count * transfer_seconds;
  const int v = plan::v_shaped(schedule) ? 2 : virtual_stages;
  const int k = schedule == plan::Schedule::KFKB ? kfkb_k : 1;
  const double unit = per_micro_batch_seconds / 3;  // a stage's forward
  const double ratio = transfer_seconds / unit;
  if (ratio <= kShortOfAChunk / v) return count * transfer_seconds;
  // The nearest grid points below and above, interpolated: a chord of a convex piecewise
  // linear function over 9% of its argument.
  const int lo_index = static_cast<int>(std::floor(std::log2(ratio) * kGridPerOctave)), hi_index = lo_index + 1;
  auto grid = [](int index) { return std::exp2(index / kGridPerOctave); };
  static std::mutex mutex;
  static std::map<std::tuple<plan::Schedule, int, int, int, int>, ExposedCurve> curves;
  const auto key = std::make_tuple(schedule, ranks, micro_batches, v, k);
  {
    const std::lock_guard<std::mutex> lock(mutex);
    if (hi_index <= curves[key].linear_to) return count * transfer_seconds;
  }
  auto exposed = [&](int index) {
    {
      const std::lock_guard<std::mutex> lock(mutex);
      const ExposedCurve& curve = curves[key];
      if (auto it = curve.at.find(index); it != curve.at.end()) return it->second;
    }
    const double units = exposed_at(schedule, ranks, micro_batches, v, k, grid(index));
    const std::lock_guard<std::mutex> lock(mutex);
    ExposedCurve& curve = curves[key];
    curve.at.emplace(index, units);
    if (units <= count * grid(index) * (1 + 1e-9)) curve.linear_to = std::max(curve.linear_to, index);
    return units;
  };
  const double hi = exposed(hi_index);
  if (hi <= count * grid(hi_index) * (1 + 1e-9)) return count * transfer_seconds;
  const double lo = exposed(lo_index);
  const double units = lo + (hi - lo) * (ratio - grid(lo_index)) / (grid(hi_index) - grid(lo_index));
  // Never below the short sends' figure: a longer send hides no more of itself.
  return std::max(count * transfer_seconds, units * unit);
}

// Every schedule with its receives posted one computation early (schedule/early_receives.h):
// the lists the executor runs and the simulator prices.
schedule::PipelineSchedule pipeline_schedule(plan::Schedule schedule, int ranks, int micro_batches,
                                             int virtual_stages, int kfkb_k) {
  return schedule::post_receives_early(generated_schedule(schedule, ranks, micro_batches, virtual_stages, kfkb_k));
}

schedule::SimulationCosts micro_batch_costs(plan::Schedule schedule, int chunks, int virtual_stages,
                                            double per_micro_batch) {
  const auto n = static_cast<std::size_t>(chunks);
  const double third = per_micro_batch / 3 / virtual_stages;
  schedule::SimulationCosts costs;
  costs.forward.assign(n, third);
  costs.backward.assign(n, 2 * per_micro_batch / 3 / virtual_stages);
  if (plan::splits_backward(schedule)) {
    costs.backward.assign(n, third);
    costs.weight.assign(n, third);
  }
  return costs;
}

namespace {

// The flush of `lists` with chunk g at its rank's times (the forward the rest of the backward).
double flush_seconds(const schedule::PipelineSchedule& lists, const std::vector<double>& seconds,
                     const std::vector<double>& backward) {
  const int chunks = lists.total_stages(), v = lists.virtual_stages;
  const bool split = lists.splits_backward();
  schedule::SimulationCosts costs;
  for (int g = 0; g < chunks; ++g) {
    const auto r = static_cast<std::size_t>(lists.rank_of_stage(g));
    const double b = std::clamp(backward[r], 0.0, seconds[r]);
    costs.forward.push_back((seconds[r] - b) / v);
    costs.backward.push_back((split ? b / 2 : b) / v);
    if (split) costs.weight.push_back(b / 2 / v);
  }
  return schedule::simulated_step_time(lists, costs);
}

}  // namespace

double uneven_bubble_scale(plan::Schedule schedule, int ranks, int micro_batches, int virtual_stages, int kfkb_k,
                           const std::vector<double>& device_seconds, const std::vector<double>& device_backward) {
  if (ranks <= 1 || device_seconds.size() != static_cast<std::size_t>(ranks) ||
      device_backward.size() != device_seconds.size())
    return 1.0;
  const double worst = std::ranges::max(device_seconds);
  if (!(worst > 0) || std::ranges::min(device_seconds) >= worst * (1 - 1e-9)) return 1.0;
  const int v = plan::v_shaped(schedule) ? 2 : virtual_stages;
  const int period = ranks * (schedule == plan::Schedule::KFKB ? kfkb_k : 1);
  const int m = micro_batches <= 4 * period ? micro_batches : 4 * period + micro_batches % period;
  // The scale depends on the times only over the slowest device's: each distinct shape is
  // simulated once, its times rounded to 1e-4 of the slowest (a step's 0.01% at most). A search
  // meets mostly new ones (GPT-3 175B on 1,024 GPUs: 11,400), so the cache is emptied past 2^16
  // entries rather than grow with every search a process runs.
  std::vector<long> key_times;  // each device's time, then its backward's, in 1e-4 of the slowest
  std::vector<double> seconds, backward;
  for (std::size_t r = 0; r < device_seconds.size(); ++r) {
    key_times.push_back(std::lround(device_seconds[r] / worst * 1e4));
    key_times.push_back(std::lround(std::clamp(device_backward[r], 0.0, device_seconds[r]) / worst * 1e4));
    seconds.push_back(key_times[2 * r] / 1e4), backward.push_back(key_times[2 * r + 1] / 1e4);
  }
  using Key = std::tuple<plan::Schedule, int, int, int, int, std::vector<long>>;
  static std::mutex mutex;
  static std::map<std::tuple<plan::Schedule, int, int, int, int>, std::shared_ptr<const schedule::PipelineSchedule>>
      lists_cache;
  static std::map<Key, double> scale_cache;
  const auto shape = std::make_tuple(schedule, ranks, m, v, kfkb_k);
  const Key key = std::tuple_cat(shape, std::make_tuple(key_times));
  std::shared_ptr<const schedule::PipelineSchedule> cached;
  {
    const std::lock_guard<std::mutex> lock(mutex);
    if (auto it = scale_cache.find(key); it != scale_cache.end()) return it->second;
    auto& slot = lists_cache[shape];
    if (!slot) {
      slot = std::make_shared<const schedule::PipelineSchedule>(pipeline_schedule(schedule, ranks, m, v, kfkb_k));
      schedule::validate(*slot);  // once: simulated_step_time takes valid lists
    }
    cached = slot;
  }
  const std::size_t busiest = static_cast<std::size_t>(std::ranges::max_element(seconds) - seconds.begin());
  const std::vector<double> equal(seconds.size(), seconds[busiest]), equal_backward(seconds.size(), backward[busiest]);
  const double busy = m * seconds[busiest];
  const double even = flush_seconds(*cached, equal, equal_backward) - busy;
  const double scale = even > busy * 1e-9 ? std::max(0.0, flush_seconds(*cached, seconds, backward) - busy) / even : 1.0;
  const std::lock_guard<std::mutex> lock(mutex);
  if (scale_cache.size() >= (std::size_t{1} << 16)) scale_cache.clear();
  scale_cache.emplace(key, scale);
  return scale;
}

schedule::PipelineSchedule pipeline_schedule(const plan::Plan& plan) {
  return pipeline_schedule(plan.schedule, plan.pipeline, static_cast<int>(plan.num_micro_batches()),
                           plan.virtual_stages, plan.kfkb_k);
}

double critical_transfers(plan::Schedule schedule, int ranks, int micro_batches, int virtual_stages, int kfkb_k) {
  if (ranks <= 1) return 0.0;
  const int v = plan::v_shaped(schedule) ? 2 : virtual_stages;
  const int k = schedule == plan::Schedule::KFKB ? kfkb_k : 1;
  const auto key = std::make_tuple(schedule, ranks, micro_batches, v, k);
  static std::mutex mutex;
  static std::map<std::tuple<plan::Schedule, int, int, int, int>, double> cache;
  {
    const std::lock_guard<std::mutex> lock(mutex);
    if (auto it = cache.find(key); it != cache.end()) return it->second;
  }
  const double count = at_micro_batches(ranks * k, micro_batches,
                                        [&](int n) { return exact_transfers(schedule, ranks, n, v, k); });
  const std::lock_guard<std::mutex> lock(mutex);
  cache.emplace(key, count);
  return count;
}

std::shared_ptr<const std::vector<schedule::LivenessMoments>> cached_liveness_moments(const plan::Plan& plan) {
  using Moments = std::vector<schedule::LivenessMoments>;
  const int m = static_cast<int>(plan.num_micro_batches());
  const auto key = std::make_tuple(plan.schedule, plan.pipeline, m, plan.virtual_stages, plan.kfkb_k);
  static std::mutex mutex;
  static std::map<std::tuple<plan::Schedule, int, int, int, int>, std::shared_ptr<const Moments>> cache;
  {
    const std::lock_guard<std::mutex> lock(mutex);
    if (auto it = cache.find(key); it != cache.end()) return it->second;
  }
  auto moments = std::make_shared<Moments>();
  for (const auto& list : pipeline_schedule(plan).per_rank) moments->push_back(schedule::liveness_moments(list));
  const std::lock_guard<std::mutex> lock(mutex);
  return cache.emplace(key, std::move(moments)).first->second;
}

}  // namespace shardwise::cost
