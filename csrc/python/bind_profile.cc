// Python face of profiled mode (csrc/cost/profiled_cost.h). Profiles cross the boundary as
// their JSON text (python/shardwise/profile.py keeps it and wraps it as shardwise.Profile);
// results come back as plain dicts, as in bind_plan.cc. The node signature is computed here
// only, so the keys the profiler measures under are exactly the keys the model looks up.
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "cost/plan_cost.h"
#include "cost/profiled_cost.h"
#include "cost/recording_cost.h"
#include "search/plan_price.h"
#include "ir/graph.h"
#include "plan/plan.h"
#include "python/bindings.h"
#include "python/plan_result.h"

namespace py = pybind11;

namespace shardwise::python {
namespace {

using py::literals::operator""_a;

py::dict coverage_to_python(const cost::ProfileCoverage& c) {
  return py::dict("nodes_measured"_a = c.nodes_measured, "nodes_analytic"_a = c.nodes_analytic,
                  "node_calls_measured"_a = c.node_calls_measured, "node_calls_analytic"_a = c.node_calls_analytic,
                  "collective_calls_measured"_a = c.collective_calls_measured,
                  "collective_calls_analytic"_a = c.collective_calls_analytic);
}

}  // namespace

void bind_profile(py::module_& m) {
  m.def(
      "node_signatures",
      [](const ir::Graph& graph) {
        std::vector<std::string> out;
        out.reserve(graph.nodes().size());
        for (const auto& node : graph.nodes()) out.push_back(cost::node_signature(graph, node));
        return out;
      },
      py::arg("graph"), "The profile key of every node, in node order (csrc/cost/profiled_cost.h).");
  m.def(
      "profile_normalise",
      [](const std::string& text, int indent) {
        return cost::profile_to_json_string(cost::profile_from_json_string(text), indent);
      },
      py::arg("profile_json"), py::arg("indent") = -1, "Parse, validate and re-write a profile's JSON.");
  m.def(
      "profile_coverage",
      [](const ir::Graph& graph, const std::string& text) {
        cost::ProfiledCostModel model(cost::profile_from_json_string(text));
        py::dict out = coverage_to_python(model.coverage(graph));
        std::vector<std::string> provenance;
        provenance.reserve(graph.nodes().size());
        for (const auto& node : graph.nodes()) {
          provenance.emplace_back(cost::provenance_name(model.provenance(graph, node)));
        }
        out["provenance"] = provenance;
        return out;
      },
      py::arg("graph"), py::arg("profile_json"),
      "Node counts measured / analytic, and every node's provenance in node order.");
  m.def(
      "profile_collective_time",
      [](const cost::Cluster& cluster, const std::string& kind, const std::vector<int>& ranks, std::int64_t bytes,
         const std::string& text) {
        cost::ProfiledCostModel model(cost::profile_from_json_string(text));
        const cost::CollectiveKind k = cost::collective_kind_from_name(kind);
        py::dict out;
        out["seconds"] = model.collective_time(cluster, k, ranks, bytes, cost::Algorithm::Auto);
        out["provenance"] =
            std::string(cost::provenance_name(model.collective_provenance(k, static_cast<int>(ranks.size()))));
        return out;
      },
      py::arg("cluster"), py::arg("kind"), py::arg("ranks"), py::arg("bytes"), py::arg("profile_json"));
  m.def(
      "plan_local_ops",
      [](const ir::Graph& graph, const cost::Cluster& cluster, const std::string& text) {
        const plan::Plan p = plan::plan_from_json_string(text);
        const cost::AnalyticCostModel analytic;
        const cost::RecordingCostModel recorder(analytic);
        {
          py::gil_scoped_release release;
          (void)search::price_plan(graph, cluster, recorder, p);
        }
        // A plan that recomputes selectively runs its ops under the policy's dispatch mode: the
        // profile times them so too (OpTime::selective_extra).
        const auto selective_of = [](const std::optional<plan::Sharding>& s) {
          return s && s->recompute == plan::Recompute::Selective;
        };
        const bool selective =
            p.recompute == plan::Recompute::Selective || selective_of(p.sharding) || selective_of(p.stage_sharding);
        py::list out;
        for (const auto& [signature, op] : recorder.records()) {
          py::dict d;
          d["signature"] = signature;
          d["node"] = static_cast<int>(op.node);
          d["shapes"] = op.shapes;
          d["fp8"] = op.fp8;
          d["selective"] = selective;
          out.append(d);
        }
        return out;
      },
      py::arg("graph"), py::arg("cluster"), py::arg("plan_json"),
      "Every node the evaluator prices for the plan, at the shapes one rank runs it (cost/recording_cost.h): "
      "[{signature, node (index), shapes (inputs then outputs), fp8 (an FP8 linear of an fp8 plan: measure it as "
      "runtime/fp8.py runs it), selective (the plan recomputes selectively: time it under the policy too)}], one per "
      "distinct signature.");
  m.def(
      "evaluate_plan_profiled",
      [](const ir::Graph& graph, const cost::Cluster& cluster, const std::string& text,
         const std::string& profile_text) {
        plan::Plan p = plan::plan_from_json_string(text);
        cost::ProfiledCostModel model(cost::profile_from_json_string(profile_text));
        // The keys of evaluate_plan, plus where the numbers came from.
        py::dict out = evaluate_plan_to_python(graph, cluster, p, model);
        cost::ProfileCoverage coverage = model.coverage(graph);
        cost::ProfileCoverage calls = model.calls();
        coverage.node_calls_measured = calls.node_calls_measured;
        coverage.node_calls_analytic = calls.node_calls_analytic;
        coverage.collective_calls_measured = calls.collective_calls_measured;
        coverage.collective_calls_analytic = calls.collective_calls_analytic;
        out["coverage"] = coverage_to_python(coverage);
        return out;
      },
      py::arg("graph"), py::arg("cluster"), py::arg("plan_json"), py::arg("profile_json"));
}

}  // namespace shardwise::python
