// The optimizer step's seconds on one rank: the one rule both planners price it by (the
// degrees evaluator's stages, cost/plan_cost.cc, and the SPMD model's leaves,
// search/sharding_model.cc).
#pragma once

#include "cost/op_cost.h"

namespace shardwise::cost {

// `elements`: the parameter elements the rank holds the optimizer state of. Measured where the
// model has it (CostModel::optimizer_seconds_per_element: a profile's AdamW step), else every
// byte of those states read and written (`bytes_per_parameter` each) at `efficiency` of the
// device's `memory_bandwidth`.
double optimizer_step_seconds(const CostModel& model, double elements, double bytes_per_parameter,
                              double memory_bandwidth, double efficiency);

}  // namespace shardwise::cost
