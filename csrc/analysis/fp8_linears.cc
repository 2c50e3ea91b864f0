#include "analysis/fp8_linears.h"

#include <variant>

#include "ops/op_table.h"

namespace shardwise::analysis {

namespace {

constexpr std::int64_t kFp8Multiple = 16;

bool fp8_input_dtype(ir::DType dtype) { return dtype == ir::DType::F32 || dtype == ir::DType::BF16; }

// An addmm's alpha or beta, absent meaning 1 (the schema's default).
bool is_one(const ir::Node& node, std::string_view name) {
  auto it = node.attrs.find(name);
  if (it == node.attrs.end()) return true;
  if (const auto* i = std::get_if<std::int64_t>(&it->second)) return *i == 1;
  if (const auto* d = std::get_if<double>(&it->second)) return *d == 1.0;
  return false;
}

}  // namespace

std::optional<Fp8Linear> fp8_linear(const ir::Graph& graph, const ir::Node& node) {
  if (node.outputs.size() != 1) return std::nullopt;
  const std::string_view op = ops::op_base_name(node.op);
  Fp8Linear out;
  if (op == "aten::linear" && (node.inputs.size() == 2 || node.inputs.size() == 3)) {
    out = {.input = 0, .weight = 1, .weight_k_dim = 1};
  } else if (op == "aten::addmm" && node.inputs.size() == 3 && is_one(node, "alpha") && is_one(node, "beta")) {
    out = {.input = 1, .weight = 2, .weight_k_dim = 0};
  } else if (op == "aten::mm" && node.inputs.size() == 2) {
    out = {.input = 0, .weight = 1, .weight_k_dim = 0};
  } else {
    return std::nullopt;
  }
  const ir::Value& x = graph.value(node.inputs[out.input]);
  const ir::Value& w = graph.value(node.inputs[out.weight]);
  if (w.role != ir::ValueRole::Parameter || w.type.shape.size() != 2 || x.type.shape.empty()) return std::nullopt;
  if (!fp8_input_dtype(x.type.dtype) || !fp8_input_dtype(w.type.dtype)) return std::nullopt;
  out.k = w.type.shape[static_cast<std::size_t>(out.weight_k_dim)];
  out.n = w.type.shape[static_cast<std::size_t>(1 - out.weight_k_dim)];
  if (x.type.shape.back() != out.k) return std::nullopt;
  if (out.k % kFp8Multiple != 0 || out.n % kFp8Multiple != 0) return std::nullopt;
  return out;
}

std::size_t count_fp8_linears(const ir::Graph& graph) {
  std::size_t n = 0;
  for (const ir::Node& node : graph.nodes()) n += fp8_linear(graph, node).has_value() ? 1 : 0;
  return n;
}

}  // namespace shardwise::analysis
