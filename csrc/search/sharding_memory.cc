#include "search/sharding_memory.h"

#include <algorithm>
#include <map>

#include "analysis/saved_for_backward.h"
#include "cost/backward_working.h"
#include "cost/op_cost.h"
#include "search/block_folding.h"
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

std::vector<double> ShardingMemory::saved_by_node() const {
  const ir::Graph& graph = facts_.graph;
  const BlockFolding& folding = facts_.folding;
  // A value's readers may save it as they read it, gathered beyond its producer's share (a
  // sequence-parallel layer norm's output, flattened, then all-gathered for the projection that
  // saves it): each saved value is charged at the most any reader of it, or of a view of it
  // (saved views are charged to their root: analysis::saved_for_backward), holds.
  const std::vector<ir::ValueId> roots = analysis::view_roots(graph);
  std::vector<double> read_share(graph.values().size(), 0.0);
  for (const ir::Node& node : graph.nodes()) {
    const ir::NodeId rep = folding.rep_node[static_cast<std::size_t>(node.id)];
    for (std::size_t i = 0; i < node.inputs.size(); ++i) {
      double& most = read_share[static_cast<std::size_t>(roots[static_cast<std::size_t>(node.inputs[i])])];
      most = std::max(most, operand_share(rep, i, false));
    }
  }
  std::vector<double> saved(graph.nodes().size(), 0.0);
  for (const ir::Node& node : graph.nodes()) {
    const ir::NodeId rep = folding.rep_node[static_cast<std::size_t>(node.id)];
    const bool whole = folding.kept_whole(static_cast<std::size_t>(rep));
    double bytes = 0;
    for (std::size_t o = 0; o < node.outputs.size(); ++o) {
      const auto v = static_cast<std::size_t>(node.outputs[o]);
      const double kept = whole ? 1.0 : facts_.saved[v];
      if (kept > 0)
        bytes += kept * facts_.value_bytes(node.outputs[o]) * std::max(operand_share(rep, o, true), read_share[v]);
    }
    saved[static_cast<std::size_t>(node.id)] = (bytes + float8_weight_bytes(rep)) * options_.activation_memory_scale;
  }
  return saved;
}

StepPeak ShardingMemory::step_peak(double activation_scale) const {
  const ir::Graph& graph = facts_.graph;
  const BlockFolding& folding = facts_.folding;
  const std::size_t num_nodes = graph.nodes().size();
  std::vector<double> saved = saved_by_node(), working(num_nodes);
  std::vector<double> rebuilt(folding.checkpoint_of.size(), 0.0);  // per block: its recomputed set
  std::vector<std::size_t> first_of(folding.checkpoint_of.size(), num_nodes);
  StepPeak held;  // the forward's end
  for (std::size_t u = 0; u < num_nodes; ++u) {
    saved[u] *= activation_scale;
    // (A folded node's representative, instance 0's, comes before it in node order.)
    const auto rep = static_cast<std::size_t>(folding.rep_node[u]);
    working[u] = rep < u ? working[rep]
                         : activation_scale * node_backward_working_bytes(static_cast<ir::NodeId>(u)) *
                               options_.activation_memory_scale;
    const int block = folding.block_of.empty() ? -1 : folding.block_of[u];
    if (block >= 0) first_of[static_cast<std::size_t>(block)] = std::min(first_of[static_cast<std::size_t>(block)], u);
    if (folding.recomputed(u))
      rebuilt[static_cast<std::size_t>(block)] += saved[u];
    else
      held.saved += saved[u];
  }
  // A block's checkpoint, held from the forward until its backward ends; not again where a node
  // outside every recomputed block already keeps that tensor (the embedding's output, which
  // the first layer's norm saves).
  auto checkpoint_bytes = [&](int block) {
    const ir::ValueId v = options_.recompute == plan::Recompute::None || block < 0
                              ? -1
                              : folding.checkpoint_of[static_cast<std::size_t>(block)];
    if (v < 0) return 0.0;
    const std::optional<ir::NodeId> producer = graph.value(v).producer;
    if (producer && facts_.saved[static_cast<std::size_t>(v)] > 0 &&
        !folding.recomputed(static_cast<std::size_t>(*producer)))
      return 0.0;
    return activation_scale * facts_.value_bytes(v) * decisions_.held_all(v) * options_.activation_memory_scale;
  };
  for (std::size_t b = 0; b < folding.checkpoint_of.size(); ++b) held.saved += checkpoint_bytes(static_cast<int>(b));
  StepPeak peak = held;
  peak.casts = activation_scale * fp8_cast_bytes();
  std::vector<bool> has_gradient(graph.values().size(), false);
  int rebuilding = -1;  // the recomputed block whose backward runs
  for (std::size_t u = num_nodes; u-- > 0;) {
    const ir::Node& node = graph.node(static_cast<ir::NodeId>(u));
    const int block = folding.block_of.empty() ? -1 : folding.block_of[u];
    if (block != rebuilding && block >= 0 && folding.checkpointed(u)) {
      rebuilding = block;
      held.saved += rebuilt[static_cast<std::size_t>(block)];
    }
    for (ir::ValueId in : node.inputs) {
      const ir::Value& v = graph.value(in);
      if (v.role != ir::ValueRole::Parameter || has_gradient[static_cast<std::size_t>(in)]) continue;
      has_gradient[static_cast<std::size_t>(in)] = true;
      held.gradients += leaf_memory_by_kind(in, -1, {}).gradients;
    }
    StepPeak here = held;
    here.working = working[u];
    if (here.total() > peak.total()) peak = here;
    held.saved -= saved[u];
    if (block >= 0 && first_of[static_cast<std::size_t>(block)] == u) held.saved -= checkpoint_bytes(block);
  }
  StepPeak end;  // the optimizer's step: every gradient
  end.gradients = held.gradients;
  return end.total() > peak.total() ? end : peak;
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
