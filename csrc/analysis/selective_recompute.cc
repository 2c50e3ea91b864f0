#include "analysis/selective_recompute.h"

#include <algorithm>
#include <array>

#include "ops/op_table.h"

namespace shardwise::analysis {

namespace {

// Graph ops kept whatever their operands (a linear is an addmm or mm at the dispatcher).
constexpr std::array<std::string_view, 8> kKeptOps = {
    "aten::linear",
    "aten::mm",
    "aten::addmm",
    "aten::scaled_dot_product_attention",
    "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_dot_product_efficient_attention",
    "aten::_scaled_dot_product_cudnn_attention",
};

bool matmul_with_a_matrix(const ir::Graph& graph, const ir::Node& node) {
  if (node.inputs.size() < 2) return false;
  // x [..., k] @ W [k, n]: the batch dimensions fold into one mm; anything else is a bmm, mv or dot.
  return graph.value(node.inputs[0]).type.shape.size() >= 2 && graph.value(node.inputs[1]).type.shape.size() == 2;
}

}  // namespace

const std::vector<std::string_view>& selective_recompute_saved_ops() {
  static const std::vector<std::string_view> ops = {
      "aten::mm",
      "aten::addmm",
      "aten::_scaled_mm",  // an FP8 linear's product (analysis/fp8_linears.h)
      "aten::_scaled_dot_product_flash_attention",
      "aten::_scaled_dot_product_flash_attention_for_cpu",
      "aten::_scaled_dot_product_efficient_attention",
      "aten::_scaled_dot_product_cudnn_attention",
  };
  return ops;
}

std::vector<bool> kept_by_selective_recompute(const ir::Graph& graph) {
  std::vector<bool> kept(graph.nodes().size(), false);
  for (const ir::Node& node : graph.nodes()) {
    const std::string_view base = ops::op_base_name(node.op);
    const bool listed = std::find(kKeptOps.begin(), kKeptOps.end(), base) != kKeptOps.end();
    kept[static_cast<std::size_t>(node.id)] = listed || (base == "aten::matmul" && matmul_with_a_matrix(graph, node));
  }
  return kept;
}

}  // namespace shardwise::analysis
