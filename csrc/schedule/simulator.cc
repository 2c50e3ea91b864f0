#include "schedule/simulator.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <stdexcept>
#include <utility>

#include "schedule/p2p_channels.h"
#include "schedule/schedules.h"
#include "support/error.h"

namespace shardwise::schedule {

TransferTime constant_transfer(double seconds) {
  return [seconds](double, double) { return seconds; };
}

TransferTime periodic_bandwidth(std::vector<double> durations, std::vector<double> bandwidth, double latency) {
  if (durations.empty() || durations.size() != bandwidth.size()) {
    throw support::ValidationError("periodic_bandwidth: need as many bandwidths as durations, at least one");
  }
  for (std::size_t j = 0; j < durations.size(); ++j) {
    if (!(durations[j] > 0.0) || !(bandwidth[j] > 0.0)) {
      throw support::ValidationError(fmt::format("periodic_bandwidth: segment {} needs a positive duration and bandwidth", j));
    }
  }
  const double period = std::accumulate(durations.begin(), durations.end(), 0.0);
  return [durations = std::move(durations), bandwidth = std::move(bandwidth), period, latency](double start,
                                                                                            double bytes) {
    // Walk segment by segment from the start; whole periods are skipped arithmetically
    // so a huge transfer on a slow link costs O(segments), not O(periods).
    double bytes_per_period = 0.0;
    for (std::size_t j = 0; j < durations.size(); ++j) bytes_per_period += durations[j] * bandwidth[j];
    double t = start;
    double left = bytes;
    double phase = std::fmod(start, period);
    std::size_t j = 0;
    while (phase >= durations[j]) phase -= durations[j++];
    for (int guard = 0; left > 0.0; ++guard) {
      if (guard == static_cast<int>(durations.size()) && left > bytes_per_period) {
        const double periods = std::floor(left / bytes_per_period);
        t += periods * period;
        left -= periods * bytes_per_period;
        if (left <= 0.0) break;
      }
      const double span = durations[j] - phase;
      const double can = span * bandwidth[j];
      if (can >= left) {
        t += left / bandwidth[j];
        left = 0.0;
        break;
      }
      t += span;
      left -= can;
      phase = 0.0;
      j = (j + 1) % durations.size();
    }
    return t - start + latency;
  };
}

const char* interval_kind_name(IntervalKind kind) {
  switch (kind) {
    case IntervalKind::Forward: return "forward";
    case IntervalKind::Backward: return "backward";
    case IntervalKind::WeightGradient: return "weight_gradient";
    case IntervalKind::Send: return "send";
    case IntervalKind::RecvWait: return "recv_wait";
    case IntervalKind::Update: return "update";
    case IntervalKind::Idle: return "idle";
  }
  return "?";
}

namespace {

// The simulation of lists validate() accepted; `record`: the timelines, busy times and peaks
// too (simulate's result), else only step_time (simulated_step_time's).
SimulationResult run_lists(const PipelineSchedule& s, const SimulationCosts& costs, bool record) {
  const int stages = s.total_stages();
  if (static_cast<int>(costs.forward.size()) != stages || static_cast<int>(costs.backward.size()) != stages) {
    throw support::ValidationError(fmt::format("simulate: need forward and backward times for {} virtual stages, got {} and {}",
                                               stages, costs.forward.size(), costs.backward.size()));
  }
  if (!costs.boundary_bytes.empty() && static_cast<int>(costs.boundary_bytes.size()) != stages - 1) {
    throw support::ValidationError(
        fmt::format("simulate: need {} boundary sizes, got {}", stages - 1, costs.boundary_bytes.size()));
  }
  const int m = s.micro_batches;
  const auto cells = static_cast<std::size_t>(stages) * static_cast<std::size_t>(m);
  auto cell = [m](int g, int i) { return static_cast<std::size_t>(g) * static_cast<std::size_t>(m) + static_cast<std::size_t>(i); };
  auto bytes_at = [&](int boundary) {
    return costs.boundary_bytes.empty() ? 0.0 : costs.boundary_bytes[static_cast<std::size_t>(boundary)];
  };
  auto transfer = [&](double start, int boundary) {
    return costs.transfer ? costs.transfer(start, bytes_at(boundary)) : 0.0;
  };

  // When each Send was reached, keyed by the producing stage, and when each receive was
  // posted, keyed by the receiving stage; negative = not yet. A transfer starts once both
  // happened (simulator.h: rendezvous), and the compute that reads it waits for its arrival.
  std::vector<double> act_sent(cells, -1.0), grad_sent(cells, -1.0);
  std::vector<double> act_posted(cells, -1.0), grad_posted(cells, -1.0);
  // A channel's transfers run one after another in its order (p2p_channels.h: one NCCL
  // communicator, one Gloo connection): each starts once the one before it has arrived.
  // Receives are read in the order they are posted, which is their channel's order
  // (check_ordered_transport), so transfers are timed here in that order too.
  std::vector<int> act_ordinal(cells, -1), grad_ordinal(cells, -1);  // position on its channel
  std::map<P2PChannel, int> posted_on;
  for (std::size_t r = 0; r < s.per_rank.size(); ++r) {
    for (const Action& a : s.per_rank[r]) {
      if (!a.is_recv()) continue;
      (a.kind == ActionKind::RecvActivation ? act_ordinal : grad_ordinal)[cell(a.stage, a.micro_batch)] =
          posted_on[p2p_channel(a, static_cast<int>(r))]++;
    }
  }
  std::map<P2PChannel, std::pair<int, double>> channel_at;  // (transfers timed, when the last arrives)
  const auto ranks = static_cast<std::size_t>(s.ranks);
  std::vector<double> clock(ranks, 0.0);
  std::vector<double> sends_done(ranks, 0.0);  // when the rank's last transfer out arrives
  std::vector<std::size_t> pc(ranks, 0);
  SimulationResult out;
  out.timelines.resize(ranks);
  out.busy.assign(ranks, 0.0);

  // validate() proved the lists run to completion, so sweeping the ranks until none
  // moves reaches the end; action times depend only on the rank's clock and the times its
  // peers reached their sends, not on the sweep order.
  for (bool progress = true; progress;) {
    progress = false;
    for (std::size_t r = 0; r < ranks; ++r) {
      const auto& list = s.per_rank[r];
      auto& tl = out.timelines[r];
      double& now = clock[r];
      for (; pc[r] < list.size(); ++pc[r]) {
        const Action& a = list[pc[r]];
        const int g = a.stage;
        const int i = a.micro_batch;
        if (a.is_recv()) {  // posted: the wait is the reading compute's
          (a.kind == ActionKind::RecvActivation ? act_posted : grad_posted)[cell(g, i)] = now;
        } else if (a.kind == ActionKind::SendActivation) {
          act_sent[cell(g, i)] = now;
        } else if (a.kind == ActionKind::SendGradient) {
          grad_sent[cell(g, i)] = now;
        } else if (a.is_compute()) {
          // The value this compute reads from another rank (a forward's activation, a
          // backward's gradient), if its receive was posted here.
          const bool forward = a.kind == ActionKind::Forward;
          double* posted = a.kind == ActionKind::WeightGradient ? nullptr
                           : forward                            ? &act_posted[cell(g, i)]
                                                                : &grad_posted[cell(g, i)];
          if (posted != nullptr && *posted >= 0.0) {
            const int from = forward ? g - 1 : g + 1;
            const double sent = forward ? act_sent[cell(from, i)] : grad_sent[cell(from, i)];
            if (sent < 0.0) break;  // not sent yet: come back on a later sweep
            const Action receive{forward ? ActionKind::RecvActivation : ActionKind::RecvGradient, g, i,
                                 s.rank_of_stage(from)};
            auto& [timed, free_at] = channel_at[p2p_channel(receive, static_cast<int>(r))];
            if ((forward ? act_ordinal : grad_ordinal)[cell(g, i)] != timed) {
              throw std::logic_error(fmt::format("simulate: rank {}: {} read out of its channel's order", r,
                                                 to_string(receive)));
            }
            const double start = std::max({*posted, sent, free_at});
            const double arrival = start + transfer(start, forward ? g - 1 : g);
            ++timed;
            free_at = arrival;
            const auto sender = static_cast<std::size_t>(s.rank_of_stage(from));
            if (record) out.timelines[sender].push_back({IntervalKind::Send, start, arrival, i, from});
            sends_done[sender] = std::max(sends_done[sender], arrival);
            if (arrival > now) {
              if (record) tl.push_back({IntervalKind::RecvWait, now, arrival, i, g});
              now = arrival;
            }
            *posted = -2.0;  // received
          }
          const auto u = static_cast<std::size_t>(g);
          const double d = a.kind == ActionKind::Forward    ? costs.forward[u]
                           : a.kind == ActionKind::Backward ? costs.backward[u]
                           : u < costs.weight.size()        ? costs.weight[u]
                                                            : 0.0;
          if (record)
            tl.push_back({a.kind == ActionKind::Forward    ? IntervalKind::Forward
                          : a.kind == ActionKind::Backward ? IntervalKind::Backward
                                                           : IntervalKind::WeightGradient,
                          now, now + d, i, g});
          now += d;
          out.busy[r] += d;
        } else {
          const double d = a.kind == ActionKind::OptimizerStep ? costs.optimizer_step : costs.grad_sync;
          if (d > 0.0 && record) tl.push_back({IntervalKind::Update, now, now + d, -1, -1});
          now += d;
        }
        progress = true;
      }
    }
  }
  // The step ends when every transfer a rank sent has completed (the runtime waits for its
  // sends before the step returns).
  for (std::size_t r = 0; r < ranks; ++r) clock[r] = std::max(clock[r], sends_done[r]);

  out.step_time = *std::max_element(clock.begin(), clock.end());
  if (!record) return out;
  for (std::size_t r = 0; r < ranks; ++r) {
    // Fill the gaps between the rank's own (non-send) intervals with Idle so the
    // timeline tiles [0, step_time].
    auto& tl = out.timelines[r];
    std::vector<Interval> filled;
    double t = 0.0;
    for (const Interval& iv : tl) {
      if (iv.kind != IntervalKind::Send) {
        if (iv.start > t) filled.push_back({IntervalKind::Idle, t, iv.start, -1, -1});
        t = iv.end;
      }
      filled.push_back(iv);
    }
    if (out.step_time > t) filled.push_back({IntervalKind::Idle, t, out.step_time, -1, -1});
    std::stable_sort(filled.begin(), filled.end(), [](const Interval& x, const Interval& y) { return x.start < y.start; });
    tl = std::move(filled);
    out.peak_in_flight.push_back(peak_in_flight(s.per_rank[r]));
  }
  const double total_busy = std::accumulate(out.busy.begin(), out.busy.end(), 0.0);
  const double max_busy = *std::max_element(out.busy.begin(), out.busy.end());
  const double rank_time = static_cast<double>(s.ranks) * out.step_time;
  out.bubble_fraction = rank_time > 0.0 ? (rank_time - total_busy) / rank_time : 0.0;
  out.bubble_overhead = max_busy > 0.0 ? (out.step_time - max_busy) / max_busy : 0.0;
  return out;
}

}  // namespace

SimulationResult simulate(const PipelineSchedule& s, const SimulationCosts& costs) {
  validate(s);
  return run_lists(s, costs, /*record=*/true);
}

double simulated_step_time(const PipelineSchedule& s, const SimulationCosts& costs) {
  return run_lists(s, costs, /*record=*/false).step_time;
}

}  // namespace shardwise::schedule
