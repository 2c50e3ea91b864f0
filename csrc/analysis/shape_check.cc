#include "analysis/shape_check.h"

#include <fmt/format.h>

#include "ops/node_rule.h"
#include "support/error.h"

namespace shardwise::analysis {

void check_shapes(const ops::OpTable& table, const ir::Graph& graph) {
  for (const auto& node : graph.nodes()) {
    if (!ops::dim_rule_for(table, graph, node)) continue;  // throws on a contradiction
    const auto inferred = ops::infer_output_shapes(table, graph, node);
    if (!inferred) continue;
    for (std::size_t o = 0; o < inferred->size() && o < node.outputs.size(); ++o) {
      const auto& value = graph.value(node.outputs[o]);
      if (value.type.shape == (*inferred)[o]) continue;
      throw support::ValidationError(fmt::format("{}: output {} '{}' is [{}] but its inputs and attributes give [{}]",
                                                 ops::describe_node(graph, node), o, value.name,
                                                 fmt::join(value.type.shape, ","), fmt::join((*inferred)[o], ",")));
    }
  }
}

}  // namespace shardwise::analysis
