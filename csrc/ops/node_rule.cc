#include "ops/node_rule.h"

#include <fmt/format.h>

#include "ops/einsum_rule.h"
#include "ops/experts.h"
#include "ops/rule_templates.h"
#include "support/error.h"

namespace shardwise::ops {
namespace {

std::string types_str(const std::vector<const ir::TensorType*>& types) {
  std::string out;
  for (std::size_t i = 0; i < types.size(); ++i) out += (i ? ", " : "") + types[i]->str();
  return out;
}

std::string operands_str(const RuleOperands& operands) {
  if (!operands.outputs_known) return fmt::format("[inputs {}]", types_str(operands.inputs));
  return fmt::format("[inputs {}; outputs {}]", types_str(operands.inputs), types_str(operands.outputs));
}

std::string indices_str(const DimRule& rule, const DimIndices& dims) {
  if (dims.empty()) return "no index (size 1)";
  if (dims.size() == 1) {
    const auto& index = rule.indices.at(static_cast<std::size_t>(dims[0]));
    return fmt::format("index {} is {}", index.label, index.size);
  }
  std::string labels;
  for (int id : dims) labels += (labels.empty() ? "" : " ") + rule.indices.at(static_cast<std::size_t>(id)).label;
  return fmt::format("indices ({}) give {}", labels, rule.dims_size(dims));
}

// Every operand dim must be exactly the product of its indices.
void check_sizes(const DimRule& rule, const RuleOperands& operands) {
  auto check = [&](const std::vector<OperandDims>& side, const std::vector<const ir::TensorType*>& types,
                   std::string_view name) {
    if (side.size() != types.size()) {
      throw support::ValidationError(fmt::format("the rule has {} {}s, the node {}", side.size(), name, types.size()));
    }
    for (std::size_t o = 0; o < side.size(); ++o) {
      const auto& shape = types[o]->shape;
      if (side[o].size() != shape.size()) {
        throw support::ValidationError(
            fmt::format("{} {} has rank {} but the rule gives it {} dims", name, o, shape.size(), side[o].size()));
      }
      for (std::size_t d = 0; d < shape.size(); ++d) {
        if (rule.dims_size(side[o][d]) != shape[d]) {
          throw support::ValidationError(
              fmt::format("{} {} dim {} is {} but {}", name, o, d, shape[d], indices_str(rule, side[o][d])));
        }
      }
    }
  };
  check(rule.inputs, operands.inputs, "input");
  if (operands.outputs_known) check(rule.outputs, operands.outputs, "output");
}

RuleOperands operands_of(const ir::Graph& graph, const ir::Node& node, bool outputs_known) {
  RuleOperands operands;
  for (auto id : node.inputs) operands.inputs.push_back(&graph.value(id).type);
  if (outputs_known) {
    for (auto id : node.outputs) operands.outputs.push_back(&graph.value(id).type);
  }
  operands.outputs_known = outputs_known;
  operands.output_count = static_cast<int>(node.outputs.size());
  operands.attrs = &node.attrs;
  return operands;
}

}  // namespace

std::string describe_node(const ir::Graph& graph, const ir::Node& node) {
  const std::string name = node.outputs.empty() ? fmt::format("#{}", node.id) : graph.value(node.outputs[0]).name;
  return fmt::format("{} node '{}' (module '{}')", node.op, name, node.module_path);
}

std::optional<DimRule> instantiate_rule(const OpSpec& spec, const RuleOperands& operands, std::string_view context) {
  static const ir::Attributes kNoAttrs;
  RuleOperands bound = operands;
  if (!bound.attrs) bound.attrs = &kNoAttrs;
  try {
    std::optional<DimRule> rule;
    if (const auto* pattern = std::get_if<EinsumPattern>(&spec.rule)) {
      rule = instantiate_pattern(*pattern, bound);
    } else {
      rule = instantiate_template(std::get<TemplateCall>(spec.rule), bound);
    }
    if (!rule) return std::nullopt;
    check_structure(*rule);
    check_sizes(*rule, bound);
    if (static_cast<int>(rule->outputs.size()) != bound.output_count) {
      throw support::ValidationError(
          fmt::format("the rule gives {} outputs, the node has {}", rule->outputs.size(), bound.output_count));
    }
    if (is_experts_op(spec.name)) mark_dispatch(*rule);
    return rule;
  } catch (const support::ValidationError& e) {
    throw support::ValidationError(fmt::format("{}: {} {}", context, e.what(), operands_str(bound)));
  }
}

std::optional<DimRule> dim_rule_for(const OpTable& table, const ir::Graph& graph, const ir::Node& node) {
  const OpSpec* spec = table.find(node.op);
  if (!spec) return std::nullopt;
  return instantiate_rule(*spec, operands_of(graph, node, true), describe_node(graph, node));
}

std::optional<std::vector<Shape>> infer_output_shapes(const OpTable& table, const ir::Graph& graph,
                                                      const ir::Node& node) {
  const OpSpec* spec = table.find(node.op);
  if (!spec) return std::nullopt;
  auto rule = instantiate_rule(*spec, operands_of(graph, node, false), describe_node(graph, node));
  if (!rule) return std::nullopt;
  std::vector<Shape> shapes;
  for (const auto& output : rule->outputs) shapes.push_back(rule->shape_of(output));
  return shapes;
}

}  // namespace shardwise::ops
