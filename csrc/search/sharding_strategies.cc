#include "search/sharding_strategies.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <utility>

#include "ops/distributed_kernels.h"
#include "ops/experts.h"
#include "ops/node_rule.h"
#include "ops/op_table.h"
#include "search/sharding_facts.h"
#include "search/sharding_options.h"
#include "support/error.h"

namespace shardwise::search {

namespace {

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

// The batch's uneven shares are the balance LP's alone (hetero_balance.h; the rewrite reads
// an uneven batch as those shares): a batch that does not divide is not split.
void drop_uneven_batch_splits(std::vector<Strategy>& strategies, const ir::Graph& graph, const ir::Node& node) {
  auto uneven_batch = [&](const std::vector<Placement>& placements, const std::vector<ir::ValueId>& values) {
    for (std::size_t i = 0; i < placements.size(); ++i) {
      const auto& batch_dim = graph.value(values[i]).type.batch_dim;
      if (!placements[i].ratios.empty() && batch_dim && placements[i].dim == *batch_dim) return true;
    }
    return false;
  };
  std::erase_if(strategies, [&](const Strategy& s) {
    return uneven_batch(s.inputs, node.inputs) || uneven_batch(s.outputs, node.outputs);
  });
}

// A linear op on floating values may carry partial sums through (strategy.h).
bool passes_partial_sums(const ir::Graph& graph, const ir::Node& node) {
  const ops::OpSpec* spec = ops::OpTable::builtin().find(node.op);
  bool floating = spec != nullptr && spec->linear && !node.inputs.empty();
  for (ir::ValueId v : node.inputs) floating = floating && ir::is_floating(graph.value(v).type.dtype);
  for (ir::ValueId v : node.outputs) floating = floating && ir::is_floating(graph.value(v).type.dtype);
  return floating;
}

// An axis that may not split the batch (ShardingModelOptions::batch_axes): no strategy splits
// the rule's batch index, the major factor of an operand's batch dim. (A split inside each
// row of a [b * s] dim, strided over the rows, splits the sequence: it stays.)
void drop_batch_splits(std::vector<Strategy>& strategies, const ir::Graph& graph, const ops::DimRule& full,
                       const ir::Node& node) {
  std::set<int> batch_indices;
  auto collect = [&](const std::vector<ops::OperandDims>& operands, const std::vector<ir::ValueId>& values) {
    for (std::size_t i = 0; i < operands.size() && i < values.size(); ++i) {
      const auto& batch_dim = graph.value(values[i]).type.batch_dim;
      if (batch_dim && static_cast<std::size_t>(*batch_dim) < operands[i].size() &&
          !operands[i][static_cast<std::size_t>(*batch_dim)].empty())
        batch_indices.insert(operands[i][static_cast<std::size_t>(*batch_dim)].front());
    }
  };
  collect(full.inputs, node.inputs);
  collect(full.outputs, node.outputs);
  // Ring attention (context parallelism) replicates the weights over its axis as a batch split
  // does, its gradients summed over the axis: data parallelism over tokens, kept off an axis
  // the user gave to the model (Megatron-LM's context-parallel ranks are data-parallel ones
  // for the weights).
  std::erase_if(strategies, [&](const Strategy& s) {
    return !s.partial && (batch_indices.contains(s.index) ||
                          (s.index >= 0 && full.indices.at(static_cast<std::size_t>(s.index)).ring));
  });
}

// A split the runtime has no distributed kernel for would run whole on gathered operands,
// not as priced (compute / n and the statistics' all-reduce): not offered
// (ops/distributed_kernels.h).
void drop_kernelless_splits(std::vector<Strategy>& strategies, const ops::DimRule& rule, const ir::Node& node,
                            bool ring_attention) {
  std::erase_if(strategies, [&](const Strategy& s) {
    if (s.partial || s.index < 0) return false;
    const ops::Index& index = rule.indices.at(static_cast<std::size_t>(s.index));
    if (index.kind != ops::IndexKind::Whole) return false;
    if (index.lookup) return !ops::lookup_kernel_ops().contains(node.op);
    if (index.ring) return !ring_attention || !ops::ring_kernel(node);
    if (index.statistics == 0) return false;
    const auto kernel = ops::statistics_kernel(node);
    // The vocabulary kernels take this rank's classes as one block (transform/spmd_rewrite.cc).
    return !kernel || (s.groups != 1 && kernel->starts_with("shardwise::vocab_"));
  });
}

// Which distributed kernel a strategy runs its node on (transform/spmd_rewrite.cc,
// decide_kernels): none (local), a lookup of its block of a table, or one that combines the
// ranks of its axis (statistics, ring attention, an experts' dispatch).
enum class KernelUse : std::uint8_t { None, Lookup, Combining };

KernelUse kernel_use(const Strategy& s, const ops::DimRule& rule) {
  if (s.partial || s.index < 0) return KernelUse::None;
  if (s.dispatch) return KernelUse::Combining;
  const ops::Index& index = rule.indices.at(static_cast<std::size_t>(s.index));
  if (index.kind != ops::IndexKind::Whole) return KernelUse::None;
  if (index.lookup) return KernelUse::Lookup;
  return index.ring || index.statistics > 0 ? KernelUse::Combining : KernelUse::None;
}

// The rewrite runs a node on one combining kernel over one axis: a second axis' statistics,
// ring or dispatch, or one beside a lookup, runs the node whole on gathered operands (a
// vocabulary-parallel loss split on both axes of a 2 x 2 mesh gathered its [tokens, vocab]
// logits to every rank, 32 MB, where it was priced as a 4-way split: benchmarks/fidelity.py,
// 2026-12-06). Not offered where another axis of the node already takes one (`others`).
void drop_second_kernel_splits(std::vector<Strategy>& strategies, const ops::DimRule& rule,
                               const std::vector<KernelUse>& others) {
  const bool combining = std::ranges::find(others, KernelUse::Combining) != others.end();
  const bool lookup = std::ranges::find(others, KernelUse::Lookup) != others.end();
  if (!combining && !lookup) return;
  std::erase_if(strategies, [&](const Strategy& s) {
    const KernelUse use = kernel_use(s, rule);
    return (use == KernelUse::Combining && (combining || lookup)) || (use == KernelUse::Lookup && combining);
  });
}

// Expert parallelism off (ShardingModelOptions::expert_parallel): no split of a mixture of
// experts' experts, the index its stacked expert weights carry in dim 0, alone or with its
// tokens (a dispatch).
void drop_expert_splits(std::vector<Strategy>& strategies, const ops::DimRule& rule, const ir::Node& node) {
  if (!ops::is_experts(node) || rule.inputs.size() < 4 || rule.inputs[3].empty() || rule.inputs[3][0].empty()) return;
  const int experts = rule.inputs[3][0].front();
  std::erase_if(strategies, [&](const Strategy& s) { return !s.partial && (s.index == experts || s.dispatch); });
}

// plan.expert: the experts split over the first axis and nothing else (ShardingModelOptions::
// experts_on_first_axis), their tokens dispatched to them by all-to-all where the axis splits
// both evenly (what the evaluator prices, cost/plan_cost.h), else gathered to every rank;
// refused by name where the axis cannot split them.
void keep_expert_splits(std::vector<Strategy>& strategies, const ops::DimRule& rule, const ir::Node& node, int ranks) {
  if (!ops::is_experts(node) || rule.inputs.size() < 4 || rule.inputs[3].empty() || rule.inputs[3][0].empty()) return;
  const int experts = rule.inputs[3][0].front();
  const bool dispatch = std::ranges::any_of(strategies, [](const Strategy& s) { return s.dispatch; });
  std::erase_if(strategies, [&](const Strategy& s) {
    return s.partial || (dispatch ? !s.dispatch : s.index != experts);
  });
  if (strategies.empty())
    throw support::ValidationError(fmt::format(
        "plan.expert: the {} experts of {} ({}) do not split over {} ranks; use expert 1", rule.indices.at(
            static_cast<std::size_t>(experts)).size, node.module_path.empty() ? std::string("the model") : node.module_path,
        node.op, ranks));
}

}  // namespace

std::vector<std::optional<ops::DimRule>> rules_at_batch(const ir::Graph& graph, double batch_scale) {
  const ops::OpTable& table = ops::OpTable::builtin();
  std::vector<std::optional<ops::DimRule>> rules(graph.nodes().size());
  for (const ir::Node& node : graph.nodes()) {
    try {
      rules[static_cast<std::size_t>(node.id)] = rule_at_batch(table, graph, node, batch_scale);
    } catch (const support::ValidationError&) {
      rules[static_cast<std::size_t>(node.id)] = std::nullopt;
    }
  }
  return rules;
}

StrategyOptions strided_sizes(const std::vector<std::optional<ops::DimRule>>& rules) {
  std::set<std::pair<std::int64_t, std::int64_t>> strided;
  for (const auto& rule : rules) {
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
  StrategyOptions out;
  out.strided.assign(strided.begin(), strided.end());
  return out;
}

Strategy replicate_strategy(const ir::Node& node) {
  Strategy s;
  s.inputs.assign(node.inputs.size(), Placement::replicate());
  s.input_grads.assign(node.inputs.size(), Placement::replicate());
  s.outputs.assign(node.outputs.size(), Placement::replicate());
  return s;
}

ops::DimRule StrategyEnumerator::rule_except(ir::NodeId node, int axis, bool outer_only) const {
  ops::DimRule rule = *facts_.rules[static_cast<std::size_t>(node)];
  const int axes = outer_only ? axis : static_cast<int>(options_.mesh.size());
  for (int b = 0; b < axes; ++b) {
    if (b == axis) continue;
    rule = local_rule(rule, decisions_.nodes[static_cast<std::size_t>(b)][static_cast<std::size_t>(node)],
                      options_.mesh[static_cast<std::size_t>(b)]);
  }
  return rule;
}

std::vector<Strategy> StrategyEnumerator::node_strategies(ir::NodeId node, int axis) const {
  const ir::Node& n = facts_.graph.node(node);
  const auto& rule = facts_.rules[static_cast<std::size_t>(node)];
  if (!rule) return {replicate_strategy(n)};
  const ops::DimRule layout = rule_except(node, axis, /*outer_only=*/true);
  auto strategies =
      enumerate_strategies(rule_except(node, axis), options_.mesh[static_cast<std::size_t>(axis)], facts_.strided,
                           &layout);
  // A rule with fewer operands than the node (optional operands the rule leaves out) cannot
  // place the rest: such a node runs replicated.
  for (const auto& s : strategies)
    if (s.inputs.size() != n.inputs.size() || s.outputs.size() != n.outputs.size()) return {replicate_strategy(n)};
  drop_uneven_batch_splits(strategies, facts_.graph, n);
  if (!options_.batch_axes.empty() && !options_.batch_axes.at(static_cast<std::size_t>(axis)))
    drop_batch_splits(strategies, facts_.graph, *rule, n);
  drop_kernelless_splits(strategies, *rule, n, options_.ring_attention);
  std::vector<KernelUse> others;
  for (std::size_t b = 0; b < options_.mesh.size(); ++b)
    if (static_cast<int>(b) != axis)
      others.push_back(kernel_use(decisions_.nodes[b][static_cast<std::size_t>(node)], *rule));
  drop_second_kernel_splits(strategies, *rule, others);
  if (!options_.expert_parallel || (axis == 0 && options_.experts_on_first_axis == false))
    drop_expert_splits(strategies, *rule, n);
  if (axis == 0 && options_.experts_on_first_axis == true) keep_expert_splits(strategies, *rule, n, options_.mesh[0]);
  if (passes_partial_sums(facts_.graph, n)) strategies.push_back(partial_strategy(*rule));
  return strategies;
}

bool StrategyEnumerator::leaf_placement_fits(ir::ValueId leaf, int axis, const Placement& want) const {
  if (!want.is_shard()) return true;
  const ir::TensorType& type = facts_.graph.value(leaf).type;
  if (want.dim < 0 || static_cast<std::size_t>(want.dim) >= type.shape.size()) return false;
  // The axes cut the dim in mesh order, outermost first, each its block of what the outer
  // ones left (local_shard.h): every even cut must divide what it cuts. A batch dim is cut
  // at the global batch the search plans for, not at the batch the graph was captured at.
  std::int64_t length = type.shape[static_cast<std::size_t>(want.dim)];
  if (type.batch_dim == want.dim)
    length = std::max<std::int64_t>(1, std::llround(static_cast<double>(length) * facts_.batch_scale));
  int cuts = 0;
  bool uneven = false;
  for (std::size_t b = 0; b < options_.mesh.size(); ++b) {
    const Placement& p =
        static_cast<int>(b) == axis ? want : decisions_.leaves[b][static_cast<std::size_t>(leaf)].placement;
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

// Choices of representative nodes and leaves: a node's strategies; a leaf whole, split as a
// reader wants it (where its other axes' blocks allow), or (ZeRO) whole with its optimizer
// state sharded.
AxisChoices StrategyEnumerator::axis_choices(int axis) const {
  const auto num_nodes = facts_.graph.nodes().size();
  const auto num_values = facts_.graph.values().size();
  const BlockFolding& folding = facts_.folding;
  AxisChoices out{std::vector<std::vector<Strategy>>(num_nodes), std::vector<std::vector<LeafChoice>>(num_values),
                  std::vector<double>(num_values, 0)};
  for (std::size_t u = 0; u < num_nodes; ++u)
    if (folding.represents_itself(u)) out.strategies[u] = node_strategies(static_cast<ir::NodeId>(u), axis);
  for (std::size_t v = 0; v < num_values; ++v)
    if (folding.rep_leaf[v] >= 0) out.leaf_instances[static_cast<std::size_t>(folding.rep_leaf[v])] += 1;
  for (const auto& [key, group] : facts_.edges) {
    if (!key.producer_is_leaf) continue;
    auto& choices = out.leaf_choices[static_cast<std::size_t>(key.producer)];
    if (choices.empty()) choices.push_back({Placement::replicate(), false});
    for (const Strategy& s : out.strategies[static_cast<std::size_t>(key.consumer)]) {
      const Placement& want = s.inputs[static_cast<std::size_t>(key.operand)];
      if (!want.is_shard() || !leaf_placement_fits(key.producer, axis, want)) continue;
      LeafChoice c{want, false};
      if (std::find(choices.begin(), choices.end(), c) == choices.end()) choices.push_back(c);
    }
  }
  for (std::size_t v = 0; v < num_values; ++v) {
    auto& choices = out.leaf_choices[v];
    const ir::Value& value = facts_.graph.value(static_cast<ir::ValueId>(v));
    if (choices.empty() || !options_.allow_zero || value.role != ir::ValueRole::Parameter || !facts_.requires_grad[v])
      continue;
    choices.push_back({Placement::replicate(), true});
  }
  return out;
}

}  // namespace shardwise::search
