// Evaluating a plan for Python: one function for every cost model (analytic in
// bind_plan.cc, profiled in bind_profile.cc), so both return the same keys.
#pragma once

#include <pybind11/pybind11.h>

#include "cost/cluster.h"
#include "cost/op_cost.h"
#include "ir/graph.h"
#include "plan/plan.h"

namespace shardwise::python {

// Prices the plan with the one evaluator (search/plan_price.h) without the GIL and returns
// {plan (JSON with the prediction), step_time, tflops_per_device, memory_per_rank,
// memory_breakdown, breakdown}, and: for a plan priced by its degrees model_flops, layers,
// tensor_parallel_pairs_per_layer, micro_batches, bubble_fraction, ...; for a sharded plan
// fits (whether it fits in cost::kMemoryFraction of the smallest device).
pybind11::dict evaluate_plan_to_python(const ir::Graph& graph, const cost::Cluster& cluster, const plan::Plan& plan,
                                       const cost::CostModel& model);

}  // namespace shardwise::python
