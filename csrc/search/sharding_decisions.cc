#include "search/sharding_decisions.h"

#include <algorithm>
#include <utility>

#include "search/sharding_strategies.h"

namespace shardwise::search {

ShardingDecisions::ShardingDecisions(const ir::Graph& graph, std::vector<int> mesh)
    : graph(&graph), mesh(std::move(mesh)) {
  const auto axes = this->mesh.size();
  nodes.assign(axes, {});
  leaves.assign(axes, std::vector<LeafChoice>(graph.values().size()));
  for (auto& choices : nodes)
    for (const ir::Node& node : graph.nodes()) choices.push_back(replicate_strategy(node));
}

Placement ShardingDecisions::value_placement(int axis, ir::ValueId value) const {
  const ir::Value& v = graph->value(value);
  const auto a = static_cast<std::size_t>(axis);
  if (!v.producer.has_value()) return leaves[a][static_cast<std::size_t>(value)].placement;
  return nodes[a][static_cast<std::size_t>(*v.producer)].outputs[static_cast<std::size_t>(v.output_index)];
}

double ShardingDecisions::held_except(ir::ValueId value, int axis, int first_axis) const {
  double held = 1;
  for (int b = std::max(0, first_axis); b < static_cast<int>(mesh.size()); ++b)
    if (b != axis) held *= held_fraction(value_placement(b, value), axis_size(b));
  return held;
}

}  // namespace shardwise::search
