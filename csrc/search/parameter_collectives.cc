#include "search/parameter_collectives.h"

#include <map>
#include <optional>

#include "analysis/repeated_blocks.h"
#include "support/enum_names.h"

namespace shardwise::search {

namespace {

constexpr auto kOverlapNames = support::enum_names<ParameterOverlap>({
    {ParameterOverlap::Exposed, "exposed"},
    {ParameterOverlap::BesideForward, "forward"}, {ParameterOverlap::BesideBackward, "backward"},
});
constexpr auto kMatmulCollectiveNames = support::enum_names<MatmulCollective>(
    {{MatmulCollective::None, "none"}, {MatmulCollective::Gather, "gather"}, {MatmulCollective::Scatter, "scatter"}});

}  // namespace

std::string_view parameter_overlap_name(ParameterOverlap overlap) { return kOverlapNames.name(overlap, "exposed"); }

ParameterOverlap forward_gather_overlap(const ShardingSpec& held, const ShardingSpec& wanted, bool recomputed) {
  if (recomputed || held.size() != wanted.size()) return ParameterOverlap::Exposed;
  int axis = -1;
  for (std::size_t a = 0; a < held.size(); ++a) {
    if (held[a] == wanted[a]) continue;
    if (axis >= 0) return ParameterOverlap::Exposed;  // steps on two axes
    axis = static_cast<int>(a);
  }
  if (axis < 0) return ParameterOverlap::Exposed;  // nothing to gather
  const Placement& from = held[static_cast<std::size_t>(axis)];
  if (!from.is_shard() || from.groups != 1 || !from.ratios.empty() || !wanted[static_cast<std::size_t>(axis)].is_replicate())
    return ParameterOverlap::Exposed;
  for (std::size_t b = 0; b < held.size(); ++b)  // another axis cutting the same dim: not one plain gather
    if (static_cast<int>(b) != axis && held[b].is_shard() && held[b].dim == from.dim) return ParameterOverlap::Exposed;
  return ParameterOverlap::BesideForward;
}

ParameterOverlap regather_overlap() { return ParameterOverlap::Exposed; }

namespace {

// Does operand `operand` of `rule` carry a reduced index? nullopt: it carries a lookup's index
// (a table, which backward does not read).
std::optional<bool> carries_reduced(const ops::DimRule& rule, std::size_t operand) {
  bool reduced = false;
  for (const auto& dim : rule.inputs[operand])
    for (int i : dim) {
      const ops::Index& index = rule.indices.at(static_cast<std::size_t>(i));
      if (index.lookup) return std::nullopt;
      reduced = reduced || index.kind == ops::IndexKind::Reduced;
    }
  return reduced;
}

}  // namespace

bool backward_reads(const ops::DimRule& rule, std::size_t operand, const std::vector<bool>& needs_gradient) {
  if (operand >= rule.inputs.size()) return true;
  bool contraction = false;
  for (const ops::Index& index : rule.indices) contraction = contraction || index.kind == ops::IndexKind::Reduced;
  if (!carries_reduced(rule, operand)) return false;
  if (!contraction) return true;
  if (rule.is_added(operand)) return false;
  // A contraction reads a factor only to make another factor's gradient.
  for (std::size_t j = 0; j < rule.inputs.size(); ++j)
    if (j != operand && (j >= needs_gradient.size() || needs_gradient[j]) && !rule.is_added(j) &&
        carries_reduced(rule, j).has_value())
      return true;
  return false;
}

ParameterOverlap gradient_reduction_overlap(const Placement& canonical) {
  return canonical.is_replicate() ? ParameterOverlap::BesideBackward : ParameterOverlap::Exposed;
}

ParameterOverlap gradient_scatter_overlap(const ShardingSpec& gradient, const ShardingSpec& canonical) {
  if (gradient.size() != canonical.size()) return ParameterOverlap::Exposed;
  int axis = -1;
  for (std::size_t a = 0; a < gradient.size(); ++a) {
    if (gradient[a].is_partial() && canonical[a].is_partial()) return ParameterOverlap::Exposed;  // bucketed
    if (gradient[a] == canonical[a]) continue;
    if (axis >= 0) return ParameterOverlap::Exposed;  // steps on two axes
    axis = static_cast<int>(a);
  }
  if (axis < 0) return ParameterOverlap::Exposed;  // nothing to reduce
  const Placement& from = gradient[static_cast<std::size_t>(axis)];
  const Placement& to = canonical[static_cast<std::size_t>(axis)];
  if (!from.is_partial() || from.reduction != ops::Reduction::Sum || !to.is_shard() || to.groups != 1 ||
      !to.ratios.empty())
    return ParameterOverlap::Exposed;
  for (std::size_t b = 0; b < canonical.size(); ++b)  // another axis cutting the same dim: not one plain scatter
    if (static_cast<int>(b) != axis && canonical[b].is_shard() && canonical[b].dim == to.dim)
      return ParameterOverlap::Exposed;
  return ParameterOverlap::BesideBackward;
}

std::vector<int> parameter_units(const ir::Graph& graph) {
  const std::size_t n = graph.nodes().size();
  std::vector<int> block(n, -1);
  const std::vector<analysis::RepeatedBlockGroup> groups = analysis::find_repeated_blocks(graph);
  if (const analysis::RepeatedBlockGroup* layers = analysis::largest_group(groups))
    for (std::size_t k = 0; k < layers->nodes.size(); ++k)
      for (ir::NodeId id : layers->nodes[k]) block[static_cast<std::size_t>(id)] = static_cast<int>(k);
  std::vector<int> unit(n, -1);
  std::map<int, int> of_block;
  int next = 0, run = -1;  // run: the unit of the nodes outside the blocks since the last block node
  for (const ir::Node& node : graph.nodes()) {
    const auto u = static_cast<std::size_t>(node.id);
    if (block[u] >= 0) {
      auto [it, fresh] = of_block.emplace(block[u], next);
      if (fresh) ++next;
      unit[u] = it->second;
      run = -1;
    } else {
      if (run < 0) run = next++;
      unit[u] = run;
    }
  }
  return unit;
}

ParameterOverlap activation_collective_overlap() { return ParameterOverlap::Exposed; }

ParameterOverlap activation_gradient_overlap(std::string_view op, std::size_t operand, bool one_all_reduce,
                                             bool only_read, const std::vector<bool>& trainable_weight) {
  // The ops whose backward the runtime splits, with their input and weight operands.
  struct Split {
    std::string_view op;
    std::size_t input, weight;
  };
  static constexpr Split kSplit[] = {{"aten::linear", 0, 1}, {"aten::addmm", 1, 2}, {"aten::mm", 0, 1}};
  if (!one_all_reduce || !only_read) return ParameterOverlap::Exposed;
  for (const Split& split : kSplit)
    if (split.op == op && split.input == operand && split.weight < trainable_weight.size() &&
        trainable_weight[split.weight])
      return ParameterOverlap::BesideBackward;
  return ParameterOverlap::Exposed;
}

std::string_view matmul_collective_name(MatmulCollective kind) { return kMatmulCollectiveNames.name(kind, "none"); }

int collective_matmul_input(const ir::Graph& graph, const ir::Node& node) {
  if (node.outputs.size() != 1) return -1;
  if (node.op == "aten::linear" && !node.inputs.empty()) return 0;
  if (node.op == "aten::mm" && node.inputs.size() == 2) return 0;
  if (node.op == "aten::addmm" && node.inputs.size() == 3 && graph.value(node.inputs[0]).type.shape.size() == 1)
    return 1;
  return -1;
}

bool collective_matmul_rows(const ir::Graph& graph, const ir::Node& node, int dim) {
  const int input = collective_matmul_input(graph, node);
  if (input < 0 || dim < 0) return false;
  const auto rank = static_cast<int>(graph.value(node.inputs[static_cast<std::size_t>(input)]).type.shape.size());
  return node.op == "aten::linear" ? dim < rank - 1 : dim == 0;
}

}  // namespace shardwise::search
