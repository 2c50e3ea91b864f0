// Python face of the plan (csrc/plan) and the plan evaluator (csrc/cost/plan_cost.h).
// Plans cross the boundary as JSON text (one document, the same the C++ core writes);
// results come back as plain dicts. python/shardwise/plan.py wraps them as shardwise.Plan.
#include <pybind11/stl.h>

#include <string>

#include "cost/op_cost.h"
#include "cost/plan_cost.h"
#include "ir/graph.h"
#include "plan/plan.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace shardwise::python {

void bind_plan(py::module_& m) {
  m.def("plan_normalise", [](const std::string& text) {
    return plan::plan_to_json_string(plan::plan_from_json_string(text));
  }, "Parse, validate and re-write a plan's JSON (canonical form).");
  m.def("plan_hash", [](const std::string& text) { return plan::plan_hash_hex(plan::plan_from_json_string(text)); });
  m.def(
      "evaluate_plan",
      [](const ir::Graph& graph, const cost::Cluster& cluster, const std::string& text) {
        plan::Plan p = plan::plan_from_json_string(text);
        cost::AnalyticCostModel model;
        cost::PlanCost c;
        {
          py::gil_scoped_release release;
          c = cost::evaluate(graph, cluster, p, model);
        }
        py::dict out;
        out["plan"] = plan::plan_to_json_string(cost::with_prediction(p, c));
        out["step_time"] = c.step_time;
        out["tflops_per_device"] = c.tflops_per_device;
        out["memory_per_rank"] = c.memory_per_rank;
        out["memory_breakdown"] = c.memory_breakdown;
        out["breakdown"] = c.breakdown();
        out["model_flops"] = c.model_flops;
        out["layers"] = c.layers;
        out["tensor_parallel_pairs_per_layer"] = c.tensor_parallel_pairs_per_layer;
        out["micro_batches"] = c.micro_batches;
        out["bubble_fraction"] = c.bubble_fraction;
        return out;
      },
      py::arg("graph"), py::arg("cluster"), py::arg("plan_json"));
}

}  // namespace shardwise::python
