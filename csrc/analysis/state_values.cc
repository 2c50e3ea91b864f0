#include "analysis/state_values.h"

#include <algorithm>

#include "ops/random_draws.h"

namespace shardwise::analysis {

std::vector<bool> state_values(const ir::Graph& graph) {
  std::vector<bool> state(graph.values().size(), false);
  for (const ir::Value& value : graph.values())
    if (!value.producer && value.role != ir::ValueRole::Input) state[static_cast<std::size_t>(value.id)] = true;
  for (const ir::Node& node : graph.nodes()) {  // in order: a node's operands are known by then
    // A collective or kernel of shardwise's, a node of several outputs, or a seeded draw
    // (its values are the rank's stream's) is not taken as the same on every rank.
    if (node.outputs.size() != 1 || node.op.starts_with("shardwise::") ||
        ops::random_draw(node.op) != ops::RandomDraw::None)
      continue;
    // A cast between floating dtypes ends the chain: one device sums the batch's share of the
    // cast's gradient in the cast's dtype, so a sum deferred past it would be taken in another
    // precision (DeepSeek-V3's router reads its float64 weight cast to float32).
    const ir::DType dtype = graph.value(node.outputs[0]).type.dtype;
    state[static_cast<std::size_t>(node.outputs[0])] =
        std::all_of(node.inputs.begin(), node.inputs.end(), [&](ir::ValueId in) {
          const ir::DType from = graph.value(in).type.dtype;
          return state[static_cast<std::size_t>(in)] && (from == dtype || !ir::is_floating(from));
        });
  }
  return state;
}

}  // namespace shardwise::analysis
