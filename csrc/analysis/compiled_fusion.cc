#include "analysis/compiled_fusion.h"

#include <algorithm>
#include <array>
#include <string_view>

#include "ops/op_table.h"

namespace shardwise::analysis {
namespace {

// Zero-FLOP ops that return a view of their input: no data moves.
constexpr std::array<std::string_view, 19> kAliasOps = {
    "aten::view",   "aten::reshape", "aten::_unsafe_view", "aten::alias",     "aten::transpose",
    "aten::permute", "aten::t",      "aten::unsqueeze",    "aten::squeeze",   "aten::expand",
    "aten::split",  "aten::split_with_sizes", "aten::slice", "aten::select",  "aten::unbind",
    "aten::detach", "aten::as_strided", "aten::chunk",     "aten::narrow"};

}  // namespace

bool is_alias(const ir::Graph& graph, const ir::Node& node) {
  std::string_view base = ops::op_base_name(node.op);
  if (std::find(kAliasOps.begin(), kAliasOps.end(), base) != kAliasOps.end()) return true;
  // `to` without a dtype change returns its input (copy=false).
  if (base == "aten::to" && !node.inputs.empty() && !node.outputs.empty()) {
    return graph.value(node.inputs[0]).type.dtype == graph.value(node.outputs[0]).type.dtype;
  }
  return false;
}

std::size_t FusedValues::count() const {
  return static_cast<std::size_t>(std::count(in_registers_.begin(), in_registers_.end(), true));
}

bool fusible_under_compile(const ir::Node& node) {
  const ops::OpSpec* spec = ops::OpTable::builtin().find(node.op);
  if (spec == nullptr) return false;  // an op the table does not know: its own kernel
  switch (spec->flops.kind) {
    case ops::FlopsKind::Zero:
    case ops::FlopsKind::PerOutputElement:
    case ops::FlopsKind::PerInputElement:
      return true;
    default:
      return false;  // products and attention: library kernels
  }
}

FusedValues compiled_fusion(const ir::Graph& graph) {
  const auto& nodes = graph.nodes();
  const auto& values = graph.values();
  const auto users = graph.users_by_value();
  // Levels, in node order (a node comes after its operands' producers), and the level of the
  // kernel that made each value: a fusible node's output at its own level, a view's its input's.
  std::vector<int> level(nodes.size(), 0), made_at(values.size(), -1);
  std::vector<bool> fusible(nodes.size()), alias(nodes.size());
  for (const ir::Node& node : nodes) {
    const auto n = static_cast<std::size_t>(node.id);
    fusible[n] = fusible_under_compile(node);
    alias[n] = is_alias(graph, node);
    for (ir::ValueId input : node.inputs) {
      const ir::Value& value = graph.value(input);
      if (!value.producer.has_value()) continue;
      const auto p = static_cast<std::size_t>(*value.producer);
      level[n] = std::max(level[n], level[p] + (fusible[p] ? 0 : 1));
    }
    if (!fusible[n]) continue;
    for (ir::ValueId output : node.outputs) {
      made_at[static_cast<std::size_t>(output)] =
          !alias[n] ? level[n] : (node.inputs.empty() ? -1 : made_at[static_cast<std::size_t>(node.inputs[0])]);
    }
  }
  std::vector<int> node_level(nodes.size(), -2);
  for (std::size_t n = 0; n < nodes.size(); ++n) {
    if (fusible[n]) node_level[n] = level[n];
  }
  const FusedValues reads({}, made_at, node_level);
  // In memory: a graph output, or read from memory by some reader, directly or through a view
  // that is itself in memory. A reader's outputs come after the value: one pass from the last.
  std::vector<bool> in_memory(values.size(), false);
  for (ir::ValueId id : graph.outputs()) in_memory[static_cast<std::size_t>(id)] = true;
  for (auto v = values.size(); v-- > 0;) {
    if (users[v].empty() || made_at[v] < 0) in_memory[v] = true;
    for (ir::NodeId r : users[v]) {
      const ir::Node& reader = nodes[static_cast<std::size_t>(r)];
      const bool view_in_memory = alias[static_cast<std::size_t>(r)] && !reader.outputs.empty() &&
                                  in_memory[static_cast<std::size_t>(reader.outputs[0])];
      if (reads.read_from_memory(static_cast<ir::ValueId>(v), r) || view_in_memory) in_memory[v] = true;
    }
  }
  std::vector<bool> in_registers(values.size(), false);
  for (std::size_t v = 0; v < values.size(); ++v) {
    in_registers[v] = values[v].role == ir::ValueRole::Activation && !in_memory[v];
  }
  return FusedValues(std::move(in_registers), std::move(made_at), std::move(node_level));
}

std::vector<std::int64_t> compiled_saved_bytes(const ir::Graph& graph, const std::vector<std::int64_t>& eager,
                                               const FusedValues& fused) {
  std::vector<std::int64_t> out = eager;
  auto base = [&](ir::ValueId v) {  // a view's bytes are its base's
    for (;;) {
      const ir::Value& value = graph.value(v);
      if (!value.producer.has_value()) return v;
      const ir::Node& producer = graph.node(*value.producer);
      if (!is_alias(graph, producer) || producer.inputs.empty()) return v;
      v = producer.inputs[0];
    }
  };
  auto keep = [&](ir::ValueId v) {
    const ir::Value& value = graph.value(base(v));
    const auto b = static_cast<std::size_t>(value.id);
    const bool activation = value.role == ir::ValueRole::Activation || value.role == ir::ValueRole::Input;
    if (activation && out[b] == 0) out[b] = value.type.bytes();
  };
  std::vector<bool> visited(graph.values().size(), false);
  // The kernel inputs behind a value in registers: through every value in registers back to
  // the first ones that cross memory.
  auto keep_kernel_inputs = [&](ir::ValueId start) {
    std::vector<ir::ValueId> stack = {start};
    while (!stack.empty()) {
      const ir::ValueId v = stack.back();
      stack.pop_back();
      if (visited[static_cast<std::size_t>(v)]) continue;
      visited[static_cast<std::size_t>(v)] = true;
      const ir::Value& value = graph.value(v);
      if (!value.producer.has_value()) continue;
      for (ir::ValueId in : graph.node(*value.producer).inputs) {
        if (fused.in_registers(in)) stack.push_back(in);
        else keep(in);
      }
    }
  };
  for (const ir::Value& value : graph.values()) {
    const auto v = static_cast<std::size_t>(value.id);
    if (eager[v] == 0 || !fused.in_registers(value.id)) continue;
    out[v] = 0;
    keep_kernel_inputs(value.id);
  }
  return out;
}

}  // namespace shardwise::analysis
