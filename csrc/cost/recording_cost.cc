#include "cost/recording_cost.h"

#include "analysis/fp8_linears.h"
#include "cost/profiled_cost.h"

namespace shardwise::cost {

OpTime RecordingCostModel::node_time(const ir::Graph& graph, const ir::Node& node, const DeviceType& device,
                                     Precision precision, const NodeContext& context) const {
  const bool splits = !context.operand_shards.empty() || (context.shards > 1 && context.split != TensorSplit::None);
  std::vector<std::vector<std::int64_t>> shapes =
      !context.local_shapes.empty() ? context.local_shapes
      : splits                      ? std::vector<std::vector<std::int64_t>>{}
                                    : batch_scaled_shapes(graph, node, context.batch_scale);
  if (!shapes.empty()) {
    const bool fp8 = precision == Precision::FP8 && analysis::fp8_linear(graph, node).has_value();
    std::string key = fp8 ? fp8_signature(graph, node, shapes) : local_signature(graph, node, shapes);
    std::lock_guard lock(mutex_);
    records_.try_emplace(std::move(key), LocalOp{node.id, std::move(shapes)});
  }
  return inner_.node_time(graph, node, device, precision, context);
}

std::map<std::string, LocalOp> RecordingCostModel::records() const {
  std::lock_guard lock(mutex_);
  return records_;
}

}  // namespace shardwise::cost
