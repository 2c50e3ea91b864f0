// Generators of the classic pipeline schedules as per-rank action lists, and a
// validator that any schedule (generated or hand-written) must pass before the
// executor or the simulator touch it.
//
// Placement: with p ranks and v chunks per rank there are p*v virtual stages; virtual
// stage g = c*p + r is chunk c of rank r, i.e. rank_of_stage(g) = g % p. With v = 1
// this is the plain "stage s on rank s" layout; with v > 1 it is Megatron's round-robin
// layout, so every hop g -> g+1 crosses ranks (when p > 1).
//
// Communication: the generators put a Recv right before the compute that consumes it
// and a Send right after the compute that produced it, whenever the neighbouring stage
// lives on another rank. Sends and receives are asynchronous (see simulator.h): a receive
// is posted where it stands and waited for by the compute that reads it. The lists that
// are run and priced post each receive one computation earlier (early_receives.h, applied
// by cost::pipeline_schedule).
// Every rank ends with one OptimizerStep.
//
// Compute orders (rank r, p ranks, m micro-batches):
//   gpipe(p, m):            F0..F(m-1), then B0..B(m-1). Peak in-flight = m.
//   one_f_one_b(p, m):      DAPPLE / PipeDream-flush: warm-up min(p-1-r, m) forwards,
//                           then alternate F, B (steady state), then the remaining B
//                           (cool-down). Peak in-flight on rank r = min(p - r, m).
//   interleaved_1f1b(p,m,v): Megatron-LM's interleaved schedule. Requires m % p == 0
//                           (Megatron's own restriction: micro-batches are issued in
//                           rounds of p per chunk, so a partial round would leave a
//                           chunk waiting on micro-batches that never come). Warm-up
//                           of (p-r-1)*2 + (v-1)*p forward micro-steps, then 1F1B.
//   kfkb(p, m, k):          Ada-Grouper: micro-batches in groups of k (the last group
//                           may be smaller), 1F1B over groups: warm-up min(p-1-r, G)
//                           groups of k forwards, steady state k forwards then k
//                           backwards, cool-down. kfkb(p, m, 1) == one_f_one_b(p, m).
//                           A group's receives are posted together before its first
//                           compute, each waited for by the compute that reads it, so
//                           the transfers of its later micro-batches overlap its first
//                           computations (a transfer starts only once its receive is
//                           posted: simulator.h). Larger k hides more communication at
//                           the cost of k times the activation memory.
//
// Example: one_f_one_b(2, 3), rank 0:
//   F0@s0 SA0@s0->r1 F1@s0 SA1@s0->r1 RG0@s0<-r1 B0@s0 F2@s0 SA2@s0->r1
//   RG1@s0<-r1 B1@s0 RG2@s0<-r1 B2@s0 OPT
#pragma once

#include "schedule/action.h"

namespace shardwise::schedule {

PipelineSchedule gpipe(int ranks, int micro_batches);
PipelineSchedule one_f_one_b(int ranks, int micro_batches);
PipelineSchedule interleaved_1f1b(int ranks, int micro_batches, int virtual_stages);
PipelineSchedule kfkb(int ranks, int micro_batches, int k);

// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): each backward split into
// its input gradient (B, which the rank before waits for) and its weight gradient (W, which
// nothing waits for), the W postponed into what would be bubbles, within 1F1B's peak
// activation memory (p micro-batches held from F to W on any rank: 1F1B's first rank's; its
// later ranks hold fewer). Made by a unit-time list schedule: each rank runs, of what is
// ready, the oldest B, else the next F within that memory, else the oldest W. With equal F,
// B and W and free communication its step is at least m (F + B + W) + (p - 1)(F + B - W) (the
// last rank's work after its first input arrives: the paper's bubble (p - 1)(F + B - W)),
// which it reaches at m = p; 1F1B's is (m + p - 1)(F + B + W). (Holding only 1F1B's p - r
// on rank r, the last rank must run each W at once, and the last B's chain back to rank 0
// runs after all of them: 62 against 69 at p = 8, m = 16, where this one takes 57.)
// Run by the executor with each stage's backward split (transform/weight_gradient_split.h,
// runtime/weight_split.py); the planner's candidate without recomputation (plan.h).
PipelineSchedule zero_bubble_h1(int ranks, int micro_batches);

// ZB-V (Qi et al. 2024, section 6): two chunks per rank placed in a V (stage g on rank g for
// g < p, on rank 2p - 1 - g after: PipelineSchedule::v_shape), each backward split into B
// and W as in ZB-H1. The first and last stage share rank 0, so the chain down and back up
// turns around on rank p - 1 with no send.
// With m >= 2p micro-batches: torch's ScheduleZBVZeroBubble order, per rank r: 2(p - r) - 1
// forwards of the first chunk; r pairs F(second) F(first); p - r of F(second) with a full
// backward (B then W) of the second; the steady pairs, F(first) with a full backward of the
// first, F(second) with a full backward of the second; r of B(first) B(second); p - r of
// B(first) W(first); the pending W, the second chunk's first. A B with its W right after it
// runs as one backward in the executor (runtime/pipeline_engine.py's fused backwards), as in
// torch. It reaches the bound (p - 1)(F + B - W) / 2 at p = 2, 4, 8 with m = 2p, 4p (unit
// times; 51.5 at p = 8, m = 16, DualPipeV's).
// With fewer (torch pads to 2p - 1 and idles): a unit-time list schedule, per chunk: each
// rank runs, of what is ready, the oldest B (the later stage on a tie), else a forward (the
// second chunk's first; a first-chunk forward only while a slot stays free for a second-chunk
// one), else the oldest W, within 2p chunk activations held from F to W (1F1B's first rank:
// p micro-batches of a whole stage): 13.5 against torch's order's 15 at p = 4, m = 4.
// The bubbles are measured by the simulator (schedules_test.cc), not taken from the paper.
PipelineSchedule zero_bubble_v(int ranks, int micro_batches);

// DualPipeV (DeepSeek-V3's DualPipe, cut in half: github.com/deepseek-ai/DualPipe; torch's
// ScheduleDualPipeV): ZB-V's placement (two chunks per rank in a V), its backward split into
// B and W, in eight phases per rank r (p ranks, m micro-batches, m >= 2p):
//   1. 2(p - 1 - r) forwards of the first chunk;  2. r + 1 pairs F(first) F(second);
//   3. p - 1 - r of B(second), a pending W, F(second);
//   4. m - 2p + r + 1 steady pairs: F(first) with a full backward (B and W) of the second,
//      then F(second) with a full backward of the first (the pair DeepSeek overlaps with the
//      other's communication; here they run one after the other). Rank p - 1's first pair
//      runs F(first) then a full backward of the second, unpaired;
//   5. p - 1 - r of a full backward of the second, then F(second) with a full backward of the first;
//   6. r + 1 backwards of both chunks, the second half B only (their W postponed);
//   7. p - 1 - r of a pending W, then a backward of the first chunk;  8. the pending W.
// The same phases as torch's ScheduleDualPipeV, so the two run the same order. Its bubble
// and memory are measured by the simulator (schedules_test.cc).
PipelineSchedule dual_pipe_v(int ranks, int micro_batches);

// Checks, by abstract execution of the per-rank lists (no timing):
//   - every action names a stage of its own rank and in-range micro-batch / peer;
//   - every (stage, micro-batch) has exactly one Forward and one Backward, and one
//     WeightGradient (after its Backward, on its rank) where the schedule has any;
//   - dependencies hold: F(g, i) after F(g-1, i), B(g, i) after F(g, i) and after
//     B(g+1, i) -- on the same rank earlier in its list, or via a matching Recv;
//     a Send comes after the compute that produced its payload;
//   - every Send has exactly one matching Recv and vice versa;
//   - the lists cannot deadlock, run as the executor runs them: a receive posted where it
//     stands (a compute reading a value whose receive is not yet posted is an ordering
//     error), waited for by the compute that reads it; asynchronous sends. (Receives used to
//     be taken as blocking where they stood, which refused lists that post them early.)
// Throws support::ValidationError naming the rank and the action at fault.
void validate(const PipelineSchedule& schedule);

// Largest number of stashed forward activations ((stage, micro-batch) pairs whose
// forward ran on this rank but whose backward, or weight gradient where the list has any,
// has not) over the rank's list.
// With v = 1 that is the number of micro-batches in flight.
int peak_in_flight(const std::vector<Action>& rank_actions);

// The most bytes the rank holds at once over its list, by liveness: each (stage g,
// micro-batch) keeps saved[g] from its forward to the end of its backward, and, where the
// list splits that backward and its W is not the next compute after its B (the executor runs
// such a pair as one full backward: runtime/pipeline_engine.py's fused_backwards), held[g]
// more from its B to its W: the gradients B leaves at the weight-reading nodes' outputs
// (analysis/weight_gradient_split.h). held may be empty (none).
// Example: ZB-H1 at p = 4, m = 8, rank 3 (the last stage) runs F0 B0 F1 B1 F2 B2 F3 B3 W0 ...:
// with saved 1 and held 0.5 a micro-batch, 4 + 4 x 0.5 = 6 (schedules_test.cc: every rank).
double peak_bytes_held(const std::vector<Action>& rank_actions, const std::vector<double>& saved,
                       const std::vector<double>& held);

// The same liveness as counts, for pricing one list many times (a search's plans differ in
// their bytes, not their lists): at each moment a forward or a split B adds to what the rank
// holds, how many micro-batches' saved tensors and held gradients it keeps of each stage it
// runs; only the moments whose counts no other moment's equal or exceed, stage by stage, are
// kept. Bytes are never negative, so every pricing's peak is at one of those moments, and a
// steady schedule repeats a few of them (ZB-H1 at p = 8 and m = 960 keeps a handful of its
// thousands of actions).
struct LivenessMoments {
  std::vector<int> stages;                // the stages the list runs, each once
  std::vector<std::vector<int>> moments;  // per moment: saved counts of `stages`, then held counts
};
LivenessMoments liveness_moments(const std::vector<Action>& rank_actions);
// peak_bytes_held of the list `moments` came from. Throws support::ValidationError on a
// negative byte count (the moments keep only what is largest for bytes >= 0).
double peak_bytes_held(const LivenessMoments& moments, const std::vector<double>& saved,
                       const std::vector<double>& held);

}  // namespace shardwise::schedule
