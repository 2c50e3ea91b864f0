#include "analysis/flops.h"

#include <algorithm>
#include <set>

#include "ops/node_rule.h"

namespace shardwise::analysis {
namespace {

std::int64_t numel(const ir::Graph& graph, ir::ValueId id) { return graph.value(id).type.numel(); }

std::set<int> indices_of(const ops::OperandDims& operand) {
  std::set<int> out;
  for (const auto& dims : operand) out.insert(dims.begin(), dims.end());
  return out;
}

// 2 x every index size; an added term (a bias, an accumulator: DimRule::added) is added once
// per output element.
NodeFlops contraction(const ops::DimRule& rule, const ir::Graph& graph, const ir::Node& node) {
  NodeFlops out;
  std::int64_t product = 1;
  bool any_reduced = false;
  for (const auto& index : rule.indices) {
    product *= index.size;
    any_reduced |= index.kind == ops::IndexKind::Reduced;
  }
  out.matmul = 2 * product;
  out.total = out.matmul;
  if (any_reduced && !node.outputs.empty()) {
    for (std::size_t input = 0; input < rule.inputs.size(); ++input)
      if (rule.is_added(input)) out.total += numel(graph, node.outputs[0]);
  }
  return out;
}

// Per output element, each output channel reads weight-elements-per-channel inputs; a
// transposed convolution is the same per input element. Counting both ways and keeping the
// smaller avoids counting the zeros a stride inserts.
NodeFlops convolution(const ops::DimRule& rule, const ir::Graph& graph, const ir::Node& node) {
  auto product_missing_from = [&](const ops::OperandDims& weight, const ops::OperandDims& other) {
    const auto present = indices_of(other);
    std::int64_t product = 1;
    for (int id : indices_of(weight)) {
      if (!present.count(id)) product *= rule.indices[static_cast<std::size_t>(id)].size;
    }
    return product;
  };
  const auto& weight = rule.inputs.at(1);
  const std::int64_t per_output = numel(graph, node.outputs.at(0)) * product_missing_from(weight, rule.outputs.at(0));
  const std::int64_t per_input = numel(graph, node.inputs.at(0)) * product_missing_from(weight, rule.inputs.at(0));
  NodeFlops out;
  out.matmul = 2 * std::min(per_output, per_input);
  out.total = out.matmul + (node.inputs.size() > 2 ? numel(graph, node.outputs.at(0)) : 0);
  return out;
}

NodeFlops attention(const ir::Graph& graph, const ir::Node& node, int softmax_per_score) {
  const auto& q = graph.value(node.inputs.at(0)).type.shape;
  const auto& k = graph.value(node.inputs.at(1)).type.shape;
  const auto& v = graph.value(node.inputs.at(2)).type.shape;
  if (q.size() < 2 || k.size() < 2 || v.empty()) return {};
  const std::int64_t s = q[q.size() - 2], d = q.back(), t = k[k.size() - 2], e = v.back();
  std::int64_t batch = 1;  // every leading dim of q: batch x heads
  for (std::size_t i = 0; i + 2 < q.size(); ++i) batch *= q[i];
  NodeFlops out;
  out.matmul = 2 * batch * s * t * d + 2 * batch * s * t * e;
  out.total = out.matmul + softmax_per_score * batch * s * t;
  return out;
}

// Each of T tokens through its K experts: the gate and up product (N = 2I rows of H), the
// down product (H rows of I), and the gating (act(gate) * up) per intermediate element.
NodeFlops experts(const ir::Graph& graph, const ir::Node& node, int per_element) {
  if (node.inputs.size() < 5) return {};
  const auto& hidden = graph.value(node.inputs[0]).type.shape;
  const auto& index = graph.value(node.inputs[1]).type.shape;
  const auto& gate_up = graph.value(node.inputs[3]).type.shape;
  const auto& down = graph.value(node.inputs[4]).type.shape;
  if (hidden.size() != 2 || index.size() != 2 || gate_up.size() != 3 || down.size() != 3) return {};
  const std::int64_t routed = hidden[0] * index[1];
  NodeFlops out;
  out.matmul = 2 * routed * (gate_up[1] * gate_up[2] + down[1] * down[2]);
  out.total = out.matmul + per_element * routed * down[2];
  return out;
}

}  // namespace

NodeFlops node_flops(const ops::OpTable& table, const ir::Graph& graph, const ir::Node& node) {
  const ops::OpSpec* spec = table.find(node.op);
  if (!spec) return {};
  const auto per_element = static_cast<std::int64_t>(spec->flops.per_element);
  switch (spec->flops.kind) {
    case ops::FlopsKind::Zero:
      return {};
    case ops::FlopsKind::PerOutputElement: {
      const std::int64_t n = node.outputs.empty() ? 0 : per_element * numel(graph, node.outputs[0]);
      return {n, 0};
    }
    case ops::FlopsKind::PerInputElement: {
      const std::int64_t n = node.inputs.empty() ? 0 : per_element * numel(graph, node.inputs[0]);
      return {n, 0};
    }
    case ops::FlopsKind::Contraction: {
      auto rule = ops::dim_rule_for(table, graph, node);
      return rule ? contraction(*rule, graph, node) : NodeFlops{};
    }
    case ops::FlopsKind::Convolution: {
      auto rule = ops::dim_rule_for(table, graph, node);
      return rule ? convolution(*rule, graph, node) : NodeFlops{};
    }
    case ops::FlopsKind::Attention:
      return attention(graph, node, spec->flops.per_element);
    case ops::FlopsKind::Experts:
      return experts(graph, node, spec->flops.per_element);
  }
  return {};
}

FlopsReport forward_flops(const ops::OpTable& table, const ir::Graph& graph) {
  FlopsReport report;
  report.per_node.reserve(graph.nodes().size());
  for (const auto& node : graph.nodes()) {
    const auto flops = node_flops(table, graph, node);
    report.per_node.push_back(flops.total);
    report.total += flops.total;
    report.matmul_total += flops.matmul;
  }
  return report;
}

}  // namespace shardwise::analysis
