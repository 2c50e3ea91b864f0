#include "cost/recording_cost.h"

#include "cost/profiled_cost.h"

namespace shardwise::cost {

OpTime RecordingCostModel::node_time(const ir::Graph& graph, const ir::Node& node, const DeviceType& device,
                                     Precision precision, const NodeContext& context) const {
  if (!context.local_shapes.empty()) {  // what ProfiledCostModel looks up; other contexts it scales
    std::string key = rank_signature(graph, node, precision, context.local_shapes);
    std::lock_guard lock(mutex_);
    records_.try_emplace(std::move(key), LocalOp{node.id, context.local_shapes, runs_fp8(graph, node, precision)});
  }
  return inner_.node_time(graph, node, device, precision, context);
}

std::map<std::string, LocalOp> RecordingCostModel::records() const {
  std::lock_guard lock(mutex_);
  return records_;
}

}  // namespace shardwise::cost
