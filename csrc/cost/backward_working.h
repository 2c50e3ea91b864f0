// What one node's backward holds at once beyond the saved activations: one rule for the two
// memory models that price it (search::ShardingMemory, the SPMD search's, and the plan
// evaluator's parts, cost/plan_cost.cc), which differ only in how one rank holds an operand.
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include "analysis/fp8_linears.h"
#include "cost/op_cost.h"
#include "ir/graph.h"
#include "ops/op_table.h"

namespace shardwise::cost {

// The gradients of `node`'s outputs (read) and of its activation inputs (made), for the values
// `flow` (analysis::gradient_flow) says a gradient reaches. A cross-entropy is a log-softmax
// then a negative log-likelihood in autograd: its backward makes the log-probabilities'
// gradient (input-sized; saved_for_backward keeps the log-probabilities themselves) and from it
// the input's, both held at once. An FP8 linear of an fp8 plan (`linear`) also casts dY and W^T
// before its products (fp8_backward_working_bytes). The caller says what one rank holds of
// operand `index` (an output where `output`) of value `v`: `bytes(v, index, output)` and
// `elements(v, index, output)`, at its batch and split.
template <typename BytesOf, typename ElementsOf>
double node_backward_working_bytes(const ir::Graph& graph, const ir::Node& node, const std::vector<bool>& flow,
                                   const std::optional<analysis::Fp8Linear>& linear, BytesOf bytes,
                                   ElementsOf elements) {
  auto gradient = [&](std::size_t index, bool output) {
    const ir::ValueId v = output ? node.outputs[index] : node.inputs[index];
    return flow[static_cast<std::size_t>(v)] ? bytes(v, index, output) : 0.0;
  };
  double inputs = 0, outputs = 0;
  for (std::size_t i = 0; i < node.inputs.size(); ++i)
    if (graph.value(node.inputs[i]).role == ir::ValueRole::Activation) inputs += gradient(i, false);
  if (ops::op_base_name(node.op) == "aten::cross_entropy_loss") inputs += gradient(0, false);
  for (std::size_t o = 0; o < node.outputs.size(); ++o) outputs += gradient(o, true);
  if (!linear || outputs == 0) return inputs + outputs;
  return fp8_backward_working_bytes(outputs, inputs, elements(node.outputs[0], 0, true),
                                    elements(node.inputs[linear->weight], linear->weight, false));
}

}  // namespace shardwise::cost
