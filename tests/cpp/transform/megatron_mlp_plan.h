// A test fixture shared by the rewrite tests: Megatron's MLP (x [8, 16] -> fc1 32 -> gelu ->
// fc2 16 -> mean) on a {data 2, tensor 2} mesh: the batch on the data axis, fc1
// column-parallel (split n) and fc2 row-parallel (split k) on the tensor axis.
#pragma once

#include <optional>
#include <vector>

#include "ir/graph.h"
#include "plan/plan.h"

namespace shardwise::transform::testing_plans {

// x [8, 16] -> linear 32 (fc1) -> gelu -> linear 16 (fc2) -> mean.
inline ir::Graph megatron_mlp_graph() {
  ir::Graph g;
  auto f32 = [](std::vector<std::int64_t> shape, std::optional<int> batch = std::nullopt) {
    return ir::TensorType{ir::DType::F32, std::move(shape), batch};
  };
  ir::ValueId x = g.add_value("x", f32({8, 16}, 0), ir::ValueRole::Input);
  ir::ValueId w1 = g.add_value("fc1.weight", f32({32, 16}), ir::ValueRole::Parameter);
  ir::ValueId w2 = g.add_value("fc2.weight", f32({16, 32}), ir::ValueRole::Parameter);
  ir::NodeId a = g.add_node("aten::linear", {x, w1}, {{"h", f32({8, 32}, 0)}}, {}, "fc1");
  ir::NodeId b = g.add_node("aten::gelu", {g.node(a).outputs[0]}, {{"act", f32({8, 32}, 0)}}, {}, "act");
  ir::NodeId c = g.add_node("aten::linear", {g.node(b).outputs[0], w2}, {{"y", f32({8, 16}, 0)}}, {}, "fc2");
  ir::NodeId d = g.add_node("aten::mean", {g.node(c).outputs[0]}, {{"loss", f32({})}}, {}, "");
  g.set_outputs({g.node(d).outputs[0]});
  return g;
}

inline plan::Sharding megatron_mlp() {
  plan::Sharding s;
  s.mesh = {2, 2};
  s.axis_names = {"data", "tensor"};
  s.level = "manual";
  s.placements = {{"x", {"S(0)", "R"}},    {"fc1.weight", {"R", "S(0)"}}, {"fc2.weight", {"R", "S(1)"}},
                  {"h", {"S(0)", "S(1)"}}, {"act", {"S(0)", "S(1)"}},     {"y", {"S(0)", "P(sum)"}},
                  {"loss", {"P(mean)", "P(sum)"}}};
  s.strategies = {{"h", {"split _0", "split n"}},
                  {"act", {"split d0", "split d1"}},
                  {"y", {"split _0", "split k"}},
                  {"loss", {"split r0", "partial"}}};
  s.leaves = {"x", "fc1.weight", "fc2.weight"};
  return s;
}

}  // namespace shardwise::transform::testing_plans
