#include "transform/fused_weight_accumulation.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string_view>
#include <variant>

#include "transform/fp8_axes.h"

namespace shardwise::transform {
namespace {

constexpr std::string_view kFusedAccumulationAttr = "shardwise.fused_accumulation";
constexpr std::string_view kOwnBackward[] = {"shardwise.async_gradient", "shardwise.gather_matmul",
                                             "shardwise.matmul_scatter", kFp8KAxesAttr};

// The position of a contraction's weight operand (inputs in schema order), or none.
std::optional<std::size_t> weight_position(std::string_view op) {
  if (op == "aten::linear" || op == "aten::mm") return 1;
  if (op == "aten::addmm") return 2;
  if (op == "aten::embedding") return 0;  // a lookup's table: its gradient is a scatter-add
  return std::nullopt;
}

bool swaps_two_dims(const ir::Node& node) {
  if (node.op == "aten::t") return true;
  if (node.op != "aten::transpose.int") return false;
  auto dim = [&](const char* name) -> std::optional<std::int64_t> {
    auto it = node.attrs.find(name);
    if (it == node.attrs.end() || !std::holds_alternative<std::int64_t>(it->second)) return std::nullopt;
    const std::int64_t d = std::get<std::int64_t>(it->second);
    return d < 0 ? d + 2 : d;  // of a 2-D operand
  };
  const auto a = dim("dim0"), b = dim("dim1");
  return a && b && ((*a == 0 && *b == 1) || (*a == 1 && *b == 0));
}

// An embedding whose backward is not a plain scatter-add of the looked-up rows: scaled by
// each row's frequency in the batch, or a sparse gradient.
bool scatters_otherwise(const ir::Node& node) {
  for (const char* name : {"scale_grad_by_freq", "sparse"}) {
    auto it = node.attrs.find(name);
    if (it != node.attrs.end() && std::holds_alternative<bool>(it->second) && std::get<bool>(it->second)) return true;
  }
  return false;
}

}  // namespace

std::vector<FusedWeightAccumulation> fused_weight_accumulations(const ir::Graph& stage) {
  std::vector<FusedWeightAccumulation> out;
  for (const ir::Node& node : stage.nodes()) {
    const auto at = weight_position(node.op);
    if (!at || *at >= node.inputs.size() || node.outputs.empty()) continue;
    if (node.op == "aten::embedding" && scatters_otherwise(node)) continue;
    const ir::Value& weight = stage.value(node.inputs[*at]);
    FusedWeightAccumulation mark{stage.value(node.outputs[0]).name, static_cast<int>(*at), {}, false};
    if (weight.role == ir::ValueRole::Parameter) {
      mark.parameter = weight.name;
    } else if (weight.producer && node.op != "aten::embedding") {  // a lookup of the table itself only
      const ir::Node& made = stage.node(*weight.producer);
      if (!swaps_two_dims(made) || made.inputs.size() != 1) continue;
      const ir::Value& source = stage.value(made.inputs[0]);
      if (source.role != ir::ValueRole::Parameter || source.type.rank() != 2) continue;
      mark.parameter = source.name;
      mark.transposed = true;
    } else {
      continue;
    }
    out.push_back(std::move(mark));
  }
  return out;
}

void mark_fused_accumulations(ir::Graph& stage_rank_graph) {
  for (const FusedWeightAccumulation& mark : fused_weight_accumulations(stage_rank_graph)) {
    const ir::NodeId node = *stage_rank_graph.value(*stage_rank_graph.find_value(mark.node)).producer;
    // A contraction an earlier pass split otherwise runs its own backward: its input gradient's
    // all-reduce beside the weight's (async_gradients.h), a ring (collective_matmul.h), or an FP8
    // linear's products (rank_graph.h: the fp8 marks; runtime/fp8.py).
    const ir::Attributes& attrs = stage_rank_graph.node(node).attrs;
    if (std::any_of(std::begin(kOwnBackward), std::end(kOwnBackward),
                    [&](std::string_view key) { return attrs.contains(std::string(key)); }))
      continue;
    stage_rank_graph.mutable_attrs(node)[std::string(kFusedAccumulationAttr)] = std::int64_t{mark.weight_input};
  }
}

std::int64_t fused_accumulation_operand(const ir::Node& node) {
  auto it = node.attrs.find(std::string(kFusedAccumulationAttr));
  return it == node.attrs.end() ? -1 : std::get<std::int64_t>(it->second);
}

}  // namespace shardwise::transform
