#include "analysis/activation_bytes.h"

namespace shardwise::analysis {

std::vector<std::int64_t> activation_bytes(const ir::Graph& graph) {
  std::vector<std::int64_t> out;
  out.reserve(graph.nodes().size());
  for (const auto& node : graph.nodes()) {
    std::int64_t bytes = 0;
    for (auto id : node.outputs) bytes += graph.value(id).type.bytes();
    out.push_back(bytes);
  }
  return out;
}

}  // namespace shardwise::analysis
