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

const char* training_precision(const ir::Graph& graph) {
  std::int64_t f32 = 0, bf16 = 0, f16 = 0;
  auto count = [&](bool parameters) {
    for (const auto& value : graph.values()) {
      if ((value.role == ir::ValueRole::Parameter) != parameters) continue;
      if (!parameters && value.role != ir::ValueRole::Activation) continue;
      const std::int64_t n = value.type.numel();
      switch (value.type.dtype) {
        case ir::DType::F64:
        case ir::DType::F32: f32 += n; break;
        case ir::DType::BF16: bf16 += n; break;
        case ir::DType::F16: f16 += n; break;
        default: break;
      }
    }
  };
  count(true);
  if (f32 + bf16 + f16 == 0) count(false);
  if (bf16 > f32 && bf16 >= f16) return "bf16";
  if (f16 > f32 && f16 > bf16) return "f16";
  return "f32";
}

}  // namespace shardwise::analysis
