// The state of one SPMD search candidate (a mesh, with or without recomputation): the
// decision of every node and leaf on every mesh axis, the costs of those decisions, and the
// per-axis SpmdProblem that improves them. Internal to search_spmd (search/spmd_search.h,
// which documents the cost model) and to the joint planner's stage layouts
// (search/stage_layout.h); tests reach it through those.
//
// Lifecycle: construct (everything replicated), solve_axis() per axis as often as wanted,
// evaluate() for the figures of the current decisions.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cost/cluster.h"
#include "cost/constants.h"
#include "cost/memory_cost.h"
#include "cost/op_cost.h"
#include "ir/graph.h"
#include "ops/dim_rule.h"
#include "plan/plan.h"
#include "search/parameter_collectives.h"
#include "search/placement.h"
#include "search/spmd_problem.h"
#include "search/strategy.h"

namespace shardwise::analysis {
struct SavedTensors;
}  // namespace shardwise::analysis

namespace shardwise::search {

struct ShardingModelOptions {
  std::vector<int> mesh;  // axis sizes, outermost first
  std::int64_t global_batch = 1;
  cost::Precision precision = cost::Precision::BF16;
  double memory_limit = 0;  // bytes per rank
  plan::Recompute recompute = plan::Recompute::None;
  bool allow_zero = true;
  std::optional<cost::MemoryConstants> memory;  // model states per parameter; none: the precision's
  int beam_width = kBeamWidth;  // search/spmd_problem.h
  // Parameter collectives (gradient reduction, ZeRO/FSDP weight gathers) run beside compute:
  // the gathers beside the forward, the gradient reductions beside the backward. One
  // second of them hidden that way still costs overlap_interference seconds (the cost
  // model's constant, cost/constants.h: NCCL kernels share SMs and HBM with the GEMMs); the
  // rest is exposed.
  double overlap_interference = cost::kOverlapInterference;
  // Parameter collectives run in buckets (the runtime's gradient buckets, cost/constants.h;
  // FSDP gathers a unit at a time): a parameter smaller than a bucket pays its share of one
  // collective's latency, not a whole one (a layer norm's 4 KB gradient is not a 42 us all-reduce).
  double bucket_bytes = static_cast<double>(cost::kGradientBucketBytes);
  // Fraction of HBM bandwidth the optimizer step reaches (cost/constants.h).
  double optimizer_memory_efficiency = cost::kOptimizerMemoryEfficiency;
  // The graph standing for a pipeline stage's share of it (search/stage_layout.h): a rank
  // holds this fraction of the parameter states and of the saved activations of the whole
  // graph at one micro-batch (1F1B's first stage: 1/p of the layers, ~p micro-batches in
  // flight). Memory only; times are the whole graph's.
  double parameter_memory_scale = 1;
  // Mesh axes on which the batch may be split (empty: every axis). A mesh the user gives as
  // {data, tensor} keeps the batch off its tensor axis: no strategy there shards a value
  // along its batch dim (tensor parallelism splits weights, heads and sequences, not rows).
  std::vector<bool> batch_axes;
  double activation_memory_scale = 1;
  // Tensor-parallel collective matmuls (search/parameter_collectives.h, MatmulCollective;
  // plan::Sharding::collective_matmul): an activation's one all-gather into a contraction's
  // rows, or a contraction's Partial output's one reduce-scatter, hidden under (n-1)/n of
  // the contraction's products at the interference price, forward and backward.
  bool collective_matmul = false;
  // Activation-gradient all-reduces beside their reader's weight gradient
  // (plan::Sharding::async_gradients, transform/async_gradients.h); false: exposed.
  bool async_gradients = true;
  // A graph captured at batch 1 searched at more rows throws (nothing could split its batch)
  // unless false: a stage layout prices its tensor axis, which need not split the batch.
  bool require_batch_index = true;
  // The per-axis problems price a resharding that readers of one value share once (solve_axis'
  // hubs), as evaluate() and the runtime do; false: once per reader edge (coarser, and a
  // smaller problem for the fast solver's beam). search_decisions descends without them and
  // polishes with them (spmd_search.cc says why).
  bool shared_reshardings = true;
  // Where solve_axis' fast solver looks its answers up and keeps them (search/spmd_problem.h,
  // FastSolveMemo; one search shares one across its candidates); none: every problem solved.
  FastSolveMemo* solve_memo = nullptr;
};

// One node's share of the current decisions' costs, per instance (a folded node of a
// repeated block: its representative's), at the options' global batch.
struct NodePrice {
  double forward = 0;   // compute seconds
  double backward = 0;  // compute seconds, without a recomputed forward
  // Collectives on the critical path: resharding of activations into this node (forward,
  // and their gradients back), its statistics' all-reduces, and gathers of the weights it
  // reads (each forward pass).
  double collectives = 0;
  double gradient_sync = 0;      // reductions of the gradients of the weights it reads (once per step)
  double activation_bytes = 0;   // saved outputs, per rank, as autograd saves them (no recomputation)
  // As the evaluator prices selective recomputation (cost::PartPrice), whatever the model's
  // own: the forward seconds it runs again (0 for a node it keeps), the output bytes it keeps.
  double selective_forward = 0;
  double selective_kept_bytes = 0;
};

// A leaf's decision on one axis.
struct LeafChoice {
  Placement placement;
  bool zero = false;  // parameters only: optimizer state sharded over the axis (ZeRO-1)

  friend bool operator==(const LeafChoice&, const LeafChoice&) = default;
};

struct ShardingEvaluation {
  double step_time = 0;
  double memory_per_rank = 0;
  bool fits = false;
  std::map<std::string, double> breakdown;         // seconds
  std::map<std::string, double> memory_breakdown;  // bytes
  std::vector<plan::CollectiveRecord> collectives;
  double model_flops = 0;  // per step (3 x forward matmul FLOPs at the global batch)
  // Parameter collectives before overlap, and whether each phase's fit under its compute
  // (forward gathers under the forward, gradient reductions under the backward).
  double parameter_sync = 0;
  bool parameter_sync_hidden = true;
};

class ShardingModel {
 public:
  ShardingModel(const ir::Graph& graph, const cost::Cluster& cluster, const cost::CostModel& model,
                ShardingModelOptions options);

  // Re-decides every node and leaf on `axis` with the other axes fixed. `memory_scale`
  // multiplies the memory limit (> 1 while later axes are still unsolved). `thorough`
  // solves the problem with the ILP started from the fast solver's answer.
  // `parameter_weight`: what the solver charges for one second of parameter collectives:
  // the overlap interference while they hide under compute, 1 when they do not
  // (search_spmd tries both; evaluate() always prices them exactly). `seeds_only`: no
  // beam: the axis takes pure data parallelism (ZeRO-1), improved by local moves when it
  // fits and as it is when it does not (a start for the coordinate descent: the other axis
  // then has to save the memory, the way Megatron's tensor axis does under ZeRO).
  void solve_axis(int axis, bool thorough, double memory_scale = 1.0, double parameter_weight = 1.0,
                  bool seeds_only = false);

  ShardingEvaluation evaluate() const;

  // Takes a plan's decisions as they are (plan::Sharding: every leaf's placement and ZeRO
  // axes, every node's strategy by its text), so that evaluate() prices the plan as written:
  // the one evaluator of a sharded plan (search/plan_price.h). The mesh must be this model's.
  // Each axis is read with the outer axes' splits in place (a strategy's blocks lie within
  // them), the outermost axis read again once the inner ones are: every strategy then stands
  // in the others' final splits, as the search leaves them. Throws ValidationError naming the
  // value, node, op and module on a name the graph lacks or a strategy its rule cannot take,
  // the decisions then as they were.
  void adopt(const plan::Sharding& sharding);

  // The current decisions' costs by node (indexed by NodeId): what a pipeline planner sums
  // over a stage's nodes. The evaluate() sums, without its overlap of parameter
  // collectives, which the planner's own model decides. `first_axis`: only the collectives
  // of the axes from it on (a stage's tensor axis, its data axis priced by the evaluator);
  // compute and saved bytes are a rank's on the whole mesh whatever it is.
  std::vector<NodePrice> node_prices(int first_axis = 0) const;
  // The fraction of a value each rank holds over the mesh axes from `first_axis` on (1 = whole).
  double held_fraction_of(ir::ValueId value, int first_axis = 0) const;

  // The plan's sharding section for the current decisions.
  plan::Sharding sharding(std::string level) const;

  // Uneven shares: sets the graph inputs' batch placements on `axis` to these ratios.
  void set_input_ratios(int axis, const std::vector<double>& ratios);
  // The axis along which the graph's inputs are sharded on their batch dim, or -1.
  int batch_axis() const;
  // The uneven shares of the batch along that axis (set_input_ratios, or a plan's adopted
  // placements): the ranks of the axis' first group and their ratios; none when even.
  struct UnevenShares {
    int axis = -1;
    std::vector<int> ranks;
    std::vector<double> ratios;
  };
  std::optional<UnevenShares> uneven_shares() const;
  // Compute seconds of the whole step on one device type, with the current decisions.
  double compute_seconds(const cost::DeviceType& device) const;
  // Parameter-state and activation bytes of the most loaded rank, split for balance.
  double activation_bytes() const;
  double parameter_bytes() const;
  // parameter_bytes() by kind: weights (and non-trainable leaves), gradients, optimizer state.
  cost::ModelStateBytes parameter_bytes_by_kind() const;
  // The largest weight one reader gathers beyond the rank's stored share (FSDP-style: held
  // only while its reader runs, one at a time): part of the peak, not of the sum.
  double gathered_parameter_bytes() const;
  // An fp8 plan's transient cast copies (runtime/fp8.py's quantize): the largest operand an FP8
  // linear casts, as the rank reads it, held three times over at once (|t| in its dtype, the
  // scaled float32 copy, the float8 one); 0 for other precisions.
  double fp8_cast_bytes() const;

  const std::vector<int>& mesh() const { return options_.mesh; }
  const ShardingModelOptions& options() const { return options_; }
  // Prices collective matmuls or not from here on (the decisions stay): a plan solved without
  // them is evaluated as the runtime would run it with them (spmd_search.cc).
  void set_collective_matmul(bool on) { options_.collective_matmul = on; }
  void set_shared_reshardings(bool on) { options_.shared_reshardings = on; }
  std::vector<int> axis_ranks(int axis) const;

 private:
  // The constructor's steps, in its order (each reads what the ones before it set).
  void price_devices_and_batch();
  void derive_rules_and_gradient_flow(const analysis::SavedTensors& saved);
  void fold_repeated_blocks(const analysis::SavedTensors& saved);
  void collect_strided_sizes();
  void group_edges();
  struct EdgeKey {
    int producer;  // problem-level identity: representative node (or leaf value) producing it
    bool producer_is_leaf;
    int consumer;  // representative consumer node
    int operand;   // input position at the consumer
    auto operator<=>(const EdgeKey&) const = default;
  };
  struct EdgeGroup {
    ir::ValueId value = -1;  // the first instance's value (for bytes and names)
    double count = 0;        // instances
  };

  // evaluate()'s sums, and the same costs by representative node (over its instances).
  struct Tally {
    std::vector<NodePrice> by_node;
    std::vector<plan::CollectiveRecord> collectives;
    double forward = 0, backward = 0;  // backward with the recomputed forward
    double activations = 0, statistics = 0;
    // Parameter collectives by where they run (search/parameter_collectives.h): beside the
    // forward, beside the backward, or exposed.
    double parameter_forward = 0, parameter_step = 0, parameter_exposed = 0;
    // Activation gradients' all-reduces beside their reader's weight gradient
    // (activation_gradient_overlap): hidden under the weight gradients' products.
    double activation_backward = 0;
    // Collective matmuls' collectives (matmul_collective_at), forward and backward, in full:
    // activations counts what of them the products leave exposed.
    double activation_matmul = 0;
  };
  Tally tally(int first_axis = 0) const;  // the collectives of the axes from first_axis on
  void tally_statistics(int axis, Tally& out) const;
  // A parameter collective's unit group on an axis: (unit of `consumer`, kind, dtype).
  std::tuple<int, int, int> unit_group_key(int consumer, ir::ValueId value, int kind) const;
  std::map<std::tuple<int, int, int>, double> unit_group_elements(int axis) const;
  void tally_reshardings(int axis, Tally& out) const;

  // solve_axis' phases over one axis' problem (sharding_model.cc: AxisProblem).
  struct Hub;
  struct AxisProblem;
  void axis_choices(AxisProblem& ap) const;
  void share_reshardings(AxisProblem& ap) const;
  void problem_nodes(AxisProblem& ap) const;
  void problem_edges(AxisProblem& ap) const;
  FastOptions solver_seeds(AxisProblem& ap, bool seeds_only) const;
  int hub_seed(const AxisProblem& ap, const Hub& hub, const std::vector<int>& seed) const;
  void adopt_solution(const AxisProblem& ap, const SpmdSolution& solution);

  void adopt_decisions(const plan::Sharding& sharding);  // adopt's work, without its undo
  Placement value_placement(int axis, ir::ValueId value) const;
  // Product of held fractions over the axes from first_axis on, `axis` excluded (-1: none).
  double held_except(ir::ValueId value, int axis, int first_axis = 0) const;
  double held_all(ir::ValueId value) const;
  double value_bytes(ir::ValueId value) const;  // whole tensor, at the global batch and precision
  // The node's rule as the other axes' current splits leave it: every other axis
  // (`outer_only` false: what may split, sizes for costs), or only the axes outer to `axis`
  // (true: where this axis' blocks lie, enumerate_strategies' `layout`).
  ops::DimRule rule_except(ir::NodeId node, int axis, bool outer_only = false) const;
  std::vector<Strategy> node_strategies(ir::NodeId node, int axis) const;
  Strategy replicate_strategy(ir::NodeId node) const;
  // Forward + backward (+ recomputed forward) seconds of a node with `choice` on `axis`
  // (the other axes as decided), on `device`.
  double node_compute(ir::NodeId node, int axis, const Strategy& choice, const cost::DeviceType& device) const;
  // The same, split: forward, and backward with the recomputed forward.
  cost::OpTime node_time(ir::NodeId node, int axis, const Strategy& choice, const cost::DeviceType& device) const;
  // The same without the recomputed forward.
  cost::OpTime base_time(ir::NodeId node, int axis, const Strategy& choice, const cost::DeviceType& device) const;
  // The node's operand shapes on one rank (the largest block) under `choice` on `axis` and the other
  // axes' decisions: NodeContext::local_shapes, for a model that wants them.
  std::vector<std::vector<std::int64_t>> local_shapes(ir::NodeId node, int axis, const Strategy& choice) const;
  double node_memory(ir::NodeId node, int axis, const Strategy& choice) const;
  // What the solver multiplies a node's compute by on a heterogeneous cluster: 1, but for
  // each axis over devices of different speeds on which `choice` (other axes: as decided)
  // splits the batch, n x slowest / sum of the axis' speeds. The batch then takes shares
  // sized to each device (the balance LP, spmd_search.cc), so the node runs at the axis'
  // summed speed; a split of anything else gives every device equal work, at the slowest's
  // pace. Without it the solver, which prices every node on the slowest device with even
  // shares, sees no reason to split the batch early (a replicated embedding split by hidden,
  // then an all-to-all) and the shares then reach only the nodes after the all-to-all.
  double balanced_compute_factor(ir::NodeId node, int axis, const Strategy& choice) const;
  // `p` as the runtime holds it on `axis`: on an axis over devices of different speeds, a
  // split of the value's batch dim takes uneven shares (the balance LP's, known only after
  // the search; priced here at the devices' speed shares), and uneven blocks move by
  // all-gather and cut, never all-to-all (resharding.h). Pricing them even would price an
  // all-to-all the run never issues.
  Placement as_run(int axis, ir::ValueId value, const Placement& p) const;
  // The fractions of a leaf this rank holds: of its values, and of its gradient and
  // optimizer state (ZeRO shards those further), with `choice` on `axis`.
  std::pair<double, double> leaf_held(ir::ValueId leaf, int axis, const LeafChoice& choice) const;
  double leaf_memory(ir::ValueId leaf, int axis, const LeafChoice& choice) const;
  cost::ModelStateBytes leaf_memory_by_kind(ir::ValueId leaf, int axis, const LeafChoice& choice) const;
  // Can the leaf be held as `want` on `axis` with its other axes' current placements? A
  // reader asks for its own split on one axis only; the leaf's own dim may already be cut by
  // another axis into blocks `want` does not divide (a [2, h] table S(0) on both axes of a
  // 2 x 2 mesh), which no rank could hold (transform/local_shard.h).
  bool leaf_placement_fits(ir::ValueId leaf, int axis, const Placement& want) const;
  // The optimizer step on this rank's share of a trainable parameter's states.
  double optimizer_seconds(ir::ValueId leaf, int axis, const LeafChoice& choice) const;
  // ZeRO (choice.zero on `axis`): the parameter broadcast from the rank that stepped it to
  // its axis' group after the step (runtime/optim.py), blocking: exposed.
  double zero_broadcast_seconds(ir::ValueId leaf, int axis, const LeafChoice& choice) const;
  // `hidden_weight`: what a second of a parameter collective that runs beside compute
  // costs (solve_axis' parameter_weight); exposed ones cost 1.
  double edge_seconds(int axis, ir::ValueId value, int consumer, int operand, const Placement& produced,
                      const Placement& wanted, const Placement& gradient, double hidden_weight = 1.0) const;
  // How often the forward resharding of `value` into `consumer` runs per step: once for an
  // activation; for a parameter, again for the backward where backward reads it (a gathered
  // weight is released after its read, FSDP / ZeRO-3), or, in a recomputed block, for the
  // recomputed forward, whose copy backward uses.
  int forward_passes(ir::ValueId value, int consumer, int operand) const;
  // Where the backward steps of activation `value` into `consumer`'s `operand` run, with
  // `produced` -> `wanted` and `gradient` on `axis` and the other axes as decided
  // (activation_gradient_overlap, parameter_collectives.h).
  ParameterOverlap activation_gradient_at(int axis, ir::ValueId value, int consumer, int operand,
                                          const Placement& produced, const Placement& wanted,
                                          const Placement& gradient) const;
  // Where the reduction of parameter `value`'s gradient at `consumer`'s `operand` runs, held
  // `produced` with the reader's `gradient` on `axis` and the other axes as decided: in the
  // buckets when it is replicated on `axis` (gradient_reduction_overlap), else
  // gradient_scatter_overlap over every axis (parameter_collectives.h).
  // The collective matmul the runtime runs an edge's collectives in on `axis` (None: none,
  // or the option is off): transform/collective_matmul.h's conditions on this axis, every
  // other axis needing no step. Gather: the reader is the contraction; Scatter: the value's
  // producer is.
  MatmulCollective matmul_collective_at(int axis, ir::ValueId value, int consumer, int operand,
                                        const Placement& produced, const Placement& wanted,
                                        const Placement& gradient) const;
  ParameterOverlap parameter_gradient_at(int axis, ir::ValueId value, int consumer, int operand,
                                         const Placement& produced, const Placement& gradient) const;
  // Where the forward gather of parameter `value` into `consumer`'s `operand` runs, with
  // `produced` -> `wanted` on `axis` and the other axes as decided (parameter_collectives.h).
  ParameterOverlap gather_overlap(int axis, ir::ValueId value, int consumer, int operand, const Placement& produced,
                                  const Placement& wanted) const;
  // Resharding `bytes` (the rank's part of the tensor) of `value` from -> to on `axis`, paying
  // `latency_share` of the collective's latency (1: issued alone).
  double reshard_seconds(int axis, ir::ValueId value, const Placement& from, const Placement& to, double bytes,
                         double latency_share = 1.0) const;
  // The share of one collective's latency a collective of parameter `value` at `consumer`
  // pays, as the runtime issues it (parameter_collectives.h): a prefetched gather (and its
  // gather again for backward) or a reduce-scatter beside backward, its share by elements of
  // its unit's flattened collective; a replicated gradient's reduction, its share of a bucket
  // of `bucket_bytes` (`bytes`: the rank's part); any other, all of it. Which of the unit's
  // parameters join the group is the plan's (tally() counts the groups the decisions make);
  // the solver, pricing one edge at a time, takes as peers the unit's parameters of the same
  // rank class, vectors with vectors and matrices with matrices: a plan that gathers a
  // unit's matrices (ZeRO-3) gathers its vectors too, while one that splits the matrices
  // (tensor parallelism) may still gather the vectors (sequence-parallel norms) alone.
  double parameter_latency_share(ir::ValueId value, int consumer, ParameterOverlap overlap, bool replicated_gradient,
                                 double bytes) const;
  // The share of a reader's gradient reduction that reader pays: a leaf replicated on the
  // axis and read by n nodes (a tied embedding, a shared weight) adds its n Partial(sum)
  // gradients locally and reduces them once, so each such reader pays 1/n (exact when every
  // reader's gradient is Partial, the common case; an approximation of a hyper-edge
  // otherwise). A leaf sharded on the axis is reduce-scattered at each read: 1 each.
  double gradient_share(ir::ValueId value, const Placement& produced, const Placement& gradient) const;
  double statistics_seconds(int axis, const Strategy& choice) const;
  // An FP8 linear whose contraction dim `choice` splits on `axis` (runtime/fp8.py): the amaxes
  // of x's rows and W's rows (K split, forward) or of dy's rows and W's columns (N split,
  // backward), one float each, in one all-reduce(MAX) over the axis. {elements, forward?};
  // {0, _} where there is none.
  std::pair<double, bool> fp8_amax_elements(ir::NodeId node, int axis, const Strategy& choice) const;
  double fp8_amax_seconds(int axis, double elements) const;
  double recompute_checkpoint_bytes() const;
  // Is the node in a block run as a checkpointed region (any recomputation)? Does its forward
  // run again in backward (full: every such node; selective: not the ones it keeps)?
  bool checkpointed(std::size_t node) const;
  bool recomputed(std::size_t node) const;
  // Does the checkpointed node run again when backward recomputes its block: at or before the
  // block's last node that saves for backward (torch.utils.checkpoint stops there,
  // analysis::saved_tensors)? Then the reshards into it run again too, and its
  // forward where recomputed. The block's save-free tail (the last projection's reshard, the
  // residual add) runs once.
  bool runs_again(std::size_t node) const;
  // Is its forward computed again in backward: recomputed (not kept) and run again.
  bool reruns_forward(std::size_t node) const;
  // Selective recomputation keeps the node's outputs whole from the forward.
  bool kept_whole(std::size_t node) const;
  // The output bytes node_memory counts, with each output's kept share given.
  double output_memory(ir::NodeId node, int axis, const Strategy& choice, bool whole) const;

  const ir::Graph& graph_;
  const cost::Cluster& cluster_;
  const cost::CostModel& model_;
  ShardingModelOptions options_;
  const cost::DeviceType* device_ = nullptr;  // the slowest: sets the pace
  // Per mesh axis: n x the slowest device's speed / the summed speed of the axis' group (1 on
  // a homogeneous axis): balanced_compute_factor.
  std::vector<double> axis_balance_;
  std::vector<std::vector<double>> axis_speed_shares_;  // per axis: each rank's speed / the sum (empty: even)
  double batch_scale_ = 1;
  bool batch_traced_ = false;  // the capture's batch > 1: activations carry their batch dims
  double float_bytes_ = 2;
  // Indexed by NodeId: the node as an FP8 linear where the plan's precision is fp8 (analysis/
  // fp8_linears.h), found once; empty for other precisions.
  std::vector<std::optional<analysis::Fp8Linear>> fp8_linears_;
  cost::MemoryConstants memory_;  // options_.memory, or the precision's (cost/memory_cost.h)
  StrategyOptions strided_;

  std::vector<std::optional<ops::DimRule>> rules_;  // per node, batch index scaled
  std::vector<bool> requires_grad_;                 // per value
  std::vector<double> reads_;                       // per value: (node, input) reads
  std::vector<double> saved_;                       // per value: the share autograd keeps (saved_for_backward.h)
  std::vector<ir::NodeId> rep_node_;                // per node
  std::vector<ir::ValueId> rep_leaf_;               // per value (leaves), else -1
  std::vector<double> instances_;                   // per node: instances folded into it (reps)
  std::vector<bool> in_block_;                      // per node
  std::vector<bool> runs_again_;  // per node of a block: at or before the block's last node that saves
  std::vector<bool> selective_kept_;                // per node: analysis::kept_by_selective_recompute
  std::vector<int> units_;                          // per node: parameter_units
  // Per (unit, matrix): the elements of the parameters of that rank class the unit reads
  // (parameter_latency_share's peers).
  std::map<std::pair<int, bool>, double> unit_elements_;
  std::vector<ir::ValueId> block_inputs_;           // checkpointed values when recomputing
  std::map<EdgeKey, EdgeGroup> edges_;

  std::vector<std::vector<Strategy>> node_choice_;    // [axis][node]
  std::vector<std::vector<LeafChoice>> leaf_choice_;  // [axis][value]
};

// The decisions search_spmd takes for one candidate (its mesh and recomputation, from `start`
// with every decision replicated): the coordinate descents, the best kept, its evaluation
// in `evaluation` when given. For callers that price the decisions themselves: the joint
// planner's stage layouts (search/stage_layout.h). Defined in spmd_search.cc.
std::unique_ptr<ShardingModel> search_decisions(const ShardingModel& start, bool thorough,
                                                ShardingEvaluation* evaluation = nullptr);

}  // namespace shardwise::search
