// Discrete-event simulation of a PipelineSchedule: the same per-rank action lists
// the executor runs, costed with per-stage compute times and a network model.
//
// Model (deliberately simple, each rule says why):
//   - A rank runs its list in order, one action at a time (one compute stream).
//   - Forward / Backward / WeightGradient of virtual stage g take forward[g] / backward[g] /
//     weight[g] seconds.
//   - Sends and receives are posted where the list puts them and take no time there; the
//     compute that reads a received value (a forward its activation, a backward its
//     gradient) waits for its arrival, a RecvWait interval. That is what the executor does
//     (runtime/pipeline_engine.py: irecv at RA/RG, wait at F/B; kFkB posts a group's
//     receives together).
//   - A transfer starts when both its Send and its Recv are posted, start = max(the two),
//     and lasts transfer(start, bytes) seconds: both transports the runtime runs on pair a
//     send with its receive before moving the bytes (rendezvous: Gloo waits for the
//     receive's notification, NCCL's send kernel for the receiving kernel; measured on
//     Gloo, 134 MB sent 1 s before its receive was posted still took the whole 0.043 s
//     after it). A rank's step ends once its own transfers out have arrived (the runtime
//     waits for its sends).
//   - A channel's transfers run one after another, in its order (p2p_channels.h: the runtime
//     sends each way and kind of a link on a process group of its own, one NCCL communicator
//     or one Gloo connection): a transfer starts no sooner than the one before it on its
//     channel arrives. kFkB's group, whose receives are posted together, waits for that.
//     Transfers on different channels do not contend (no link queue): bandwidth changes
//     over time are modelled, sharing is not.
//   - OptimizerStep / GradSync take optimizer_step / grad_sync seconds.
//   - The bytes of both the activation going g -> g+1 and the gradient coming back
//     g+1 -> g are boundary_bytes[g] (same tensor shape).
//
// Figures:
//   step_time        = time the last rank finishes its list.
//   busy[r]          = Forward + Backward + WeightGradient seconds on rank r.
//   bubble_fraction  = (ranks * step_time - sum_r busy[r]) / (ranks * step_time): the
//                      share of rank-time not spent computing. For GPipe / 1F1B with
//                      equal stages and free communication it is (p-1)/(m+p-1).
//   bubble_overhead  = (step_time - max_r busy[r]) / max_r busy[r]: the bubble relative
//                      to the ideal (bubble-free) step. GPipe: (p-1)/m; interleaved
//                      with v chunks: (p-1)/(v*m) -- Megatron's figure.
//   peak_in_flight[r]= peak_in_flight(per_rank[r]) (see schedules.h).
//
// Example: p = 4, m = 8, forward = 1, backward = 2, free network:
//   simulate(gpipe(4, 8), {...}).step_time == (8 + 3) * 3 == 33,
//   bubble_fraction == 3 / 11.
#pragma once

#include <functional>
#include <vector>

#include "schedule/action.h"

namespace shardwise::schedule {

// Seconds a transfer of `bytes` takes when it starts at `start_time`.
using TransferTime = std::function<double(double start_time, double bytes)>;

// A transfer that always takes `seconds`, whatever its size.
TransferTime constant_transfer(double seconds);

// Piecewise-constant link bandwidth that repeats with period sum(durations):
// segment j lasts durations[j] seconds at bandwidth[j] bytes/s. A transfer integrates
// the bandwidth from its start until `bytes` have moved, plus a fixed latency.
// Example: periodic_bandwidth({1.0, 1.0}, {100.0, 50.0}) halves the bandwidth every
// other second; 150 bytes starting at t = 0.5 move 50 B by t = 1 (100 B/s), 50 B more
// by t = 2 (50 B/s) and the last 50 B by t = 2.5 (100 B/s again): 2.0 s.
TransferTime periodic_bandwidth(std::vector<double> durations, std::vector<double> bandwidth, double latency = 0.0);

struct SimulationCosts {
  std::vector<double> forward;         // seconds per virtual stage
  std::vector<double> backward;        // seconds per virtual stage (the input's gradient only where
                                       // the schedule has WeightGradient actions)
  std::vector<double> weight;          // seconds per virtual stage of a WeightGradient action;
                                       // empty = 0 (a schedule without them)
  std::vector<double> boundary_bytes;  // per boundary g -> g+1 (size stages - 1); empty = 0 bytes
  TransferTime transfer;               // null = free communication
  double optimizer_step = 0.0;
  double grad_sync = 0.0;
};

enum class IntervalKind { Forward, Backward, WeightGradient, Send, RecvWait, Update, Idle };

const char* interval_kind_name(IntervalKind kind);

struct Interval {
  IntervalKind kind = IntervalKind::Idle;
  double start = 0.0;
  double end = 0.0;
  int micro_batch = -1;  // -1 for Idle / Update
  int stage = -1;
};

struct SimulationResult {
  double step_time = 0.0;
  double bubble_fraction = 0.0;
  double bubble_overhead = 0.0;
  std::vector<double> busy;
  std::vector<int> peak_in_flight;
  // Per rank, sorted by start. Send intervals (the transfer in flight, from the moment
  // its receiver posted the receive) overlap the rank's other intervals because sends are
  // asynchronous; all other kinds tile [0, step_time] exactly.
  std::vector<std::vector<Interval>> timelines;
};

// Validates the schedule (schedules.h validate()) and simulates it.
// Throws support::ValidationError if costs do not cover every virtual stage.
SimulationResult simulate(const PipelineSchedule& schedule, const SimulationCosts& costs);
// simulate's step_time alone, without its timelines, for a caller that times lists many times
// (cost/pipeline_transfers.h). The lists must be ones validate() accepted: not checked here.
// Throws support::ValidationError if costs do not cover every virtual stage.
double simulated_step_time(const PipelineSchedule& schedule, const SimulationCosts& costs);

}  // namespace shardwise::schedule
