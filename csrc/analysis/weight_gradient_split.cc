#include "analysis/weight_gradient_split.h"

#include <algorithm>
#include <cstdint>
#include <string_view>

namespace shardwise::analysis {
namespace {

enum class GradientClass : std::uint8_t { Constant, Weight, Activation };

GradientClass leaf_class(const ir::Value& v) {
  switch (v.role) {
    case ir::ValueRole::Input: return GradientClass::Activation;
    case ir::ValueRole::Parameter: return GradientClass::Weight;
    default: return GradientClass::Constant;
  }
}

}  // namespace

WeightGradientSplit weight_gradient_split(const ir::Graph& stage) {
  std::vector<GradientClass> cls(stage.values().size(), GradientClass::Constant);
  for (const ir::Value& v : stage.values())
    if (!v.producer) cls[static_cast<std::size_t>(v.id)] = leaf_class(v);
  auto of = [&](ir::ValueId id) { return cls[static_cast<std::size_t>(id)]; };
  WeightGradientSplit out;
  for (const ir::Node& node : stage.nodes()) {
    if (node.op == "shardwise::send") {
      if (of(node.inputs[0]) == GradientClass::Weight) out.weight_outputs.push_back(stage.value(node.inputs[0]).name);
      continue;
    }
    // A received value is the stage's input: its gradient goes back to the stage before (B).
    GradientClass made = node.op == "shardwise::recv" ? GradientClass::Activation : GradientClass::Constant;
    for (ir::ValueId in : node.inputs) made = std::max(made, of(in));
    for (ir::ValueId o : node.outputs) cls[static_cast<std::size_t>(o)] = made;
    if (made != GradientClass::Activation || node.outputs.empty()) continue;
    WeightBoundary boundary{stage.value(node.outputs[0]).name, {}};
    for (std::size_t i = 0; i < node.inputs.size(); ++i)
      if (of(node.inputs[i]) == GradientClass::Weight) boundary.inputs.push_back(static_cast<int>(i));
    if (!boundary.inputs.empty()) out.boundaries.push_back(std::move(boundary));
  }
  for (ir::ValueId o : stage.outputs())
    if (of(o) == GradientClass::Weight) out.weight_outputs.push_back(stage.value(o).name);
  return out;
}

std::vector<std::int64_t> weight_gradient_held_bytes(const ir::Graph& graph) {
  std::vector<std::int64_t> out(graph.nodes().size(), 0);
  const WeightGradientSplit split = weight_gradient_split(graph);
  const auto users = graph.users_by_value();
  std::vector<bool> is_output(graph.values().size(), false);
  for (ir::ValueId o : graph.outputs()) is_output[static_cast<std::size_t>(o)] = true;
  std::vector<ir::NodeId> nodes;  // each boundary's node, in split.boundaries' order
  std::vector<bool> boundary_node(graph.nodes().size(), false);
  for (const WeightBoundary& b : split.boundaries) {
    nodes.push_back(*graph.value(*graph.find_value(b.node)).producer);
    boundary_node[static_cast<std::size_t>(nodes.back())] = true;
  }
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const WeightBoundary& b = split.boundaries[i];
    const ir::NodeId id = nodes[i];
    const ir::Node& node = graph.node(id);
    if (node.op == "aten::add.Tensor" && node.inputs.size() >= 2 && b.inputs.size() == 1) {
      // The operand that is not the weight value: its gradient is the add's output's.
      const ir::ValueId operand = node.inputs[b.inputs.front() == 0 ? 1 : 0];
      const ir::Value& a = graph.value(operand);
      const auto k = static_cast<std::size_t>(operand);
      const bool passed_on = a.producer && boundary_node[static_cast<std::size_t>(*a.producer)] &&
                             a.type.shape == graph.value(node.outputs[0]).type.shape && users[k].size() == 1 &&
                             !is_output[k];
      if (passed_on) continue;
    }
    for (ir::ValueId o : node.outputs) {
      const ir::Value& v = graph.value(o);
      const auto k = static_cast<std::size_t>(o);
      const bool read = !users[k].empty() || is_output[k];
      if (ir::is_floating(v.type.dtype) && read) out[static_cast<std::size_t>(id)] += v.type.bytes();
    }
  }
  return out;
}

}  // namespace shardwise::analysis
