#include "transform/fp8_axes.h"

#include <fmt/format.h>

#include "analysis/fp8_linears.h"
#include "support/error.h"

namespace shardwise::transform {

namespace {

void refuse_partial(const ir::Graph& graph, const NodeRewrite& node, const OperandRewrite& operand) {
  for (std::size_t a = 0; a < operand.required.size(); ++a) {
    if (operand.required[a].kind != search::PlacementKind::Partial) continue;
    const ir::Node& captured = graph.node(node.node);
    throw support::ValidationError(fmt::format(
        "fp8: {} '{}' (module '{}') reads '{}' as a partial sum over mesh axis {}; an FP8 linear scales whole values "
        "(each rank's part would round apart), so this plan cannot run in fp8: reduce the operand first, or plan "
        "in bf16",
        node.op, graph.value(captured.outputs[0]).name, captured.module_path, operand.value, a));
  }
}

}  // namespace

std::optional<Fp8Axes> fp8_axes(const ir::Graph& graph, const NodeRewrite& node) {
  const auto linear = analysis::fp8_linear(graph, graph.node(node.node));
  if (!linear) return std::nullopt;
  Fp8Axes axes;
  if (node.mode == NodeMode::Whole) {  // whole operands on every rank: no amax axes
    axes.float8_weight = linear->weight < node.inputs.size() && node.inputs[linear->weight].float8_saved;
    return axes;
  }
  if (linear->weight >= node.inputs.size() || linear->input >= node.inputs.size()) {
    const ir::Node& captured = graph.node(node.node);
    throw support::ValidationError(fmt::format("fp8: {} '{}' (module '{}') has {} operands in the rank program",
                                               node.op, graph.value(captured.outputs[0]).name,
                                               captured.module_path, node.inputs.size()));
  }
  const OperandRewrite& x = node.inputs[linear->input];
  const OperandRewrite& w = node.inputs[linear->weight];
  axes.float8_weight = w.float8_saved;
  refuse_partial(graph, node, x);
  refuse_partial(graph, node, w);
  for (std::size_t a = 0; a < w.required.size(); ++a) {
    const search::Placement& p = w.required[a];
    if (p.kind != search::PlacementKind::Shard) continue;
    (p.dim == linear->weight_k_dim ? axes.k_axes : axes.n_axes).push_back(static_cast<int>(a));
  }
  return axes;
}

bool saves_float8_weight(const ir::Graph& graph, const ir::Node& node, std::size_t operand, bool fp8) {
  if (!fp8) return false;
  const auto linear = analysis::fp8_linear(graph, node);
  return linear && linear->weight == operand;
}

std::optional<Fp8Axes> marked_fp8_axes(const ir::Node& call) {
  auto axes_of = [&](std::string_view key) -> const std::vector<std::int64_t>* {
    auto it = call.attrs.find(key);
    return it == call.attrs.end() ? nullptr : std::get_if<std::vector<std::int64_t>>(&it->second);
  };
  const auto* k = axes_of(kFp8KAxesAttr);
  const auto* n = axes_of(kFp8NAxesAttr);
  if (k == nullptr && n == nullptr) return std::nullopt;
  if (k == nullptr || n == nullptr)
    throw support::ValidationError(fmt::format("fp8: a {} call carries one of {} and {} without the other", call.op,
                                               kFp8KAxesAttr, kFp8NAxesAttr));
  const auto saved = call.attrs.find(kFp8Float8WeightAttr);
  const bool float8_weight = saved != call.attrs.end() && std::get_if<bool>(&saved->second) != nullptr &&
                             std::get<bool>(saved->second);
  return Fp8Axes{{k->begin(), k->end()}, {n->begin(), n->end()}, float8_weight};
}

}  // namespace shardwise::transform
