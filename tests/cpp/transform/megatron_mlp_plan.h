// A test fixture shared by the rewrite tests: Megatron's MLP (x [8, 16] -> fc1 32 -> gelu ->
// fc2 16 -> mean) on a {data 2, tensor 2} mesh: the batch on the data axis, fc1
// column-parallel (split n) and fc2 row-parallel (split k) on the tensor axis.
#pragma once

#include "plan/plan.h"

namespace shardwise::transform::testing_plans {

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
