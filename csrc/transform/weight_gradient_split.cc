#include "transform/weight_gradient_split.h"

#include <algorithm>
#include <cstdint>
#include <string_view>
#include <variant>

namespace shardwise::transform {
namespace {

constexpr std::string_view kWeightCutAttr = "shardwise.weight_cut";
constexpr std::string_view kWeightOutputAttr = "shardwise.weight_output";

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

void mark_weight_cuts(ir::Graph& stage_rank_graph) {
  const WeightGradientSplit split = weight_gradient_split(stage_rank_graph);
  for (const WeightBoundary& boundary : split.boundaries) {
    const ir::NodeId node = *stage_rank_graph.value(*stage_rank_graph.find_value(boundary.node)).producer;
    stage_rank_graph.mutable_attrs(node)[std::string(kWeightCutAttr)] =
        std::vector<std::int64_t>(boundary.inputs.begin(), boundary.inputs.end());
  }
  for (const ir::Node& node : stage_rank_graph.nodes())
    if (node.op == "shardwise::send" &&
        std::ranges::find(split.weight_outputs, stage_rank_graph.value(node.inputs[0]).name) !=
            split.weight_outputs.end())
      stage_rank_graph.mutable_attrs(node.id)[std::string(kWeightOutputAttr)] = true;
}

bool sends_weight_output(const ir::Node& node) {
  return node.op == "shardwise::send" && node.attrs.contains(std::string(kWeightOutputAttr));
}

std::vector<std::int64_t> weight_cut_operands(const ir::Node& node) {
  auto it = node.attrs.find(std::string(kWeightCutAttr));
  if (it == node.attrs.end()) return {};
  return std::get<std::vector<std::int64_t>>(it->second);
}

}  // namespace shardwise::transform
