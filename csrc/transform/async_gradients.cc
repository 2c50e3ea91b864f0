#include "transform/async_gradients.h"

#include <algorithm>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "search/parameter_collectives.h"
#include "transform/rank_graph.h"

namespace shardwise::transform {
namespace {

constexpr std::string_view kAsyncGradientAttr = "shardwise.async_gradient";
constexpr std::string_view kWholeAttr = "shardwise.whole";

// The region gives `value` as it was before any step: a floating parameter of the graph
// (what has a gradient of its own, the weight whose product hides the all-reduce).
bool trainable_parameter(const ir::Graph& graph, ir::ValueId value) {
  const ir::Value& source = graph.value(region_ending_at(graph, value).source);
  return !source.producer && source.role == ir::ValueRole::Parameter && ir::is_floating(source.type.dtype);
}

// The region's steps are no forward step and one exposed all-reduce (sum) backward.
bool one_exposed_all_reduce(const ir::Graph& graph, const StepRegion& region) {
  if (!region.forward.empty() || region.backward.size() != 1) return false;
  const ir::Node& step = graph.node(region.backward[0]);
  const std::string* mark = step_overlap(step);
  const ReshardAction action = step_action(step);
  return action.kind == ReshardKind::AllReduce && action.reduce == "sum" && mark != nullptr &&
         *mark == search::parameter_overlap_name(search::ParameterOverlap::Exposed);
}

// `reader` reads `region`'s value once, and nothing else reads it or the value it starts at.
bool only_read(const ir::Graph& graph, const std::vector<std::vector<ir::NodeId>>& users, const ir::Node& reader,
               const StepRegion& region) {
  const auto& first = users[static_cast<std::size_t>(region.source)];
  const ir::ValueId end = region_end(graph, region);
  const auto& last = users[static_cast<std::size_t>(end)];
  const auto reads = std::count(reader.inputs.begin(), reader.inputs.end(), end);
  return first.size() == 1 && last.size() == 1 && last[0] == reader.id && reads == 1;
}

}  // namespace

void overlap_activation_gradients(ir::Graph& rank_graph) {
  const std::vector<std::vector<ir::NodeId>> users = rank_graph.users_by_value();
  for (const ir::Node& node : rank_graph.nodes()) {
    if (node.outputs.empty() || node.op.starts_with("shardwise::") || node.attrs.contains(std::string(kWholeAttr)))
      continue;
    std::vector<bool> trainable;  // of every operand, made at the node's first candidate
    for (std::size_t i = 0; i < node.inputs.size(); ++i) {
      const StepRegion region = region_ending_at(rank_graph, node.inputs[i]);
      if (rank_graph.value(region.source).role == ir::ValueRole::Parameter ||
          !one_exposed_all_reduce(rank_graph, region))
        continue;
      if (trainable.empty())
        for (ir::ValueId in : node.inputs) trainable.push_back(trainable_parameter(rank_graph, in));
      // The search's rule (parameter_collectives.h), so the price and the program agree.
      if (search::activation_gradient_overlap(node.op, i, true, only_read(rank_graph, users, node, region),
                                              trainable) != search::ParameterOverlap::BesideBackward)
        continue;
      rank_graph.mutable_attrs(node.id)[std::string(kAsyncGradientAttr)] = static_cast<std::int64_t>(i);
      rank_graph.mutable_attrs(region.backward[0])["overlap"] =
          std::string(search::parameter_overlap_name(search::ParameterOverlap::BesideBackward));
    }
  }
}

std::int64_t async_gradient_operand(const ir::Node& node) {
  auto it = node.attrs.find(std::string(kAsyncGradientAttr));
  if (it == node.attrs.end()) return -1;
  return std::get<std::int64_t>(it->second);
}

}  // namespace shardwise::transform
