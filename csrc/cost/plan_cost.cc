// The plan evaluator; the model is documented in plan_cost.h.
#include "cost/plan_cost.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <numeric>
#include <set>
#include <vector>

#include "analysis/flops.h"
#include "analysis/fp8_linears.h"
#include "cost/backward_working.h"
#include "cost/layer_balance.h"
#include "cost/optimizer_cost.h"
#include "cost/pipeline_transfers.h"
#include "ops/distributed_kernels.h"
#include "ops/experts.h"
#include "ops/node_rule.h"
#include "ops/op_table.h"
#include "schedule/schedules.h"
#include "support/error.h"

namespace shardwise::cost {
namespace {

using support::ValidationError;

// A part priced from the graph: its load (which a searched layout's replaces), and what stays
// the graph's under any layout: the FLOP accounting and an fp8 plan's cast transient.
struct PartCost : PartLoad {
  double matmul_flops = 0;  // forward, at the graph's batch, whole (unsharded)
  // An fp8 plan: the most one of its FP8 linears' forward casts hold at once, one rank, at the
  // micro-batch (cost::fp8_cast_transient_bytes; search::ShardingMemory::fp8_cast_bytes):
  // transient, so the most of any node, not a sum.
  double fp8_cast_bytes = 0;
  // An fp8 plan whose weights are gathered for their reads (ZeRO-3): the float8 W^T copies its
  // FP8 linears save for backward, one rank's elements (1 byte each; in activation_bytes too).
  // Those weights are gathered once a forward pass, not again for the backward.
  double float8_weight_elements = 0;
  // Context parallelism: the ring attention's exposed sends per micro-batch (inside forward
  // and backward already; PlanCost::context_parallel).
  double ring_seconds = 0;
  // Expert parallelism: the token dispatch's seconds per micro-batch (inside forward and
  // backward already; PlanCost::expert_parallel).
  double dispatch_seconds = 0;
};

// One rank's shares of a node's operands under a Megatron split of t: the activations a Row or
// All split divides (inputs) and what a Column or All split divides (outputs); weights any split.
struct SplitShares {
  double input = 1, output = 1, weight = 1;
  SplitShares(TensorSplit split, int t) {
    const double share = 1.0 / static_cast<double>(t);
    const bool all = split == TensorSplit::All;
    if (split == TensorSplit::Row || all) input = share;
    if (split == TensorSplit::Column || all) output = share;
    if (split != TensorSplit::None) weight = share;
  }
};

// A node's forward cast transient in an fp8 plan (PartCost::fp8_cast_bytes), 0 if it is no FP8
// linear: x's casts, then W's beside x's float8 copy (cost::fp8_cast_transient_bytes).
double fp8_cast_bytes(const ir::Graph& graph, const ir::Node& node, double batch_scale, TensorSplit split, int t) {
  const auto linear = analysis::fp8_linear(graph, node);
  if (!linear) return 0;
  const SplitShares shares(split, t);
  const double x = static_cast<double>(graph.value(node.inputs[linear->input]).type.numel()) * batch_scale * shares.input;
  const double w = static_cast<double>(graph.value(node.inputs[linear->weight]).type.numel()) * shares.weight;
  return fp8_cast_transient_bytes(x, w);
}

// What a node's backward holds at once beyond the saved activations (PartLoad::
// backward_working_bytes; cost::node_backward_working_bytes, the rule the SPMD search prices
// too), one rank's shares of its operands under the Megatron split, activations at the batch.
double backward_working_bytes(const ir::Graph& graph, const ir::Node& node, const std::vector<bool>& flow,
                              double batch_scale, TensorSplit split, int t, bool fp8) {
  const SplitShares shares(split, t);
  const auto linear = fp8 ? analysis::fp8_linear(graph, node) : std::nullopt;
  auto held = [&](ir::ValueId v, std::size_t index, bool output) {
    const double share = output ? shares.output : linear && index == linear->weight ? shares.weight : shares.input;
    return share * (graph.value(v).role == ir::ValueRole::Activation ? batch_scale : 1.0);
  };
  return node_backward_working_bytes(
      graph, node, flow, linear,
      [&](ir::ValueId v, std::size_t i, bool output) {
        return static_cast<double>(graph.value(v).type.bytes()) * held(v, i, output);
      },
      [&](ir::ValueId v, std::size_t i, bool output) {
        return static_cast<double>(graph.value(v).type.numel()) * held(v, i, output);
      });
}

// The forward seconds a recomputed layer runs again in its backward.
double recomputed_forward(const PartCost& layer, plan::Recompute recompute) {
  switch (recompute) {
    case plan::Recompute::Full: return layer.forward;
    case plan::Recompute::Selective: return layer.selective_forward;
    case plan::Recompute::None: break;
  }
  return 0.0;
}

// A part's blocks outside the layers as the plan runs them: recomputation keeps their
// checkpoints (and, selective, the outputs it keeps) in place of their saved bytes and runs
// their forward again in the backward, as it does the layers'.
void checkpoint_outer_blocks(PartLoad& part, plan::Recompute recompute) {
  if (recompute == plan::Recompute::None) return;
  const PartLoad::Blocks& b = part.blocks;
  const bool selective = recompute == plan::Recompute::Selective;
  part.activation_bytes += b.checkpoint_bytes + (selective ? b.selective_kept_bytes : 0.0) - b.activation_bytes;
  part.backward += selective ? b.selective_forward : b.forward;
}

// How a plan's programs run every node: the context each node's price starts from (compiled
// or eager: plan.compile); whether ZeRO-3 gathers each weight for its read (an FP8 linear then
// saves the float8 copy of its W^T for backward: transform/fp8_axes.h); whether a column
// split's input-gradient all-reduce runs beside the weight gradient (plan::Sharding::
// async_gradients: such an FP8 linear runs eagerly when compiled).
struct Program {
  NodeContext context;
  bool gathers_weights = false;
  bool async_gradients = true;
};

PartCost cost_nodes(const ir::Graph& graph, const std::vector<ir::NodeId>& nodes,
                    const std::map<ir::NodeId, TensorSplit>& split, const LayerStructure& structure,
                    const CostModel& model,
                    const DeviceType& device, Precision precision, const Program& program,
                    double batch_scale, int t, std::set<ir::ValueId>* seen_params, bool row_shapes = true) {
  PartCost out;
  OuterBlockTally blocks(structure);
  for (ir::NodeId id : nodes) {
    const ir::Node& node = graph.node(id);
    auto it = split.find(id);
    NodeContext context = program.context;
    context.batch_scale = batch_scale;
    context.shards = t;
    context.split = it == split.end() || t == 1 ? TensorSplit::None : it->second;
    context.async_input_gradient = program.async_gradients && context.split == TensorSplit::Column &&
                                   static_cast<std::size_t>(id) < structure.async_gradient_site.size() &&
                                   structure.async_gradient_site[static_cast<std::size_t>(id)];
    // A node the split leaves whole runs at its batch-scaled shapes; a split node's
    // per-rank shapes are the SPMD search's to say (the stage layout), not this sketch's.
    if (model.wants_local_shapes() && context.split == TensorSplit::None && row_shapes)
      context.local_shapes = batch_scaled_shapes(graph, node, batch_scale);
    OpTime time = model.node_time(graph, node, device, precision, context);
    const bool fp8 = precision == Precision::FP8;
    if (fp8) out.fp8_cast_bytes = std::max(out.fp8_cast_bytes, fp8_cast_bytes(graph, node, batch_scale, context.split, t));
    out.backward_working_bytes =
        std::max(out.backward_working_bytes, backward_working_bytes(graph, node, structure.gradient_flow, batch_scale,
                                                                    context.split, t, fp8));
    out.forward += time.forward;
    out.backward += time.backward;
    out.matmul_flops += static_cast<double>(analysis::node_flops(ops::OpTable::builtin(), graph, node).matmul);
    // Saved activations: what autograd keeps of the node's outputs (analysis/saved_for_backward.h).
    const double split_share = context.split == TensorSplit::Column || context.split == TensorSplit::All ? 1.0 / t : 1.0;
    const auto at = static_cast<std::size_t>(id);
    double saved = static_cast<double>(program.context.compiled != nullptr ? structure.compiled_activation_bytes[at]
                                                                         : structure.activation_bytes[at]) *
                         batch_scale * split_share;
    out.activation_bytes += saved;
    // A gathered weight's float8 W^T, saved by its FP8 linear in place of W (1 byte an element).
    if (fp8 && program.gathers_weights)
      if (const auto linear = analysis::fp8_linear(graph, node)) {
        const double copy = static_cast<double>(graph.value(node.inputs[linear->weight]).type.numel()) *
                            SplitShares(context.split, t).weight;
        out.activation_bytes += copy, saved += copy;
        out.float8_weight_elements += copy;
      }
    out.weight_gradient_bytes += static_cast<double>(structure.weight_gradient_held[at]) * batch_scale * split_share;
    double kept = 0;
    if (structure.selective_kept[at])
      for (ir::ValueId v : node.outputs)
        kept += static_cast<double>(graph.value(v).type.bytes()) * batch_scale * split_share;
    // What the selective policy adds: measured where the profile has it (OpTime::selective_extra:
    // the dispatch mode's own seconds included), else the forward of what it does not keep.
    const double selective_forward = time.selective_extra >= 0     ? time.selective_extra
                                     : structure.selective_kept[at] ? 0.0
                                                                    : time.forward;
    out.selective_kept_bytes += kept;
    out.selective_forward += selective_forward;
    blocks.add(id, time.forward, selective_forward, saved, kept);
    for (ir::ValueId in : node.inputs) {
      const ir::Value& value = graph.value(in);
      if (value.role != ir::ValueRole::Parameter || !seen_params->insert(in).second) continue;
      double n = static_cast<double>(value.type.numel());
      const double held = structure.sharded_params.contains(in) ? n / t : n;
      out.parameters += held;
      for (std::size_t i = 0; i < node.inputs.size(); ++i)
        if (node.inputs[i] == in && ops::is_expert_weight(node, i)) {
          out.expert_parameters += held;
          break;
        }
    }
  }
  // A checkpoint outside the layers is whole on every tensor rank (Megatron: no sequence split there).
  out.blocks = blocks.finish(
      [&](ir::ValueId v) { return static_cast<double>(graph.value(v).type.bytes()) * batch_scale; });
  return out;
}

// Node::compute_alone: the factor on a pipeline's compute and bubble (`path`, priced at the
// shared rate) that makes them the larger of the same path at the alone rate (the smallest
// over the nodes) and the busiest node's pool (its ranks' compute over the step, over its
// ranks). 1 when a node's ranks have devices of their own; never above 1.
// Worked example: 4 ranks on one node, compute_alone 2, 4 stages of 1 rank, 8 micro-batches
// of 10 ms each on every stage, path = (8 + 3) x 10 ms = 110 ms: alone 55 ms, pool
// 4 x 80 ms / 4 = 80 ms, factor 80 / 110.
double shared_compute_factor(const Cluster& cluster, const std::vector<std::pair<int, int>>& stage_ranks,
                             const std::vector<double>& stage_compute, double micro_batches, double path) {
  double alone = std::numeric_limits<double>::infinity();
  for (const Node& node : cluster.nodes()) alone = std::min(alone, node.compute_alone);
  if (!(alone > 1.0) || !(path > 0)) return 1.0;
  std::vector<double> busy(static_cast<std::size_t>(cluster.num_nodes()), 0.0);
  for (std::size_t s = 0; s < stage_ranks.size(); ++s) {
    const auto [first, count] = stage_ranks[s];
    for (int r = first; r < first + count; ++r)
      busy[static_cast<std::size_t>(cluster.node_of(r))] += micro_batches * stage_compute[s];
  }
  double pool = 0;
  for (int n = 0; n < cluster.num_nodes(); ++n)
    pool = std::max(pool, busy[static_cast<std::size_t>(n)] / cluster.nodes()[static_cast<std::size_t>(n)].device_count());
  return std::min(1.0, std::max(path / alone, pool) / path);
}

}  // namespace

void OuterBlockTally::add(ir::NodeId id, double forward, double selective_forward, double activation_bytes,
                          double selective_kept_bytes) {
  const int block = structure_.outer_block[static_cast<std::size_t>(id)];
  if (block < 0) return;
  sum_.forward += forward;
  sum_.selective_forward += selective_forward;
  sum_.activation_bytes += activation_bytes;
  sum_.selective_kept_bytes += selective_kept_bytes;
  saved_by_block_[block] += activation_bytes;
}

std::map<std::string, double> PlanCost::breakdown() const {
  std::map<std::string, double> out{{"compute", compute},
          {"tensor_parallel", tensor_parallel},
          {"pipeline_p2p", pipeline_p2p},
          {"pipeline_transfer", pipeline_transfer},
          {"pipeline_bubble", pipeline_bubble},
          {"data_parallel", data_parallel},
          {"data_parallel_total", data_parallel_total},
          {"data_parallel_overlapped", data_parallel_overlapped ? 1.0 : 0.0},
          {"optimizer", optimizer}};
  if (context_parallel > 0) out["context_parallel"] = context_parallel;
  if (expert_parallel > 0) out["expert_parallel"] = expert_parallel;
  if (zero_broadcast > 0) out["zero_broadcast"] = zero_broadcast;
  if (shared_weight_sync > 0) out["shared_weight_sync"] = shared_weight_sync;
  return out;
}

PlanCost evaluate(const ir::Graph& graph, const Cluster& cluster, const plan::Plan& plan, const CostModel& model,
                  const PlanCostConstants& constants) {
  plan::validate(plan, cluster.world_size());  // before the graph analysis: bad plans fail fast
  return evaluate(find_layer_structure(graph), graph, cluster, plan, model, constants);
}

namespace {

// The three parts of the graph on one rank: a repeated layer, what comes before the first
// (embedding) and after the last (head and loss).
struct Parts {
  PartCost layer, pre, post;
};

// Tensor-parallel all-reduces per micro-batch of a layer and of the two outer parts.
struct TensorParallel {
  double layer = 0, pre = 0, post = 0;
};

// Each stage's prices: the plan's one sub-mesh for every stage, or (stage_meshes) each
// stage's own {d_s, t_s}: a rank runs micro_batch / d_s rows with its layers split t_s ways,
// on its ranks' slowest type (a searched layout is for one sub-mesh shape: not used then).
struct StagePrice {
  PartCost layer, pre, post;
  double layer_compute = 0;
  TensorParallel tp;
  int data = 1, tensor = 1, first = 0;
  double boundary_bytes = 0;  // one rank's share of a layer's input (what its 1F1B keeps per micro-batch)
};

// What a stage holds at its fullest moment beyond its model states and the activations it keeps,
// and the breakdown's parts of it.
struct StageTransient {
  double bytes = 0;
  double activations = 0;       // a recomputed layer or block, rebuilt for its backward
  double backward_working = 0;  // gradients in flight
  double fp8_casts = 0;         // an fp8 plan's forward casts beyond the working set
  bool casts = false;           // the plan casts at all (the breakdown then names them)
};

// One evaluation of a plan: its phases (the graph's parts priced, the stages balanced, the
// step timed, data parallelism and the optimizer, memory, FLOPs) as methods over the state
// they share, run in that order by evaluate().
class PlanEvaluator {
 public:
  PlanEvaluator(const LayerStructure& structure, const ir::Graph& graph, const Cluster& cluster,
                const plan::Plan& plan, const CostModel& model, const PlanCostConstants& constants,
                const StageLayoutPrices* layout);
  void price_parts_and_stages();
  void balance_stages();
  void time_step();
  void data_parallel_and_optimizer();
  void memory();
  PlanCost flops();
  double split_backward_bytes(const schedule::LivenessMoments& liveness, int s) const;
  double accumulation_seconds(int s, double params) const;
  double in_flight_bytes(int s, double in_flight) const;
  double rebuilt_bytes(int s) const;
  StageTransient stage_transient(int s, double gradients) const;
  double shared_pre_post_parameters(int tensor) const;
  double shared_weight_sync() const;

 private:
  Parts price_parts(const DeviceType& on, double scale, int width) const;
  // How the plan's programs run every node (Program).
  Program program() const {
    Program out;
    out.context.compiled = plan_.compile ? &structure_.compiled : nullptr;
    out.gathers_weights = plan_.zero_stage >= 3 && plan_.stage_data() > 1;
    out.async_gradients = !plan_.sharding || plan_.sharding->async_gradients;
    return out;
  }
  void check_context() const;
  void check_experts() const;
  void add_dispatch(PartCost& part, const std::vector<ir::NodeId>& nodes, double scale, int width) const;
  void add_ring(PartCost& part, const std::vector<ir::NodeId>& nodes, const std::map<ir::NodeId, TensorSplit>& split,
                const DeviceType& on, double scale, int width) const;
  TensorParallel tensor_parallel(int width, int first, double scale) const;
  void scale_stage_devices();
  double boundary_transfer() const;
  void bottleneck();

  const LayerStructure& structure_;
  const ir::Graph& graph_;
  const Cluster& cluster_;
  const plan::Plan& plan_;
  const CostModel& model_;
  const PlanCostConstants& constants_;
  const StageLayoutPrices* layout_;
  const int t_, p_, v_, c_, e_;  // c_: context, e_: expert (plan.h)
  const std::int64_t m_;
  Precision precision_ = Precision::BF16;
  const DeviceType* device_ = nullptr;  // the slowest type: it sets the pace
  int num_layers_ = 0;
  double batch_scale_ = 0;
  bool recompute_ = false;  // (either way the forward's collectives run again)
  PartCost layer_, pre_cost_, post_cost_;
  double layer_compute_ = 0, layer_tp_ = 0, pre_tp_ = 0, post_tp_ = 0, boundary_bytes_ = 0;
  std::vector<const DeviceType*> stage_device_;
  std::vector<double> stage_scale_;
  std::vector<StagePrice> price_;
  bool v_shape_ = false;
  int last_device_ = 0;
  std::vector<int> device_layers_;
  std::vector<int> chunk_layers_;  // by virtual stage (chunk)
  double transfer_ = 0;
  double worst_compute_ = 0, worst_tp_ = 0, worst_backward_ = 0, worst_ring_ = 0, worst_dispatch_ = 0, t_mb_ = 0;
  // device_expert_params_: of device_params_, the stacked expert weights (held whole here: a
  // plan's expert degree divides them in memory() and data_parallel_and_optimizer()).
  std::vector<double> device_params_, device_expert_params_, device_backward_, device_tensor_sync_, device_compute_;
  MemoryConstants mem_;
  PlanCost out_;
};

PlanEvaluator::PlanEvaluator(const LayerStructure& structure, const ir::Graph& graph, const Cluster& cluster,
                             const plan::Plan& plan, const CostModel& model, const PlanCostConstants& constants,
                             const StageLayoutPrices* layout)
    : structure_(structure),
      graph_(graph),
      cluster_(cluster),
      plan_(plan),
      model_(model),
      constants_(constants),
      layout_(layout),
      t_(plan.tensor),
      p_(plan.pipeline),
      v_(plan.virtual_stages),
      c_(plan.context),
      e_(plan.expert),
      m_(plan.num_micro_batches()) {
  std::optional<Precision> precision = parse_precision(plan.precision);
  if (!precision) throw ValidationError(fmt::format("evaluate: unknown precision '{}'", plan.precision));
  precision_ = *precision;
  cluster.require_precision(precision_, "evaluate");
  device_ = &cluster.device_of(0);
  for (const DeviceType& type : cluster.device_types())
    if (type.peak_flops.at(precision_) < device_->peak_flops.at(precision_)) device_ = &type;
  num_layers_ = structure.num_layers();
  const int p = p_, v = v_;
  if (p * v > 1 && num_layers_ == 0)
    throw ValidationError(fmt::format(
        "evaluate: pipeline {} x virtual_stages {} cuts the model into {} chunks of its repeated layers, but the graph "
        "has none (no sibling modules run the same ops, as transformer blocks do: analysis/repeated_blocks.h), so "
        "there is no stage to price; a model without repeated layers trains with pipeline 1 (data and tensor "
        "parallelism)",
        p, v, p * v));
  if (p * v > std::max(num_layers_, 1))
    throw ValidationError(fmt::format(
        "evaluate: pipeline {} x virtual_stages {} = {} chunks but the graph has {} layers", p, v, p * v, num_layers_));
  // A rank of a context-parallel plan holds 1/c of each row's tokens: every tensor with a
  // batch dim scaled by it (attention's share is add_ring's).
  batch_scale_ = static_cast<double>(plan.micro_batch) / structure.graph_batch / c_;
  if (c_ > 1) check_context();
  if (e_ > 1) check_experts();
  recompute_ = plan.recompute != plan::Recompute::None;
  mem_ = constants.memory.value_or(plan_memory_constants(plan, graph));
}

// The three parts on one rank of `on` running `scale` of the graph's batch, split `width`
// ways. Without repeated structure the whole graph is one part on one stage (post).
Parts PlanEvaluator::price_parts(const DeviceType& on, double scale, int width) const {
  const auto& layers = structure_.layers;
  Parts out;
  std::set<ir::ValueId> seen_layer, seen_pre, seen_post;
  if (layers)
    out.layer = cost_nodes(graph_, layers->nodes.front(), structure_.layer_split, structure_, model_, on, precision_,
                           program(), scale, width, &seen_layer, c_ == 1);
  out.pre = cost_nodes(graph_, structure_.pre, structure_.outside_split, structure_, model_, on, precision_,
                       program(), scale, width, &seen_pre, c_ == 1);
  out.post = cost_nodes(graph_, structure_.post, structure_.outside_split, structure_, model_, on, precision_,
                        program(), scale, width, &seen_post, c_ == 1);
  if (c_ > 1) {
    if (layers) add_ring(out.layer, layers->nodes.front(), structure_.layer_split, on, scale, width);
    add_ring(out.pre, structure_.pre, structure_.outside_split, on, scale, width);
    add_ring(out.post, structure_.post, structure_.outside_split, on, scale, width);
  }
  checkpoint_outer_blocks(out.pre, plan_.recompute);
  checkpoint_outer_blocks(out.post, plan_.recompute);
  if (!layers) {
    out.post.forward += out.pre.forward;
    out.post.backward += out.pre.backward;
    out.post.matmul_flops += out.pre.matmul_flops;
    out.post.ring_seconds += out.pre.ring_seconds;
  }
  return out;
}

// A context-parallel plan runs every attention as a ring over its c ranks (the SPMD search's
// Index::ring, runtime/ring_attention.py): each must have the ring kernel (no dropout), be
// self-attention (queries and keys one sequence) and have a sequence the c ranks divide in
// equal blocks. Anything else is no plan the runtime runs: refused by name.
void PlanEvaluator::check_context() const {
  int attentions = 0;
  for (const ir::Node& node : graph_.nodes()) {
    if (node.op != "aten::scaled_dot_product_attention") continue;
    ++attentions;
    const std::string where = ops::describe_node(graph_, node);  // the layer named by its module
    if (!ops::ring_kernel(node))
      throw ValidationError(fmt::format("evaluate: context {}: attention {} has no ring kernel (dropout)", c_, where));
    const std::int64_t rows = ops::ring_rows(graph_, node);
    if (rows == 0)
      throw ValidationError(fmt::format("evaluate: context {}: attention {} attends across two sequences: only "
                                        "self-attention runs as a ring",
                                        c_, where));
    if (rows % c_ != 0)
      throw ValidationError(fmt::format("evaluate: context {}: attention {} has a sequence of {} that {} ranks do "
                                        "not split in equal blocks",
                                        c_, where, rows, c_));
  }
  if (attentions == 0)
    throw ValidationError(fmt::format("evaluate: context {}: the graph has no attention to run as a ring", c_));
}

// An expert-parallel plan splits every experts op's experts over its e ranks, as many each:
// a graph without one, or an experts op e does not divide, is no plan the runtime runs.
void PlanEvaluator::check_experts() const {
  int layers = 0;
  for (const ir::Node& node : graph_.nodes()) {
    if (!ops::is_experts(node)) continue;
    ++layers;
    const std::int64_t experts = ops::expert_count(graph_, node);
    if (experts % e_ != 0)
      throw ValidationError(fmt::format("evaluate: expert {}: the {} experts of {} do not split over {} ranks evenly",
                                        e_, experts, node.module_path.empty() ? "the model" : node.module_path, e_));
  }
  if (layers == 0)
    throw ValidationError(fmt::format("evaluate: expert {}: the graph has no mixture of experts (shardwise_moe::experts) "
                                      "to split",
                                      e_));
}

// Each experts op of `nodes` with its experts split over the stage's e data ranks (plan.expert;
// the SPMD completion's dispatch of its tokens over the first mesh axis, search's
// Strategy::dispatch): each rank's routed rows (its tokens x top-k: hidden vector, weight and
// expert id) go to their experts' ranks and the results come back by all-to-all, and the
// gradients the same way in backward (the runtime's shardwise::experts_all_to_all): four
// all-to-alls of those rows, exposed (the program waits on each). The compute is the graph's:
// routing balanced, each rank's experts receive as many rows as it sends. (check_experts:
// e divides the experts.)
void PlanEvaluator::add_dispatch(PartCost& part, const std::vector<ir::NodeId>& nodes, double scale, int width) const {
  std::vector<int> axis;  // the e ranks of one tensor coordinate
  for (int j = 0; j < e_; ++j) axis.push_back(j * width);
  for (ir::NodeId id : nodes) {
    const ir::Node& node = graph_.node(id);
    if (!ops::is_experts(node)) continue;
    const double routed = ops::routed_bytes(graph_, node, scale);
    if (routed <= 0) continue;
    const double one = model_.collective_time(cluster_, CollectiveKind::AllToAll, axis,
                                              static_cast<std::int64_t>(routed), Algorithm::Auto);
    part.forward += 2 * one;
    part.backward += 2 * one;
    if (!structure_.selective_kept[static_cast<std::size_t>(id)]) part.selective_forward += 2 * one;
    part.dispatch_seconds += 4 * one;
  }
}

// Each attention of `nodes` on the c ranks that split its sequence, the cheaper of the two
// ways the SPMD search lays a stage's {c, t} mesh out (its choice at run time):
//  - as its ring runs it on the rank that waits longest (priced as search::ShardingModel
//    prices the SPMD search's ring): the rank's queries against every block, x (2c - 1) / c
//    where causal (the contiguous layout's last rank computes the most); the forward's c - 1
//    hops of the rank's keys and values exposed where they outlast it, the backward's c - 1
//    hops of them with their gradients and one of the gradients alone exposed;
//  - where the c ranks divide each tensor rank's query and key heads, as the heads split
//    (DeepSpeed-Ulysses: the search's resharding of q, k, v from the sequence to the heads
//    and of the output back, an all-to-all of each rank's block each way, and the same four
//    for their gradients, exposed): whole sequences over a c-th of the heads, no imbalance.
void PlanEvaluator::add_ring(PartCost& part, const std::vector<ir::NodeId>& nodes,
                             const std::map<ir::NodeId, TensorSplit>& split, const DeviceType& on, double scale,
                             int width) const {
  const std::vector<int> pair = {0, (c_ - 1) * width};  // the ring's widest hop
  auto hop = [&](double bytes) {
    return model_.collective_time(cluster_, CollectiveKind::SendRecv, pair, static_cast<std::int64_t>(bytes),
                                  Algorithm::Auto);
  };
  std::vector<int> axis;  // the c ranks of one tensor coordinate
  for (int j = 0; j < c_; ++j) axis.push_back(j * width);
  auto all_to_all = [&](double bytes) {
    return model_.collective_time(cluster_, CollectiveKind::AllToAll, axis, static_cast<std::int64_t>(bytes),
                                  Algorithm::Auto);
  };
  const double hops = c_ - 1;
  for (ir::NodeId id : nodes) {
    const ir::Node& node = graph_.node(id);
    if (!ops::ring_kernel(node)) continue;
    auto it = split.find(id);
    NodeContext context = program().context;
    context.batch_scale = scale;
    context.shards = width;
    context.split = it == split.end() || width == 1 ? TensorSplit::None : it->second;
    const OpTime time = model_.node_time(graph_, node, on, precision_, context);
    const auto causal = node.attrs.find("is_causal");
    const bool* is_causal = causal == node.attrs.end() ? nullptr : std::get_if<bool>(&causal->second);
    const double factor = is_causal != nullptr && *is_causal ? (2.0 * c_ - 1) / c_ : 1.0;
    const double heads = context.split == TensorSplit::None ? 1.0 : width;
    const double kv = static_cast<double>(graph_.value(node.inputs.at(1)).type.bytes() +
                                          graph_.value(node.inputs.at(2)).type.bytes()) *
                      scale / heads;
    double forward_wait = std::max(0.0, hops * hop(kv) - factor * time.forward);
    double backward_wait = hops * hop(2 * kv) + hop(kv);
    double forward_extra = (factor - 1) * time.forward + forward_wait;
    double backward_extra = (factor - 1) * time.backward + backward_wait;
    const auto head_count = [&](std::size_t i) {
      const auto& shape = graph_.value(node.inputs.at(i)).type.shape;
      return shape.size() >= 3 ? shape[shape.size() - 3] : 0;
    };
    const std::int64_t per_rank_heads = static_cast<std::int64_t>(heads);
    const bool heads_divide = head_count(0) > 0 && head_count(1) > 0 && head_count(0) % (per_rank_heads * c_) == 0 &&
                              head_count(1) % (per_rank_heads * c_) == 0;
    if (heads_divide) {
      const double q = static_cast<double>(graph_.value(node.inputs.at(0)).type.bytes()) * scale / heads;
      const double out = static_cast<double>(graph_.value(node.outputs.at(0)).type.bytes()) * scale / heads;
      const double k = static_cast<double>(graph_.value(node.inputs.at(1)).type.bytes()) * scale / heads;
      const double v = static_cast<double>(graph_.value(node.inputs.at(2)).type.bytes()) * scale / heads;
      const double exchange = all_to_all(q) + all_to_all(k) + all_to_all(v) + all_to_all(out);
      if (2 * exchange < forward_extra + backward_extra) {
        forward_wait = backward_wait = exchange;
        forward_extra = backward_extra = exchange;
      }
    }
    part.forward += forward_extra;
    part.backward += backward_extra;
    if (!structure_.selective_kept[static_cast<std::size_t>(id)]) part.selective_forward += forward_extra;
    part.ring_seconds += forward_wait + backward_wait;
  }
}

// Tensor-parallel all-reduces per micro-batch on `width` ranks from `first`, at `scale`.
TensorParallel PlanEvaluator::tensor_parallel(int width, int first, double scale) const {
  TensorParallel tp;
  if (width <= 1) return tp;
  std::vector<int> tp_ranks(static_cast<std::size_t>(width));
  std::iota(tp_ranks.begin(), tp_ranks.end(), first);
  auto all_reduce = [&](double bytes) {
    return model_.collective_time(cluster_, CollectiveKind::AllReduce, tp_ranks, static_cast<std::int64_t>(bytes),
                                  Algorithm::Auto);
  };
  for (ir::NodeId row : structure_.row_ends)
    tp.layer += all_reduce(static_cast<double>(graph_.value(graph_.node(row).outputs[0]).type.bytes()) * scale) *
                (recompute_ ? 3 : 2);
  for (const auto& lookup : structure_.pre_lookups) tp.pre += all_reduce(lookup.bytes * (lookup.batched ? scale : 1));
  for (const auto& lookup : structure_.post_lookups)
    tp.post += all_reduce(lookup.bytes * (lookup.batched ? scale : 1));
  return tp;
}

// A heterogeneous cluster: each stage runs on its own ranks' slowest type, its compute scaled
// by that type's time for a layer against the pace-setting type's (the op cost model on both,
// so a memory-bound op scales with bandwidth, a matmul with FLOP/s).
void PlanEvaluator::scale_stage_devices() {
  const auto& layers = structure_.layers;
  stage_device_.assign(static_cast<std::size_t>(p_), device_);
  stage_scale_.assign(static_cast<std::size_t>(p_), 1.0);
  if (cluster_.device_types().size() <= 1) return;
  const PartCost& reference = layers ? layer_ : post_cost_;
  const double reference_time = reference.forward + reference.backward;
  for (int s = 0; s < p_; ++s) {
    const DeviceType* slowest = &cluster_.slowest_device(plan_.stage_first_rank(s), plan_.stage_size(s), precision_);
    stage_device_[static_cast<std::size_t>(s)] = slowest;
    if (slowest == device_ || reference_time <= 0 || !plan_.stage_meshes.empty()) continue;
    std::set<ir::ValueId> seen;
    const PartCost here =
        layers ? cost_nodes(graph_, layers->nodes.front(), structure_.layer_split, structure_, model_, *slowest,
                            precision_, program(), batch_scale_, t_, &seen)
               : cost_nodes(graph_, structure_.post, structure_.outside_split, structure_, model_, *slowest,
                            precision_, program(), batch_scale_, t_, &seen);
    stage_scale_[static_cast<std::size_t>(s)] = (here.forward + here.backward) / reference_time;
  }
}

// The graph's parts priced (by the graph, or the searched layout's prices; the FLOP
// accounting stays the graph's), the stages' devices, and each stage's prices.
void PlanEvaluator::price_parts_and_stages() {
  const Parts plain_parts = price_parts(*device_, batch_scale_, t_);
  layer_ = plain_parts.layer, pre_cost_ = plain_parts.pre, post_cost_ = plain_parts.post;
  // (a searched layout comes with repeated layers only: the merge in price_parts never precedes it)
  if (layout_ != nullptr) {
    static_cast<PartLoad&>(layer_) = layout_->layer;
    static_cast<PartLoad&>(pre_cost_) = layout_->pre;
    static_cast<PartLoad&>(post_cost_) = layout_->post;
    checkpoint_outer_blocks(pre_cost_, plan_.recompute);
    checkpoint_outer_blocks(post_cost_, plan_.recompute);
    // The layout's own prices hold its sequence split's sends among its collectives (both
    // axes': tensor_parallel): the graph's ring estimate is not shown beside them.
    layer_.ring_seconds = pre_cost_.ring_seconds = post_cost_.ring_seconds = 0;
  }
  // The experts' dispatch over the data axis: no stage layout (its search has a data axis of
  // 1) prices it, so it is added to whichever prices the parts. (Without repeated layers the
  // whole graph is the post part: price_parts merged pre into it.)
  if (e_ > 1) {
    if (structure_.layers) {
      add_dispatch(layer_, structure_.layers->nodes.front(), batch_scale_, t_);
      add_dispatch(pre_cost_, structure_.pre, batch_scale_, t_);
    } else {
      add_dispatch(post_cost_, structure_.pre, batch_scale_, t_);
    }
    add_dispatch(post_cost_, structure_.post, batch_scale_, t_);
  }
  scale_stage_devices();
  // One rank's share of a layer's input (Megatron: scattered over the t ranks).
  boundary_bytes_ = layout_ != nullptr ? layout_->boundary_bytes : structure_.layer_input_bytes * batch_scale_ / t_;
  layer_compute_ = layer_.forward + layer_.backward + recomputed_forward(layer_, plan_.recompute);
  out_.layers = num_layers_;
  out_.tensor_parallel_pairs_per_layer = static_cast<int>(structure_.row_ends.size());
  out_.all_reduces_per_layer_per_micro_batch = t_ > 1 ? out_.tensor_parallel_pairs_per_layer * (recompute_ ? 3 : 2) : 0;
  out_.micro_batches = m_;
  const TensorParallel plain_tp = tensor_parallel(t_, 0, batch_scale_);
  layer_tp_ = plain_tp.layer, pre_tp_ = plain_tp.pre, post_tp_ = plain_tp.post;
  if (layout_ != nullptr) {
    // Recomputation runs the forward's collectives again: about half of forward + backward's.
    const double again = recompute_ ? 1.5 : 1.0;
    layer_tp_ = layout_->layer.collectives * again;
    pre_tp_ = layout_->pre.collectives;
    post_tp_ = layout_->post.collectives;
  }
  price_.assign(static_cast<std::size_t>(p_), StagePrice{});
  for (int s = 0; s < p_; ++s) {
    StagePrice& here = price_[static_cast<std::size_t>(s)];
    const std::vector<int> mesh = plan_.stage_mesh(s);
    here.data = mesh[0], here.tensor = mesh[1], here.first = plan_.stage_first_rank(s);
    if (plan_.stage_meshes.empty()) {
      here.layer = layer_, here.pre = pre_cost_, here.post = post_cost_, here.layer_compute = layer_compute_;
      here.tp = {layer_tp_, pre_tp_, post_tp_};
      here.boundary_bytes = boundary_bytes_;
      continue;
    }
    const double scale = static_cast<double>(plan_.micro_batch) / here.data / structure_.graph_batch;
    const Parts parts = price_parts(*stage_device_[static_cast<std::size_t>(s)], scale, here.tensor);
    here.layer = parts.layer, here.pre = parts.pre, here.post = parts.post;
    here.boundary_bytes = structure_.layer_input_bytes * scale / here.tensor;
    here.layer_compute = here.layer.forward + here.layer.backward + recomputed_forward(here.layer, plan_.recompute);
    here.tp = tensor_parallel(here.tensor, here.first, scale);
  }
}

// What balances the stages' layers (layer_balance.h): a layer's time, each stage's device
// scale and the first and last stages' extras; then the layers each device holds.
void PlanEvaluator::balance_stages() {
  out_.layer_time = layer_compute_ + layer_tp_;
  out_.stage_scale = stage_scale_;
  if (cluster_.device_types().size() > 1)
    for (const DeviceType* type : stage_device_) out_.stage_devices.push_back(type->name);
  out_.first_stage_extra = pre_cost_.forward + pre_cost_.backward + pre_tp_;
  out_.last_stage_extra = post_cost_.forward + post_cost_.backward + post_tp_;
  if (!plan_.stage_meshes.empty()) {
    // Stages of their own widths: stage s's layer against the first stage's, as a device
    // scale; the extras at their own stage's width.
    const StagePrice& first = price_.front();
    const StagePrice& last = price_.back();
    const double reference = first.layer_compute + first.tp.layer;
    out_.layer_time = reference;
    for (int s = 0; s < p_; ++s) {
      const StagePrice& here = price_[static_cast<std::size_t>(s)];
      out_.stage_scale[static_cast<std::size_t>(s)] =
          reference > 0 ? (here.layer_compute + here.tp.layer) / reference : 1.0;
    }
    out_.first_stage_extra = first.pre.forward + first.pre.backward + first.tp.pre;
    const double last_scale = out_.stage_scale.back() > 0 ? out_.stage_scale.back() : 1.0;
    out_.last_stage_extra = (last.post.forward + last.post.backward + last.tp.post) / last_scale;
  }
  // Layers per device: chunks s, s + p, ... of the plan's split (or a balanced one).
  std::vector<int> chunk_layers = plan_.layers_per_stage;
  if (chunk_layers.empty()) {
    chunk_layers = even_layers(num_layers_, p_ * v_);
  } else if (std::accumulate(chunk_layers.begin(), chunk_layers.end(), 0) != num_layers_) {
    throw ValidationError(fmt::format("evaluate: layers_per_stage sums to {} but the graph has {} layers",
                                      std::accumulate(chunk_layers.begin(), chunk_layers.end(), 0), num_layers_));
  }
  // ZB-V's chunks sit in a V: the last (the LM head's) on the first device, beside the first.
  v_shape_ = plan::v_shaped(plan_.schedule);
  last_device_ = v_shape_ ? 0 : p_ - 1;
  device_layers_ = layers_per_device(chunk_layers, p_, v_shape_);
  chunk_layers_ = std::move(chunk_layers);
}

// One transfer across a stage cut, each way (an activation forward, its gradient back): the
// slowest boundary's. The step waits for exposed_transfer_seconds() of them (pipeline_transfers.h).
// Stages of their own meshes: between equal meshes a rank sends its shard to the same
// coordinate (one rank's share: whole / (d t)); between different ones the value is gathered
// whole on the sending sub-mesh (an all-gather of its shards) and sent whole to every
// receiving rank, the sending ranks taking them in turn (the busiest sends
// ceil(receivers / senders)); its gradient the same way back. The slowest boundary paces.
double PlanEvaluator::boundary_transfer() const {
  double transfer = 0;
  if (p_ > 1 && plan_.stage_meshes.empty()) {
    std::vector<int> pair = {0, t_ * plan_.stage_data()};
    transfer = model_.collective_time(cluster_, CollectiveKind::SendRecv, pair,
                                      static_cast<std::int64_t>(boundary_bytes_), Algorithm::Auto);
  }
  for (int s = 0; s + 1 < p_ && !plan_.stage_meshes.empty(); ++s) {
    const StagePrice& a = price_[static_cast<std::size_t>(s)];
    const StagePrice& b = price_[static_cast<std::size_t>(s + 1)];
    const double whole = structure_.layer_input_bytes * static_cast<double>(plan_.micro_batch) / structure_.graph_batch;
    auto send = [&](int from, int to, double bytes) {
      const std::vector<int> pair = {from, to};
      return model_.collective_time(cluster_, CollectiveKind::SendRecv, pair, static_cast<std::int64_t>(bytes),
                                    Algorithm::Auto);
    };
    auto gather = [&](const StagePrice& x) {
      if (x.data * x.tensor == 1) return 0.0;
      std::vector<int> ranks(static_cast<std::size_t>(x.data * x.tensor));
      std::iota(ranks.begin(), ranks.end(), x.first);
      return model_.collective_time(cluster_, CollectiveKind::AllGather, ranks, static_cast<std::int64_t>(whole),
                                    Algorithm::Auto);
    };
    double boundary = 0;
    if (a.data == b.data && a.tensor == b.tensor) {
      boundary = 2.0 * send(a.first, b.first, whole / (a.data * a.tensor));
    } else {
      const int sa = a.data * a.tensor, sb = b.data * b.tensor;
      boundary = gather(a) + (sb + sa - 1) / sa * send(a.first, b.first, whole) +  // forward
                 gather(b) + (sa + sb - 1) / sb * send(b.first, a.first, whole);   // gradient
    }
    transfer = std::max(transfer, boundary / 2.0);
  }
  return transfer;
}

// Elements of the parameters the nodes before the layers and after them both read (a tied
// embedding), on one rank of `tensor`: held once where one rank runs both.
double PlanEvaluator::shared_pre_post_parameters(int tensor) const {
  double out = 0;
  for (ir::ValueId id : structure_.pre_and_post_params) {
    const double n = static_cast<double>(graph_.value(id).type.numel());
    out += structure_.sharded_params.contains(id) ? n / tensor : n;
  }
  return out;
}

// The bottleneck device: each device's compute, backward and parameters per micro-batch.
void PlanEvaluator::bottleneck() {
  const std::size_t p = static_cast<std::size_t>(p_);
  device_params_.assign(p, 0), device_expert_params_.assign(p, 0), device_backward_.assign(p, 0);
  device_tensor_sync_.assign(p, 0);  // searched layouts only
  device_compute_.assign(p, 0);      // per micro-batch
  for (int s = 0; s < p_; ++s) {
    const StagePrice& here = price_[static_cast<std::size_t>(s)];
    double layers_here = device_layers_[static_cast<std::size_t>(s)];
    double compute = layers_here * here.layer_compute;
    double backward = layers_here * here.layer.backward;
    double params = layers_here * here.layer.parameters;
    double expert_params = layers_here * here.layer.expert_parameters;
    if (s == 0)
      compute += here.pre.forward + here.pre.backward, backward += here.pre.backward, params += here.pre.parameters,
          expert_params += here.pre.expert_parameters;
    if (s == last_device_)
      compute += here.post.forward + here.post.backward, backward += here.post.backward,
          params += here.post.parameters, expert_params += here.post.expert_parameters;
    if (s == 0 && s == last_device_) params -= shared_pre_post_parameters(here.tensor);
    compute *= stage_scale_[static_cast<std::size_t>(s)];
    backward *= stage_scale_[static_cast<std::size_t>(s)];
    const double accumulate = accumulation_seconds(s, params);
    compute += accumulate, backward += accumulate;
    double tp = layers_here * here.tp.layer + (s == 0 ? here.tp.pre : 0.0) + (s == last_device_ ? here.tp.post : 0.0);
    const double ring = (layers_here * here.layer.ring_seconds + (s == 0 ? here.pre.ring_seconds : 0.0) +
                         (s == last_device_ ? here.post.ring_seconds : 0.0)) *
                        stage_scale_[static_cast<std::size_t>(s)];
    const double dispatch = layers_here * here.layer.dispatch_seconds + (s == 0 ? here.pre.dispatch_seconds : 0.0) +
                            (s == last_device_ ? here.post.dispatch_seconds : 0.0);
    out_.stage_times.push_back(compute + tp);
    device_compute_[static_cast<std::size_t>(s)] = compute;
    if (compute + tp > worst_compute_ + worst_tp_)
      worst_compute_ = compute, worst_tp_ = tp, worst_backward_ = backward, worst_ring_ = ring,
      worst_dispatch_ = dispatch;
    device_params_[static_cast<std::size_t>(s)] = params;
    device_expert_params_[static_cast<std::size_t>(s)] = expert_params;
    device_backward_[static_cast<std::size_t>(s)] = backward;
    if (layout_ != nullptr)
      device_tensor_sync_[static_cast<std::size_t>(s)] = layers_here * layout_->layer.gradient_sync +
                                                          (s == 0 ? layout_->pre.gradient_sync : 0.0) +
                                                          (s == last_device_ ? layout_->post.gradient_sync : 0.0);
  }
}

// A micro-batch's share of adding the stage's gradients into .grad. Each micro-batch's backward
// after the first adds what it made into the gradient the earlier ones left (autograd's
// AccumulateGrad: an add_ that reads both and writes one), unless the runtime writes it there
// itself: a pipelined plan's fused accumulation (runtime/fused_accumulation.py) does so for the
// products' and lookups' weights, except in a parameter's last backward of the step on a stage
// with data ranks (its bucket's hook counts that one: autograd adds it, once a step), and not at
// all where the plan turns it off or for ZeRO-3's gathered weights, which reach their shards
// through the gather's backward. At the stage device's memory bandwidth, at the analytic model's
// efficiency of a memory-bound kernel (the rate Cluster.detect's copy is written for). Not
// priced: the fused plans' few terms autograd still adds (biases, norms). Worked example (the
// 4-process GPT-2 of benchmarks/fidelity.py, "pipeline 2 x data 2" without the fusion, first
// stage): 2.66 M float32 gradients x 12 bytes, 4 micro-batches, 10.5 GB/s x 0.75: 3/4 x 31.9 MB /
// 7.9 GB/s = 3.0 ms a micro-batch; with it, 1/4 of one add: 1.0 ms.
double PlanEvaluator::accumulation_seconds(int s, double params) const {
  if (m_ <= 1) return 0.0;
  const StagePrice& here = price_[static_cast<std::size_t>(s)];
  const double md = static_cast<double>(m_);
  const bool shards = plan_.zero_stage >= 3 && here.data > 1;
  double adds = md - 1;  // a step's adds of the stage's gradients
  if (plan_.fused_accumulation && !shards) adds = here.data > 1 ? 1.0 : 0.0;
  const double elements = shards ? params / here.data : params;
  const double bytes = adds / md * 3.0 * elements * mem_.gradient_bytes;
  return bytes / (stage_device_[static_cast<std::size_t>(s)]->memory_bandwidth * AnalyticConstants{}.memory_efficiency);
}

// The step's compute, tensor-parallel time, pipeline transfers and bubble.
void PlanEvaluator::time_step() {
  transfer_ = boundary_transfer();
  bottleneck();
  const int p = p_, v = v_;
  t_mb_ = worst_compute_ + worst_tp_;
  const double md = static_cast<double>(m_);
  out_.compute = md * worst_compute_;
  out_.context_parallel = md * worst_ring_;
  out_.expert_parallel = md * worst_dispatch_;
  out_.tensor_parallel = md * worst_tp_;
  out_.pipeline_transfer = transfer_;
  out_.pipeline_p2p = exposed_transfer_seconds(plan_.schedule, p, static_cast<int>(m_), v, plan_.kfkb_k, transfer_,
                                                t_mb_);
  out_.pipeline_bubble = (p - 1) / static_cast<double>(v) * t_mb_;
  if (plan::splits_backward(plan_.schedule)) {
    // ZB-H1's bubble, (p - 1)(F + B - W) (Qi et al. 2024, and schedules.h): the weight
    // gradient W fills what 1F1B leaves idle. W is half the backward: a matmul's weight
    // product costs what its input product does, and the weights of norms and biases are a
    // rounding error beside them.
    // ZB-V's chunks are half a stage each: (p - 1)(F + B - W) / 2 (schedules.h's ZB-V reaches
    // it at p = 2, 4, 8 with m = p to 4p: its list schedule below 2p micro-batches, torch's
    // order from there).
    // Fewer micro-batches than stages leave no other micro-batch's work to fill with: the
    // first micro-batch's forwards and the last one's backwards run stage after stage, and
    // only a stage's own W waits beside the earlier stages' backwards: (p - 1)(F + B) (with
    // one micro-batch on 2 stages: F F B B, then W beside the first stage's B).
    const double weight = worst_backward_ / 2.0;
    if (m_ < p)
      out_.pipeline_bubble = (p - 1) * std::max(0.0, t_mb_ - weight);
    else
      out_.pipeline_bubble = (p - 1) * std::max(0.0, t_mb_ - 2.0 * weight) / (v_shape_ ? 2.0 : 1.0);
  }
  // Stages of unequal times idle for the others' fill and drain, not (p - 1) of the slowest's
  // (pipeline_transfers.h, uneven_bubble_scale): the formula above is the equal pipeline's.
  out_.pipeline_bubble *= uneven_bubble_scale(plan_.schedule, p, static_cast<int>(m_), v, plan_.kfkb_k,
                                              out_.stage_times, device_backward_);
  out_.bubble_fraction = out_.pipeline_bubble / (md * t_mb_);
  // Ranks that share a node's cores (Node::compute_alone > 1): while a pipeline's other stages
  // wait, a busy stage runs faster, but the node's ranks together never exceed their shared
  // rate. The compute and the bubble, priced at the shared rate, become the larger of the
  // same path at the alone rate and the node's busiest pool: its ranks' compute over the step
  // divided by how many ranks it holds.
  std::vector<std::pair<int, int>> stage_ranks;
  for (const StagePrice& here : price_) stage_ranks.emplace_back(here.first, here.data * here.tensor);
  const double factor =
      shared_compute_factor(cluster_, stage_ranks, device_compute_, md, out_.compute + out_.pipeline_bubble);
  out_.compute *= factor;
  out_.pipeline_bubble *= factor;
}

// Data parallelism's gradient synchronisation (exposed and total) and the optimizer step,
// each the slowest stage's.
void PlanEvaluator::data_parallel_and_optimizer() {
  const int p = p_, v = v_;
  const double md = static_cast<double>(m_);
  double dp_exposed = 0, dp_total = 0, optimizer = 0, broadcast = 0;
  const double interference = constants_.overlap_interference.value_or(overlap_interference(cluster_));
  for (int s = 0; s < p; ++s) {
    // Split over the data axis (plan.expert: the whole of it), a rank's experts are its own:
    // their gradients are reduced over no rank and their states sharded by no ZeRO.
    const double experts = device_expert_params_[static_cast<std::size_t>(s)];
    const double params = device_params_[static_cast<std::size_t>(s)] - (e_ > 1 ? experts : 0.0);
    const StagePrice& here = price_[static_cast<std::size_t>(s)];
    const int d = here.data;  // this stage's data width (stage_meshes: its own)
    std::vector<int> dp_ranks;
    for (int j = 0; j < d; ++j) dp_ranks.push_back(here.first + j * here.tensor);
    double sync = 0, exposed = 0;
    if (d > 1 && plan_.zero_stage < 3) {
      sync = model_.collective_time(cluster_, CollectiveKind::AllReduce, dp_ranks,
                                    static_cast<std::int64_t>(params * constants_.grad_reduce_bytes_per_param),
                                    Algorithm::Auto);
      // The runtime issues each gradient bucket from the hook of its last gradient
      // (runtime/buckets.py): beside the step's backward without a pipeline; in a pipeline,
      // beside the last backward of the rank's last virtual stage reading it, and the cooldown
      // after it: pipeline rank s's last chunk ends while ranks s-1 .. 0 still run theirs
      // (and pass the gradient down), so its window is its own last chunk's backward plus
      // theirs. Rank 0, which runs the step's last backward, has its last chunk alone.
      double window = device_backward_[static_cast<std::size_t>(s)];
      if (p > 1) {
        window /= v;
        for (int r = 0; r < s; ++r) window += device_backward_[static_cast<std::size_t>(r)] / v + transfer_;
      }
      exposed = std::max(0.0, sync - window) + interference * std::min(sync, window);
    } else if (d > 1) {
      // ZeRO-3 gathers each parameter bucket and reduce-scatters its gradient as flat
      // collectives over the whole data group, once per micro-batch, so they run at the
      // ring's bottleneck link (one NIC per GPU), not the hierarchical all-NIC rate.
      // Narayanan et al. 2021 Table 2 shows exactly that: ZeRO-3's 175B throughput falls
      // from 144 to 44 TFLOP/s as the per-GPU batch shrinks while this traffic stays.
      double gather = model_.collective_time(cluster_, CollectiveKind::AllGather, dp_ranks,
                                             static_cast<std::int64_t>(params * mem_.weight_bytes), Algorithm::Ring);
      const auto reduced = static_cast<std::int64_t>(params * constants_.grad_reduce_bytes_per_param);
      double scatter =
          model_.collective_time(cluster_, CollectiveKind::ReduceScatter, dp_ranks, reduced, Algorithm::Ring);
      // Each weight is gathered for the forward and again for the backward (and for a
      // recomputed forward), but an FP8 linear's, whose float8 W^T is saved, only for its forwards.
      double float8 = device_layers_[static_cast<std::size_t>(s)] * here.layer.float8_weight_elements;
      if (s == 0) float8 += here.pre.float8_weight_elements;
      if (s == last_device_) float8 += here.post.float8_weight_elements;
      const double saved_share = params > 0 ? std::min(1.0, float8 / params) : 0.0;
      double per_mb = gather * ((recompute_ ? 3 : 2) - saved_share) + scatter;
      sync = md * per_mb;
      const double paced = t_mb_ + out_.pipeline_p2p / md;  // a micro-batch's share of the step
      exposed = md * (std::max(0.0, per_mb - paced) + interference * std::min(per_mb, paced));
    }
    // A searched layout that splits the batch over the t ranks reduces those gradients too,
    // once per step after the last micro-batch: exposed.
    sync += device_tensor_sync_[static_cast<std::size_t>(s)];
    exposed += device_tensor_sync_[static_cast<std::size_t>(s)];
    dp_total = std::max(dp_total, sync);
    dp_exposed = std::max(dp_exposed, exposed);
    double held = params / (plan_.zero_stage >= 1 ? d : 1) + (e_ > 1 ? experts / e_ : 0.0);  // (this stage's d)
    optimizer = std::max(optimizer, optimizer_step_seconds(model_, held, mem_.bytes_per_parameter(),
                                                           stage_device_[static_cast<std::size_t>(s)]->memory_bandwidth,
                                                           constants_.optimizer_memory_efficiency));
    // ZeRO 1-2: each owner broadcasts the parameters it stepped (one flat broadcast per owner,
    // runtime/optim.py): the stage's whole weights cross its data group once, exposed.
    if (d > 1 && (plan_.zero_stage == 1 || plan_.zero_stage == 2))
      broadcast = std::max(broadcast, model_.collective_time(cluster_, CollectiveKind::Broadcast, dp_ranks,
                                                             static_cast<std::int64_t>(params * mem_.weight_bytes),
                                                             Algorithm::Auto));
  }
  out_.data_parallel = dp_exposed;
  out_.data_parallel_total = dp_total;
  out_.data_parallel_overlapped =
      std::any_of(price_.begin(), price_.end(), [](const StagePrice& here) { return here.data > 1; });
  out_.optimizer = optimizer;
  out_.zero_broadcast = broadcast;
  out_.shared_weight_sync = shared_weight_sync();
  out_.step_time = out_.compute + out_.tensor_parallel + out_.pipeline_p2p + out_.pipeline_bubble +
                   out_.data_parallel + out_.optimizer + out_.zero_broadcast + out_.shared_weight_sync;
}

// The tied weights' gradients summed among the first and the last pipeline rank after the
// step (plan_cost.h): one all-reduce a weight, the groups of every sub-mesh coordinate at once.
// Nothing where one rank runs both ends (one stage; ZB-V's V puts the last chunk on rank 0).
double PlanEvaluator::shared_weight_sync() const {
  if (last_device_ == 0) return 0;
  const StagePrice& first = price_.front();
  const StagePrice& last = price_[static_cast<std::size_t>(last_device_)];
  const bool one_layout = first.data == last.data && first.tensor == last.tensor;
  std::vector<int> ranks = {first.first, last.first};
  if (!one_layout) {
    ranks.clear();
    for (const StagePrice* here : {&first, &last})
      for (int r = here->first; r < here->first + here->data * here->tensor; ++r) ranks.push_back(r);
  }
  double seconds = 0;
  for (ir::ValueId id : structure_.pre_and_post_params) {
    double n = static_cast<double>(graph_.value(id).type.numel());
    if (one_layout && structure_.sharded_params.contains(id)) n /= first.tensor;
    seconds += model_.collective_time(cluster_, CollectiveKind::AllReduce, ranks,
                                      static_cast<std::int64_t>(n * constants_.grad_reduce_bytes_per_param),
                                      Algorithm::Auto);
  }
  return seconds;
}

// Rank s's saved tensors and held gradients at their peak under a split backward: each
// chunk g it runs keeps its layers' (and the embedding's, the head's) saved bytes from F to W
// and their weight-reading outputs' gradients from B to W.
double PlanEvaluator::split_backward_bytes(const schedule::LivenessMoments& liveness, int s) const {
  const StagePrice& here = price_[static_cast<std::size_t>(s)];
  const int chunks = p_ * v_;
  std::vector<double> saved(static_cast<std::size_t>(chunks), 0.0), held(static_cast<std::size_t>(chunks), 0.0);
  for (int g = 0; g < chunks; ++g) {
    const double layers = chunk_layers_[static_cast<std::size_t>(g)];
    auto& kept = saved[static_cast<std::size_t>(g)];
    auto& gradients = held[static_cast<std::size_t>(g)];
    kept = layers * here.layer.activation_bytes;
    gradients = layers * here.layer.weight_gradient_bytes;
    if (g == 0) kept += here.pre.activation_bytes, gradients += here.pre.weight_gradient_bytes;
    if (g == chunks - 1) kept += here.post.activation_bytes, gradients += here.post.weight_gradient_bytes;
  }
  return schedule::peak_bytes_held(liveness, saved, held);
}

// Rank s's saved activations when its backward runs whole: `in_flight` micro-batches on the
// first stage, fewer the later it is (1F1B: p - s), as many on every stage under GPipe.
double PlanEvaluator::in_flight_bytes(int s, double in_flight) const {
  const StagePrice& here = price_[static_cast<std::size_t>(s)];
  const double flight = std::max(1.0, in_flight - (plan_.schedule == plan::Schedule::GPipe ? 0.0 : s));
  const double kept_bytes =
      here.boundary_bytes + (plan_.recompute == plan::Recompute::Selective ? here.layer.selective_kept_bytes : 0.0);
  double acts = stage_activation_bytes(here.layer.activation_bytes, kept_bytes,
                                       device_layers_[static_cast<std::size_t>(s)], flight, recompute_);
  // The nodes before the first layer and after the last (embedding, head and loss) keep
  // theirs for every micro-batch their stage holds (repeated blocks among them: their
  // checkpoints, checkpoint_outer_blocks); a block recomputed in the backward holds its saved
  // bytes meanwhile, as a layer does (one recomputation at a time: the larger of the two).
  const double layer_transient = recompute_ && device_layers_[static_cast<std::size_t>(s)] > 0
                                     ? here.layer.activation_bytes : 0.0;
  double block_transient = 0;
  if (s == 0) acts += flight * here.pre.activation_bytes, block_transient = here.pre.blocks.largest_block_bytes;
  if (s == last_device_)
    acts += flight * here.post.activation_bytes,
        block_transient = std::max(block_transient, here.post.blocks.largest_block_bytes);
  if (recompute_) acts += std::max(0.0, block_transient - layer_transient);
  return acts;
}

// What a recomputing stage rebuilds at once for a backward (part of in_flight_bytes): a layer's
// saved set, or a larger checkpointed block among its embedding's and head's.
double PlanEvaluator::rebuilt_bytes(int s) const {
  if (!recompute_) return 0;
  const StagePrice& here = price_[static_cast<std::size_t>(s)];
  double most = device_layers_[static_cast<std::size_t>(s)] > 0 ? here.layer.activation_bytes : 0.0;
  if (s == 0) most = std::max(most, here.pre.blocks.largest_block_bytes);
  if (s == last_device_) most = std::max(most, here.post.blocks.largest_block_bytes);
  return most;
}

// The transients of stage s, each at its own moment, so the larger counts: the backward's
// gradients in flight (the most of the stage's parts), a recomputed layer rebuilt with its own,
// an fp8 plan's forward casts. At a stage's first backward no parameter has a gradient yet
// (zero_grad leaves none), so a one-micro-batch step holds only what exceeds the parameters'
// gradients; from the second micro-batch on every gradient exists, and a 1F1B-like stage runs
// each later backward with as many micro-batches in flight as its first, so what is in flight
// comes on top of them (GPipe's first backward holds all m micro-batches and no gradient: the
// one-micro-batch rule). The loss' working set comes before any layer of its stage is rebuilt.
StageTransient PlanEvaluator::stage_transient(int s, double gradients) const {
  const StagePrice& here = price_[static_cast<std::size_t>(s)];
  const bool layers = device_layers_[static_cast<std::size_t>(s)] > 0;
  auto most = [&](double PartCost::*field) {
    double bytes = layers ? here.layer.*field : 0.0;
    if (s == 0) bytes = std::max(bytes, here.pre.*field);
    if (s == last_device_) bytes = std::max(bytes, here.post.*field);
    return bytes;
  };
  const bool gradients_held = m_ > 1 && plan_.schedule != plan::Schedule::GPipe;
  auto beyond = [&](double in_flight) { return gradients_held ? in_flight : std::max(0.0, in_flight - gradients); };
  const double working = beyond(most(&PartCost::backward_working_bytes));
  const double casts = most(&PartCost::fp8_cast_bytes);
  const double rebuilt = rebuilt_bytes(s);
  const double rebuild = rebuilt > 0 ? rebuilt + beyond(layers ? here.layer.backward_working_bytes : 0.0) : 0.0;
  StageTransient out;
  out.casts = casts > 0;
  if (rebuild > std::max(working, casts)) {
    out.bytes = rebuild, out.activations = rebuilt, out.backward_working = rebuild - rebuilt;
  } else {
    out.bytes = std::max(working, casts), out.backward_working = working, out.fp8_casts = std::max(0.0, casts - working);
  }
  return out;
}

// Memory per rank: the most loaded pipeline stage's.
void PlanEvaluator::memory() {
  const int p = p_;
  double in_flight = stage_micro_batches_in_flight(plan_.schedule, p, v_, plan_.kfkb_k, m_);
  std::shared_ptr<const std::vector<schedule::LivenessMoments>> split;
  if (plan::splits_backward(plan_.schedule) && p > 1) split = cached_liveness_moments(plan_);
  for (int s = 0; s < p; ++s) {
    const StagePrice& here = price_[static_cast<std::size_t>(s)];
    const double experts = e_ > 1 ? device_expert_params_[static_cast<std::size_t>(s)] : 0.0;
    ModelStateBytes states =
        model_state_bytes(device_params_[static_cast<std::size_t>(s)] - experts, here.data, plan_.zero_stage, mem_);
    if (experts > 0) {
      const ModelStateBytes own = model_state_bytes(experts / e_, 1, plan_.zero_stage, mem_);
      states.weights += own.weights, states.gradients += own.gradients, states.optimizer += own.optimizer;
    }
    // A split backward holds its saved tensors to W and, between B and W, the gradients B
    // left: priced by liveness over the rank's own list (it takes no recomputation: plan.h).
    // Otherwise what the micro-batches in flight keep; a recomputation's rebuilt set is a
    // transient (stage_transient).
    const double acts = split != nullptr ? split_backward_bytes((*split)[static_cast<std::size_t>(s)], s)
                                         : in_flight_bytes(s, in_flight) - rebuilt_bytes(s);
    const StageTransient transient = stage_transient(s, states.gradients);
    const double total = states.total() + acts + transient.bytes;
    out_.memory_use = std::max(
        out_.memory_use, total / static_cast<double>(stage_device_[static_cast<std::size_t>(s)]->memory_bytes));
    if (total > out_.memory_per_rank) {
      out_.memory_per_rank = total;
      out_.memory_breakdown = {{"weights", states.weights},
                               {"gradients", states.gradients},
                               {"optimizer", states.optimizer},
                               {"activations", acts + transient.activations},
                               {"backward_working", transient.backward_working},
                               {"stage", static_cast<double>(s)}};
      if (transient.casts) out_.memory_breakdown["fp8_casts"] = transient.fp8_casts;
    }
  }
}

// FLOP accounting: model FLOPs, and Megatron-LM's (plan_cost.h); the cost is complete.
PlanCost PlanEvaluator::flops() {
  const auto& layers = structure_.layers;
  const int num_layers = num_layers_;
  const double rest = pre_cost_.matmul_flops + post_cost_.matmul_flops;
  const double forward = layers ? num_layers * layer_.matmul_flops + rest : post_cost_.matmul_flops;
  const double megatron =
      layers ? 4.0 * num_layers * layer_.matmul_flops + 3.0 * rest : 3.0 * post_cost_.matmul_flops;
  const double samples = static_cast<double>(plan_.global_batch) / structure_.graph_batch;
  out_.model_flops = 3.0 * forward * samples;
  out_.megatron_flops = megatron * samples;
  const double per_device_second = out_.step_time > 0 ? 1.0 / out_.step_time / cluster_.world_size() / 1e12 : 0;
  out_.tflops_per_device = out_.model_flops * per_device_second;
  out_.megatron_tflops_per_device = out_.megatron_flops * per_device_second;
  out_.ranks_per_node = cluster_.ranks_per_node();
  return std::move(out_);
}

}  // namespace

PlanCost evaluate(const LayerStructure& structure, const ir::Graph& graph, const Cluster& cluster,
                  const plan::Plan& plan, const CostModel& model, const PlanCostConstants& constants,
                  const StageLayoutPrices* layout) {
  plan::validate(plan, cluster.world_size());
  if (!plan.split_experts && std::ranges::any_of(structure.row_ends, [&](ir::NodeId id) {
        return ops::is_experts(graph.node(id));
      }))
    return evaluate(with_whole_experts(structure, graph), graph, cluster, plan, model, constants, layout);
  PlanEvaluator evaluation(structure, graph, cluster, plan, model, constants, layout);
  evaluation.price_parts_and_stages();
  evaluation.balance_stages();
  evaluation.time_step();
  evaluation.data_parallel_and_optimizer();
  evaluation.memory();
  return evaluation.flops();
}

plan::Plan with_prediction(plan::Plan plan, const PlanCost& cost) {
  plan::Predicted predicted;
  predicted.step_time = cost.step_time;
  predicted.tflops_per_device = cost.tflops_per_device;
  predicted.megatron_tflops_per_device = cost.megatron_tflops_per_device;
  predicted.memory_per_rank = cost.memory_per_rank;
  predicted.breakdown = cost.breakdown();
  predicted.memory_breakdown = cost.memory_breakdown;
  predicted.ranks_per_node = cost.ranks_per_node;
  predicted.stage_devices = cost.stage_devices;
  // Every pipeline's stages (a homogeneous one's too: its first and last stages hold the
  // embedding, head and loss), what Plan.simulation() scales each stage by.
  if (!cost.stage_devices.empty() || cost.stage_times.size() > 1) predicted.stage_times = cost.stage_times;
  plan.predicted = std::move(predicted);
  return plan;
}

}  // namespace shardwise::cost
