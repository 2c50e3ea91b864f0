#include "analysis/batch_dim.h"

#include <algorithm>
#include <optional>

#include "ops/node_rule.h"

namespace shardwise::analysis {

bool propagate_batch_dim(const ops::OpTable& table, ir::Graph& graph) {
  bool changed = false;
  for (std::size_t n = 0; n < graph.nodes().size(); ++n) {
    const ir::Node& node = graph.nodes()[n];
    const bool any_batch = std::any_of(node.inputs.begin(), node.inputs.end(),
                                       [&](ir::ValueId id) { return graph.value(id).type.batch_dim.has_value(); });
    if (!any_batch) continue;
    const auto rule = ops::dim_rule_for(table, graph, node);
    if (!rule) continue;
    std::optional<int> batch_index;
    for (std::size_t i = 0; i < node.inputs.size() && !batch_index; ++i) {
      const auto& batch_dim = graph.value(node.inputs[i]).type.batch_dim;
      if (!batch_dim || *batch_dim < 0 || static_cast<std::size_t>(*batch_dim) >= rule->inputs[i].size()) continue;
      const auto& dims = rule->inputs[i][static_cast<std::size_t>(*batch_dim)];
      if (!dims.empty()) batch_index = dims.front();
    }
    if (!batch_index) continue;
    for (std::size_t o = 0; o < node.outputs.size(); ++o) {
      auto& type = graph.mutable_type(node.outputs[o]);
      if (type.batch_dim) continue;
      const auto& output = rule->outputs[o];
      for (std::size_t d = 0; d < output.size(); ++d) {
        if (!output[d].empty() && output[d].front() == *batch_index) {
          type.batch_dim = static_cast<int>(d);
          changed = true;
          break;
        }
      }
    }
  }
  return changed;
}

std::int64_t input_batch(const ir::Graph& graph) {
  for (ir::ValueId in : graph.inputs()) {
    const ir::TensorType& type = graph.value(in).type;
    if (type.batch_dim.has_value()) return type.shape[static_cast<std::size_t>(*type.batch_dim)];
  }
  return 0;
}

}  // namespace shardwise::analysis
