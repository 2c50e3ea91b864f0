#include "cost/pipeline_transfers.h"

#include <cmath>
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

// Exact transfers on the critical path at m micro-batches: the step's slope in a transfer time
// far below every slack of the unit costs (the smallest is a fraction of a chunk's forward),
// rounded (a path's transfer count is a whole number).
double exact_transfers(plan::Schedule kind, int p, int m, int v, int k) {
  const schedule::PipelineSchedule lists = pipeline_schedule(kind, p, m, v, k);
  schedule::SimulationCosts costs = micro_batch_costs(kind, p * v, v, 3.0);  // forward 1 / v a chunk
  costs.boundary_bytes.assign(static_cast<std::size_t>(p * v - 1), 1.0);
  const double free = schedule::simulate(lists, costs).step_time;
  constexpr double kTransfer = 1e-6;
  costs.transfer = schedule::constant_transfer(kTransfer);
  const double timed = schedule::simulate(lists, costs).step_time;
  return std::round((timed - free) / kTransfer);
}

}  // namespace

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
  const int period = ranks * k;  // a whole number of interleaved rounds and kFkB groups
  double count = 0;
  if (micro_batches <= 16 * period) {
    count = exact_transfers(schedule, ranks, micro_batches, v, k);
  } else {
    // The steady state's slope over 4 periods of the same residue, extended.
    const int upper = 15 * period + micro_batches % period, lower = upper - 4 * period;
    const double at_upper = exact_transfers(schedule, ranks, upper, v, k);
    const double at_lower = exact_transfers(schedule, ranks, lower, v, k);
    count = at_upper + (at_upper - at_lower) / (4 * period) * (micro_batches - upper);
  }
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
