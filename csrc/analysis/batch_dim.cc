#include "analysis/batch_dim.h"

#include <algorithm>
#include <optional>

#include "ops/node_rule.h"

namespace shardwise::analysis {

namespace {

// The batch index of `node` under `rule`: that of its first batch-marked input's batch dim.
std::optional<int> batch_index_of(const ir::Graph& graph, const ir::Node& node, const ops::DimRule& rule) {
  for (std::size_t i = 0; i < node.inputs.size(); ++i) {
    const auto& batch_dim = graph.value(node.inputs[i]).type.batch_dim;
    if (!batch_dim || *batch_dim < 0 || static_cast<std::size_t>(*batch_dim) >= rule.inputs[i].size()) continue;
    const auto& dims = rule.inputs[i][static_cast<std::size_t>(*batch_dim)];
    if (!dims.empty()) return dims.front();
  }
  return std::nullopt;
}

bool propagate_forward(const ops::OpTable& table, ir::Graph& graph) {
  bool changed = false;
  for (std::size_t n = 0; n < graph.nodes().size(); ++n) {
    const ir::Node& node = graph.nodes()[n];
    const bool any_batch = std::any_of(node.inputs.begin(), node.inputs.end(),
                                       [&](ir::ValueId id) { return graph.value(id).type.batch_dim.has_value(); });
    if (!any_batch) continue;
    const auto rule = ops::dim_rule_for(table, graph, node);
    if (!rule) continue;
    const std::optional<int> batch_index = batch_index_of(graph, node, *rule);
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

// A tensor made from a size (new_empty, zeros, full: a "create(...)" rule) that a batched
// node reads with that node's batch index on one of its dims takes that dim as its batch dim:
// transformers' DeepSeek-V3 attention fills key_states = k_pe.new_empty([b, heads, s, d]) by
// two slice_scatters, a tensor of the batch's size that would otherwise be priced at the
// captured rows at any micro-batch and never split with the batch.
bool mark_created_batches(const ops::OpTable& table, ir::Graph& graph) {
  bool changed = false;
  for (const ir::Node& node : graph.nodes()) {
    const auto rule = ops::dim_rule_for(table, graph, node);
    if (!rule) continue;
    const std::optional<int> batch_index = batch_index_of(graph, node, *rule);
    if (!batch_index) continue;
    const std::int64_t batch = rule->indices[static_cast<std::size_t>(*batch_index)].size;
    for (std::size_t i = 0; i < node.inputs.size(); ++i) {
      const ir::Value& value = graph.value(node.inputs[i]);
      if (value.type.batch_dim || !value.producer) continue;
      const ops::OpSpec* maker = table.find(graph.node(*value.producer).op);
      if (maker == nullptr || !maker->rule_text.starts_with("create(")) continue;
      const auto& dims = rule->inputs[i];
      for (std::size_t d = 0; d < dims.size() && d < value.type.shape.size(); ++d)
        if (!dims[d].empty() && dims[d].front() == *batch_index && value.type.shape[d] == batch) {
          graph.mutable_type(node.inputs[i]).batch_dim = static_cast<int>(d);
          changed = true;
          break;
        }
    }
  }
  return changed;
}

}  // namespace

bool propagate_batch_dim(const ops::OpTable& table, ir::Graph& graph) {
  bool changed = propagate_forward(table, graph);
  if (mark_created_batches(table, graph)) changed = true, propagate_forward(table, graph);
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
