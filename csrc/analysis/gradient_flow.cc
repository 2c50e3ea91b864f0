#include "analysis/gradient_flow.h"

namespace shardwise::analysis {

std::vector<bool> gradient_flow(const ir::Graph& graph) {
  std::vector<bool> flow(graph.values().size(), false);
  for (const ir::Value& value : graph.values())
    flow[static_cast<std::size_t>(value.id)] = value.role == ir::ValueRole::Parameter && ir::is_floating(value.type.dtype);
  for (const ir::Node& node : graph.nodes()) {  // nodes are in topological order
    bool any = false;
    for (ir::ValueId in : node.inputs) any = any || flow[static_cast<std::size_t>(in)];
    for (ir::ValueId out : node.outputs)
      flow[static_cast<std::size_t>(out)] = any && ir::is_floating(graph.value(out).type.dtype);
  }
  return flow;
}

std::vector<bool> operand_gradients(const ir::Node& node, const std::vector<bool>& flow) {
  std::vector<bool> out(node.inputs.size());
  for (std::size_t j = 0; j < node.inputs.size(); ++j) out[j] = flow[static_cast<std::size_t>(node.inputs[j])];
  return out;
}

bool partner_needs_gradient(const ir::Node& node, std::size_t operand, const std::vector<bool>& flow) {
  for (std::size_t j = 0; j < node.inputs.size(); ++j)
    if (j != operand && flow[static_cast<std::size_t>(node.inputs[j])]) return true;
  return false;
}

}  // namespace shardwise::analysis
