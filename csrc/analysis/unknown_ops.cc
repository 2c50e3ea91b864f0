#include "analysis/unknown_ops.h"

#include <unordered_map>

namespace shardwise::analysis {

std::vector<UnknownOp> unknown_ops(const ops::OpTable& table, const ir::Graph& graph) {
  std::vector<UnknownOp> out;
  std::unordered_map<std::string, std::size_t> seen;
  for (const auto& node : graph.nodes()) {
    if (table.find(node.op)) continue;
    auto [it, inserted] = seen.emplace(node.op, out.size());
    if (inserted) out.push_back(UnknownOp{node.op, node.module_path, 0});
    ++out[it->second].count;
  }
  return out;
}

}  // namespace shardwise::analysis
