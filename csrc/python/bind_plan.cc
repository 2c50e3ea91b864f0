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
#include "python/plan_result.h"

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
        return evaluate_plan_to_python(graph, cluster, p, cost::AnalyticCostModel{});
      },
      py::arg("graph"), py::arg("cluster"), py::arg("plan_json"));
}

}  // namespace shardwise::python
