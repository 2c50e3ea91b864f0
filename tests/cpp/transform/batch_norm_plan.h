// A test fixture shared by the rank-graph tests of state written in place (rank_graph.h):
// batch norm in training, its running statistics marked written by the capture
// ({shardwise.writes=[3,4]}), then a mean; on a tensor axis of 2 that splits its channels.
#pragma once

#include <string>

#include "ir/graph.h"
#include "ir/parser.h"
#include "plan/plan.h"

namespace shardwise::transform::testing_plans {

constexpr const char* kBatchNorm = R"(graph(%x: f32[b8,4,3,3]) {
  %bn.weight: f32[4] parameter
  %bn.bias: f32[4] parameter
  %bn.running_mean: f32[4] buffer
  %bn.running_var: f32[4] buffer
  %y: f32[b8,4,3,3] = aten::batch_norm(%x, %bn.weight, %bn.bias, %bn.running_mean, %bn.running_var) {cudnn_enabled=false, eps=1e-05, momentum=0.1, shardwise.writes=[3,4], training=true} @bn
  %loss: f32[] = aten::mean(%y) {dtype=none}
  return (%loss)
})";

inline ir::Graph batch_norm_graph() { return ir::parse_graph(kBatchNorm); }

// The channels split (batch norm's `strategy`, "split d0"; its weight and bias S(0)), the
// running statistics held `stats` ("R": replicated, the case that runs).
inline plan::Sharding batch_norm_channels_split(const std::string& stats = "R",
                                                const std::string& strategy = "split d0") {
  plan::Sharding s;
  s.mesh = {2};
  s.axis_names = {"tensor"};
  s.placements = {{"x", {"R"}},  {"bn.weight", {"S(0)"}}, {"bn.bias", {"S(0)"}}, {"bn.running_mean", {stats}},
                  {"bn.running_var", {stats}}, {"y", {"S(1)"}}, {"loss", {"P(mean)"}}};
  s.strategies = {{"y", {strategy}}, {"loss", {"split r1"}}};
  return s;
}

}  // namespace shardwise::transform::testing_plans
