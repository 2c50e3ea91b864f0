// The joint planner: pipeline x data x tensor degrees, micro-batch size, schedule, virtual
// stages, recomputation and ZeRO stage, searched together over the plan evaluator
// (cost/plan_cost.h), the same model that prices a hand-written Megatron configuration.
//
//   JointPlanResult r = plan_joint(graph, cluster, model, {.global_batch = 1536});
//   r.plan;          // e.g. t 8, p 8, d 16, micro-batch 1, interleaved-1f1b v 3, recompute
//
// The space (every combination is a plan::Plan the evaluator prices):
//  - context c (plan.context, with d = 1): the same world / (t p) ranks splitting each row's
//    sequence (ring attention, or its heads exchanged all-to-all: cost/plan_cost.h) rather
//    than the rows, where every attention runs as a ring and c divides the sequence; then a micro-batch is b rows over the c ranks, b dividing the
//    global batch (Llama 3 405B at 131,072 tokens: t 8, c 16, p 16). Priced by the evaluator
//    (cost/plan_cost.h); the stage layouts' pass leaves these alone (it searches whole rows).
//  - t: a divisor of the world size and of a node's devices (tensor parallelism on the
//    fastest links) and of the attention head count (each rank holds whole heads); p: a divisor of world / t no larger than the number of layers; d = world / (t p),
//    dividing the global batch;
//  - micro-batch b: a divisor of global_batch / d, up to max_micro_batch;
//  - schedule: p = 1: none needed (1F1B, m micro-batches of gradient accumulation); p > 1:
//    1F1B, interleaved 1F1B with v virtual stages (p v <= layers, m a multiple of p, as
//    Megatron-LM requires), and ZB-H1 and ZB-V (v 2, 2p <= layers) without recomputation
//    (bubbles (p - 1)(F + B - W) and half that, p micro-batches held on every stage,
//    cost/plan_cost.cc; the runtime does not split a recomputed block's backward, so where
//    memory needs recomputation they are no candidates). GPipe has 1F1B's bubble and more memory: it cannot win. kFkB
//    differs from 1F1B only where sends take time the evaluator cannot overlap: it joins
//    with a network condition (below).
//  - recomputation none / full; ZeRO 0 / 1 (optimizer state sharded over the data ranks);
//  - layers per stage: balanced by count (the evaluator's default), and, for p > 1, balanced
//    by time when that differs (cost/layer_balance.h: the stages holding the embedding and
//    the LM head get fewer layers), each priced with its own memory per stage.
// `fast` tries b in {1, 2, 4}, v in {2, 4} and ZeRO 1 for the combinations that do not fit
// without it (every combination when none does);
// `thorough` every b up to max_micro_batch, v in {2, 3, 4, 6, 8}, both ZeRO stages. A graph
// whose rows meet in batch statistics (JointPlanOptions::micro_batch_semantics) takes only
// b = global batch / d, whatever the level: one micro-batch per step.
//
// Stage layouts (JointPlanOptions::stage_layouts, on by default): the evaluator's tensor
// parallelism is Megatron's layout, found from the graph's dataflow; what parallelize() runs
// on a stage's ranks is the SPMD search's. So the best candidates are priced again with the
// layout the SPMD search finds for their stages' t ranks (search/stage_layout.h: sequence
// parallelism, a graph Megatron's rules cannot split), lazily: the best of every tensor degree
// first, then the best not yet re-priced until the ten best all are, one search per
// StageLayoutKey, at most 12 (`fast`) or 48 (`thorough`) searches; a candidate beyond them
// keeps Megatron's prices. GPT-3 175B on 1,024 A100s: 11 searches, 1.1 s more (fast).
//
// A varying network (JointPlanOptions::network, Ada-Grouper's preempted links): every
// pipelined plan that fits is priced again by the discrete-event simulator
// (schedule/simulator.h) with its stage-to-stage sends at the network's bandwidth over
// time: per micro-batch the bottleneck device's compute and tensor-parallel time (forward
// 1 : backward 2), each send the evaluator's point-to-point seconds at full bandwidth, then
// the exposed gradient synchronisation and the optimizer step. A transfer starts once both
// its send and its receive are posted and the transfer before it on its channel has arrived,
// and the compute that reads it waits for it, as at run time (simulator.h): a send overlaps
// compute only where its receive was posted early enough (kFkB posts a group's receives
// together, whose transfers then run one after another). For each 1F1B plan the adaptive kFkB (schedule/adaptive_kfkb.h)
// picks the group size k from that network within the memory left for activations; a k > 1
// that beats 1F1B by more than 1% joins the candidates as a kFkB plan (its memory from the
// evaluator). Plans whose compute, tensor-parallel, gradient and optimizer parts alone
// reach the tenth best step so far are dropped unsimulated (a step is never shorter).
// Example (joint_planner_test.cc): GPT, 8 layers of 2048, on 4 DGX A100 nodes of 1.25 GiB
// devices over 10 Gb/s: the evaluator alone, a steady network and one whose bandwidth halves
// every other 0.1 s all pick d 2 t 8 p 2 DualPipeV (0.688, 0.700 and 0.746 s). Until every
// list posted each receive one computation early (schedule/early_receives.h) the varying
// network picked kFkB with k = 2 (0.918 s, 0.925 of its 1F1B twin, on 2 GiB devices then): its
// group's receives were the only ones posted ahead of the compute before them. At a fifth of
// the bandwidth (benchmarks/joint_planner.py, 2026-11) no pipeline: t 8 p 1 d 4, 1.012 s.
//
// The best plan that fits (memory per rank <= the smallest device's memory x
// memory_fraction) has the lowest predicted step time; ties go to the earlier candidate in
// the order above (smaller t, smaller p, smaller b). Nothing fits: the least-memory plan with
// `fits` false. Deterministic. Homogeneous clusters only (heterogeneous ones: the SPMD
// search's uneven shares, search/spmd_search.h): ValidationError otherwise, and on a
// global batch < 1 or a graph with no repeated layers to cut.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "cost/cluster.h"
#include "cost/constants.h"
#include "cost/op_cost.h"
#include "cost/plan_cost.h"
#include "ir/graph.h"
#include "plan/plan.h"
#include "search/spmd_search.h"

namespace shardwise::search {

// The links between pipeline stages over time: bandwidth repeats with period
// sum(durations), segment j at bandwidth_scale[j] x the cluster's (1 = as the cluster
// says, 0.5 = halved). Durations in seconds, both lists of one length, every value > 0.
struct NetworkCondition {
  std::vector<double> durations;
  std::vector<double> bandwidth_scale;
};

// The run settings (precision, state_dtype, compile, micro_batch_semantics) are every
// candidate's (plan::RunSettings). micro_batch_semantics Exact: where the graph couples the
// rows of its batch (analysis/batch_coupling.h: batch norm in training, a router's
// load-balancing loss) only plans of one micro-batch are candidates (micro_batch x data =
// global batch), so the plan computes the batch's step; PerMicroBatch: every micro-batch size,
// and the plan carries the choice (plan/plan.h).
struct JointPlanOptions : plan::RunSettings {
  std::int64_t global_batch = 0;  // required
  std::optional<NetworkCondition> network;  // none: a steady network (the evaluator alone)
  SearchLevel level = SearchLevel::Fast;
  double memory_fraction = cost::kMemoryFraction;  // of each device's memory the plan may use
  int max_micro_batch = 16;  // thorough's cap on b
  // Candidates with ZeRO-1 (optimizer states sharded over the data axis); false: none
  // (parallelize(zero=False), shardwise.plan(zero=False)).
  bool allow_zero = true;
  // Price the best candidates with their stages' layout as the SPMD search finds it
  // (search/stage_layout.h) rather than Megatron's; false: Megatron's layout alone.
  bool stage_layouts = true;
  // Candidates whose stages split each row's sequence over their data ranks (plan.context,
  // ring attention) where every attention can run as a ring; false: none
  // (shardwise.plan(context_parallel=False)).
  bool context_parallel = true;
  // Candidates whose stages split each mixture of experts layer's experts over their data ranks
  // (plan.expert) where those ranks divide every layer's experts, or over their tensor ranks
  // where their layout does; false: neither (plan.split_experts false: every rank of a stage
  // holds every expert).
  bool expert_parallel = true;
  // Called every 64 candidates and at the end of each pass with (done, total); may throw to
  // stop the search.
  std::function<void(int, int)> progress;
};

struct JointCandidate {
  plan::Plan plan;
  double step_time = 0;
  double memory_per_rank = 0;
  bool fits = false;
  bool searched_layout = false;  // priced with its stages' searched layout (stage_layout.h)
};

// Why the chosen plan splits what it splits (each row's sequence, each layer's experts): the
// plan it was chosen over without that split, priced by the same evaluator. "context": the plan
// the same search chooses with context parallelism off (before its completion; none fitting,
// the one needing the least memory); "experts": the chosen plan's own degrees with
// every expert whole on every rank (plan.expert 1, split_experts false), priced as the chosen
// plan was (its stages' layout searched again so, or the evaluator's own layout), where the
// chosen plan splits experts over a stage's data (plan.expert) or, with its tensor degree > 1,
// may split them over its tensor ranks. `with`: the chosen candidate as the search priced it
// (before its completion).
struct SplitReason {
  std::string split;  // "context" or "experts"
  JointCandidate with;
  std::optional<JointCandidate> without;  // none: no plan without the split (16 rows, 8 layers, 2,048 GPUs)
};

struct JointPlanResult {
  plan::Plan plan;  // predicted filled in
  bool fits = false;
  int evaluated = 0;                     // plans priced
  int stage_layout_searches = 0;         // SPMD searches of a stage's layout (stage_layout.h)
  bool searched_layout = false;          // the plan is priced with its stages' searched layout
  std::vector<JointCandidate> best;      // the 10 best that fit, best first
  std::vector<SplitReason> split_reasons;  // one per split the chosen plan makes (above)
  double memory_limit = 0;
  double search_seconds = 0;
};

JointPlanResult plan_joint(const ir::Graph& graph, const cost::Cluster& cluster, const cost::CostModel& model,
                           const JointPlanOptions& options);

}  // namespace shardwise::search
