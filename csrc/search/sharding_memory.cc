#include "search/sharding_memory.h"

#include <algorithm>
#include <map>

#include "cost/backward_working.h"
#include "cost/op_cost.h"
#include "search/sharding_facts.h"
#include "search/sharding_options.h"

namespace shardwise::search {

namespace {

bool is_leaf(const ir::Value& value) { return !value.producer.has_value(); }

}  // namespace

double ShardingMemory::node_memory(ir::NodeId node, int axis, const Strategy& choice) const {
  return output_memory(node, axis, choice, facts_.folding.kept_whole(static_cast<std::size_t>(node)));
}

double ShardingMemory::output_memory(ir::NodeId node, int axis, const Strategy& choice, bool whole) const {
  const ir::Node& n = facts_.graph.node(node);
  double bytes = 0;
  for (std::size_t o = 0; o < n.outputs.size(); ++o) {
    const double saved = whole ? 1.0 : facts_.saved[static_cast<std::size_t>(n.outputs[o])];
    if (saved <= 0) continue;
    double held = held_fraction(choice.outputs[o], options_.mesh[static_cast<std::size_t>(axis)]);
    bytes += saved * facts_.value_bytes(n.outputs[o]) * decisions_.held_except(n.outputs[o], axis) * held;
  }
  return bytes * options_.activation_memory_scale;
}

LeafShares ShardingMemory::leaf_held(ir::ValueId leaf, int axis, const LeafChoice& choice) const {
  double held = 1, state_held = 1;
  for (int b = 0; b < static_cast<int>(options_.mesh.size()); ++b) {
    const auto size = options_.mesh[static_cast<std::size_t>(b)];
    const LeafChoice& c = decisions_.leaf_on(b, leaf, axis, choice);
    const double h = held_fraction(c.placement, size);
    held *= h;
    state_held *= c.zero ? h / size : h;
  }
  return {held, state_held};
}

double ShardingMemory::leaf_memory(ir::ValueId leaf, int axis, const LeafChoice& choice) const {
  return leaf_memory_by_kind(leaf, axis, choice).total();
}

cost::ModelStateBytes ShardingMemory::leaf_memory_by_kind(ir::ValueId leaf, int axis, const LeafChoice& choice) const {
  const ir::Value& v = facts_.graph.value(leaf);
  if (v.role == ir::ValueRole::Input) return {};
  const auto [held, state_held] = leaf_held(leaf, axis, choice);
  const double numel = static_cast<double>(v.type.numel());
  const double scale = options_.parameter_memory_scale;
  if (v.role != ir::ValueRole::Parameter || !facts_.requires_grad[static_cast<std::size_t>(leaf)])
    return {.weights = facts_.value_bytes(leaf) * held * scale};
  const cost::MemoryConstants& m = facts_.memory;
  // ZeRO shards the optimizer state only: the runtime all-reduces a ZeRO parameter's gradient
  // whole to every rank, and its owner steps it (runtime/optim.py: ZeRO-1). A gradient is as
  // sharded as its weight.
  return {.weights = numel * m.weight_bytes * held * scale,
          .gradients = numel * m.gradient_bytes * held * scale,
          .optimizer = numel * m.optimizer_bytes * state_held * scale};
}

cost::ModelStateBytes ShardingMemory::parameter_bytes_by_kind() const {
  cost::ModelStateBytes bytes;
  for (const ir::Value& v : facts_.graph.values()) {
    if (!is_leaf(v)) continue;
    const cost::ModelStateBytes leaf = leaf_memory_by_kind(v.id, -1, {});
    bytes.weights += leaf.weights;
    bytes.gradients += leaf.gradients;
    bytes.optimizer += leaf.optimizer;
  }
  return bytes;
}

double ShardingMemory::recompute_checkpoint_bytes() const {
  if (options_.recompute == plan::Recompute::None) return 0;
  double bytes = 0;
  for (ir::ValueId v : facts_.folding.block_inputs) bytes += facts_.value_bytes(v) * decisions_.held_all(v);
  return bytes * options_.activation_memory_scale;
}

double ShardingMemory::activation_bytes() const {
  double bytes = 0;
  for (const ir::Node& node : facts_.graph.nodes()) {
    const auto u = static_cast<std::size_t>(node.id);
    if (!facts_.folding.represents_itself(u)) continue;
    const double count = facts_.folding.recomputed(u) ? 1.0 : facts_.folding.instances[u];
    bytes += count * (node_memory(node.id, 0, decisions_.nodes[0][u]) +
                      float8_weight_bytes(node.id) * options_.activation_memory_scale);
  }
  return bytes + recompute_checkpoint_bytes();
}

double ShardingMemory::float8_weight_bytes(ir::NodeId id) const {
  if (facts_.fp8_linears.empty()) return 0;
  const auto& linear = facts_.fp8_linears[static_cast<std::size_t>(id)];
  if (!linear) return 0;
  const ir::Node& node = facts_.graph.node(id);
  const ir::ValueId weight = node.inputs[linear->weight];
  // (Only where backward reads W: x takes a gradient.)
  if (facts_.graph.value(weight).role != ir::ValueRole::Parameter ||
      !facts_.requires_grad[static_cast<std::size_t>(node.inputs[linear->input])])
    return 0;
  const double read = operand_share(id, linear->weight, false);
  return read > decisions_.held_all(weight) ? facts_.value_elements(weight) * read : 0.0;
}

double ShardingMemory::operand_share(ir::NodeId node, std::size_t index, bool output) const {
  const auto u = static_cast<std::size_t>(node);
  double held = 1;
  for (std::size_t a = 0; a < options_.mesh.size(); ++a) {
    const Strategy& s = decisions_.nodes[a][u];
    held *= held_fraction(output ? s.outputs[index] : s.inputs[index], options_.mesh[a]);
  }
  return held;
}

double ShardingMemory::node_backward_working_bytes(ir::NodeId id) const {
  static const std::optional<analysis::Fp8Linear> none;
  const auto& linear = facts_.fp8_linears.empty() ? none : facts_.fp8_linears[static_cast<std::size_t>(id)];
  // Each operand's gradient as this rank holds it: its share over every axis, as the node's
  // strategy on each axis places that operand.
  return cost::node_backward_working_bytes(
      facts_.graph, facts_.graph.node(id), facts_.requires_grad, linear,
      [&](ir::ValueId v, std::size_t i, bool output) { return facts_.value_bytes(v) * operand_share(id, i, output); },
      [&](ir::ValueId v, std::size_t i, bool output) {
        return facts_.value_elements(v) * operand_share(id, i, output);
      });
}

double ShardingMemory::backward_working_bytes() const {
  double peak = 0;
  for (const ir::Node& node : facts_.graph.nodes())
    if (facts_.folding.represents_itself(static_cast<std::size_t>(node.id)))
      peak = std::max(peak, node_backward_working_bytes(node.id));
  return peak * options_.activation_memory_scale;
}

double ShardingMemory::gathered_parameter_bytes() const {
  // The two largest units' weights readers gather beyond the rank's stored share: a unit's
  // gathers are one flattened all-gather, its weights released after their reads (and
  // gathered again for backward, the unit at once), while the next unit is prefetched
  // (search/parameter_collectives.h), so the peak is two units', not the sum of all.
  std::map<int, double> by_unit;
  for (const auto& [key, group] : facts_.edges) {
    const ir::Value& value = facts_.graph.value(group.value);
    if (value.role != ir::ValueRole::Parameter) continue;
    double wanted = 1;
    for (std::size_t a = 0; a < options_.mesh.size(); ++a) {
      const Strategy& reader = decisions_.nodes[a][static_cast<std::size_t>(key.consumer)];
      wanted *= held_fraction(reader.inputs[static_cast<std::size_t>(key.operand)], options_.mesh[a]);
    }
    by_unit[facts_.units.of_node[static_cast<std::size_t>(key.consumer)]] +=
        facts_.value_bytes(group.value) * (wanted - decisions_.held_all(group.value));
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

double ShardingMemory::fp8_cast_bytes() const {
  if (facts_.fp8_linears.empty()) return 0;
  double peak = 0;
  for (const ir::Node& node : facts_.graph.nodes()) {
    const auto& linear = facts_.fp8_linears[static_cast<std::size_t>(node.id)];
    if (!linear) continue;
    auto elements = [&](std::size_t operand) {
      return facts_.value_elements(node.inputs[operand]) * operand_share(node.id, operand, false);
    };
    peak = std::max(peak, cost::fp8_cast_transient_bytes(elements(linear->input), elements(linear->weight)));
  }
  return peak;
}


}  // namespace shardwise::search
