#include "ops/experts.h"

#include "ops/op_table.h"

namespace shardwise::ops {

bool is_experts_op(std::string_view op) { return op_base_name(op) == "shardwise_moe::experts"; }

bool is_experts(const ir::Node& node) { return is_experts_op(node.op) && node.inputs.size() >= 5; }

double routed_bytes(const ir::Graph& graph, const ir::Node& node, double token_share) {
  const ir::TensorType& hidden = graph.value(node.inputs.at(0)).type;
  const auto& routing = graph.value(node.inputs.at(1)).type.shape;  // top-k index [t, K]
  if (hidden.shape.empty() || routing.size() != 2) return 0;
  const double rows = static_cast<double>(routing[0]) * token_share * static_cast<double>(routing[1]);
  return rows * (static_cast<double>(hidden.shape.back() * ir::dtype_bytes(hidden.dtype)) + 16.0);
}

bool is_expert_weight(const ir::Node& node, std::size_t input) {
  return is_experts(node) && (input == 3 || input == 4);
}

std::int64_t expert_count(const ir::Graph& graph, const ir::Node& node) {
  if (!is_experts(node)) return 0;
  const auto& shape = graph.value(node.inputs[3]).type.shape;
  return shape.empty() ? 0 : shape.front();
}

void mark_dispatch(DimRule& rule) {
  if (rule.inputs.size() < 4 || rule.inputs[0].empty() || rule.inputs[0][0].size() != 1 || rule.inputs[3].empty() ||
      rule.inputs[3][0].size() != 1)
    return;
  const int tokens = rule.inputs[0][0].front(), experts = rule.inputs[3][0].front();
  if (tokens != experts) rule.indices.at(static_cast<std::size_t>(tokens)).dispatch = experts;
}

}  // namespace shardwise::ops
