// The state of one SPMD search candidate (a mesh, with or without recomputation): the
// decision of every node and leaf on every mesh axis, the costs of those decisions, and the
// per-axis SpmdProblem that improves them. Internal to search_spmd (search/spmd_search.h,
// which documents the cost model) and to the joint planner's stage layouts
// (search/stage_layout.h); tests reach it through those.
//
// Lifecycle: construct (everything replicated), solve_axis() per axis as often as wanted,
// evaluate() for the figures of the current decisions.
//
// The model coordinates; its parts say what things are and cost: what it derives once from
// the graph (sharding_facts.h, the repeated blocks folded by block_folding.h), the decisions
// (sharding_decisions.h), the strategies each node and leaf may take on an axis
// (sharding_strategies.h), what an edge's reshardings cost (sharding_edges.h) and what a rank
// holds (sharding_memory.h). The model adds the compute, the statistics' and the optimizer
// step's collectives, builds and solves the per-axis problems, and sums the evaluation.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cost/cluster.h"
#include "cost/memory_cost.h"
#include "cost/op_cost.h"
#include "ir/graph.h"
#include "plan/plan.h"
#include "search/parameter_collectives.h"
#include "search/placement.h"
#include "search/sharding_decisions.h"
#include "search/sharding_edges.h"
#include "search/sharding_facts.h"
#include "search/sharding_memory.h"
#include "search/sharding_options.h"
#include "search/sharding_strategies.h"
#include "search/spmd_problem.h"
#include "search/strategy.h"

namespace shardwise::search {

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
  double output_bytes = 0;  // all its outputs, per rank, under its decision (what a kept node keeps)
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
  // The gradients one node's backward holds beyond the saved activations, at their largest (ShardingMemory).
  double backward_working_bytes() const;
  // One node's (ShardingMemory::node_backward_working_bytes): a stage layout's parts take their most.
  double node_backward_working_bytes(ir::NodeId node) const;
  double parameter_bytes() const;
  // parameter_bytes() by kind: weights (and non-trainable leaves), gradients, optimizer state.
  cost::ModelStateBytes parameter_bytes_by_kind() const;
  // The weights readers gather beyond the rank's stored share, at their peak (ShardingMemory).
  double gathered_parameter_bytes() const;
  // An fp8 plan's transient cast copies (ShardingMemory); 0 for other precisions.
  double fp8_cast_bytes() const;

  const std::vector<int>& mesh() const { return options_.mesh; }
  const ShardingModelOptions& options() const { return options_; }
  // Prices collective matmuls or not from here on (the decisions stay): a plan solved without
  // them is evaluated as the runtime would run it with them (spmd_search.cc).
  void set_collective_matmul(bool on) { options_.collective_matmul = on; }
  void set_shared_reshardings(bool on) { options_.shared_reshardings = on; }
  std::vector<int> axis_ranks(int axis) const;

 private:
  // The parts, as views of this model's facts, decisions and options (made on each use: a
  // copy of the model must not point into the original).
  StrategyEnumerator strategy_enumerator() const { return {*facts_, decisions_, options_}; }
  // Whether `node`'s operand `input` (an FP8 linear's x) has its gradient all-reduced beside
  // the weight gradient on some axis: a compiled plan runs that linear eagerly (op_cost.h).
  bool async_input_gradient(ir::NodeId node, int axis, const Strategy& choice, std::size_t input) const;
  EdgePricer edge_pricer() const { return {*facts_, decisions_, options_}; }
  ShardingMemory memory() const { return {*facts_, decisions_, options_}; }
  const BlockFolding& folding() const { return facts_->folding; }

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
  void tally_reshardings(int axis, Tally& out) const;

  // solve_axis' phases over one axis' problem (sharding_model.cc: AxisProblem).
  struct Hub;
  struct AxisProblem;
  void share_reshardings(AxisProblem& ap) const;
  void problem_nodes(AxisProblem& ap) const;
  void problem_edges(AxisProblem& ap) const;
  FastOptions solver_seeds(AxisProblem& ap, bool seeds_only) const;
  int hub_seed(const AxisProblem& ap, const Hub& hub, const std::vector<int>& seed) const;
  void adopt_solution(const AxisProblem& ap, const SpmdSolution& solution);

  void adopt_decisions(const plan::Sharding& sharding);  // adopt's work, without its undo
  // Forward + backward (+ recomputed forward) seconds of a node with `choice` on `axis`
  // (the other axes as decided), on `device`.
  double node_compute(ir::NodeId node, int axis, const Strategy& choice, const cost::DeviceType& device) const;
  // The same, split: forward, and backward with the recomputed forward.
  cost::OpTime node_time(ir::NodeId node, int axis, const Strategy& choice, const cost::DeviceType& device) const;
  // The same without the recomputed forward.
  cost::OpTime base_time(ir::NodeId node, int axis, const Strategy& choice, const cost::DeviceType& device) const;
  // What recomputation adds to the node's backward, `time` its base_time: a full block's node
  // its forward again; a selective block's its measured extra under the policy where the
  // profile has it (cost::OpTime::selective_extra), else its forward unless kept.
  double recompute_seconds(std::size_t node, const cost::OpTime& time) const;
  // The node's operand shapes on one rank (the largest block) under `choice` on `axis` and the other
  // axes' decisions: NodeContext::local_shapes, for a model that wants them.
  std::vector<std::vector<std::int64_t>> local_shapes(ir::NodeId node, int axis, const Strategy& choice) const;
  // What the solver multiplies a node's compute by on a heterogeneous cluster: 1, but for
  // each axis over devices of different speeds on which `choice` (other axes: as decided)
  // splits the batch, n x slowest / sum of the axis' speeds. The batch then takes shares
  // sized to each device (the balance LP, spmd_search.cc), so the node runs at the axis'
  // summed speed; a split of anything else gives every device equal work, at the slowest's
  // pace. Without it the solver, which prices every node on the slowest device with even
  // shares, sees no reason to split the batch early (a replicated embedding split by hidden,
  // then an all-to-all) and the shares then reach only the nodes after the all-to-all.
  double balanced_compute_factor(ir::NodeId node, int axis, const Strategy& choice) const;
  // The optimizer step on this rank's share of a trainable parameter's states.
  double optimizer_seconds(ir::ValueId leaf, int axis, const LeafChoice& choice) const;
  // ZeRO (choice.zero on `axis`): the parameter broadcast from the rank that stepped it to
  // its axis' group after the step (runtime/optim.py), blocking: exposed.
  double zero_broadcast_seconds(ir::ValueId leaf, int axis, const LeafChoice& choice) const;
  double statistics_seconds(int axis, const Strategy& choice) const;
  // Ring attention (a split of an Index::ring, ops/distributed_kernels.h): the axis that
  // splits the node's sequence under `choice` on `axis` (the other axes as decided), or -1.
  int ring_axis(ir::NodeId node, int axis, const Strategy& choice) const;
  // What the slowest rank of a causal ring on `ring_axis` computes over the mean: rank n - 1's
  // rows see every block, (2n - 1) / n of the balanced share (runtime/ring_attention.py's
  // contiguous layout); 1 for attention that is not causal.
  double ring_compute_factor(ir::NodeId node, int ring_axis) const;
  // The key and value blocks' hops when `choice` splits the ring on `axis`: in forward n - 1
  // hops beside the blocks' compute (what outlasts it), in backward n - 1 hops of a block with
  // its gradients and one of the gradients, after each block's compute. 0 for other choices.
  struct RingHops {
    double block_bytes = 0;  // a rank's key and value rows
    double seconds = 0;
  };
  RingHops ring_hops(ir::NodeId node, int axis, const Strategy& choice) const;
  // A mixture of experts' tokens dispatched on `axis` (Strategy::dispatch): a rank's routed
  // rows (its tokens x top-k, with their weights and expert ids) sent to their experts' ranks
  // and the results back by all-to-all, forward; the gradients the same way back, backward:
  // four all-to-alls of `bytes`, exposed. {} for other choices. Balanced routing (each rank
  // receives what it sends); the imbalance of a real router is not priced.
  struct DispatchTraffic {
    double bytes = 0;  // a rank's routed rows
    double seconds = 0;
  };
  DispatchTraffic dispatch_traffic(ir::NodeId node, int axis, const Strategy& choice) const;
  // An FP8 linear whose contraction dim `choice` splits on `axis` (runtime/fp8.py): the amaxes
  // of x's rows and W's rows (K split, forward) or of dy's rows and W's columns (N split,
  // backward), one float each, in one all-reduce(MAX) over the axis. {elements, forward?};
  // {0, _} where there is none.
  std::pair<double, bool> fp8_amax_elements(ir::NodeId node, int axis, const Strategy& choice) const;
  double fp8_amax_seconds(int axis, double elements) const;

  const ir::Graph& graph_;
  const cost::Cluster& cluster_;
  const cost::CostModel& model_;
  ShardingModelOptions options_;
  std::shared_ptr<const ShardingFacts> facts_;  // shared by the copies the search makes
  ShardingDecisions decisions_;
};

// The decisions search_spmd takes for one candidate (its mesh and recomputation, from `start`
// with every decision replicated): the coordinate descents, the best kept, its evaluation
// in `evaluation` when given. For callers that price the decisions themselves: the joint
// planner's stage layouts (search/stage_layout.h). Defined in spmd_search.cc.
std::unique_ptr<ShardingModel> search_decisions(const ShardingModel& start, bool thorough,
                                                ShardingEvaluation* evaluation = nullptr);

}  // namespace shardwise::search
