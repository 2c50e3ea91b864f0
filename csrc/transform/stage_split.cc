#include "transform/stage_split.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "support/error.h"

namespace shardwise::transform {

std::vector<ir::Graph> split_stages_of(const ir::Graph& graph, const std::vector<std::set<int>>& stages_of_node,
                                       int stages) {
  const auto& nodes = graph.nodes();
  // Per value: the stage that makes it (a node on one stage) and the stages that read it.
  const std::size_t count = graph.values().size();
  std::vector<int> made(count, -1), last_read(count, -1);
  std::vector<std::set<int>> read(count);
  for (const ir::Node& node : nodes) {
    const std::set<int>& here = stages_of_node[static_cast<std::size_t>(node.id)];
    for (ir::ValueId in : node.inputs) read[static_cast<std::size_t>(in)].insert(here.begin(), here.end());
    if (here.size() == 1)
      for (ir::ValueId out : node.outputs) made[static_cast<std::size_t>(out)] = *here.begin();
  }
  for (ir::ValueId out : graph.outputs()) read[static_cast<std::size_t>(out)].insert(stages - 1);
  for (std::size_t v = 0; v < count; ++v) last_read[v] = read[v].empty() ? -1 : *read[v].rbegin();
  auto received_at = [&](int g) {
    std::vector<ir::ValueId> values;
    for (const ir::Value& v : graph.values()) {
      const auto id = static_cast<std::size_t>(v.id);
      if (v.producer && made[id] >= 0 && made[id] < g && last_read[id] >= g) values.push_back(v.id);
    }
    return values;
  };

  std::vector<ir::Graph> out(static_cast<std::size_t>(stages));
  for (int g = 0; g < stages; ++g) {
    ir::Graph& stage = out[static_cast<std::size_t>(g)];
    std::vector<ir::ValueId> local(count, -1);
    for (const ir::Value& v : graph.values())
      if (!v.producer && read[static_cast<std::size_t>(v.id)].contains(g))
        local[static_cast<std::size_t>(v.id)] = stage.add_value(v.name, v.type, v.role);
    for (ir::ValueId id : received_at(g)) {
      const ir::Value& v = graph.value(id);
      const ir::NodeId recv = stage.add_node("shardwise::recv", {}, {{v.name, v.type}},
                                             {{"from", std::int64_t{g - 1}}, {"stage", std::int64_t{g}}},
                                             graph.node(*v.producer).module_path);
      local[static_cast<std::size_t>(id)] = stage.node(recv).outputs[0];
    }
    for (const ir::Node& node : nodes) {
      if (!stages_of_node[static_cast<std::size_t>(node.id)].contains(g)) continue;
      std::vector<ir::ValueId> inputs;
      for (ir::ValueId in : node.inputs) inputs.push_back(local[static_cast<std::size_t>(in)]);
      std::vector<ir::OutputSpec> outputs;
      for (ir::ValueId o : node.outputs) outputs.push_back({graph.value(o).name, graph.value(o).type});
      const ir::NodeId id = stage.add_node(node.op, inputs, outputs, node.attrs, node.module_path);
      for (std::size_t o = 0; o < node.outputs.size(); ++o)
        local[static_cast<std::size_t>(node.outputs[o])] = stage.node(id).outputs[o];
    }
    if (g + 1 < stages) {
      for (ir::ValueId id : received_at(g + 1))
        stage.add_node("shardwise::send", {local[static_cast<std::size_t>(id)]}, {},
                       {{"to", std::int64_t{g + 1}}, {"stage", std::int64_t{g}}}, "");
    } else {
      std::vector<ir::ValueId> results;
      for (ir::ValueId o : graph.outputs()) results.push_back(local[static_cast<std::size_t>(o)]);
      stage.set_outputs(results);
    }
  }
  return out;
}

std::vector<ir::Graph> split_stages(const ir::Graph& graph, const std::vector<int>& stage_of_node, int stages) {
  using support::ValidationError;
  const auto& nodes = graph.nodes();
  if (stage_of_node.size() != nodes.size())
    throw ValidationError(fmt::format("split_stages: {} stage entries for {} nodes", stage_of_node.size(), nodes.size()));
  for (std::size_t n = 0; n < nodes.size(); ++n) {
    const int s = stage_of_node[n];
    if (s < 0 || s >= stages)
      throw ValidationError(fmt::format("split_stages: node {} ({}) in stage {} of {}", n, nodes[n].op, s, stages));
    if (n > 0 && s < stage_of_node[n - 1])
      throw ValidationError(fmt::format("split_stages: node {} ({}) in stage {} after a node in stage {}: stages "
                                        "must follow the node order",
                                        n, nodes[n].op, s, stage_of_node[n - 1]));
  }
  std::vector<std::set<int>> of;
  for (int stage : stage_of_node) of.push_back({stage});
  return split_stages_of(graph, of, stages);
}

}  // namespace shardwise::transform
