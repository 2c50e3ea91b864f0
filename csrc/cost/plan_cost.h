// The evaluator: step time, memory per rank and TFLOP/s per device of a plan on a cluster.
//
//   PlanCost evaluate(graph, cluster, plan, model)
//
// The graph may be built at any batch B0 (the batch size of its first input's batch
// dimension); every tensor with a batch dimension is scaled to the plan's micro-batch.
//
// Structure, found from the graph alone (no layer names):
//  - Layers: the largest group of analysis::find_repeated_blocks (most nodes in all). Nodes
//    before its first layer are "pre" (first pipeline stage), after its last "post" (last
//    stage). Every layer is costed as the first one. The other groups' blocks among them
//    (DeepSeek-V3's dense first layers) are priced with them, and recomputed as the layers
//    are: each keeps its checkpoint per micro-batch, its forward runs again in the backward.
//  - Tensor parallelism (degree t), Megatron-style, from the dataflow of one layer
//    (layer_structure.h): column-parallel weighted contractions (several may feed one
//    group: q, k, v; SwiGLU's gate and up) whose outputs reach one row-parallel weighted
//    contraction through ops that are not normalisations or reductions (pointwise, views,
//    attention); the ops between run on 1/t of the data (attention heads, the MLP
//    activation). One all-reduce of the row end's output per group in forward, one in
//    backward, and one more per group when recomputing. Everything else in the layer (layer
//    norms, residual adds, dropout after the group) is replicated on the t ranks.
//    Outside the layers, a weighted contraction is column-parallel over its parameter (the
//    vocabulary-parallel LM head) and the ops after it run on 1/t (the vocabulary-parallel
//    loss; its small all-reduces over [b, s] are ignored). A parameter any contraction
//    shards is stored sharded wherever it is read (a tied embedding), and a lookup of a
//    parameter table outside the layers is vocabulary-parallel with one all-reduce of its
//    output per micro-batch in forward (an untied input embedding).
//  - Pipeline (degree p, v virtual stages): layers balanced over p x v chunks (or the
//    plan's layers_per_stage), device s holding chunks s, s + p, ...; the bottleneck device
//    sets the pace. Per micro-batch: T_mb = compute + tensor-parallel all-reduces.
//    Device s is the stage on ranks [g t d, (g + 1) t d), g its block (plan.stage_groups,
//    else s). On a heterogeneous cluster its compute is priced on those ranks' slowest type
//    (stage_scale), its memory against that type's capacity (memory_use), its optimizer step
//    at that type's bandwidth.
//      ideal   = m x T_mb
//      bubble  = (p - 1) / v x T_mb    (GPipe, 1F1B, kFkB: v = 1): the (p-1)/(v m) fraction
//      p2p     = the sends the step waits for (pipeline_transfers.h: the critical path of the
//                schedule's own action lists, simulated with unit costs; the runtime runs
//                the others beside compute) x one send of b x s x h / t bytes (Megatron's
//                scatter/gather over the t ranks) between rank r and r + t d, on the link
//                that pair crosses. 1F1B waits for 2 per micro-batch from p = 3 (1 at p = 2),
//                ZB-H1 for 3 from p = 4, kFkB (k = 2) for 1 / 2. It was 2 v per micro-batch,
//                plus the bubble's, for every schedule.
//  - Data parallelism (degree d): gradients of the device's parameters, at
//    grad_reduce_bytes_per_param, all-reduced over the data group (ranks r, r + t, ...;
//    ring or hierarchical, the faster, from collective_cost.h). With p = 1 the all-reduce
//    overlaps the last micro-batch's backward (exposed = max(0, all-reduce - backward));
//    with p > 1 it follows the pipeline flush, fully exposed (Megatron-LM 2021). ZeRO 1-2:
//    reduce-scatter + all-gather, priced as the all-reduce. ZeRO-3: per micro-batch an
//    all-gather of the weights for forward, recomputation and backward, and a reduce-scatter
//    of the gradients, overlapped with that micro-batch's compute (exposed = the excess).
//  - Optimizer step: 2 x bytes_per_parameter per parameter held (read + write), memory-bound.
//  - ZeRO 1-2 broadcast: the runtime steps each parameter on one owner of its data group and
//    broadcasts it to the rest after the step (runtime/optim.py), before the next forward may
//    read it: a broadcast of the stage's weights over its data ranks, exposed (the SPMD
//    search's zero_broadcast, sharding_model.cc).
//  - Tied weights across stages: a weight the nodes before the layers and after them both
//    read (a tied embedding and LM head), on different pipeline ranks, has its gradient
//    all-reduced among its readers after the step's gradient synchronisation, one call a
//    weight (runtime/pipeline_engine.py; Megatron-LM's embedding group): exposed. Readers of
//    one layout: one group per sub-mesh coordinate, the weight's share at it; layouts that
//    differ: every rank of both stages, the weight whole.
//  step_time = ideal + bubble + data_parallel (exposed) + optimizer + zero_broadcast
//              + shared_weight_sync.
//
// TFLOP/s per device: model FLOPs, the standard definition (PaLM's MFU; what the SPMD search
// reports too): 3 x the graph's forward matmul FLOPs (forward, 2 x backward) per sample, x
// global batch / step_time / world size; a recomputed forward is work, not model FLOPs, so
// it is not counted. megatron_tflops_per_device is Megatron-LM's accounting (Narayanan et
// al. 2021, eq. 3: 96 B s l h^2 (1 + s/6h + V/16lh), recomputation included): 4 x the layers'
// forward + 3 x the rest, whether the plan recomputes or not; for comparison with the
// paper's published figures only.
//
// Worked example: see tests/cpp/cost/plan_cost_test.cc (a 4-layer toy GPT, t = 2, p = 2:
// 2 pairs per layer, bubble (2-1)/m of the ideal time).
#pragma once

#include <algorithm>
#include <map>
#include <optional>
#include <string>

#include "cost/cluster.h"
#include "cost/layer_structure.h"
#include "cost/constants.h"
#include "cost/memory_cost.h"
#include "cost/op_cost.h"
#include "ir/graph.h"
#include "plan/plan.h"

namespace shardwise::cost {

struct PlanCostConstants {
  // Megatron-LM 2021 all-reduces fp32 main gradients (bf16 training).
  double grad_reduce_bytes_per_param = 4;
  // Fraction of HBM bandwidth the optimizer step reaches (cost/constants.h).
  double optimizer_memory_efficiency = kOptimizerMemoryEfficiency;
  // What a second of communication overlapped with compute still costs; unset: the
  // cluster's (cost::overlap_interference: measured, or kOverlapInterference).
  std::optional<double> overlap_interference = std::nullopt;
  std::optional<MemoryConstants> memory;  // model states per parameter; none: the plan precision's
};

struct PlanCost {
  double step_time = 0;  // seconds per iteration
  // Breakdown (seconds per iteration; they sum to step_time):
  double compute = 0;          // m x per-micro-batch compute on the bottleneck device
  double tensor_parallel = 0;  // m x its all-reduces
  double pipeline_p2p = 0;     // the sends the step waits for x pipeline_transfer
  double pipeline_transfer = 0;  // one send across a stage cut (the slowest boundary's), seconds
  double pipeline_bubble = 0;  // (p - 1) / v x T_mb
  double data_parallel = 0;    // exposed gradient synchronisation
  double optimizer = 0;
  double zero_broadcast = 0;   // the owners' parameters broadcast after the step (ZeRO 1-2); key only when > 0
  // A weight read before the layers and after them (a tied embedding and LM head) on two
  // pipeline ranks: its gradient all-reduced among them after the step, one call a weight
  // (runtime/pipeline_engine.py, Megatron-LM's embedding group), exposed. Key only when > 0.
  double shared_weight_sync = 0;
  double data_parallel_total = 0;  // the whole synchronisation, before overlap
  bool data_parallel_overlapped = false;
  // Context parallelism (plan.context > 1): m x the ring attention's exposed sends on the
  // bottleneck device, already inside `compute` (an attention block waits for its keys and
  // values as a kernel would): shown apart, not summed again. Breakdown key only when > 0.
  double context_parallel = 0;
  // Expert parallelism (plan.expert > 1): m x the experts' token dispatch on the bottleneck
  // device (each MoE layer's tokens gathered over the expert ranks before its experts and their
  // sum reduce-scattered after, and both again for the gradients: exposed, the program waits
  // on them), already inside `compute`: shown apart. Breakdown key only when > 0.
  double expert_parallel = 0;

  // Per micro-batch, what balances the stages (layer_balance.h): one layer's compute and
  // tensor-parallel time, and the first and last stage's time outside the layers.
  double layer_time = 0;
  double first_stage_extra = 0;
  double last_stage_extra = 0;

  // Per pipeline stage: the device type it runs on (its ranks' slowest; heterogeneous clusters
  // only, else empty) and what its compute is multiplied by against the pace-setting
  // (slowest) type's (1 on a homogeneous cluster).
  std::vector<std::string> stage_devices;
  std::vector<double> stage_scale;
  std::vector<double> stage_times;  // per device, per micro-batch: compute + tensor-parallel seconds

  double memory_per_rank = 0;  // bytes on the most loaded rank
  // The largest fraction of its own device's memory a stage's rank needs (a heterogeneous
  // cluster's stages hold different capacities): what a planner compares with its memory
  // fraction.
  double memory_use = 0;
  std::map<std::string, double> memory_breakdown;

  double model_flops = 0;     // per iteration: 3 x forward (see above)
  double tflops_per_device = 0;
  double megatron_flops = 0;  // per iteration, Megatron-LM's accounting (4 x the layers' forward)
  double megatron_tflops_per_device = 0;
  std::vector<int> ranks_per_node;  // the cluster priced on (Cluster::ranks_per_node)

  // Structure found (for tests and reports).
  int layers = 0;
  int tensor_parallel_pairs_per_layer = 0;
  int all_reduces_per_layer_per_micro_batch = 0;
  std::int64_t micro_batches = 0;
  double bubble_fraction = 0;  // bubble / ideal

  std::map<std::string, double> breakdown() const;
};

// What one rank computes and holds of a part of the graph (a layer, the nodes before the
// layers, those after them) per micro-batch, whether the evaluator prices the part from the
// graph (Megatron-style) or takes it from a searched layout (PartPrice): one struct, so the
// layout's figures replace the graph's by assignment.
struct PartLoad {
  double forward = 0;           // compute seconds
  double backward = 0;          // compute seconds, without a recomputed forward
  double parameters = 0;        // elements held by one rank
  double expert_parameters = 0;  // of them, a mixture of experts' stacked expert weights (ops/experts.h)
  double activation_bytes = 0;  // saved outputs, one rank, at the micro-batch
  // The most one node's backward holds at once beyond the saved activations: the gradients of
  // its outputs and activation inputs (an FP8 linear's casts too), one rank, at the micro-batch.
  double backward_working_bytes = 0;
  // Selective recomputation (analysis/selective_recompute.h): the seconds it adds to the step (the
  // forward of the ops it runs again, or what a profile measured under its policy:
  // OpTime::selective_extra), and the bytes of the outputs it keeps, one rank.
  double selective_forward = 0;
  double selective_kept_bytes = 0;
  // A split backward (a zero-bubble schedule): the gradients its B leaves at the weight-reading
  // nodes' outputs for its W (analysis/weight_gradient_split.h), one rank, at the micro-batch.
  double weight_gradient_bytes = 0;
  // Of the above, the nodes of repeated blocks outside the layers (LayerStructure::outer_block:
  // DeepSeek-V3's dense first layers), which recomputation checkpoints as it does the layers.
  struct Blocks {
    double forward = 0, selective_forward = 0;              // theirs, and the ops selective runs again
    double activation_bytes = 0, selective_kept_bytes = 0;  // theirs, and the outputs selective keeps
    double checkpoint_bytes = 0;     // the blocks' checkpoints (what a recomputed block keeps)
    double largest_block_bytes = 0;  // the most one block saves: held while its backward recomputes it
  } blocks;
};

// PartLoad::Blocks summed over a part's nodes as its pricer (the evaluator's graph pricing, a
// searched stage layout's) visits them, one rank's figures at the micro-batch.
class OuterBlockTally {
 public:
  explicit OuterBlockTally(const LayerStructure& structure) : structure_(structure) {}
  // Node `id`'s figures; nothing when it is in no block outside the layers.
  void add(ir::NodeId id, double forward, double selective_forward, double activation_bytes,
           double selective_kept_bytes);
  // `checkpoint_bytes(v)`: one rank's bytes of checkpoint value v at the micro-batch.
  template <typename BytesOf>
  PartLoad::Blocks finish(BytesOf checkpoint_bytes) const {
    PartLoad::Blocks out = sum_;
    for (const auto& [block, saved] : saved_by_block_) {
      out.largest_block_bytes = std::max(out.largest_block_bytes, saved);
      const ir::ValueId checkpoint = structure_.outer_block_checkpoint[static_cast<std::size_t>(block)];
      if (checkpoint >= 0) out.checkpoint_bytes += checkpoint_bytes(checkpoint);
    }
    return out;
  }

 private:
  const LayerStructure& structure_;
  PartLoad::Blocks sum_;
  std::map<int, double> saved_by_block_;
};

// A searched layout of a stage's tensor-parallel ranks (search/stage_layout.h finds it with
// the SPMD search), priced by part per micro-batch on one rank. It replaces the Megatron-style
// figures above for one layer, the nodes before the layers and those after them; the pipeline,
// data parallelism, ZeRO, the optimizer and the activations in flight are priced as above.
struct PartPrice : PartLoad {
  double collectives = 0;    // per micro-batch, on the critical path (where the all-reduces were)
  double gradient_sync = 0;  // per step: gradients reduced over the t ranks (a batch split over them)
};

struct StageLayoutPrices {
  PartPrice layer, pre, post;
  double boundary_bytes = 0;  // one rank's share of a layer's input: what crosses a stage boundary
};

// Throws support::ValidationError when the plan does not fit the cluster (t x p x d !=
// world size), the graph (p x v > layers), or is invalid (plan::validate).
PlanCost evaluate(const ir::Graph& graph, const Cluster& cluster, const plan::Plan& plan, const CostModel& model,
                  const PlanCostConstants& constants = {});

// The same, with the graph's structure found beforehand (find_layer_structure(graph)): what
// a planner pricing many plans on one graph calls.
// `layout`: the stages' searched layout at this plan's tensor degree and micro-batch, instead
// of Megatron's.
PlanCost evaluate(const LayerStructure& structure, const ir::Graph& graph, const Cluster& cluster,
                  const plan::Plan& plan, const CostModel& model, const PlanCostConstants& constants = {},
                  const StageLayoutPrices* layout = nullptr);

// The plan with predicted figures filled in.
plan::Plan with_prediction(plan::Plan plan, const PlanCost& cost);

}  // namespace shardwise::cost
