// How many of a pipeline's sends a step waits for: the transfers on the critical path of the
// schedule's action lists (schedule/schedules.h, receives posted early), as the simulator
// (schedule/simulator.h) times the runtime's sends and receives: asynchronous beside compute, a
// transfer starting once its receive is posted, one channel's transfers in order.
//
// The evaluator (plan_cost.h) prices a pipeline's communication as this count times one
// send's seconds. It used to charge 2 v sends per micro-batch, exposed, and (p - 1) / v
// micro-batches' more in the bubble, whatever the schedule. The lists post each receive one
// computation before the compute that reads it (schedule/early_receives.h), so a transfer
// runs beside that computation: 1F1B at p = 2 waits for 8 at m = 8 (9 with each receive
// posted where it is read; 18 charged once), at p = 4 for 28 at m = 16 (35), GPipe and
// DualPipeV at p = 4 only for the fill and drain's 6 (36 and 37), interleaved 1F1B (v = 2) for
// 14 (53), while ZB-H1 at p = 4 waits for 34 (48), more than 1F1B: its weight gradients fill
// the slack the sends would hide in.
//
// The count is the step's slope in the transfer time at zero (each path's length is its
// compute plus its transfers times the transfer time: the slope is the most transfers on a
// longest path), so it is a small-transfer figure, the regime of a plan whose sends are
// short beside its compute. Where they are long the evaluator simulates the lists at the
// send's length (exposed_transfer_seconds, below); where the network varies the joint
// planner simulates the plan itself (search/joint_planner.h, NetworkCondition).
//
// Unit costs, as the evaluator prices a micro-batch: forward 1 / v per chunk, backward 2 / v
// (schedules that split it: B 1 / v and W 1 / v, W half the backward). Exact for m up to
// 16 p k micro-batches (k: kFkB's group, else 1); beyond, the steady state's slope over 4 p k
// micro-batches of m's residue, extended: exact for GPipe, 1F1B, interleaved 1F1B, kFkB (k 2),
// ZB-V and DualPipeV (their counts repeat every p k micro-batches there), within 1.3% for
// ZB-H1, whose count repeats over other periods (e.g. 24 micro-batches at p = 6): every p from
// 2 to 8, m from 16 p k to 18 p k, checked against the simulation. Counts are cached per
// (schedule, p, v, k, m): a search asks for few.
#pragma once

#include <memory>

#include "plan/plan.h"
#include "schedule/action.h"
#include "schedule/schedules.h"
#include "schedule/simulator.h"

namespace shardwise::cost {

// The plan's pipeline schedule as per-rank action lists (p, its micro-batches, v, k).
schedule::PipelineSchedule pipeline_schedule(plan::Schedule schedule, int ranks, int micro_batches,
                                             int virtual_stages, int kfkb_k);
schedule::PipelineSchedule pipeline_schedule(const plan::Plan& plan);
// Each rank's liveness over those lists (schedule::liveness_moments), made once per
// (schedule, p, m, v, k) and shared: what the evaluator prices a split backward's memory by
// (plan_cost.cc), plan after plan of a search.
std::shared_ptr<const std::vector<schedule::LivenessMoments>> cached_liveness_moments(const plan::Plan& plan);

// The simulator's compute costs of one micro-batch of `per_micro_batch` seconds on each of
// `chunks` chunks of v per rank, as the evaluator prices it: forward a third, backward two
// thirds, or B and W a third each where the schedule splits the backward (W half of it).
schedule::SimulationCosts micro_batch_costs(plan::Schedule schedule, int chunks, int virtual_stages,
                                            double per_micro_batch);

// The transfers on the critical path of the schedule's step (above); 0 at p = 1.
double critical_transfers(plan::Schedule schedule, int ranks, int micro_batches, int virtual_stages, int kfkb_k);

// The seconds the step waits for its sends when each takes `transfer_seconds` and a micro-batch
// `per_micro_batch_seconds` on a stage (its forward a third): critical_transfers x the send
// while a send is short (up to an eighth of a chunk's forward, or up to a length the
// simulation found the count's), else the simulation's growth over the step without sends, at
// the two nearest points of a grid of 8 points an octave in the send's length over the
// forward's, interpolated, and cached per (schedule, p, m, v, k, point).
// A send longer than the computation it hides behind puts paths with more sends on the
// critical path: on 10 Gb/s links the joint planner's DualPipeV (d2 t8 p2) is priced within
// 0.1% of its own simulation (0.7004 against 0.6998 s), where the count alone priced it 1.7%
// under and a ZeRO-1 plan at t 4, whose sends are twice as long, 6.3% under
// (joint_planner_test.cc, AVaryingNetworkTimesPipelinesBySimulation).
double exposed_transfer_seconds(plan::Schedule schedule, int ranks, int micro_batches, int virtual_stages,
                                int kfkb_k, double transfer_seconds, double per_micro_batch_seconds);

// What stages of unequal times do to the bubble: the flush's idle time on the busiest device
// (the simulated step less m x its micro-batch time) with each device's own times, over the same
// with every device at the busiest one's (the lists of the schedule, no sends); 1 where the
// devices are equal or the equal pipeline has no bubble. `device_seconds`: each pipeline rank's
// seconds a micro-batch (all its chunks), `device_backward`: of them the backward's (W half of it
// where the schedule splits it). The evaluator's bubble (plan_cost.cc) is the equal pipeline's,
// in closed form, times this. Why: a stage waits only for the stages before and after it, so the
// fill and drain a 1F1B step pays are the other stages' times, not (p - 1) of the slowest: the
// 2-process GPT-2 of benchmarks/fidelity.py at 8 micro-batches (a last stage with the LM head,
// 45.6 ms a micro-batch as profiled, the first 28.2) idles 28.2 ms where 45.6 was priced;
// interleaved 1F1B 13.6 (21.5), ZB-H1 8.7 (14.0); ZB-V, whose heavy chunks share rank 0, none
// (7.4). Simulated at m, or beyond 4 p k micro-batches at 4 p k + m mod p k: the idle time only
// falls with more micro-batches in every case tried (the stages beside the slow one get ahead),
// so beyond 4 p k this is an upper bound, within 2.2% of the step at 4 p k (3.1% for kFkB) in 40
// random cases of stage times 20 to 45 at p 2 to 16, and exact where it has stopped falling
// (p 2 in every case; 1F1B at p 8 to 16 in most by 2 p).
double uneven_bubble_scale(plan::Schedule schedule, int ranks, int micro_batches, int virtual_stages, int kfkb_k,
                           const std::vector<double>& device_seconds, const std::vector<double>& device_backward);

}  // namespace shardwise::cost
