#include "transform/collective_matmul.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <set>
#include <string>

#include "search/parameter_collectives.h"

namespace shardwise::transform {
namespace {

// One collective of `kind` along even blocks of one dim: contiguous, or strided (groups > 1:
// a sequence cut flattened with the batch, GPT-2's Conv1D view before its addmm), whose
// blocks the runtime's ring takes and joins alike (collective_matmul.py, _Blocks).
bool one_even(const std::vector<ReshardAction>& steps, ReshardKind kind) {
  return steps.size() == 1 && steps[0].kind == kind && steps[0].ratios.empty() && steps[0].dim >= 0;
}

// One ring's steps on `op`, read by `node`: one even `forward` collective along a row dim of
// the contraction, and its gradient's one `backward` collective on the same axis and dim
// (none where the value carries no gradient). Not where its gradient's all-reduce is
// already split beside the weight gradient (async_gradients).
bool one_ring(const ir::Graph& graph, const ir::Node& node, const OperandRewrite& op, ReshardKind forward,
              ReshardKind backward) {
  if (op.gradient_overlap != search::ParameterOverlap::Exposed || !one_even(op.forward, forward) ||
      !search::collective_matmul_rows(graph, node, op.forward[0].dim))
    return false;
  if (!op.gradient) return op.backward.empty();
  return one_even(op.backward, backward) && op.backward[0].axis == op.forward[0].axis &&
         op.backward[0].dim == op.forward[0].dim && op.backward[0].groups == op.forward[0].groups;
}

std::string region_key(const OperandRewrite& op) {
  std::vector<std::string> forward, backward;
  for (const ReshardAction& step : op.forward) forward.push_back(step.str());
  for (const ReshardAction& step : op.backward) backward.push_back(step.str());
  return fmt::format("{}|{}|backward|{}", op.value, fmt::join(forward, "|"), fmt::join(backward, "|"));
}

}  // namespace

void mark_collective_matmuls(const ir::Graph& graph, std::vector<NodeRewrite>& rewrites) {
  // Each value's readers, (node, operand), in node order.
  std::map<ir::ValueId, std::vector<std::pair<std::size_t, std::size_t>>> readers;
  for (const ir::Node& node : graph.nodes())
    for (std::size_t i = 0; i < node.inputs.size(); ++i)
      readers[node.inputs[i]].emplace_back(static_cast<std::size_t>(node.id), i);
  std::set<ir::ValueId> outputs(graph.outputs().begin(), graph.outputs().end());

  std::set<std::string> regions;  // gathered values seen, by value and steps
  for (const ir::Node& node : graph.nodes()) {
    NodeRewrite& rw = rewrites[static_cast<std::size_t>(node.id)];
    const int input = search::collective_matmul_input(graph, node);
    for (std::size_t i = 0; i < rw.inputs.size(); ++i) {
      OperandRewrite& op = rw.inputs[i];
      if (op.forward.empty() && op.backward.empty()) continue;
      // Only the region's first reader may run the ring.
      if (!regions.insert(region_key(op)).second) continue;
      if (rw.mode != NodeMode::Local || static_cast<int>(i) != input) continue;
      if (graph.value(node.inputs[i]).role == ir::ValueRole::Parameter) continue;
      if (one_ring(graph, node, op, ReshardKind::AllGather, ReshardKind::ReduceScatter))
        op.matmul = search::MatmulCollective::Gather;
    }
  }
  for (const ir::Node& node : graph.nodes()) {
    NodeRewrite& rw = rewrites[static_cast<std::size_t>(node.id)];
    const int input = search::collective_matmul_input(graph, node);
    if (input < 0 || rw.mode != NodeMode::Local) continue;
    if (rw.inputs[static_cast<std::size_t>(input)].matmul != search::MatmulCollective::None) continue;
    const ir::ValueId out = node.outputs[0];
    const auto& reads = readers[out];
    if (reads.size() != 1 || outputs.contains(out)) continue;
    NodeRewrite& reader = rewrites[reads[0].first];
    OperandRewrite& op = reader.inputs[reads[0].second];
    if (!one_ring(graph, node, op, ReshardKind::ReduceScatter, ReshardKind::AllGather)) continue;
    op.matmul = search::MatmulCollective::Scatter;
    rw.matmul_scatter_forward = op.forward;
    rw.matmul_scatter_backward = op.backward;
  }
}

}  // namespace shardwise::transform
