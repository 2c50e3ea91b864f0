// Python face of the plan (csrc/plan) and the plan evaluator (csrc/cost/plan_cost.h).
// Plans cross the boundary as JSON text (one document, the same the C++ core writes);
// results come back as plain dicts. python/shardwise/plan.py wraps them as shardwise.Plan.
#include <pybind11/stl.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cost/constants.h"
#include "cost/op_cost.h"
#include "cost/plan_cost.h"
#include "cost/profiled_cost.h"
#include "ir/graph.h"
#include "plan/plan.h"
#include "search/placement.h"
#include "search/plan_report.h"
#include "search/spmd_search.h"
#include "search/stage_layout.h"
#include "python/bindings.h"
#include "python/plan_result.h"
#include "support/error.h"
#include "search/joint_planner.h"
#include "search/micro_batch_check.h"
#include "analysis/batch_coupling.h"
#include "ops/op_table.h"
#include "transform/local_shard.h"

namespace py = pybind11;

namespace shardwise::python {
namespace {

cost::Precision precision_named(const std::string& precision) {
  auto parsed = cost::parse_precision(precision);
  if (!parsed)
    throw support::ValidationError("plan: unknown precision '" + precision + "' (known: f32, tf32, bf16, f16, fp8)");
  return *parsed;
}

// A search's progress callback calling a Python function (the search runs without the GIL).
std::function<void(int, int)> python_progress(const std::optional<py::function>& progress) {
  if (!progress) return {};
  return [fn = *progress](int done, int total) {
    py::gil_scoped_acquire gil;
    fn(done, total);
  };
}

// The cost model a planner prices with: a profile's measurements where it has them
// (cost/profiled_cost.h), or the analytic model ("").
std::unique_ptr<cost::CostModel> cost_model_of(const std::string& profile_json) {
  if (profile_json.empty()) return std::make_unique<cost::AnalyticCostModel>();
  return std::make_unique<cost::ProfiledCostModel>(cost::profile_from_json_string(profile_json));
}

// `run()` without the GIL: a planner is pure C++ and may run threads; its progress callback
// takes the GIL back (python_progress).
template <typename Run>
auto without_gil(Run&& run) {
  py::gil_scoped_release release;
  return run();
}

// The SPMD search's result as Python reads it (the binding's docstring).
py::dict search_plan_dict(const ir::Graph& graph, const cost::Cluster& cluster, std::int64_t global_batch,
                          const std::string& level, std::optional<std::vector<int>> mesh, double memory_fraction,
                          const std::string& precision, bool allow_recompute, bool allow_zero,
                          std::optional<py::function> progress, bool collective_matmul, bool batch_on_tensor_axis,
                          const std::string& recompute, const std::string& profile, bool context_parallel,
                          bool expert_parallel, const std::string& state_dtype, bool compile) {
  const std::unique_ptr<cost::CostModel> model = cost_model_of(profile);
  search::SpmdSearchOptions options;
  options.compile = compile;
  (void)cost::state_dtype_memory(state_dtype);  // checked here, named in the plan
  options.state_dtype = state_dtype;
  if (!recompute.empty()) options.recompute = plan::recompute_from_name(recompute);
  options.batch_on_tensor_axis = batch_on_tensor_axis;
  options.collective_matmul = collective_matmul;
  options.context_parallel = context_parallel;
  options.expert_parallel = expert_parallel;
  options.global_batch = global_batch;
  options.level = search::search_level_from_name(level);
  options.mesh = std::move(mesh);
  options.memory_fraction = memory_fraction;
  options.precision = precision_named(precision);
  options.allow_recompute = allow_recompute;
  options.allow_zero = allow_zero;
  options.progress = python_progress(progress);
  const search::SpmdSearchResult r = without_gil([&] { return search::search_spmd(graph, cluster, *model, options); });
  py::list candidates;
  for (const auto& c : r.candidates) {
    py::dict d;
    d["mesh"] = c.mesh;
    d["recompute"] = std::string(plan::recompute_name(c.recompute));
    d["fits"] = c.fits;
    d["step_time"] = c.step_time;
    d["memory_per_rank"] = c.memory_per_rank;
    candidates.append(d);
  }
  py::dict out;
  out["plan"] = plan::plan_to_json_string(r.plan);
  out["fits"] = r.fits;
  out["candidates"] = candidates;
  out["search_seconds"] = r.search_seconds;
  out["axis_problems_solved"] = r.axis_problems_solved;
  out["axis_problems_reused"] = r.axis_problems_reused;
  out["memory_capacity"] = r.memory_limit;
  out["report"] = search::plan_report(r.plan, r.memory_limit);
  if (r.balance) {
    py::dict b;
    b["axis"] = r.balance->axis;
    b["ranks"] = r.balance->ranks;
    b["ratios"] = r.balance->ratios;
    b["step_time"] = r.balance->step_time;
    b["even_step_time"] = r.balance->even_step_time;
    b["lp_step_time"] = r.balance->lp_step_time;
    out["balance"] = b;
  }
  return out;
}

// The joint planner's result as Python reads it (the binding's docstring).
py::dict plan_joint_dict(const ir::Graph& graph, const cost::Cluster& cluster, std::int64_t global_batch,
                         const std::string& level, double memory_fraction, const std::string& precision,
                         std::optional<py::function> progress,
                         std::optional<std::pair<std::vector<double>, std::vector<double>>> network, bool stage_layouts,
                         bool allow_zero, const std::string& micro_batch_semantics, const std::string& profile,
                         bool context_parallel, bool expert_parallel, const std::string& state_dtype,
                         bool compile, bool collective_matmul) {
  const std::unique_ptr<cost::CostModel> model = cost_model_of(profile);
  search::JointPlanOptions options;
  options.compile = compile;
  options.collective_matmul = collective_matmul;
  (void)cost::state_dtype_memory(state_dtype);  // checked here, named in the plan
  options.state_dtype = state_dtype;
  options.context_parallel = context_parallel;
  options.expert_parallel = expert_parallel;
  options.micro_batch_semantics = plan::micro_batch_semantics_from_name(micro_batch_semantics);
  options.stage_layouts = stage_layouts;
  options.allow_zero = allow_zero;
  options.global_batch = global_batch;
  if (network) options.network = search::NetworkCondition{network->first, network->second};
  options.level = search::search_level_from_name(level);
  options.memory_fraction = memory_fraction;
  precision_named(precision);  // checked here, named in the plan
  options.precision = precision;
  options.progress = python_progress(progress);
  const search::JointPlanResult r = without_gil([&] { return search::plan_joint(graph, cluster, *model, options); });
  py::list best;
  for (const auto& b : r.best) best.append(plan::plan_to_json_string(b.plan));
  py::dict out;
  out["plan"] = plan::plan_to_json_string(r.plan);
  out["fits"] = r.fits;
  out["evaluated"] = r.evaluated;
  out["stage_layout_searches"] = r.stage_layout_searches;
  out["searched_layout"] = r.searched_layout;
  out["best"] = best;
  out["search_seconds"] = r.search_seconds;
  out["memory_capacity"] = r.memory_limit;
  out["report"] = search::plan_report(r.plan, r.memory_limit);
  py::list reasons;
  for (const search::SplitReason& reason : r.split_reasons) {
    auto candidate = [](const search::JointCandidate& c) {
      py::dict d;
      d["plan"] = plan::plan_to_json_string(c.plan);
      d["step_time"] = c.step_time;
      d["memory_per_rank"] = c.memory_per_rank;
      d["fits"] = c.fits;
      return d;
    };
    py::dict d;
    d["split"] = reason.split;
    d["with"] = candidate(reason.with);
    d["without"] = reason.without ? py::object(candidate(*reason.without)) : py::none();
    reasons.append(d);
  }
  out["split_reasons"] = reasons;
  return out;
}

// Where a placement puts a tensor's elements on a rank, and how people read it.
void bind_placements(py::module_& m) {
  m.def(
      "local_shard",
      [](const std::vector<std::int64_t>& shape, const std::vector<std::string>& placements,
         const std::vector<int>& mesh, int rank) {
        transform::LocalShard s = transform::local_shard(shape, placements, mesh, rank);
        py::dict out;
        out["dims"] = s.dims;
        out["shape"] = s.shape;
        out["partial"] = s.partial;
        return out;
      },
      py::arg("shape"), py::arg("placements"), py::arg("mesh"), py::arg("rank"));
  m.def("block_bounds", &transform::block_bounds, py::arg("length"), py::arg("n"), py::arg("k"),
        py::arg("ratios") = std::vector<double>{},
        "[begin, end) of block k of n over `length` elements, even or at the ratios (transform/local_shard.h).");
  m.def(
      "partial_axes",
      [](const std::vector<std::string>& placement) {
        std::vector<int> axes;
        for (std::size_t a = 0; a < placement.size(); ++a)
          if (search::parse_placement(placement[a]).is_partial()) axes.push_back(static_cast<int>(a));
        return axes;
      },
      py::arg("placement"),
      "The mesh axes on which a placement (one text per axis, docs/plan-format.md) is Partial (search/placement.h).");
  m.def("readable_placement", &search::readable_placement, py::arg("placement"),
        "A placement's text for people (csrc/search/plan_report.h).");
}

// A plan document: its canonical form, hash, schedules, micro-batches and stages, and its report.
void bind_plan_document(py::module_& m) {
  m.def("plan_normalise", [](const std::string& text) {
    return plan::plan_to_json_string(plan::plan_from_json_string(text));
  }, "Parse, validate and re-write a plan's JSON (canonical form).");
  m.def("schedule_names", [] {
    std::vector<std::string> names;
    for (std::string_view n : plan::schedule_names()) names.emplace_back(n);
    return names;
  }, "Every pipeline schedule's plan name (plan/plan.h).");
  m.def("canonical_schedule", [](const std::string& name) {
    return std::string(plan::schedule_name(plan::schedule_from_name(name)));
  }, "A schedule's plan name from any name a plan accepts (\"interleaved\" too); ValidationError if none.");
  m.def("schedule_v_shaped", [](const std::string& name) { return plan::v_shaped(plan::schedule_from_name(name)); },
        "Two chunks per rank in a V (zb-v, dualpipe-v).");
  m.def(
      "plan_num_micro_batches",
      [](std::int64_t global_batch, std::int64_t micro_batch, int data, bool sharded) {
        // The count reads four fields: a plan of them alone, not the document parsed again.
        plan::Plan p;
        p.data = data;
        p.global_batch = global_batch;
        p.micro_batch = micro_batch;
        if (sharded) p.sharding = plan::Sharding{};
        return p.num_micro_batches();
      },
      py::arg("global_batch"), py::arg("micro_batch"), py::arg("data"), py::arg("sharded"),
      "Micro-batches per step on each data rank (plan::Plan::num_micro_batches).");
  m.def("plan_hash", [](const std::string& text) { return plan::plan_hash_hex(plan::plan_from_json_string(text)); });
  m.def(
      "stage_plan", [](const std::string& text, int stage) {
        const plan::Plan p = plan::plan_from_json_string(text);
        return plan::plan_to_json_string(stage < 0 ? plan::stage_plan(p) : plan::stage_plan(p, stage));
      },
      py::arg("plan_json"), py::arg("stage") = -1,
      "The SPMD plan every stage of a complete pipelined plan runs, or stage `stage`'s where the stages have "
      "meshes of their own (plan/plan.h).");
  m.def(
      "stage_ranks",
      [](const std::string& text, int stage) {
        const plan::Plan p = plan::plan_from_json_string(text);
        if (stage < 0 || stage >= p.pipeline)
          throw support::ValidationError("stage_ranks: stage " + std::to_string(stage) + " of a plan of " +
                                         std::to_string(p.pipeline) + " stages");
        return p.stage_ranks(stage);
      },
      py::arg("plan_json"), py::arg("stage"),
      "The global ranks pipeline stage `stage` runs on (plan/plan.h: stage_first_rank, stage_size).");
  m.def(
      "plan_report",
      [](const std::string& text, double capacity) {
        return search::plan_report(plan::plan_from_json_string(text), capacity);
      },
      py::arg("plan_json"), py::arg("memory_capacity") = 0.0);
}

// Whether micro-batches change what a graph computes, and the refusal of a plan they would change.
void bind_micro_batch_checks(py::module_& m) {
  m.def(
      "batch_coupling",
      [](const ir::Graph& graph) {
        const analysis::BatchCoupling c = analysis::batch_coupling(ops::OpTable::builtin(), graph);
        py::list sites;
        for (const auto& s : c.sites) {
          py::dict d;
          d["op"] = s.op;
          d["node"] = s.node;
          d["module_path"] = s.module_path;
          d["reason"] = s.reason;
          sites.append(d);
        }
        py::dict out;
        out["batch"] = c.batch;
        out["loss"] = std::string(analysis::loss_combination_name(c.loss));
        out["sites"] = sites;
        out["describe"] = c.describe();
        return out;
      },
      py::arg("graph"),
      "Whether micro-batches change what the graph computes (csrc/analysis/batch_coupling.h): the rows "
      "followed, how the loss combines ('sum' or 'mean') and where the rows meet.");
  m.def(
      "check_micro_batches",
      [](const ir::Graph& graph, const std::string& text) {
        search::check_micro_batches(ops::OpTable::builtin(), graph, plan::plan_from_json_string(text));
      },
      py::arg("graph"), py::arg("plan_json"),
      "Refuses a plan with micro-batches for a graph they change (csrc/search/micro_batch_check.h).");
}

// The planners and the evaluator: a plan completed, priced, or searched for.
void bind_planners(py::module_& m) {
  m.def(
      "complete_plan",
      [](const ir::Graph& graph, const cost::Cluster& cluster, const std::string& text, const std::string& level,
         const std::string& profile) {
        const plan::Plan p = plan::plan_from_json_string(text);
        const std::unique_ptr<cost::CostModel> model = cost_model_of(profile);
        search::CompletedPlan out;
        {
          py::gil_scoped_release release;
          out = search::complete_plan(graph, cluster, p, search::search_level_from_name(level), cost::kMemoryFraction,
                                      model.get());
        }
        plan::validate(out.plan);
        py::dict d;
        d["plan"] = plan::plan_to_json_string(out.plan);
        d["fits"] = out.fits ? py::cast(*out.fits) : py::none();
        return d;
      },
      py::arg("graph"), py::arg("cluster"), py::arg("plan_json"), py::arg("level") = "fast",
      py::arg("profile_json") = "",
      "The plan with everything its run needs (csrc/search/stage_layout.h: complete_plan), and whether it fits "
      "(None when no search said); a pipelined plan priced again with its stages' layout (with profile_json's "
      "measurements where given).");
  m.def(
      "evaluate_plan",
      [](const ir::Graph& graph, const cost::Cluster& cluster, const std::string& text) {
        plan::Plan p = plan::plan_from_json_string(text);
        search::check_micro_batches(ops::OpTable::builtin(), graph, p);
        return evaluate_plan_to_python(graph, cluster, p, cost::AnalyticCostModel{});
      },
      py::arg("graph"), py::arg("cluster"), py::arg("plan_json"));
  m.def("search_plan", &search_plan_dict,
        py::arg("graph"), py::arg("cluster"), py::arg("global_batch"), py::arg("level") = "fast",
        py::arg("mesh") = py::none(), py::arg("memory_fraction") = cost::kMemoryFraction, py::arg("precision") = "bf16",
        py::arg("allow_recompute") = true, py::arg("allow_zero") = true, py::arg("progress") = py::none(),
        py::arg("collective_matmul") = false, py::arg("batch_on_tensor_axis") = true, py::arg("recompute") = "",
        py::arg("profile_json") = "", py::arg("context_parallel") = true, py::arg("expert_parallel") = true,
        py::arg("state_dtype") = "", py::arg("compile") = false,
        "The SPMD sharding search (csrc/search/spmd_search.h); recompute= \"none\", \"full\" or \"selective\": only "
        "that recomputation (\"\": none, and selective and full where allow_recompute); profile_json: a "
        "shardwise.Profile's JSON, priced with it (cost/profiled_cost.h), \"\": the analytic model; "
        "context_parallel: whether self-attention's sequence may be split as ring attention; expert_parallel: "
        "whether a mixture of experts' experts may be split over ranks; compile: the programs run under "
        "torch.compile, priced so (plan.compile).");
  m.def("plan_joint", &plan_joint_dict,
        py::arg("graph"), py::arg("cluster"), py::arg("global_batch"), py::arg("level") = "fast",
        py::arg("memory_fraction") = cost::kMemoryFraction, py::arg("precision") = "bf16",
        py::arg("progress") = py::none(), py::arg("network") = py::none(), py::arg("stage_layouts") = true,
        py::arg("allow_zero") = true, py::arg("micro_batch_semantics") = "exact", py::arg("profile_json") = "",
        py::arg("context_parallel") = true, py::arg("expert_parallel") = true, py::arg("state_dtype") = "",
        py::arg("compile") = false, py::arg("collective_matmul") = false,
        "The joint pipeline x data x tensor planner (csrc/search/joint_planner.h); profile_json as search_plan's; "
        "context_parallel: whether candidates may split each row's sequence (plan.context); expert_parallel: "
        "whether candidates may split the experts over their stages' data ranks (plan.expert); compile: as "
        "search_plan's; collective_matmul: every candidate's (plan.collective_matmul), its stage layouts searched "
        "and priced with the rings.");
}

}  // namespace

void bind_plan(py::module_& m) {
  bind_placements(m);
  bind_plan_document(m);
  bind_micro_batch_checks(m);
  bind_planners(m);
}

}  // namespace shardwise::python
