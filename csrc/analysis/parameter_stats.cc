#include "analysis/parameter_stats.h"

namespace shardwise::analysis {

ParameterStats parameter_stats(const ir::Graph& graph) {
  ParameterStats stats;
  for (const auto& value : graph.values()) {
    if (value.role == ir::ValueRole::Parameter) {
      stats.parameters += value.type.numel();
      stats.parameter_bytes += value.type.bytes();
    } else if (value.role == ir::ValueRole::Buffer) {
      stats.buffers += value.type.numel();
      stats.buffer_bytes += value.type.bytes();
    }
  }
  return stats;
}

}  // namespace shardwise::analysis
