#include "transform/weight_gradient_split.h"

#include <algorithm>
#include <string>
#include <string_view>
#include <variant>

namespace shardwise::transform {
namespace {

constexpr std::string_view kWeightCutAttr = "shardwise.weight_cut";
constexpr std::string_view kWeightOutputAttr = "shardwise.weight_output";

}  // namespace

using analysis::WeightBoundary;
using analysis::WeightGradientSplit;
using analysis::weight_gradient_split;

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
