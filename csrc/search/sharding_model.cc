#include "search/sharding_model.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>
#include <tuple>
#include <utility>

#include "analysis/batch_dim.h"
#include "analysis/flops.h"
#include "analysis/fp8_linears.h"
#include "analysis/repeated_blocks.h"
#include "analysis/saved_for_backward.h"
#include "analysis/selective_recompute.h"
#include "cost/collective_cost.h"
#include "ir/fingerprint.h"
#include "ops/distributed_kernels.h"
#include "ops/node_rule.h"
#include "ops/op_table.h"
#include "search/parameter_collectives.h"
#include "search/resharding.h"
#include "support/error.h"

namespace shardwise::search {

namespace {

using support::ValidationError;

bool scales_with_batch(const ir::Value& value) {
  return value.role == ir::ValueRole::Activation || value.role == ir::ValueRole::Input;
}

bool is_leaf(const ir::Value& value) { return !value.producer.has_value(); }

// Scales every index that some operand carries as the major factor of its batch dim.
void scale_batch_indices(ops::DimRule& rule, const ir::Graph& graph, const ir::Node& node, double scale) {
  if (scale == 1.0) return;
  std::set<int> batch;
  auto visit = [&](const ops::OperandDims& dims, ir::ValueId id) {
    const ir::TensorType& type = graph.value(id).type;
    if (!type.batch_dim.has_value()) return;
    auto d = static_cast<std::size_t>(*type.batch_dim);
    if (d < dims.size() && !dims[d].empty()) batch.insert(dims[d].front());
  };
  for (std::size_t i = 0; i < rule.inputs.size() && i < node.inputs.size(); ++i) visit(rule.inputs[i], node.inputs[i]);
  for (std::size_t o = 0; o < rule.outputs.size() && o < node.outputs.size(); ++o)
    visit(rule.outputs[o], node.outputs[o]);
  for (int index : batch) {
    auto& size = rule.indices[static_cast<std::size_t>(index)].size;
    size = std::max<std::int64_t>(1, std::llround(static_cast<double>(size) * scale));
  }
}

// The node's rule at the global batch: its operands' batch dims scaled, the rule built anew
// (so a graph captured at batch 1, whose batch dims are unit dims tied to no index, still
// gets a batch index to split). Falls back to scaling the rule's batch indices when the
// template cannot rebuild it from the scaled shapes (an attribute pins the old size).
std::optional<ops::DimRule> rule_at_batch(const ops::OpTable& table, const ir::Graph& graph, const ir::Node& node,
                                          double scale) {
  std::optional<ops::DimRule> rule = ops::dim_rule_for(table, graph, node);
  if (!rule || scale == 1.0) return rule;
  const ops::OpSpec* spec = table.find(node.op);
  std::vector<ir::TensorType> inputs, outputs;
  auto scaled = [&](ir::ValueId id) {
    ir::TensorType type = graph.value(id).type;
    if (type.batch_dim) {
      auto& size = type.shape[static_cast<std::size_t>(*type.batch_dim)];
      size = std::llround(static_cast<double>(size) * scale);
    }
    return type;
  };
  for (ir::ValueId in : node.inputs) inputs.push_back(scaled(in));
  for (ir::ValueId out : node.outputs) outputs.push_back(scaled(out));
  ops::RuleOperands operands;
  for (const auto& t : inputs) operands.inputs.push_back(&t);
  for (const auto& t : outputs) operands.outputs.push_back(&t);
  operands.outputs_known = true;
  operands.output_count = static_cast<int>(outputs.size());
  operands.attrs = &node.attrs;
  try {
    auto rebuilt = ops::instantiate_rule(*spec, operands, ops::describe_node(graph, node));
    if (rebuilt && rebuilt->inputs.size() == rule->inputs.size() && rebuilt->outputs.size() == rule->outputs.size())
      return rebuilt;
  } catch (const support::Error&) {
  }
  scale_batch_indices(*rule, graph, node, scale);
  return rule;
}

double divisor(const Placement& placement, int axis_size) { return 1.0 / held_fraction(placement, axis_size); }

// A spec over `axes` mesh axes with `at_axis` on `axis` and `other(b)` on every other axis b:
// one axis's candidate beside what the other axes have chosen.
template <typename Other>
ShardingSpec one_axis_varied(std::size_t axes, int axis, const Placement& at_axis, Other other) {
  ShardingSpec spec;
  for (int b = 0; b < static_cast<int>(axes); ++b) spec.push_back(b == axis ? at_axis : other(b));
  return spec;
}

}  // namespace

ShardingModel::ShardingModel(const ir::Graph& graph, const cost::Cluster& cluster, const cost::CostModel& model,
                             ShardingModelOptions options)
    : graph_(graph), cluster_(cluster), model_(model), options_(std::move(options)) {
  const int axes = static_cast<int>(options_.mesh.size());
  int world = 1;
  for (int size : options_.mesh) world *= size;
  if (world != cluster_.world_size())
    throw ValidationError(fmt::format("spmd search: mesh of {} ranks on a cluster of {}", world, cluster_.world_size()));

  price_devices_and_batch();
  const analysis::SavedTensors saved = analysis::saved_tensors(graph_);
  derive_rules_and_gradient_flow(saved);
  fold_repeated_blocks(saved);
  collect_strided_sizes();
  group_edges();

  const auto num_values = graph_.values().size();
  node_choice_.assign(static_cast<std::size_t>(axes), {});
  leaf_choice_.assign(static_cast<std::size_t>(axes), std::vector<LeafChoice>(num_values));
  for (int a = 0; a < axes; ++a) {
    auto& choices = node_choice_[static_cast<std::size_t>(a)];
    for (const ir::Node& node : graph_.nodes()) choices.push_back(replicate_strategy(node.id));
  }
}

// The pace and the scale: the slowest device, the batch the capture traced against the plan's,
// each axis' balance of speeds, the memory constants and the FP8 linears of the precision.
void ShardingModel::price_devices_and_batch() {
  const int axes = static_cast<int>(options_.mesh.size());
  cluster_.require_precision(options_.precision, "spmd search");
  device_ = &cluster_.device_of(0);
  for (const cost::DeviceType& type : cluster_.device_types())
    if (type.peak_flops.at(options_.precision) < device_->peak_flops.at(options_.precision)) device_ = &type;
  const std::int64_t b0 = analysis::input_batch(graph_);
  // A batch dim of size 1 has no index in the rules (a unit dim is tied to none), so nothing
  // could split the batch: say so rather than return a plan that never shards it.
  if (b0 == 1 && options_.global_batch > 1 && options_.require_batch_index)
    throw ValidationError(fmt::format(
        "spmd search: the graph was captured at batch 1; capture it with a batch of at least 2 (the batch size "
        "does not matter otherwise: the search scales it to global_batch {})",
        options_.global_batch));
  batch_scale_ = b0 > 0 ? static_cast<double>(options_.global_batch) / static_cast<double>(b0) : 1.0;
  batch_traced_ = b0 > 1;
  // Peak rate at the plan's precision stands for a device's speed, as device_ does: every
  // group along an axis is alike in a cluster description (a run of devices per node), so
  // axis_ranks' first group stands for all.
  for (int b = 0; b < axes; ++b) {
    std::vector<double> speeds;
    for (int r : axis_ranks(b)) speeds.push_back(cluster_.device_of(r).peak_flops.at(options_.precision));
    const double sum = std::accumulate(speeds.begin(), speeds.end(), 0.0);
    const double slowest = *std::min_element(speeds.begin(), speeds.end());
    axis_balance_.push_back(sum > 0 ? static_cast<double>(speeds.size()) * slowest / sum : 1.0);
    if (axis_balance_.back() < 1.0)
      for (double& speed : speeds) speed /= sum;  // each rank's share of the axis' speed
    else
      speeds.clear();  // even
    axis_speed_shares_.push_back(std::move(speeds));
  }
  const cost::Precision states = cost::model_state_precision(options_.precision, graph_);
  memory_ = options_.memory.value_or(cost::memory_constants(states));
  float_bytes_ = states == cost::Precision::F32 || states == cost::Precision::TF32 ? 4 : 2;
  if (options_.precision == cost::Precision::FP8)
    for (const ir::Node& node : graph_.nodes()) fp8_linears_.push_back(analysis::fp8_linear(graph_, node));
}

// Per node its rule at the global batch; per value what autograd saves of it, how often it is
// read and whether a gradient flows into it.
void ShardingModel::derive_rules_and_gradient_flow(const analysis::SavedTensors& saved) {
  const auto num_nodes = graph_.nodes().size();
  const auto num_values = graph_.values().size();
  const ops::OpTable& table = ops::OpTable::builtin();

  // Rules at the global batch; a node whose rule cannot be built runs replicated.
  rules_.resize(num_nodes);
  saved_.assign(num_values, 0.0);
  for (const ir::Value& value : graph_.values()) {
    const std::int64_t bytes = value.type.bytes();
    const auto v = static_cast<std::size_t>(value.id);
    if (bytes > 0) saved_[v] = static_cast<double>(saved.bytes[v]) / static_cast<double>(bytes);
  }
  for (const ir::Node& node : graph_.nodes()) {
    try {
      rules_[static_cast<std::size_t>(node.id)] = rule_at_batch(table, graph_, node, batch_scale_);
    } catch (const support::ValidationError&) {
      rules_[static_cast<std::size_t>(node.id)] = std::nullopt;
    }
  }

  // Reads per value: a leaf read n times sums n partial gradients before one reduction.
  reads_.assign(num_values, 0.0);
  for (const ir::Node& node : graph_.nodes())
    for (ir::ValueId in : node.inputs) reads_[static_cast<std::size_t>(in)] += 1;

  // Gradients flow into floating parameters and everything computed from them.
  requires_grad_.assign(num_values, false);
  for (const ir::Value& value : graph_.values())
    if (value.role == ir::ValueRole::Parameter && ir::is_floating(value.type.dtype))
      requires_grad_[static_cast<std::size_t>(value.id)] = true;
  for (const ir::Node& node : graph_.nodes()) {
    bool any = false;
    for (ir::ValueId in : node.inputs) any = any || requires_grad_[static_cast<std::size_t>(in)];
    for (ir::ValueId out : node.outputs)
      requires_grad_[static_cast<std::size_t>(out)] = any && ir::is_floating(graph_.value(out).type.dtype);
  }
}

// The repeated blocks: which node of instance 0 stands for each node of the others, which
// nodes a recomputed block runs again, the parameter units and the checkpointed inputs.
void ShardingModel::fold_repeated_blocks(const analysis::SavedTensors& saved) {
  const auto num_nodes = graph_.nodes().size();
  const auto num_values = graph_.values().size();

  // Repeated blocks: the largest group; instance k's j-th node folds into instance 0's.
  rep_node_.resize(num_nodes);
  for (std::size_t i = 0; i < num_nodes; ++i) rep_node_[i] = static_cast<ir::NodeId>(i);
  instances_.assign(num_nodes, 1.0);
  in_block_.assign(num_nodes, false);
  runs_again_.assign(num_nodes, false);
  selective_kept_ = analysis::kept_by_selective_recompute(graph_);
  rep_leaf_.assign(num_values, -1);
  for (const ir::Value& value : graph_.values())
    if (is_leaf(value)) rep_leaf_[static_cast<std::size_t>(value.id)] = value.id;

  // The units of grouped parameter collectives, and the parameter elements each reads (per
  // rank class: parameter_latency_share's peers).
  units_ = parameter_units(graph_);
  {
    std::set<std::pair<int, ir::ValueId>> counted;
    for (const ir::Node& node : graph_.nodes())
      for (ir::ValueId in : node.inputs) {
        const int unit = units_[static_cast<std::size_t>(node.id)];
        const ir::Value& v = graph_.value(in);
        if (v.role != ir::ValueRole::Parameter || !counted.emplace(unit, in).second) continue;
        unit_elements_[{unit, v.type.shape.size() >= 2}] += static_cast<double>(v.type.numel());
      }
  }
  std::vector<analysis::RepeatedBlockGroup> groups = analysis::find_repeated_blocks(graph_);
  const analysis::RepeatedBlockGroup* layers = analysis::largest_group(groups);
  if (layers != nullptr) {
    const auto& first = layers->nodes.front();
    for (const auto& block : layers->nodes) {
      for (ir::NodeId id : block) in_block_[static_cast<std::size_t>(id)] = true;
      // A block's recomputed forward ends at its last node that saves for backward
      // (torch.utils.checkpoint's early stop): program order is node order.
      std::vector<ir::NodeId> order(block.begin(), block.end());
      std::ranges::sort(order);
      bool later = false;
      for (auto it = order.rbegin(); it != order.rend(); ++it) {
        later = later || saved.saves_by_node[static_cast<std::size_t>(*it)];
        runs_again_[static_cast<std::size_t>(*it)] = later;
      }
    }
    for (std::size_t k = 1; k < layers->nodes.size(); ++k) {
      const auto& block = layers->nodes[k];
      if (block.size() != first.size()) continue;
      for (std::size_t j = 0; j < block.size(); ++j) {
        const ir::Node& node = graph_.node(block[j]);
        const ir::Node& rep = graph_.node(first[j]);
        if (node.op != rep.op || node.inputs.size() != rep.inputs.size() ||
            rules_[static_cast<std::size_t>(node.id)] != rules_[static_cast<std::size_t>(rep.id)])
          continue;
        rep_node_[static_cast<std::size_t>(node.id)] = rep.id;
        instances_[static_cast<std::size_t>(rep.id)] += 1;
      }
    }
    // A parameter or buffer read only at one position of one instance folds into the
    // value read at that position of instance 0.
    std::vector<std::vector<std::pair<ir::NodeId, int>>> readers(num_values);
    for (const ir::Node& node : graph_.nodes())
      for (std::size_t i = 0; i < node.inputs.size(); ++i)
        readers[static_cast<std::size_t>(node.inputs[i])].emplace_back(node.id, static_cast<int>(i));
    for (const ir::Value& value : graph_.values()) {
      if (!is_leaf(value) || value.role == ir::ValueRole::Input) continue;
      const auto& users = readers[static_cast<std::size_t>(value.id)];
      if (users.empty()) continue;
      std::optional<ir::ValueId> target;
      bool ok = true;
      for (const auto& [user, pos] : users) {
        ir::NodeId rep = rep_node_[static_cast<std::size_t>(user)];
        if (rep == user) {
          ok = false;
          break;
        }
        ir::ValueId candidate = graph_.node(rep).inputs[static_cast<std::size_t>(pos)];
        if (target && *target != candidate) ok = false;
        target = candidate;
      }
      if (!ok || !target) continue;
      const ir::Value& rep_value = graph_.value(*target);
      if (!is_leaf(rep_value) || rep_value.type.shape != value.type.shape || rep_value.role != value.role) continue;
      rep_leaf_[static_cast<std::size_t>(value.id)] = *target;
    }
    // Checkpoints when recomputing: the largest activation each block reads from outside.
    for (const auto& block : layers->nodes) {
      std::set<ir::NodeId> inside(block.begin(), block.end());
      ir::ValueId largest = -1;
      for (ir::NodeId id : block)
        for (ir::ValueId in : graph_.node(id).inputs) {
          const ir::Value& v = graph_.value(in);
          if (!v.producer || inside.contains(*v.producer)) continue;
          if (largest < 0 || v.type.numel() > graph_.value(largest).type.numel()) largest = in;
        }
      if (largest >= 0) block_inputs_.push_back(largest);
    }
  }
}

void ShardingModel::collect_strided_sizes() {
  // Strided variants: a tensor of size P x c that an equal P-way split or concatenation
  // (a Whole major factor) cuts apart.
  std::set<std::pair<std::int64_t, std::int64_t>> strided;
  for (const auto& rule : rules_) {
    if (!rule) continue;
    auto visit = [&](const ops::OperandDims& operand) {
      for (const auto& dim : operand) {
        if (dim.size() < 2) continue;
        const ops::Index& major = rule->indices[static_cast<std::size_t>(dim.front())];
        if (major.kind == ops::IndexKind::Whole && major.statistics == 0 && major.size >= 2)
          strided.emplace(rule->dims_size(dim), major.size);
      }
    };
    for (const auto& operand : rule->inputs) visit(operand);
    for (const auto& operand : rule->outputs) visit(operand);
  }
  strided_.strided.assign(strided.begin(), strided.end());
}

void ShardingModel::group_edges() {
  // Producer -> reader edges, grouped by their representatives.
  for (const ir::Node& node : graph_.nodes()) {
    for (std::size_t i = 0; i < node.inputs.size(); ++i) {
      const ir::Value& value = graph_.value(node.inputs[i]);
      EdgeKey key{};
      if (is_leaf(value)) {
        key.producer = rep_leaf_[static_cast<std::size_t>(value.id)];
        key.producer_is_leaf = true;
      } else {
        key.producer = rep_node_[static_cast<std::size_t>(*value.producer)];
        key.producer_is_leaf = false;
      }
      key.consumer = rep_node_[static_cast<std::size_t>(node.id)];
      key.operand = static_cast<int>(i);
      EdgeGroup& group = edges_[key];
      if (group.value < 0) group.value = value.id;
      group.count += 1;
    }
  }
}

std::vector<int> ShardingModel::axis_ranks(int axis) const {
  const auto& mesh = options_.mesh;
  int stride = 1;
  for (std::size_t b = static_cast<std::size_t>(axis) + 1; b < mesh.size(); ++b) stride *= mesh[b];
  std::vector<int> ranks;
  for (int k = 0; k < mesh[static_cast<std::size_t>(axis)]; ++k) ranks.push_back(k * stride);
  return ranks;
}

Strategy ShardingModel::replicate_strategy(ir::NodeId node) const {
  const ir::Node& n = graph_.node(node);
  Strategy s;
  s.inputs.assign(n.inputs.size(), Placement::replicate());
  s.input_grads.assign(n.inputs.size(), Placement::replicate());
  s.outputs.assign(n.outputs.size(), Placement::replicate());
  return s;
}

Placement ShardingModel::value_placement(int axis, ir::ValueId value) const {
  const ir::Value& v = graph_.value(value);
  const auto a = static_cast<std::size_t>(axis);
  if (is_leaf(v)) return leaf_choice_[a][static_cast<std::size_t>(value)].placement;
  return node_choice_[a][static_cast<std::size_t>(*v.producer)].outputs[static_cast<std::size_t>(v.output_index)];
}

double ShardingModel::held_except(ir::ValueId value, int axis, int first_axis) const {
  double held = 1;
  for (int b = std::max(0, first_axis); b < static_cast<int>(options_.mesh.size()); ++b)
    if (b != axis) held *= held_fraction(value_placement(b, value), options_.mesh[static_cast<std::size_t>(b)]);
  return held;
}

double ShardingModel::held_all(ir::ValueId value) const { return held_except(value, -1); }

double ShardingModel::held_fraction_of(ir::ValueId value, int first_axis) const {
  return held_except(value, -1, first_axis);
}

double ShardingModel::value_bytes(ir::ValueId value) const {
  const ir::Value& v = graph_.value(value);
  double element = ir::is_floating(v.type.dtype) ? float_bytes_ : ir::dtype_bytes(v.type.dtype);
  double bytes = static_cast<double>(v.type.numel()) * element;
  // An activation without a batch dim (a position embedding's [1, s, h] rows, a causal mask,
  // a rotary table) is the same size at every batch; where the capture's batch of 1 left the
  // batch dims untraced (batch_dim.h ties no index to a unit dim), every activation scales.
  if (!scales_with_batch(v) || (batch_traced_ && !v.type.batch_dim)) return bytes;
  return bytes * batch_scale_;
}

ops::DimRule ShardingModel::rule_except(ir::NodeId node, int axis, bool outer_only) const {
  ops::DimRule rule = *rules_[static_cast<std::size_t>(node)];
  const int axes = outer_only ? axis : static_cast<int>(options_.mesh.size());
  for (int b = 0; b < axes; ++b) {
    if (b == axis) continue;
    rule = local_rule(rule, node_choice_[static_cast<std::size_t>(b)][static_cast<std::size_t>(node)],
                      options_.mesh[static_cast<std::size_t>(b)]);
  }
  return rule;
}

std::vector<Strategy> ShardingModel::node_strategies(ir::NodeId node, int axis) const {
  if (!rules_[static_cast<std::size_t>(node)]) return {replicate_strategy(node)};
  const ops::DimRule layout = rule_except(node, axis, /*outer_only=*/true);
  auto strategies =
      enumerate_strategies(rule_except(node, axis), options_.mesh[static_cast<std::size_t>(axis)], strided_, &layout);
  // A rule with fewer operands than the node (optional operands the rule leaves out) cannot
  // place the rest: such a node runs replicated.
  const ir::Node& n = graph_.node(node);
  for (const auto& s : strategies)
    if (s.inputs.size() != n.inputs.size() || s.outputs.size() != n.outputs.size()) return {replicate_strategy(node)};
  // The batch's uneven shares are the balance LP's alone (hetero_balance.h; the rewrite reads
  // an uneven batch as those shares): a batch that does not divide is not split.
  auto uneven_batch = [&](const std::vector<Placement>& placements, const std::vector<ir::ValueId>& values) {
    for (std::size_t i = 0; i < placements.size(); ++i) {
      const auto& batch_dim = graph_.value(values[i]).type.batch_dim;
      if (!placements[i].ratios.empty() && batch_dim && placements[i].dim == *batch_dim) return true;
    }
    return false;
  };
  std::erase_if(strategies, [&](const Strategy& s) {
    return uneven_batch(s.inputs, n.inputs) || uneven_batch(s.outputs, n.outputs);
  });
  // An axis that may not split the batch (ShardingModelOptions::batch_axes): no strategy splits
  // the rule's batch index, the major factor of an operand's batch dim. (A split inside each
  // row of a [b * s] dim, strided over the rows, splits the sequence: it stays.)
  if (!options_.batch_axes.empty() && !options_.batch_axes.at(static_cast<std::size_t>(axis))) {
    const ops::DimRule& full = *rules_[static_cast<std::size_t>(node)];
    std::set<int> batch_indices;
    auto collect = [&](const std::vector<ops::OperandDims>& operands, const std::vector<ir::ValueId>& values) {
      for (std::size_t i = 0; i < operands.size() && i < values.size(); ++i) {
        const auto& batch_dim = graph_.value(values[i]).type.batch_dim;
        if (batch_dim && static_cast<std::size_t>(*batch_dim) < operands[i].size() &&
            !operands[i][static_cast<std::size_t>(*batch_dim)].empty())
          batch_indices.insert(operands[i][static_cast<std::size_t>(*batch_dim)].front());
      }
    };
    collect(full.inputs, n.inputs);
    collect(full.outputs, n.outputs);
    std::erase_if(strategies, [&](const Strategy& s) { return !s.partial && batch_indices.contains(s.index); });
  }
  // A split the runtime has no distributed kernel for would run whole on gathered operands,
  // not as priced (compute / n and the statistics' all-reduce): not offered
  // (ops/distributed_kernels.h).
  const ops::DimRule& rule = *rules_[static_cast<std::size_t>(node)];
  std::erase_if(strategies, [&](const Strategy& s) {
    if (s.partial || s.index < 0) return false;
    const ops::Index& index = rule.indices.at(static_cast<std::size_t>(s.index));
    if (index.kind != ops::IndexKind::Whole) return false;
    if (index.lookup) return !ops::lookup_kernel_ops().contains(n.op);
    if (index.statistics == 0) return false;
    const auto kernel = ops::statistics_kernel(n);
    // The vocabulary kernels take this rank's classes as one block (transform/spmd_rewrite.cc).
    return !kernel || (s.groups != 1 && kernel->starts_with("shardwise::vocab_"));
  });
  // A linear op on floating values may carry partial sums through (strategy.h).
  const ops::OpSpec* spec = ops::OpTable::builtin().find(n.op);
  bool floating = spec != nullptr && spec->linear && !n.inputs.empty();
  for (ir::ValueId v : n.inputs) floating = floating && ir::is_floating(graph_.value(v).type.dtype);
  for (ir::ValueId v : n.outputs) floating = floating && ir::is_floating(graph_.value(v).type.dtype);
  if (floating) strategies.push_back(partial_strategy(*rules_[static_cast<std::size_t>(node)]));
  return strategies;
}

double ShardingModel::node_compute(ir::NodeId node, int axis, const Strategy& choice,
                                   const cost::DeviceType& device) const {
  const cost::OpTime time = node_time(node, axis, choice, device);
  return time.forward + time.backward;
}

cost::OpTime ShardingModel::node_time(ir::NodeId node, int axis, const Strategy& choice,
                                      const cost::DeviceType& device) const {
  cost::OpTime time = base_time(node, axis, choice, device);
  if (reruns_forward(static_cast<std::size_t>(node))) time.backward += time.forward;
  return time;
}

cost::OpTime ShardingModel::base_time(ir::NodeId node, int axis, const Strategy& choice,
                                      const cost::DeviceType& device) const {
  const ir::Node& n = graph_.node(node);
  cost::NodeContext context;
  context.batch_scale = batch_scale_;
  context.operand_shards.assign(n.inputs.size() + n.outputs.size(), 1.0);
  for (int b = 0; b < static_cast<int>(options_.mesh.size()); ++b) {
    const Strategy& s = b == axis ? choice : node_choice_[static_cast<std::size_t>(b)][static_cast<std::size_t>(node)];
    const int size = options_.mesh[static_cast<std::size_t>(b)];
    for (std::size_t i = 0; i < n.inputs.size(); ++i) context.operand_shards[i] *= divisor(s.inputs[i], size);
    for (std::size_t o = 0; o < n.outputs.size(); ++o)
      context.operand_shards[n.inputs.size() + o] *= divisor(s.outputs[o], size);
    if (s.index >= 0) context.work_shards *= size;
  }
  if (model_.wants_local_shapes()) context.local_shapes = local_shapes(node, axis, choice);
  return model_.node_time(graph_, n, device, options_.precision, context);
}

std::vector<std::vector<std::int64_t>> ShardingModel::local_shapes(ir::NodeId node, int axis,
                                                                   const Strategy& choice) const {
  const ir::Node& n = graph_.node(node);
  std::vector<std::vector<std::int64_t>> shapes = cost::batch_scaled_shapes(graph_, n, batch_scale_);
  // Each axis' shard of a dim: the largest block (held_fraction, rounded up: rank 0's of
  // an even split, as transform/local_shard.h gives it; the most loaded rank's of an uneven one).
  auto shard = [](std::vector<std::int64_t>& shape, const Placement& p, int size) {
    if (!p.is_shard() || p.dim < 0 || p.dim >= static_cast<int>(shape.size())) return;
    std::int64_t& length = shape[static_cast<std::size_t>(p.dim)];
    const double share = held_fraction(p, size) * static_cast<double>(length);
    length = std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(share - 1e-9)));
  };
  for (int b = 0; b < static_cast<int>(options_.mesh.size()); ++b) {
    const Strategy& s = b == axis ? choice : node_choice_[static_cast<std::size_t>(b)][static_cast<std::size_t>(node)];
    const int size = options_.mesh[static_cast<std::size_t>(b)];
    for (std::size_t i = 0; i < n.inputs.size(); ++i) shard(shapes[i], s.inputs[i], size);
    for (std::size_t o = 0; o < n.outputs.size(); ++o) shard(shapes[n.inputs.size() + o], s.outputs[o], size);
  }
  return shapes;
}

double ShardingModel::balanced_compute_factor(ir::NodeId node, int axis, const Strategy& choice) const {
  const ir::Node& n = graph_.node(node);
  double factor = 1;
  for (int b = 0; b < static_cast<int>(options_.mesh.size()); ++b) {
    if (axis_balance_[static_cast<std::size_t>(b)] >= 1.0) continue;
    const Strategy& s = b == axis ? choice : node_choice_[static_cast<std::size_t>(b)][static_cast<std::size_t>(node)];
    bool batch = false;
    for (std::size_t o = 0; o < n.outputs.size() && !batch; ++o) {
      const ir::TensorType& type = graph_.value(n.outputs[o]).type;
      batch = type.batch_dim && s.outputs[o].is_shard() && s.outputs[o].dim == *type.batch_dim;
    }
    if (batch) factor *= axis_balance_[static_cast<std::size_t>(b)];
  }
  return factor;
}

Placement ShardingModel::as_run(int axis, ir::ValueId value, const Placement& p) const {
  if (axis < 0 || !p.is_shard() || !p.ratios.empty() || p.groups > 1) return p;
  const auto& shares = axis_speed_shares_[static_cast<std::size_t>(axis)];
  const ir::TensorType& type = graph_.value(value).type;
  if (shares.empty() || !type.batch_dim || p.dim != *type.batch_dim) return p;
  Placement uneven = p;
  uneven.ratios = shares;
  return uneven;
}

double ShardingModel::node_memory(ir::NodeId node, int axis, const Strategy& choice) const {
  return output_memory(node, axis, choice, kept_whole(static_cast<std::size_t>(node)));
}

double ShardingModel::output_memory(ir::NodeId node, int axis, const Strategy& choice, bool whole) const {
  const ir::Node& n = graph_.node(node);
  double bytes = 0;
  for (std::size_t o = 0; o < n.outputs.size(); ++o) {
    const double saved = whole ? 1.0 : saved_[static_cast<std::size_t>(n.outputs[o])];
    if (saved <= 0) continue;
    double held = held_fraction(choice.outputs[o], options_.mesh[static_cast<std::size_t>(axis)]);
    bytes += saved * value_bytes(n.outputs[o]) * held_except(n.outputs[o], axis) * held;
  }
  return bytes * options_.activation_memory_scale;
}

std::pair<double, double> ShardingModel::leaf_held(ir::ValueId leaf, int axis, const LeafChoice& choice) const {
  double held = 1, state_held = 1;
  for (int b = 0; b < static_cast<int>(options_.mesh.size()); ++b) {
    const auto size = options_.mesh[static_cast<std::size_t>(b)];
    const LeafChoice& c = b == axis ? choice : leaf_choice_[static_cast<std::size_t>(b)][static_cast<std::size_t>(leaf)];
    const double h = held_fraction(c.placement, size);
    held *= h;
    state_held *= c.zero ? h / size : h;
  }
  return {held, state_held};
}

bool ShardingModel::leaf_placement_fits(ir::ValueId leaf, int axis, const Placement& want) const {
  if (!want.is_shard()) return true;
  const ir::TensorType& type = graph_.value(leaf).type;
  if (want.dim < 0 || static_cast<std::size_t>(want.dim) >= type.shape.size()) return false;
  // The axes cut the dim in mesh order, outermost first, each its block of what the outer
  // ones left (local_shard.h): every even cut must divide what it cuts. A batch dim is cut
  // at the global batch the search plans for, not at the batch the graph was captured at.
  std::int64_t length = type.shape[static_cast<std::size_t>(want.dim)];
  if (type.batch_dim == want.dim)
    length = std::max<std::int64_t>(1, std::llround(static_cast<double>(length) * batch_scale_));
  int cuts = 0;
  bool uneven = false;
  for (std::size_t b = 0; b < options_.mesh.size(); ++b) {
    const Placement& p = static_cast<int>(b) == axis ? want : leaf_choice_[b][static_cast<std::size_t>(leaf)].placement;
    if (!p.is_shard() || p.dim != want.dim) continue;
    ++cuts;
    if (!p.ratios.empty()) {
      uneven = true;
      continue;
    }
    const std::int64_t n = options_.mesh[b], groups = std::max<std::int64_t>(1, p.groups);
    if (length < groups * n || length % (groups * n) != 0) return false;
    length /= n;
  }
  return !(uneven && cuts > 1);  // uneven shares of a dim another axis cuts too: not offered
}

double ShardingModel::leaf_memory(ir::ValueId leaf, int axis, const LeafChoice& choice) const {
  return leaf_memory_by_kind(leaf, axis, choice).total();
}

cost::ModelStateBytes ShardingModel::leaf_memory_by_kind(ir::ValueId leaf, int axis, const LeafChoice& choice) const {
  const ir::Value& v = graph_.value(leaf);
  if (v.role == ir::ValueRole::Input) return {};
  const auto [held, state_held] = leaf_held(leaf, axis, choice);
  const double numel = static_cast<double>(v.type.numel());
  const double scale = options_.parameter_memory_scale;
  if (v.role != ir::ValueRole::Parameter || !requires_grad_[static_cast<std::size_t>(leaf)])
    return {.weights = value_bytes(leaf) * held * scale};
  const cost::MemoryConstants& m = memory_;
  // ZeRO shards the optimizer state only: the runtime all-reduces a ZeRO parameter's gradient
  // whole to every rank, and its owner steps it (runtime/optim.py: ZeRO-1). A gradient is as
  // sharded as its weight.
  return {.weights = numel * m.weight_bytes * held * scale,
          .gradients = numel * m.gradient_bytes * held * scale,
          .optimizer = numel * m.optimizer_bytes * state_held * scale};
}

double ShardingModel::optimizer_seconds(ir::ValueId leaf, int axis, const LeafChoice& choice) const {
  const ir::Value& v = graph_.value(leaf);
  if (v.role != ir::ValueRole::Parameter || !requires_grad_[static_cast<std::size_t>(leaf)]) return 0;
  const double state_held = leaf_held(leaf, axis, choice).second;
  // Read and write every byte of the rank's share of the states (cost/plan_cost.h's rule).
  return static_cast<double>(v.type.numel()) * state_held * 2.0 * memory_.bytes_per_parameter() /
         (device_->memory_bandwidth * options_.optimizer_memory_efficiency);
}

double ShardingModel::zero_broadcast_seconds(ir::ValueId leaf, int axis, const LeafChoice& choice) const {
  if (!choice.zero || axis < 0 || options_.mesh[static_cast<std::size_t>(axis)] <= 1) return 0;
  const double bytes = value_bytes(leaf) * held_except(leaf, axis);
  const auto ranks = axis_ranks(axis);
  const double whole =
      model_.collective_time(cluster_, cost::CollectiveKind::Broadcast, ranks, static_cast<std::int64_t>(bytes),
                             cost::Algorithm::Auto);
  if (bytes >= options_.bucket_bytes) return whole;
  // Flattened with the other parameters of its owner (one broadcast per owner): its share of
  // the latency, as a gradient bucket's.
  const double latency =
      model_.collective_time(cluster_, cost::CollectiveKind::Broadcast, ranks, 1, cost::Algorithm::Auto);
  return whole - latency * (1.0 - bytes / options_.bucket_bytes);
}

double ShardingModel::reshard_seconds(int axis, ir::ValueId value, const Placement& from, const Placement& to,
                                      double bytes, double latency_share) const {
  const auto ranks = axis_ranks(axis);
  const Placement source = as_run(axis, value, from), target = as_run(axis, value, to);
  const double whole = reshard_time(model_, cluster_, ranks, source, target, static_cast<std::int64_t>(bytes));
  if (whole <= 0 || latency_share >= 1.0 || graph_.value(value).role != ir::ValueRole::Parameter) return whole;
  // The latency part: the same collective on one byte.
  const double latency = reshard_time(model_, cluster_, ranks, source, target, 1);
  return whole - latency * (1.0 - latency_share);
}

double ShardingModel::parameter_latency_share(ir::ValueId value, int consumer, ParameterOverlap overlap,
                                              bool replicated_gradient, double bytes) const {
  if (replicated_gradient) return std::min(1.0, bytes / options_.bucket_bytes);
  if (overlap == ParameterOverlap::Exposed) return 1.0;
  const ir::Value& v = graph_.value(value);
  auto it = unit_elements_.find({units_[static_cast<std::size_t>(consumer)], v.type.shape.size() >= 2});
  return it != unit_elements_.end() && it->second > 0
             ? std::min(1.0, static_cast<double>(v.type.numel()) / it->second)
             : 1.0;
}

int ShardingModel::forward_passes(ir::ValueId value, int consumer, int operand) const {
  // A parameter is gathered for its read, and again either for backward (released after the
  // read) or for the recomputed forward, whose gathered copy backward then uses
  // (search/parameter_collectives.h).
  if (graph_.value(value).role != ir::ValueRole::Parameter) return 1;
  const auto c = static_cast<std::size_t>(consumer);
  if (runs_again(c)) return 2;
  return rules_[c] && !backward_reads(*rules_[c], static_cast<std::size_t>(operand)) ? 1 : 2;
}

ParameterOverlap ShardingModel::activation_gradient_at(int axis, ir::ValueId value, int consumer, int operand,
                                                       const Placement& produced, const Placement& wanted,
                                                       const Placement& gradient) const {
  const auto c = static_cast<std::size_t>(consumer);
  if (!options_.async_gradients || !rules_[c] || !requires_grad_[static_cast<std::size_t>(value)])
    return activation_collective_overlap();
  // One all-reduce in all: no forward step on any axis, and one axis whose gradient goes
  // Partial -> Replicate while every other axis' gradient needs no step.
  int reductions = 0;
  bool other_steps = false;
  for (int b = 0; b < static_cast<int>(options_.mesh.size()); ++b) {
    const Placement held = b == axis ? produced : value_placement(b, value);
    const Strategy& reader = node_choice_[static_cast<std::size_t>(b)][c];
    const Placement& read = b == axis ? wanted : reader.inputs[static_cast<std::size_t>(operand)];
    const Placement& grad = b == axis ? gradient : reader.input_grads[static_cast<std::size_t>(operand)];
    const Placement canonical = gradient_placement(held);
    if (!(held == read)) other_steps = true;
    if (grad == canonical) continue;
    if (grad.is_partial() && grad.reduction == ops::Reduction::Sum && canonical.is_replicate()) ++reductions;
    else other_steps = true;
  }
  const ir::Node& node = graph_.node(consumer);
  std::vector<bool> trainable;
  for (ir::ValueId in : node.inputs)
    trainable.push_back(graph_.value(in).role == ir::ValueRole::Parameter &&
                        requires_grad_[static_cast<std::size_t>(in)]);
  return activation_gradient_overlap(node.op, static_cast<std::size_t>(operand), reductions == 1 && !other_steps,
                                     reads_[static_cast<std::size_t>(value)] == 1, trainable);
}

MatmulCollective ShardingModel::matmul_collective_at(int axis, ir::ValueId value, int consumer, int operand,
                                                     const Placement& produced, const Placement& wanted,
                                                     const Placement& gradient) const {
  if (!options_.collective_matmul) return MatmulCollective::None;
  const ir::Value& v = graph_.value(value);
  if (v.role == ir::ValueRole::Parameter) return MatmulCollective::None;
  // Every other axis: no step forward, none backward.
  for (int b = 0; b < static_cast<int>(options_.mesh.size()); ++b) {
    if (b == axis || options_.mesh[static_cast<std::size_t>(b)] <= 1) continue;
    const Placement held = value_placement(b, value);
    const Strategy& reader = node_choice_[static_cast<std::size_t>(b)][static_cast<std::size_t>(consumer)];
    if (!(held == reader.inputs[static_cast<std::size_t>(operand)])) return MatmulCollective::None;
    if (requires_grad_[static_cast<std::size_t>(value)] &&
        !(reader.input_grads[static_cast<std::size_t>(operand)] == gradient_placement(held)))
      return MatmulCollective::None;
  }
  // Even blocks, contiguous or strided (the ring takes a strided block as it takes a
  // contiguous one: transform/collective_matmul.cc).
  auto even = [](const Placement& p) { return p.is_shard() && p.ratios.empty(); };
  const bool grad = requires_grad_[static_cast<std::size_t>(value)];
  const ir::Node& reader = graph_.node(consumer);
  // Gather into the reader: S(d) -> R on a row dim, the gradient Partial -> S(d) or none.
  if (even(produced) && wanted.is_replicate() && search::collective_matmul_input(graph_, reader) == operand &&
      search::collective_matmul_rows(graph_, reader, produced.dim) &&
      (!grad || (gradient.is_partial() && gradient.reduction == ops::Reduction::Sum)))
    return MatmulCollective::Gather;
  // Scatter out of the producer: P(sum) -> S(d) on a row dim, the only read; the gradient
  // S(d) -> R (none without a gradient).
  if (!v.producer || !produced.is_partial() || produced.reduction != ops::Reduction::Sum || !even(wanted))
    return MatmulCollective::None;
  const ir::Node& producer = graph_.node(*v.producer);
  if (reads_[static_cast<std::size_t>(value)] != 1 ||
      std::find(graph_.outputs().begin(), graph_.outputs().end(), value) != graph_.outputs().end() ||
      search::collective_matmul_input(graph_, producer) < 0 ||
      !search::collective_matmul_rows(graph_, producer, wanted.dim))
    return MatmulCollective::None;
  if (grad && !(gradient == wanted)) return MatmulCollective::None;
  return MatmulCollective::Scatter;
}

ParameterOverlap ShardingModel::parameter_gradient_at(int axis, ir::ValueId value, int consumer, int operand,
                                                      const Placement& produced, const Placement& gradient) const {
  const Placement canonical = gradient_placement(produced);
  if (canonical.is_replicate()) return gradient_reduction_overlap(canonical);
  const std::size_t axes = options_.mesh.size();
  const ShardingSpec grads = one_axis_varied(axes, axis, gradient, [&](int b) {
    return node_choice_[static_cast<std::size_t>(b)][static_cast<std::size_t>(consumer)]
        .input_grads[static_cast<std::size_t>(operand)];
  });
  const ShardingSpec canonicals = one_axis_varied(
      axes, axis, canonical, [&](int b) { return gradient_placement(value_placement(b, value)); });
  return gradient_scatter_overlap(grads, canonicals);
}

ParameterOverlap ShardingModel::gather_overlap(int axis, ir::ValueId value, int consumer, int operand,
                                               const Placement& produced, const Placement& wanted) const {
  const std::size_t axes = options_.mesh.size();
  const ShardingSpec held = one_axis_varied(axes, axis, produced, [&](int b) { return value_placement(b, value); });
  const ShardingSpec read = one_axis_varied(axes, axis, wanted, [&](int b) {
    return node_choice_[static_cast<std::size_t>(b)][static_cast<std::size_t>(consumer)]
        .inputs[static_cast<std::size_t>(operand)];
  });
  return forward_gather_overlap(held, read, checkpointed(static_cast<std::size_t>(consumer)));
}

double ShardingModel::edge_seconds(int axis, ir::ValueId value, int consumer, int operand, const Placement& produced,
                                   const Placement& wanted, const Placement& gradient, double hidden_weight) const {
  const double bytes = value_bytes(value) * held_except(value, axis);
  const bool parameter = graph_.value(value).role == ir::ValueRole::Parameter;
  // Each collective costs what its mark (search/parameter_collectives.h, the rewrite's too)
  // says: in full where exposed, `hidden_weight` where it runs beside compute.
  auto weight = [&](ParameterOverlap overlap) { return overlap != ParameterOverlap::Exposed ? hidden_weight : 1.0; };
  double seconds = 0;
  // A collective matmul's collectives, forward and backward: beside the contraction's
  // products, at the interference price (evaluate() caps what they hide by the products).
  if (!parameter && matmul_collective_at(axis, value, consumer, operand, produced, wanted, gradient) !=
                        MatmulCollective::None) {
    double fused = reshard_seconds(axis, value, produced, wanted, bytes, 1.0);
    if (requires_grad_[static_cast<std::size_t>(value)])
      fused += reshard_seconds(axis, value, gradient, gradient_placement(produced), bytes, 1.0);
    return options_.overlap_interference * fused;
  }
  const ParameterOverlap first = parameter ? gather_overlap(axis, value, consumer, operand, produced, wanted)
                                           : activation_collective_overlap();
  // A prefetched gather and its gather again for backward run in their unit's group.
  const double gather = reshard_seconds(axis, value, produced, wanted, bytes,
                                        parameter ? parameter_latency_share(value, consumer, first, false, bytes) : 1.0);
  if (gather > 0)
    seconds = (weight(first) + (forward_passes(value, consumer, operand) - 1) * weight(regather_overlap())) * gather;
  // A recomputed reader reshards an activation again when backward runs its forward: exposed.
  if (!parameter && runs_again(static_cast<std::size_t>(consumer))) seconds += gather;
  if (requires_grad_[static_cast<std::size_t>(value)]) {
    const Placement canonical = gradient_placement(produced);
    const ParameterOverlap reduction =
        parameter ? parameter_gradient_at(axis, value, consumer, operand, produced, gradient)
                  : activation_gradient_at(axis, value, consumer, operand, produced, wanted, gradient);
    // An activation's gradient beside its reader's weight gradient: hidden at the
    // interference price whatever the solver charges for parameter collectives (the weight
    // gradient's product, as long as the input gradient's, covers it; evaluate() caps it).
    const double reduction_weight =
        !parameter && reduction != ParameterOverlap::Exposed ? options_.overlap_interference : weight(reduction);
    seconds += reduction_weight * gradient_share(value, produced, gradient) *
               reshard_seconds(axis, value, gradient, canonical, bytes,
                               parameter ? parameter_latency_share(value, consumer, reduction, canonical.is_replicate(),
                                                                   bytes)
                                         : 1.0);
  }
  return seconds;
}

double ShardingModel::gradient_share(ir::ValueId value, const Placement& produced, const Placement& gradient) const {
  const auto v = static_cast<std::size_t>(value);
  // A replicated leaf's partial sums add up over its reads and are reduced once, in the
  // engine's buckets (transform/spmd_rewrite.cc: the canonical gradient kept Partial); a
  // sharded leaf's gradient is reduce-scattered at each read (a tied embedding held
  // vocabulary-parallel: once for the lookup, once for the head).
  if (!gradient.is_partial() || gradient.reduction != ops::Reduction::Sum || !produced.is_replicate() ||
      !is_leaf(graph_.value(value)) || reads_[v] <= 1)
    return 1.0;
  return 1.0 / reads_[v];
}

double ShardingModel::statistics_seconds(int axis, const Strategy& choice) const {
  if (choice.statistics_elements <= 0) return 0;
  const auto ranks = axis_ranks(axis);
  // fp32 statistics, all-reduced in forward and again in backward.
  return 2 * model_.collective_time(cluster_, cost::CollectiveKind::AllReduce, ranks, choice.statistics_elements * 4,
                                    cost::Algorithm::Auto);
}

std::pair<double, bool> ShardingModel::fp8_amax_elements(ir::NodeId node, int axis, const Strategy& choice) const {
  if (fp8_linears_.empty()) return {0, true};
  const ir::Node& n = graph_.node(node);
  const auto& linear = fp8_linears_[static_cast<std::size_t>(node)];
  if (!linear || linear->weight >= choice.inputs.size()) return {0, true};
  const Placement& w = choice.inputs[linear->weight];
  if (!w.is_shard()) return {0, true};
  const bool k_split = w.dim == linear->weight_k_dim;
  // x's rows on this rank: its elements over K, split as the other axes read it.
  double rows = value_bytes(n.inputs[linear->input]) / float_bytes_ / static_cast<double>(linear->k);
  for (std::size_t b = 0; b < options_.mesh.size(); ++b)
    if (static_cast<int>(b) != axis)
      rows *= held_fraction(node_choice_[b][static_cast<std::size_t>(node)].inputs[linear->input], options_.mesh[b]);
  // W's rows (N of them, whole where K is split) in forward, its columns (K, whole where N is) in backward.
  return {rows + static_cast<double>(k_split ? linear->n : linear->k), k_split};
}

double ShardingModel::fp8_amax_seconds(int axis, double elements) const {
  if (elements <= 0) return 0;
  return model_.collective_time(cluster_, cost::CollectiveKind::AllReduce, axis_ranks(axis),
                                static_cast<std::int64_t>(std::llround(elements * 4)), cost::Algorithm::Auto);
}

bool ShardingModel::checkpointed(std::size_t node) const {
  return options_.recompute != plan::Recompute::None && in_block_[node];
}

bool ShardingModel::kept_whole(std::size_t node) const {
  return options_.recompute == plan::Recompute::Selective && in_block_[node] && selective_kept_[node];
}

bool ShardingModel::recomputed(std::size_t node) const { return checkpointed(node) && !kept_whole(node); }

bool ShardingModel::runs_again(std::size_t node) const { return checkpointed(node) && runs_again_[node]; }

bool ShardingModel::reruns_forward(std::size_t node) const { return recomputed(node) && runs_again_[node]; }

double ShardingModel::recompute_checkpoint_bytes() const {
  if (options_.recompute == plan::Recompute::None) return 0;
  double bytes = 0;
  for (ir::ValueId v : block_inputs_) bytes += value_bytes(v) * held_all(v);
  return bytes * options_.activation_memory_scale;
}

// Readers of one value that want it the same way share one resharding (tally(), as the
// runtime runs it: q, k and v read one gathered norm output). A pair cost cannot see that:
// priced per reader edge, Megatron's column-parallel k and v would each pay the gather q
// pays already. So the readers of a value (not a parameter, whose collectives are its
// own) that are two or more edges of the same count meet at a choice node of their own, a
// hub: its choice is the produced placement and the one resharding the readers share (or
// none); the producer -> hub edge holds the two placements equal and prices the shared
// resharding once; a reader that wants the shared placement pays nothing more, any other
// its own resharding from the produced placement (what the runtime runs). Never below
// tally()'s price; equal unless two readers share a resharding other than the hub's.
struct ShardingModel::Hub {
  ir::ValueId value = -1;
  double count = 0;
  std::vector<EdgeKey> readers;  // in edges_ order
  std::vector<Placement> produced;                             // per hub choice
  std::vector<std::optional<std::pair<Placement, Placement>>> shared;  // per hub choice: (wanted, gradient)
  std::vector<int> first_reader;  // per hub choice: the reader edge whose consumer prices the shared resharding
  std::vector<double> seconds;    // per hub choice: the shared resharding's (count x edge_seconds)
  int id = -1;                    // problem node
};

// solve_axis' state for one axis: the choices of every representative node and leaf, the
// hubs where readers share a resharding, and the problem made of them.
struct ShardingModel::AxisProblem {
  AxisProblem(int axis, double parameter_weight, std::size_t nodes, std::size_t values)
      : axis(axis),
        parameter_weight(parameter_weight),
        strategies(nodes),
        leaf_choices(values),
        leaf_instances(values, 0),
        node_id(nodes, -1),
        leaf_id(values, -1) {}

  // The placements the producer of `key` may give `value`, one per producer choice.
  std::vector<Placement> produced_by(const EdgeKey& key, const ir::Value& value) const {
    std::vector<Placement> produced;
    if (key.producer_is_leaf) {
      for (const LeafChoice& c : leaf_choices[static_cast<std::size_t>(key.producer)]) produced.push_back(c.placement);
    } else {
      for (const Strategy& s : strategies[static_cast<std::size_t>(key.producer)])
        produced.push_back(s.outputs[static_cast<std::size_t>(value.output_index)]);
    }
    return produced;
  }
  int producer_id(const EdgeKey& key) const {
    return key.producer_is_leaf ? leaf_id[static_cast<std::size_t>(key.producer)]
                                : node_id[static_cast<std::size_t>(key.producer)];
  }
  // The edge between problem nodes a and b (made, zero, on first use), and whether its cost
  // matrix is indexed [b][a] (a > b) rather than [a][b].
  std::pair<ChoiceEdge*, bool> edge_between(int a, int b) {
    const bool flip = a > b;
    const std::pair<int, int> pair = flip ? std::make_pair(b, a) : std::make_pair(a, b);
    auto [it, added] = edge_at.emplace(pair, problem.edges.size());
    if (added) {
      ChoiceEdge e;
      e.a = pair.first;
      e.b = pair.second;
      e.cost.assign(problem.nodes[static_cast<std::size_t>(e.a)].cost.size() *
                        problem.nodes[static_cast<std::size_t>(e.b)].cost.size(),
                    0.0);
      problem.edges.push_back(std::move(e));
    }
    return {&problem.edges[it->second], flip};
  }
  // The hubs of `producer`'s values, as problem nodes right after it in the sweep order.
  void push_hubs(int producer, bool is_leaf, const ir::Graph& graph) {
    const auto it = hubs_after.find({producer, is_leaf});
    if (it == hubs_after.end()) return;
    for (std::size_t h : it->second) {
      ChoiceNode c;
      c.name = "shared " + graph.value(hubs[h].value).name;
      c.cost.assign(hubs[h].produced.size(), 0.0);
      c.memory.assign(hubs[h].produced.size(), 0.0);
      hubs[h].id = static_cast<int>(problem.nodes.size());
      problem.nodes.push_back(std::move(c));
    }
  }

  const int axis;
  const double parameter_weight;
  std::vector<std::vector<Strategy>> strategies;    // per representative node
  std::vector<std::vector<LeafChoice>> leaf_choices;  // per representative leaf
  std::vector<double> leaf_instances;
  std::vector<Hub> hubs;
  std::set<EdgeKey> via_hub;  // reader edges priced through a hub
  std::map<std::pair<int, bool>, std::vector<std::size_t>> hubs_after;  // by producer
  SpmdProblem problem;
  std::vector<int> node_id, leaf_id;  // problem node of each representative node and leaf
  std::map<std::pair<int, int>, std::size_t> edge_at;
};

void ShardingModel::solve_axis(int axis, bool thorough, double memory_scale, double parameter_weight, bool seeds_only) {
  if (options_.mesh[static_cast<std::size_t>(axis)] <= 1) return;
  AxisProblem ap(axis, parameter_weight, graph_.nodes().size(), graph_.values().size());
  axis_choices(ap);
  if (options_.shared_reshardings) share_reshardings(ap);
  problem_nodes(ap);
  problem_edges(ap);
  // The gathered-weight peak is a max, not a sum over choices: the problem cannot price it,
  // so it keeps room for the peak the current decisions have (the descent's later passes see
  // the gathers its earlier ones chose).
  ap.problem.memory_limit = options_.memory_limit * memory_scale - recompute_checkpoint_bytes() -
                            gathered_parameter_bytes() - fp8_cast_bytes();
  SpmdSolution solution = solve_fast(ap.problem, solver_seeds(ap, seeds_only));
  if (thorough && !seeds_only) {
    SpmdSolution exact = solve_ilp(ap.problem, IlpOptions{}, &solution);
    if ((exact.feasible && (!solution.feasible || exact.cost <= solution.cost)) ||
        (!exact.feasible && !solution.feasible && exact.memory < solution.memory))
      solution = std::move(exact);
  }
  adopt_solution(ap, solution);
}

// Choices of representative nodes and leaves: a node's strategies; a leaf whole, split as a
// reader wants it (where its other axes' blocks allow), or (ZeRO) whole with its optimizer
// state sharded.
void ShardingModel::axis_choices(AxisProblem& ap) const {
  const auto num_nodes = graph_.nodes().size();
  const auto num_values = graph_.values().size();
  for (std::size_t u = 0; u < num_nodes; ++u)
    if (rep_node_[u] == static_cast<ir::NodeId>(u))
      ap.strategies[u] = node_strategies(static_cast<ir::NodeId>(u), ap.axis);
  for (std::size_t v = 0; v < num_values; ++v)
    if (rep_leaf_[v] >= 0) ap.leaf_instances[static_cast<std::size_t>(rep_leaf_[v])] += 1;
  for (const auto& [key, group] : edges_) {
    if (!key.producer_is_leaf) continue;
    auto& choices = ap.leaf_choices[static_cast<std::size_t>(key.producer)];
    if (choices.empty()) choices.push_back({Placement::replicate(), false});
    for (const Strategy& s : ap.strategies[static_cast<std::size_t>(key.consumer)]) {
      const Placement& want = s.inputs[static_cast<std::size_t>(key.operand)];
      if (!want.is_shard() || !leaf_placement_fits(key.producer, ap.axis, want)) continue;
      LeafChoice c{want, false};
      if (std::find(choices.begin(), choices.end(), c) == choices.end()) choices.push_back(c);
    }
  }
  for (std::size_t v = 0; v < num_values; ++v) {
    auto& choices = ap.leaf_choices[v];
    const ir::Value& value = graph_.value(static_cast<ir::ValueId>(v));
    if (choices.empty() || !options_.allow_zero || value.role != ir::ValueRole::Parameter || !requires_grad_[v])
      continue;
    choices.push_back({Placement::replicate(), true});
  }
}

// The hubs (Hub): the readers of a value, two or more edges of the same count,
// that could share a resharding that costs something.
void ShardingModel::share_reshardings(AxisProblem& ap) const {
  std::map<std::pair<ir::ValueId, double>, std::vector<EdgeKey>> readers_of;
  for (const auto& [key, group] : edges_) {
    if (graph_.value(group.value).role == ir::ValueRole::Parameter) continue;
    if (!key.producer_is_leaf && key.producer == key.consumer) continue;  // a self-pair: the node's own cost
    if (key.producer_is_leaf ? ap.leaf_choices[static_cast<std::size_t>(key.producer)].empty()
                             : ap.strategies[static_cast<std::size_t>(key.producer)].empty())
      continue;
    if (ap.strategies[static_cast<std::size_t>(key.consumer)].empty()) continue;
    readers_of[{group.value, group.count}].push_back(key);
  }
  for (auto& [value_count, keys] : readers_of) {
    if (keys.size() < 2) continue;
    Hub hub;
    hub.value = value_count.first;
    hub.count = value_count.second;
    hub.readers = keys;
    std::vector<Placement> produced;
    for (const Placement& p : ap.produced_by(keys.front(), graph_.value(hub.value)))
      if (std::find(produced.begin(), produced.end(), p) == produced.end()) produced.push_back(p);
    // The placements two or more of the readers may want (only those can be shared).
    std::vector<std::pair<Placement, Placement>> targets;
    std::vector<int> target_reader, target_readers;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      std::vector<std::pair<Placement, Placement>> mine;
      for (const Strategy& st : ap.strategies[static_cast<std::size_t>(keys[i].consumer)]) {
        std::pair<Placement, Placement> t{st.inputs[static_cast<std::size_t>(keys[i].operand)],
                                          st.input_grads[static_cast<std::size_t>(keys[i].operand)]};
        if (std::find(mine.begin(), mine.end(), t) != mine.end()) continue;
        mine.push_back(t);
        const auto at = std::find(targets.begin(), targets.end(), t);
        if (at == targets.end()) {
          targets.push_back(std::move(t));
          target_reader.push_back(static_cast<int>(i));
          target_readers.push_back(1);
        } else {
          ++target_readers[static_cast<std::size_t>(at - targets.begin())];
        }
      }
    }
    // A choice per produced placement: nothing shared, or one of those placements whose
    // resharding costs something (a free one is as good as none).
    bool shares = false;
    for (const Placement& p : produced) {
      hub.produced.push_back(p);
      hub.shared.emplace_back(std::nullopt);
      hub.first_reader.push_back(-1);
      hub.seconds.push_back(0);
      for (std::size_t t = 0; t < targets.size(); ++t) {
        if (target_readers[t] < 2) continue;
        const EdgeKey& by = keys[static_cast<std::size_t>(target_reader[t])];
        const double seconds = hub.count * edge_seconds(ap.axis, hub.value, by.consumer, by.operand, p,
                                                        targets[t].first, targets[t].second, ap.parameter_weight);
        if (!(seconds > 0) || !std::isfinite(seconds)) continue;
        hub.produced.push_back(p);
        hub.shared.emplace_back(targets[t]);
        hub.first_reader.push_back(target_reader[t]);
        hub.seconds.push_back(seconds);
        shares = true;
      }
    }
    if (!shares) continue;  // nothing the readers could share: their own edges
    for (const EdgeKey& k : keys) ap.via_hub.insert(k);
    ap.hubs.push_back(std::move(hub));
  }
  for (std::size_t h = 0; h < ap.hubs.size(); ++h)
    ap.hubs_after[{ap.hubs[h].readers.front().producer, ap.hubs[h].readers.front().producer_is_leaf}].push_back(h);
}

// Problem nodes, in sweep order: each node's unseen leaves, then the node (each followed by
// its values' hubs); their costs and memory per choice.
void ShardingModel::problem_nodes(AxisProblem& ap) const {
  const int axis = ap.axis;
  for (const ir::Node& node : graph_.nodes()) {
    for (ir::ValueId in : node.inputs) {
      ir::ValueId leaf = rep_leaf_[static_cast<std::size_t>(in)];
      if (leaf < 0 || ap.leaf_id[static_cast<std::size_t>(leaf)] >= 0) continue;
      const auto& choices = ap.leaf_choices[static_cast<std::size_t>(leaf)];
      ChoiceNode c;
      c.name = graph_.value(leaf).name;
      for (const LeafChoice& choice : choices) {
        // A tie-break, not a cost: with equal traffic (an all-reduce is a reduce-scatter and an
        // all-gather), keep the weight and its optimizer state whole.
        // A graph input is the other way round: each rank loads only its share of the batch,
        // so its placement follows what its readers split (R -> S is local, a tie otherwise).
        const ir::Value& value = graph_.value(leaf);
        const bool whole = !choice.zero && choice.placement.is_replicate();
        const double instances = ap.leaf_instances[static_cast<std::size_t>(leaf)];
        if (value.role == ir::ValueRole::Input) {
          c.cost.push_back(1e-15 * value_bytes(leaf) *
                           held_fraction(choice.placement, options_.mesh[static_cast<std::size_t>(axis)]));
        } else {
          c.cost.push_back((whole ? 0.0 : 1e-12 * static_cast<double>(value.type.numel())) +
                           instances *
                               (optimizer_seconds(leaf, axis, choice) + zero_broadcast_seconds(leaf, axis, choice)));
        }
        c.memory.push_back(leaf_memory(leaf, axis, choice) * instances);
      }
      ap.leaf_id[static_cast<std::size_t>(leaf)] = static_cast<int>(ap.problem.nodes.size());
      ap.problem.nodes.push_back(std::move(c));
      ap.push_hubs(static_cast<int>(leaf), true, graph_);
    }
    const auto u = static_cast<std::size_t>(node.id);
    if (rep_node_[u] != node.id) continue;
    ChoiceNode c;
    c.name = node.outputs.empty() ? node.op : graph_.value(node.outputs[0]).name;
    const double n = instances_[u];
    const double memory_count = recomputed(u) ? 1.0 : n;
    for (const Strategy& s : ap.strategies[u]) {
      const double amax = fp8_amax_seconds(axis, fp8_amax_elements(node.id, axis, s).first);
      c.cost.push_back(n * (node_compute(node.id, axis, s, *device_) * balanced_compute_factor(node.id, axis, s) +
                            statistics_seconds(axis, s) + amax));
      c.memory.push_back(memory_count * node_memory(node.id, axis, s));
    }
    ap.node_id[u] = static_cast<int>(ap.problem.nodes.size());
    ap.problem.nodes.push_back(std::move(c));
    ap.push_hubs(static_cast<int>(u), false, graph_);
  }
}

// Edges, merged per pair of problem nodes; a self-pair (a block's output read by the next
// instance at a position folded into the same node) is a cost on that node's diagonal. Then
// the hubs' edges: producer -> hub (the placements equal, the shared resharding once) and hub
// -> each reader (nothing where it wants the shared placement, else its own resharding).
void ShardingModel::problem_edges(AxisProblem& ap) const {
  const int axis = ap.axis;
  const double parameter_weight = ap.parameter_weight;
  SpmdProblem& problem = ap.problem;
  for (const auto& [key, group] : edges_) {
    const int pa = ap.producer_id(key);
    const int pb = ap.node_id[static_cast<std::size_t>(key.consumer)];
    if (pa < 0 || pb < 0 || ap.via_hub.contains(key)) continue;
    // Parameter traffic beside compute costs parameter_weight (see the header); edge_seconds
    // weighs each of its collectives by where the runtime runs it.
    const std::vector<Placement> produced = ap.produced_by(key, graph_.value(group.value));
    const auto& readers = ap.strategies[static_cast<std::size_t>(key.consumer)];
    const auto op = static_cast<std::size_t>(key.operand);
    if (pa == pb) {
      for (std::size_t s = 0; s < readers.size(); ++s)
        problem.nodes[static_cast<std::size_t>(pb)].cost[s] +=
            group.count * edge_seconds(axis, group.value, key.consumer, key.operand, produced[s], readers[s].inputs[op],
                                       readers[s].input_grads[op], parameter_weight);
      continue;
    }
    const auto [edge, flip] = ap.edge_between(pa, pb);
    ChoiceEdge& e = *edge;
    const std::size_t nb = problem.nodes[static_cast<std::size_t>(e.b)].cost.size();
    for (std::size_t p = 0; p < produced.size(); ++p)
      for (std::size_t r = 0; r < readers.size(); ++r) {
        double seconds = group.count * edge_seconds(axis, group.value, key.consumer, key.operand, produced[p],
                                                    readers[r].inputs[op], readers[r].input_grads[op],
                                                    parameter_weight);
        e.cost[flip ? r * nb + p : p * nb + r] += seconds;
      }
  }
  constexpr double kForbidden = std::numeric_limits<double>::infinity();
  for (const Hub& hub : ap.hubs) {
    const EdgeKey& first = hub.readers.front();
    const int pa = ap.producer_id(first);
    const std::vector<Placement> produced = ap.produced_by(first, graph_.value(hub.value));
    const std::size_t choices = hub.produced.size();
    {
      auto [e, flip] = ap.edge_between(pa, hub.id);
      const std::size_t nb = problem.nodes[static_cast<std::size_t>(e->b)].cost.size();
      for (std::size_t p = 0; p < produced.size(); ++p)
        for (std::size_t h = 0; h < choices; ++h) {
          e->cost[flip ? h * nb + p : p * nb + h] += produced[p] == hub.produced[h] ? hub.seconds[h] : kForbidden;
        }
    }
    for (const EdgeKey& key : hub.readers) {
      const int pb = ap.node_id[static_cast<std::size_t>(key.consumer)];
      const auto& readers = ap.strategies[static_cast<std::size_t>(key.consumer)];
      const auto op = static_cast<std::size_t>(key.operand);
      auto [e, flip] = ap.edge_between(hub.id, pb);
      const std::size_t nb = problem.nodes[static_cast<std::size_t>(e->b)].cost.size();
      for (std::size_t h = 0; h < choices; ++h)
        for (std::size_t r = 0; r < readers.size(); ++r) {
          const bool shares = hub.shared[h] && hub.shared[h]->first == readers[r].inputs[op] &&
                              hub.shared[h]->second == readers[r].input_grads[op];
          const double seconds =
              shares ? 0.0
                     : hub.count * edge_seconds(axis, hub.value, key.consumer, key.operand, hub.produced[h],
                                                readers[r].inputs[op], readers[r].input_grads[op], parameter_weight);
          e->cost[flip ? r * nb + h : h * nb + r] += seconds;
        }
    }
  }
}

// A hub's seed: the producer's placement in the seed, and the resharding most of the seed's
// readers that need one want (none when none does).
int ShardingModel::hub_seed(const AxisProblem& ap, const Hub& hub, const std::vector<int>& seed) const {
  const EdgeKey& first = hub.readers.front();
  const auto chosen = [&](int problem_node) {
    return static_cast<std::size_t>(seed[static_cast<std::size_t>(problem_node)]);
  };
  const auto producer = static_cast<std::size_t>(first.producer);
  const auto output = static_cast<std::size_t>(graph_.value(hub.value).output_index);
  const Placement p = first.producer_is_leaf ? ap.leaf_choices[producer][chosen(ap.leaf_id[producer])].placement
                                             : ap.strategies[producer][chosen(ap.node_id[producer])].outputs[output];
  std::vector<std::pair<std::pair<Placement, Placement>, int>> wanted;
  for (const EdgeKey& key : hub.readers) {
    const auto consumer = static_cast<std::size_t>(key.consumer);
    const Strategy& r = ap.strategies[consumer][chosen(ap.node_id[consumer])];
    const auto op = static_cast<std::size_t>(key.operand);
    if (edge_seconds(ap.axis, hub.value, key.consumer, key.operand, p, r.inputs[op], r.input_grads[op],
                     ap.parameter_weight) <= 0)
      continue;
    std::pair<Placement, Placement> t{r.inputs[op], r.input_grads[op]};
    auto it = std::find_if(wanted.begin(), wanted.end(), [&](const auto& w) { return w.first == t; });
    if (it == wanted.end()) wanted.emplace_back(std::move(t), 1);
    else ++it->second;
  }
  const auto most = std::max_element(wanted.begin(), wanted.end(),
                                     [](const auto& x, const auto& y) { return x.second < y.second; });
  int none = 0;
  for (std::size_t h = 0; h < hub.produced.size(); ++h) {
    if (hub.produced[h] != p) continue;
    if (!hub.shared[h]) none = static_cast<int>(h);
    if (most != wanted.end() && hub.shared[h] && *hub.shared[h] == most->first) return static_cast<int>(h);
  }
  return none;
}

// Seeds for the fast solver: this axis' current decisions (a pass never makes the axis
// worse), and pure data parallelism (every node splits the index its batch dim carries,
// parameters whole, inputs split on their batch dim).
FastOptions ShardingModel::solver_seeds(AxisProblem& ap, bool seeds_only) const {
  const auto a = static_cast<std::size_t>(ap.axis);
  FastOptions fast{options_.beam_width, {}};
  fast.memo = options_.solve_memo;
  std::vector<int> current(ap.problem.nodes.size(), 0), data_parallel(ap.problem.nodes.size(), 0);
  auto shards_batch = [&](ir::ValueId id, const Placement& p) {
    const ir::TensorType& type = graph_.value(id).type;
    return type.batch_dim && p.is_shard() && p.dim == *type.batch_dim && p.groups == 1 && p.ratios.empty();
  };
  for (std::size_t u = 0; u < graph_.nodes().size(); ++u) {
    if (ap.node_id[u] < 0) continue;
    const auto& options = ap.strategies[u];
    const ir::Node& node = graph_.node(static_cast<ir::NodeId>(u));
    for (std::size_t c = 0; c < options.size(); ++c) {
      if (options[c] == node_choice_[a][u]) current[static_cast<std::size_t>(ap.node_id[u])] = static_cast<int>(c);
      bool batch = false;
      for (std::size_t o = 0; o < node.outputs.size(); ++o)
        batch = batch || shards_batch(node.outputs[o], options[c].outputs[o]);
      for (std::size_t i = 0; i < node.inputs.size(); ++i)
        batch = batch || shards_batch(node.inputs[i], options[c].inputs[i]);
      int& dp = data_parallel[static_cast<std::size_t>(ap.node_id[u])];
      if (batch && dp == 0) dp = static_cast<int>(c);
    }
  }
  for (std::size_t v = 0; v < graph_.values().size(); ++v) {
    if (ap.leaf_id[v] < 0) continue;
    const auto& options = ap.leaf_choices[v];
    for (std::size_t c = 0; c < options.size(); ++c) {
      if (options[c] == leaf_choice_[a][v]) current[static_cast<std::size_t>(ap.leaf_id[v])] = static_cast<int>(c);
      int& dp = data_parallel[static_cast<std::size_t>(ap.leaf_id[v])];
      const ir::ValueRole role = graph_.value(static_cast<ir::ValueId>(v)).role;
      if (role == ir::ValueRole::Input && dp == 0 && !options[c].zero &&
          shards_batch(static_cast<ir::ValueId>(v), options[c].placement))
        dp = static_cast<int>(c);
      // Data parallelism as practised: whole weights, their optimizer state sharded (ZeRO-1),
      // when the parameter may be.
      if (role == ir::ValueRole::Parameter && options[c].zero && options[c].placement.is_replicate())
        dp = static_cast<int>(c);
    }
  }
  for (const Hub& hub : ap.hubs) {
    current[static_cast<std::size_t>(hub.id)] = hub_seed(ap, hub, current);
    data_parallel[static_cast<std::size_t>(hub.id)] = hub_seed(ap, hub, data_parallel);
  }
  fast.seeds_only = seeds_only;
  if (seeds_only)
    fast.seeds = {std::move(data_parallel)};
  else
    fast.seeds = {std::move(current), std::move(data_parallel)};
  return fast;
}

// The solution's choices become the axis' decisions, for every instance of a representative.
void ShardingModel::adopt_solution(const AxisProblem& ap, const SpmdSolution& solution) {
  const auto a = static_cast<std::size_t>(ap.axis);
  const auto num_nodes = graph_.nodes().size();
  const auto num_values = graph_.values().size();
  for (std::size_t u = 0; u < num_nodes; ++u) {
    if (ap.node_id[u] < 0) continue;
    node_choice_[a][u] =
        ap.strategies[u][static_cast<std::size_t>(solution.choice[static_cast<std::size_t>(ap.node_id[u])])];
  }
  for (std::size_t u = 0; u < num_nodes; ++u) node_choice_[a][u] = node_choice_[a][static_cast<std::size_t>(rep_node_[u])];
  for (std::size_t v = 0; v < num_values; ++v) {
    if (ap.leaf_id[v] < 0) continue;
    leaf_choice_[a][v] =
        ap.leaf_choices[v][static_cast<std::size_t>(solution.choice[static_cast<std::size_t>(ap.leaf_id[v])])];
  }
  for (std::size_t v = 0; v < num_values; ++v)
    if (rep_leaf_[v] >= 0) leaf_choice_[a][v] = leaf_choice_[a][static_cast<std::size_t>(rep_leaf_[v])];
}

double ShardingModel::compute_seconds(const cost::DeviceType& device) const {
  double seconds = 0;
  for (const ir::Node& node : graph_.nodes()) {
    const auto u = static_cast<std::size_t>(node.id);
    if (rep_node_[u] != node.id) continue;
    seconds += instances_[u] * node_compute(node.id, -1, node_choice_[0][u], device);
  }
  return seconds;
}

double ShardingModel::parameter_bytes() const { return parameter_bytes_by_kind().total(); }

cost::ModelStateBytes ShardingModel::parameter_bytes_by_kind() const {
  cost::ModelStateBytes bytes;
  for (const ir::Value& v : graph_.values()) {
    if (!is_leaf(v)) continue;
    const cost::ModelStateBytes leaf = leaf_memory_by_kind(v.id, -1, {});
    bytes.weights += leaf.weights;
    bytes.gradients += leaf.gradients;
    bytes.optimizer += leaf.optimizer;
  }
  return bytes;
}

double ShardingModel::gathered_parameter_bytes() const {
  // The two largest units' weights readers gather beyond the rank's stored share: a unit's
  // gathers are one flattened all-gather, its weights released after their reads (and
  // gathered again for backward, the unit at once), while the next unit is prefetched
  // (search/parameter_collectives.h), so the peak is two units', not the sum of all.
  std::map<int, double> by_unit;
  for (const auto& [key, group] : edges_) {
    const ir::Value& value = graph_.value(group.value);
    if (value.role != ir::ValueRole::Parameter) continue;
    double wanted = 1;
    for (std::size_t a = 0; a < options_.mesh.size(); ++a) {
      const Strategy& reader = node_choice_[a][static_cast<std::size_t>(key.consumer)];
      wanted *= held_fraction(reader.inputs[static_cast<std::size_t>(key.operand)], options_.mesh[a]);
    }
    by_unit[units_[static_cast<std::size_t>(key.consumer)]] += value_bytes(group.value) * (wanted - held_all(group.value));
  }
  double peak = 0, second = 0;
  for (const auto& [unit, bytes] : by_unit) {
    if (bytes > peak) {
      second = peak;
      peak = bytes;
    } else {
      second = std::max(second, bytes);
    }
  }
  return peak + second;
}

double ShardingModel::fp8_cast_bytes() const {
  if (fp8_linears_.empty()) return 0;
  double peak = 0;
  for (const ir::Node& node : graph_.nodes()) {
    const auto& linear = fp8_linears_[static_cast<std::size_t>(node.id)];
    if (!linear) continue;
    const auto u = static_cast<std::size_t>(node.id);
    auto as_read = [&](ir::ValueId value, auto placement_of) {
      double held = 1;
      for (std::size_t a = 0; a < options_.mesh.size(); ++a)
        held *= held_fraction(placement_of(node_choice_[a][u]), options_.mesh[a]);
      return value_bytes(value) * held;
    };
    const double x = as_read(node.inputs[linear->input], [&](const Strategy& s) { return s.inputs[linear->input]; });
    const double w = as_read(node.inputs[linear->weight], [&](const Strategy& s) { return s.inputs[linear->weight]; });
    const double dy = as_read(node.outputs[0], [](const Strategy& s) { return s.outputs[0]; });
    peak = std::max(peak, cost::fp8_cast_copies_bytes(std::max({x, w, dy}), float_bytes_));
  }
  return peak;
}

double ShardingModel::activation_bytes() const {
  double bytes = 0;
  for (const ir::Node& node : graph_.nodes()) {
    const auto u = static_cast<std::size_t>(node.id);
    if (rep_node_[u] != node.id) continue;
    const double count = recomputed(u) ? 1.0 : instances_[u];
    bytes += count * node_memory(node.id, 0, node_choice_[0][u]);
  }
  return bytes + recompute_checkpoint_bytes();
}

ShardingModel::Tally ShardingModel::tally(int first_axis) const {
  Tally out;
  out.by_node.assign(graph_.nodes().size(), {});
  for (const ir::Node& node : graph_.nodes()) {
    const auto u = static_cast<std::size_t>(node.id);
    if (rep_node_[u] != node.id) continue;
    const cost::OpTime time = base_time(node.id, -1, node_choice_[0][u], *device_);
    const double recomputed = reruns_forward(u) ? time.forward : 0.0;
    out.by_node[u].forward = instances_[u] * time.forward;
    out.by_node[u].backward = instances_[u] * time.backward;
    out.forward += instances_[u] * time.forward;
    out.backward += instances_[u] * (time.backward + recomputed);
  }
  for (int axis = first_axis; axis < static_cast<int>(options_.mesh.size()); ++axis) {
    if (options_.mesh[static_cast<std::size_t>(axis)] <= 1) continue;
    tally_statistics(axis, out);
    tally_reshardings(axis, out);
  }
  return out;
}

// The FP8 amax all-reduces and the statistics kernels' all-reduces on `axis`.
void ShardingModel::tally_statistics(int axis, Tally& out) const {
  const auto a = static_cast<std::size_t>(axis);
  for (const ir::Node& node : graph_.nodes()) {
    const auto u = static_cast<std::size_t>(node.id);
    if (rep_node_[u] != node.id) continue;
    const Strategy& s = node_choice_[a][u];
    if (const auto [elements, forward] = fp8_amax_elements(node.id, axis, s); elements > 0) {
      const double amax = fp8_amax_seconds(axis, elements);
      out.statistics += instances_[u] * amax;
      out.by_node[u].collectives += instances_[u] * amax;
      out.collectives.push_back({"all_reduce", graph_.value(node.outputs[0]).name, axis,
                                 forward ? "forward" : "backward", elements * 4, instances_[u], amax});
    }
    const double seconds = statistics_seconds(axis, s);
    if (seconds <= 0) continue;
    out.statistics += instances_[u] * seconds;
    out.by_node[u].collectives += instances_[u] * seconds;
    for (const char* phase : {"forward", "backward"}) {
      out.collectives.push_back({"all_reduce", graph_.value(node.outputs[0]).name, axis, phase,
                                 static_cast<double>(s.statistics_elements * 4), instances_[u], seconds / 2});
    }
  }
}

std::tuple<int, int, int> ShardingModel::unit_group_key(int consumer, ir::ValueId value, int kind) const {
  return std::tuple{units_[static_cast<std::size_t>(consumer)], kind, static_cast<int>(graph_.value(value).type.dtype)};
}

// The unit groups the decisions make on `axis` (parameter_collectives.h): one flattened
// collective per (unit, kind, dtype), whose latency its members share by elements; the
// elements of each, kind 0 a prefetched gather, 1 a reduce-scatter beside backward.
std::map<std::tuple<int, int, int>, double> ShardingModel::unit_group_elements(int axis) const {
  const auto a = static_cast<std::size_t>(axis);
  std::map<std::tuple<int, int, int>, double> group_elements;
  std::set<std::tuple<int, int, ir::ValueId>> members;
  auto scattered = [&](const EdgeKey& key, ir::ValueId value, const Placement& produced, const Strategy& reader) {
    return requires_grad_[static_cast<std::size_t>(value)] && !gradient_placement(produced).is_replicate() &&
           parameter_gradient_at(axis, value, key.consumer, key.operand, produced,
                                 reader.input_grads[static_cast<std::size_t>(key.operand)]) ==
               ParameterOverlap::BesideBackward;
  };
  for (const auto& [key, group] : edges_) {
    const ir::Value& value = graph_.value(group.value);
    if (value.role != ir::ValueRole::Parameter) continue;
    const Strategy& reader = node_choice_[a][static_cast<std::size_t>(key.consumer)];
    const Placement produced = value_placement(axis, group.value);
    const auto numel = static_cast<double>(value.type.numel());
    if (gather_overlap(axis, group.value, key.consumer, key.operand, produced,
                       reader.inputs[static_cast<std::size_t>(key.operand)]) == ParameterOverlap::BesideForward &&
        members.emplace(units_[static_cast<std::size_t>(key.consumer)], 0, group.value).second)
      group_elements[unit_group_key(key.consumer, group.value, 0)] += numel;
    if (scattered(key, group.value, produced, reader) &&
        members.emplace(units_[static_cast<std::size_t>(key.consumer)], 1, group.value).second)
      group_elements[unit_group_key(key.consumer, group.value, 1)] += numel;
  }
  return group_elements;
}

// Every resharding the decisions make on `axis`, each where it runs: activations' (a
// resharding its readers share counted once), parameters' gathers (prefetched, gathered
// again) and gradient reductions, collective matmuls' beside their products.
void ShardingModel::tally_reshardings(int axis, Tally& out) const {
  const auto a = static_cast<std::size_t>(axis);
  std::map<std::tuple<int, int, int>, double> group_elements = unit_group_elements(axis);
  auto grouped_share = [&](int consumer, ir::ValueId value, int kind) {
    const double total = group_elements[unit_group_key(consumer, value, kind)];
    return total > 0 ? std::min(1.0, static_cast<double>(graph_.value(value).type.numel()) / total) : 1.0;
  };
  // Readers of one activation that want it the same way share one resharding, as the
  // runtime runs it (runtime/lower.py reuses the reshard, its backward sees the summed gradient):
  // q, k and v read one gathered norm output. The per-axis problems price it so through
  // their hubs (solve_axis, ShardingModelOptions::shared_reshardings), else per reader edge.
  std::set<std::string> shared;
  for (const auto& [key, group] : edges_) {
    const ir::Value& value = graph_.value(group.value);
    const Strategy& reader = node_choice_[a][static_cast<std::size_t>(key.consumer)];
    const auto op = static_cast<std::size_t>(key.operand);
    const Placement produced = value_placement(axis, group.value);
    if (value.role != ir::ValueRole::Parameter &&
        !shared.insert(fmt::format("{} {} {} {}", group.value, reader.inputs[op].str(), reader.input_grads[op].str(),
                                   group.count))
             .second)
      continue;
    const double bytes = value_bytes(group.value) * held_except(group.value, axis);
    NodePrice& price = out.by_node[static_cast<std::size_t>(key.consumer)];
    auto record = [&](const Placement& from, const Placement& to, const char* phase, double& into, double& by_node,
                      double share, double node_weight = 1.0, double latency_share = 1.0) {
      auto step = reshard_step(as_run(axis, group.value, from), as_run(axis, group.value, to),
                               static_cast<std::int64_t>(bytes), options_.mesh[a]);
      if (!step) return;
      double seconds = reshard_seconds(axis, group.value, from, to, bytes, latency_share);
      into += share * group.count * seconds;
      by_node += node_weight * share * group.count * seconds;
      out.collectives.push_back({std::string(cost::collective_kind_name(step->kind)), value.name, axis, phase,
                                 static_cast<double>(step->bytes), share * group.count, seconds});
    };
    const bool parameter = value.role == ir::ValueRole::Parameter;
    // A collective matmul: each collective beside its contraction's products, (n-1)/n of
    // them (parameter_collectives.h); what they cannot cover is exposed, what they cover
    // costs the interference.
    if (const MatmulCollective fused = parameter ? MatmulCollective::None
                                                 : matmul_collective_at(axis, group.value, key.consumer, key.operand,
                                                                        produced, reader.inputs[op],
                                                                        reader.input_grads[op]);
        fused != MatmulCollective::None) {
      const ir::NodeId contraction =
          fused == MatmulCollective::Gather ? key.consumer : *graph_.value(group.value).producer;
      const auto r = static_cast<std::size_t>(rep_node_[static_cast<std::size_t>(contraction)]);
      const double covered = static_cast<double>(options_.mesh[a] - 1) / options_.mesh[a] / instances_[r];
      const double k = options_.overlap_interference;
      auto hidden = [&](const Placement& from, const Placement& to, const char* phase, double products) {
        double seconds = 0, unused = 0;
        record(from, to, phase, seconds, unused, 1.0);  // the collective as recorded, in full
        out.activation_matmul += seconds;
        const double exposed = std::max(0.0, seconds - products) + k * std::min(seconds, products);
        out.activations += exposed;
        price.collectives += exposed;
      };
      hidden(produced, reader.inputs[op], "forward", covered * out.by_node[r].forward * group.count);
      if (requires_grad_[static_cast<std::size_t>(group.value)])
        hidden(reader.input_grads[op], gradient_placement(produced), "backward",
               covered * out.by_node[r].backward * group.count);
      continue;
    }
    // Where each parameter collective runs (search/parameter_collectives.h).
    auto beside = [&](ParameterOverlap overlap) -> double& {
      return overlap == ParameterOverlap::BesideForward    ? out.parameter_forward
             : overlap == ParameterOverlap::BesideBackward ? out.parameter_step
                                                           : out.parameter_exposed;
    };
    const ParameterOverlap first =
        parameter ? gather_overlap(axis, group.value, key.consumer, key.operand, produced, reader.inputs[op])
                  : activation_collective_overlap();
    // A prefetched gather and its gather again for backward run in their unit's group.
    const double gather_latency =
        parameter && first == ParameterOverlap::BesideForward ? grouped_share(key.consumer, group.value, 0) : 1.0;
    record(produced, reader.inputs[op], "forward", parameter ? beside(first) : out.activations, price.collectives,
           1.0, 1.0, gather_latency);
    // A recomputed reader's forward, run again in backward, reshards an activation again.
    if (!parameter && runs_again(static_cast<std::size_t>(key.consumer)))
      record(produced, reader.inputs[op], "backward", out.activations, price.collectives, 1.0);
    // A gathered weight is released after its read and gathered again for the backward (and
    // for the recomputed forward): ZeRO-3 / FSDP's traffic, as the runtime runs it.
    if (parameter)
      record(produced, reader.inputs[op], "backward", beside(regather_overlap()), price.collectives,
             forward_passes(group.value, key.consumer, key.operand) - 1, 1.0, gather_latency);
    if (requires_grad_[static_cast<std::size_t>(group.value)]) {
      const Placement canonical = gradient_placement(produced);
      const ParameterOverlap reduction =
          parameter ? parameter_gradient_at(axis, group.value, key.consumer, key.operand, produced,
                                            reader.input_grads[op])
                    : activation_gradient_at(axis, group.value, key.consumer, key.operand, produced,
                                             reader.inputs[op], reader.input_grads[op]);
      record(reader.input_grads[op], canonical, parameter ? "step" : "backward",
             parameter                                        ? beside(reduction)
             : reduction == ParameterOverlap::BesideBackward ? out.activation_backward
                                                             : out.activations,
             parameter ? price.gradient_sync : price.collectives, gradient_share(group.value, produced, reader.input_grads[op]),
             // a stage's price (node_prices) counts an activation's hidden all-reduce at
             // the interference, as the solver does (edge_seconds)
             !parameter && reduction == ParameterOverlap::BesideBackward ? options_.overlap_interference : 1.0,
             !parameter                     ? 1.0
             : canonical.is_replicate()      ? std::min(1.0, bytes / options_.bucket_bytes)
             : reduction == ParameterOverlap::BesideBackward ? grouped_share(key.consumer, group.value, 1)
                                                             : 1.0);
    }
  }
}

std::vector<NodePrice> ShardingModel::node_prices(int first_axis) const {
  const Tally tally = this->tally(first_axis);
  std::vector<NodePrice> out(graph_.nodes().size());
  const double unscale = options_.activation_memory_scale > 0 ? 1.0 / options_.activation_memory_scale : 1.0;
  for (const ir::Node& node : graph_.nodes()) {
    const auto u = static_cast<std::size_t>(node.id);
    const auto r = static_cast<std::size_t>(rep_node_[u]);
    const NodePrice& total = tally.by_node[r];
    const double n = instances_[r];
    const bool kept = in_block_[r] && selective_kept_[r];
    out[u] = {total.forward / n,
              total.backward / n,
              total.collectives / n,
              total.gradient_sync / n,
              output_memory(rep_node_[u], 0, node_choice_[0][r], false) * unscale,
              kept ? 0.0 : total.forward / n,
              kept ? output_memory(rep_node_[u], 0, node_choice_[0][r], true) * unscale : 0.0};
  }
  return out;
}

ShardingEvaluation ShardingModel::evaluate() const {
  ShardingEvaluation out;
  Tally tally = this->tally();
  const double forward = tally.forward, backward = tally.backward, compute = forward + backward;
  const double activations = tally.activations, statistics = tally.statistics;
  const double parameter_forward = tally.parameter_forward, parameter_step = tally.parameter_step;
  const double parameter_exposed = tally.parameter_exposed;
  out.collectives = std::move(tally.collectives);
  // Hidden under its phase's compute at the interference price, the excess exposed.
  const double k = options_.overlap_interference;
  auto exposed = [k](double sync, double beside) { return std::max(0.0, sync - beside) + k * std::min(sync, beside); };
  const double gradients =
      exposed(parameter_forward, forward) + exposed(parameter_step, backward) + parameter_exposed;
  out.parameter_sync = parameter_forward + parameter_step + parameter_exposed;
  out.parameter_sync_hidden = parameter_forward <= forward && parameter_step <= backward;
  double optimizer = 0, broadcasts = 0;
  for (const ir::Value& v : graph_.values()) {
    if (!is_leaf(v)) continue;
    optimizer += optimizer_seconds(v.id, -1, {});
    for (int a = 0; a < static_cast<int>(options_.mesh.size()); ++a) {
      const LeafChoice& choice = leaf_choice_[static_cast<std::size_t>(a)][static_cast<std::size_t>(v.id)];
      const double seconds = zero_broadcast_seconds(v.id, a, choice);
      if (seconds <= 0) continue;
      broadcasts += seconds;
      out.collectives.push_back({"broadcast", v.name, a, "step", value_bytes(v.id) * held_except(v.id, a), 1.0,
                                 seconds});
    }
  }
  // The asynchronous all-reduces of activation gradients hide under the weight gradients'
  // products, about half of the backward's compute (a contraction's backward is two
  // products of its forward's size).
  const double activation_beside = exposed(tally.activation_backward, backward / 2);
  out.step_time = compute + activations + activation_beside + gradients + statistics + optimizer + broadcasts;
  out.breakdown = {{"compute", compute},
                   {"activations", activations + activation_beside},
                   {"activations_beside_backward_total", tally.activation_backward},
                   {"activations_beside_matmul_total", tally.activation_matmul},
                   {"gradient_sync", gradients},
                   {"gradient_sync_total", out.parameter_sync},
                   {"statistics", statistics},
                   {"optimizer", optimizer},
                   {"zero_broadcast", broadcasts}};
  // The keys of a manual plan's breakdown (cost/plan_cost.cc), so one report reads both.
  const cost::ModelStateBytes states = parameter_bytes_by_kind();
  double acts = activation_bytes();
  const double gathered = gathered_parameter_bytes();
  const double casts = fp8_cast_bytes();
  out.memory_per_rank = states.total() + acts + gathered + casts;
  out.fits = out.memory_per_rank <= options_.memory_limit;
  if (const std::optional<UnevenShares> shares = uneven_shares()) {
    // The batch's uneven shares (set_input_ratios: the balance LP's, hetero_balance.h), priced
    // as the LP prices them: rank i of the axis' group computes its share, ratio x n of the
    // even one, at its own device's speed, and the slowest of them sets the step; its saved
    // activations scale with its share, against its own device's memory.
    const double n = static_cast<double>(shares->ranks.size());
    // memory_limit is the smallest device's memory x the plan's fraction of it.
    double smallest = std::numeric_limits<double>::infinity();
    for (int r = 0; r < cluster_.world_size(); ++r)
      smallest = std::min(smallest, static_cast<double>(cluster_.device_of(r).memory_bytes));
    const double fraction = options_.memory_limit / smallest;
    double paced = 0, most = 0;
    out.fits = true;
    for (std::size_t i = 0; i < shares->ranks.size(); ++i) {
      const cost::DeviceType& device = cluster_.device_of(shares->ranks[i]);
      const double scale = shares->ratios[i] * n;
      paced = std::max(paced, compute_seconds(device) * scale);
      most = std::max(most, scale);
      out.fits = out.fits && states.total() + acts * scale + gathered + casts <=
                                 static_cast<double>(device.memory_bytes) * fraction;
    }
    out.step_time += paced - compute;
    out.breakdown["compute"] = paced;
    acts *= most;
    out.memory_per_rank = states.total() + acts + gathered + casts;
  }
  out.memory_breakdown = {{"weights", states.weights},
                          {"gradients", states.gradients},
                          {"optimizer", states.optimizer},
                          {"activations", acts},
                          {"gathered_parameters", gathered}};
  if (casts > 0) out.memory_breakdown["fp8_casts"] = casts;
  double flops = 0;
  for (const ir::Node& node : graph_.nodes())
    flops += static_cast<double>(analysis::node_flops(ops::OpTable::builtin(), graph_, node).matmul);
  out.model_flops = 3 * flops * batch_scale_;
  return out;
}

void ShardingModel::adopt(const plan::Sharding& sharding) {
  // A sharding this graph cannot take changes nothing: the decisions as they were come back.
  auto nodes = node_choice_;
  auto leaves = leaf_choice_;
  try {
    adopt_decisions(sharding);
  } catch (...) {
    node_choice_ = std::move(nodes);
    leaf_choice_ = std::move(leaves);
    throw;
  }
}

void ShardingModel::adopt_decisions(const plan::Sharding& sharding) {
  const std::size_t axes = options_.mesh.size();
  if (sharding.mesh != options_.mesh)
    throw ValidationError(fmt::format("plan: sharding mesh [{}] priced on a model of mesh [{}]",
                                      fmt::join(sharding.mesh, ", "), fmt::join(options_.mesh, ", ")));
  for (const ir::Value& v : graph_.values()) {
    if (!is_leaf(v)) continue;
    const auto& texts = plan::sharding_entry(sharding.placements, v.name, "placement", axes);
    auto zero = sharding.zero.find(v.name);
    for (std::size_t a = 0; a < axes; ++a) {
      LeafChoice& choice = leaf_choice_[a][static_cast<std::size_t>(v.id)];
      choice.placement = parse_placement(texts[a]);
      choice.zero = zero != sharding.zero.end() &&
                    std::ranges::find(zero->second, static_cast<int>(a)) != zero->second.end();
    }
  }
  auto read_axis = [&](std::size_t a) {
    for (const ir::Node& node : graph_.nodes()) {
      if (node.outputs.empty()) continue;
      const std::string& name = graph_.value(node.outputs[0]).name;
      const std::string& text = plan::sharding_entry(sharding.strategies, name, "strategy", axes)[a];
      const auto& rule = rules_[static_cast<std::size_t>(node.id)];
      Strategy& slot = node_choice_[a][static_cast<std::size_t>(node.id)];
      if (text == "replicate" || !rule) {
        if (text != "replicate")
          throw ValidationError(fmt::format("plan: node '{}' ({}, module '{}') has strategy '{}' on mesh axis {} "
                                            "but no sharding rule", name, node.op, node.module_path, text, a));
        slot = replicate_strategy(node.id);
        continue;
      }
      bool found = false;
      for (Strategy& s : node_strategies(node.id, static_cast<int>(a))) {
        if (s.str(*rule) != text) continue;
        slot = std::move(s);
        found = true;
        break;
      }
      if (!found)
        throw ValidationError(fmt::format("plan: node '{}' ({}, module '{}'): strategy '{}' is not one its rule {} "
                                          "takes on mesh axis {} of {} ranks", name, node.op, node.module_path, text,
                                          rule->str(), a, options_.mesh[a]));
    }
  };
  for (std::size_t a = 0; a < axes; ++a) read_axis(a);
  if (axes > 1) read_axis(0);
}

plan::Sharding ShardingModel::sharding(std::string level) const {
  plan::Sharding out;
  out.mesh = options_.mesh;
  out.axis_names = {"data", "tensor"};
  out.axis_names.resize(options_.mesh.size(), "axis");
  out.level = std::move(level);
  out.recompute = options_.recompute;
  out.collective_matmul = options_.collective_matmul;
  out.async_gradients = options_.async_gradients;
  out.graph = ir::graph_fingerprint(graph_);
  const auto axes = options_.mesh.size();
  for (const ir::Value& v : graph_.values()) {
    std::vector<std::string> per_axis;
    for (std::size_t a = 0; a < axes; ++a) per_axis.push_back(value_placement(static_cast<int>(a), v.id).str());
    out.placements[v.name] = std::move(per_axis);
    if (!is_leaf(v)) continue;
    out.leaves.push_back(v.name);
    if (v.role == ir::ValueRole::Input) out.inputs.push_back(v.name);
    std::vector<int> zero;
    for (std::size_t a = 0; a < axes; ++a)
      if (leaf_choice_[a][static_cast<std::size_t>(v.id)].zero) zero.push_back(static_cast<int>(a));
    if (!zero.empty()) out.zero[v.name] = std::move(zero);
  }
  for (const ir::Node& node : graph_.nodes()) {
    if (node.outputs.empty()) continue;
    const auto& rule = rules_[static_cast<std::size_t>(node.id)];
    std::vector<std::string> per_axis;
    for (std::size_t a = 0; a < axes; ++a) {
      const Strategy& s = node_choice_[a][static_cast<std::size_t>(node.id)];
      per_axis.push_back(rule ? s.str(*rule) : std::string("replicate"));
    }
    out.strategies[graph_.value(node.outputs[0]).name] = std::move(per_axis);
  }
  return out;
}

std::optional<ShardingModel::UnevenShares> ShardingModel::uneven_shares() const {
  const int axis = batch_axis();
  if (axis < 0) return std::nullopt;
  for (ir::ValueId in : graph_.inputs()) {
    const Placement& p = leaf_choice_[static_cast<std::size_t>(axis)][static_cast<std::size_t>(in)].placement;
    const ir::TensorType& type = graph_.value(in).type;
    if (type.batch_dim && p.is_shard() && p.dim == *type.batch_dim && !p.ratios.empty()) {
      if (p.ratios.size() != static_cast<std::size_t>(options_.mesh[static_cast<std::size_t>(axis)]))
        throw ValidationError(fmt::format("plan: input '{}' has {} batch shares on a mesh axis of {} ranks",
                                          graph_.value(in).name, p.ratios.size(),
                                          options_.mesh[static_cast<std::size_t>(axis)]));
      return UnevenShares{axis, axis_ranks(axis), p.ratios};
    }
  }
  return std::nullopt;
}

int ShardingModel::batch_axis() const {
  for (std::size_t a = 0; a < options_.mesh.size(); ++a) {
    if (options_.mesh[a] <= 1) continue;
    for (ir::ValueId in : graph_.inputs()) {
      const ir::TensorType& type = graph_.value(in).type;
      const Placement& p = leaf_choice_[a][static_cast<std::size_t>(in)].placement;
      if (type.batch_dim && p.is_shard() && p.dim == *type.batch_dim) return static_cast<int>(a);
    }
  }
  return -1;
}

void ShardingModel::set_input_ratios(int axis, const std::vector<double>& ratios) {
  for (ir::ValueId in : graph_.inputs()) {
    Placement& p = leaf_choice_[static_cast<std::size_t>(axis)][static_cast<std::size_t>(in)].placement;
    const ir::TensorType& type = graph_.value(in).type;
    if (type.batch_dim && p.is_shard() && p.dim == *type.batch_dim) p.ratios = ratios;
  }
}

}  // namespace shardwise::search
