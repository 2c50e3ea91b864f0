#include "python/plan_result.h"

#include <pybind11/stl.h>

#include "cost/plan_cost.h"
#include "search/plan_price.h"

namespace py = pybind11;

namespace shardwise::python {

py::dict evaluate_plan_to_python(const ir::Graph& graph, const cost::Cluster& cluster, const plan::Plan& plan,
                                 const cost::CostModel& model) {
  search::PricedPlan priced;
  {
    py::gil_scoped_release release;  // pure C++ from here; planners may run threads
    priced = search::price_plan(graph, cluster, model, plan);
  }
  py::dict out;
  out["plan"] = plan::plan_to_json_string(priced.plan);
  const plan::Predicted& p = *priced.plan.predicted;
  out["step_time"] = p.step_time;
  out["tflops_per_device"] = p.tflops_per_device;
  out["memory_per_rank"] = p.memory_per_rank;
  out["memory_breakdown"] = p.memory_breakdown;
  out["breakdown"] = p.breakdown;
  if (priced.sharded) {
    out["fits"] = priced.fits;
    return out;
  }
  const cost::PlanCost& c = priced.degrees;
  out["breakdown"] = c.breakdown();
  out["model_flops"] = c.model_flops;
  out["megatron_tflops_per_device"] = c.megatron_tflops_per_device;
  out["layers"] = c.layers;
  out["tensor_parallel_pairs_per_layer"] = c.tensor_parallel_pairs_per_layer;
  out["micro_batches"] = c.micro_batches;
  out["bubble_fraction"] = c.bubble_fraction;
  out["memory_use"] = c.memory_use;
  out["stage_scale"] = c.stage_scale;
  return out;
}

}  // namespace shardwise::python
