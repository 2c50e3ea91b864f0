#include "transform/dead_code.h"

#include <string_view>
#include <utility>
#include <vector>

namespace shardwise::transform {

using ir::Graph;
using ir::NodeId;
using ir::ValueId;
using ir::ValueRole;

namespace {

// An in-place op on a leaf (aten's trailing underscore, as `num_batches_tracked += 1` on a
// buffer) updates the model's state: live though nothing reads its result. Capture has made
// every other write functional (python/shardwise/_functionalize.py).
bool updates_state(const Graph& graph, const ir::Node& node) {
  const std::string_view op(node.op);
  const std::string_view base = op.substr(0, op.find('.'));
  const bool in_place = base.size() > 2 && base.back() == '_' && base.substr(base.size() - 2) != "__";
  return in_place && !node.inputs.empty() && !graph.value(node.inputs[0]).producer;
}

}  // namespace

bool eliminate_dead_code(Graph& graph) {
  const auto& nodes = graph.nodes();
  std::vector<bool> live_value(graph.values().size(), false);
  for (ValueId out : graph.outputs()) live_value[static_cast<std::size_t>(out)] = true;

  // Nodes are in topological order, so one backward sweep settles liveness.
  std::vector<bool> live_node(nodes.size(), false);
  std::size_t dead = 0;
  for (std::size_t n = nodes.size(); n-- > 0;) {
    live_node[n] = updates_state(graph, nodes[n]);
    for (ValueId out : nodes[n].outputs) live_node[n] = live_node[n] || live_value[static_cast<std::size_t>(out)];
    if (!live_node[n]) {
      ++dead;
      continue;
    }
    for (ValueId in : nodes[n].inputs) live_value[static_cast<std::size_t>(in)] = true;
  }
  if (dead == 0) return false;

  // Rebuild in the old creation order (values by id, a node at its first output), so
  // the surviving values keep their relative order.
  Graph out;
  std::vector<ValueId> remap(graph.values().size(), -1);
  for (const ir::Value& v : graph.values()) {
    if (v.role != ValueRole::Activation) {
      remap[static_cast<std::size_t>(v.id)] = out.add_value(v.name, v.type, v.role);
      continue;
    }
    if (v.output_index != 0 || !live_node[static_cast<std::size_t>(*v.producer)]) continue;
    const ir::Node& node = graph.node(*v.producer);
    std::vector<ValueId> inputs;
    for (ValueId in : node.inputs) inputs.push_back(remap[static_cast<std::size_t>(in)]);
    std::vector<ir::OutputSpec> outputs;
    for (ValueId o : node.outputs) outputs.push_back({graph.value(o).name, graph.value(o).type});
    const NodeId id = out.add_node(node.op, std::move(inputs), std::move(outputs), node.attrs, node.module_path);
    for (std::size_t k = 0; k < node.outputs.size(); ++k) {
      remap[static_cast<std::size_t>(node.outputs[k])] = out.node(id).outputs[k];
    }
  }
  std::vector<ValueId> outputs;
  for (ValueId o : graph.outputs()) outputs.push_back(remap[static_cast<std::size_t>(o)]);
  out.set_outputs(std::move(outputs));
  graph = std::move(out);
  return true;
}

}  // namespace shardwise::transform
