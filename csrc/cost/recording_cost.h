// RecordingCostModel: a CostModel that answers as the model it wraps and writes down every
// node, at the shapes one rank runs it, that a planner asked about. It is how
// shardwise.profile(graph, plans=...) learns what to measure (issue 46, item 7: the model's
// own ops at the per-rank sizes): price the plans once with a recorder, measure each
// recorded signature once, and price again with a ProfiledCostModel (profiled_cost.h), which
// then finds every one of them.
//
// It wants_local_shapes, so planners fill NodeContext::local_shapes, and it records exactly
// the contexts that have them: those ProfiledCostModel looks up. A context without them (the
// degrees evaluator's Megatron split of a tensor-parallel node, whose shapes it cannot say)
// is not recorded; the profile then scales the whole graph's measurement there.
//
// Keys are rank_signature's (profiled_cost.h): an FP8 linear of an fp8 plan is recorded under
// fp8_signature ("fp8:...") and marked `fp8`, to be measured as runtime/fp8.py runs it.
//
// Thread-safe: planners price from several threads; records are kept in a mutex-guarded map
// keyed by local_signature, first context wins (equal signatures are equal calls).
//
// Worked example:
//   RecordingCostModel rec(analytic);
//   search::price_plan(graph, cluster, rec, plan);   // a data-4 plan of a batch-16 graph
//   rec.records();   // {"aten::linear(f32[4,128,256],f32[768,256],f32[768])->(f32[4,128,768]){}": {node 7,
//                    //   shapes [[4,128,256],[768,256],[768],[4,128,768]]}, ...}
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "cost/op_cost.h"

namespace shardwise::cost {

struct LocalOp {
  ir::NodeId node = 0;                            // the first node asked at these shapes
  std::vector<std::vector<std::int64_t>> shapes;  // inputs then outputs, one rank's
  bool fp8 = false;                               // an FP8 linear of an fp8 plan (runs_fp8)
};

class RecordingCostModel final : public CostModel {
 public:
  explicit RecordingCostModel(const CostModel& inner) : inner_(inner) {}
  RecordingCostModel(const RecordingCostModel&) = delete;
  RecordingCostModel& operator=(const RecordingCostModel&) = delete;

  OpTime node_time(const ir::Graph& graph, const ir::Node& node, const DeviceType& device, Precision precision,
                   const NodeContext& context) const override;
  double collective_time(const Cluster& cluster, CollectiveKind kind, std::span<const int> ranks,
                         std::int64_t bytes, Algorithm algorithm) const override {
    return inner_.collective_time(cluster, kind, ranks, bytes, algorithm);
  }
  bool wants_local_shapes() const override { return true; }

  // local_signature -> the node and shapes; a copy taken under the lock.
  std::map<std::string, LocalOp> records() const;

 private:
  const CostModel& inner_;
  mutable std::mutex mutex_;
  mutable std::map<std::string, LocalOp> records_;
};

}  // namespace shardwise::cost
