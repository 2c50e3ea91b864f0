// Python face of the pipeline schedules and the simulator (csrc/schedule):
// shardwise._C.simulate_schedule(...) -> _C.Simulation, wrapped by
// python/shardwise/simulate.py as shardwise.simulate. Pictures come back as strings.
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "cost/pipeline_transfers.h"
#include "plan/plan.h"
#include "python/bindings.h"
#include "schedule/chrome_trace.h"
#include "schedule/p2p_channels.h"
#include "schedule/schedules.h"
#include "schedule/simulator.h"
#include "schedule/timeline_svg.h"
#include "support/error.h"

namespace py = pybind11;

namespace shardwise::python {
namespace {

struct Simulation {
  schedule::PipelineSchedule schedule;
  schedule::SimulationResult result;
  std::vector<std::string> rank_labels;  // a heterogeneous pipeline's device type per rank
};

// The schedule the planner prices (cost::pipeline_schedule), by its plan name: one dispatch.
schedule::PipelineSchedule make_schedule(const std::string& name, int stages, int micro_batches, int virtual_stages,
                                         int k) {
  return cost::pipeline_schedule(plan::schedule_from_name(name), stages, micro_batches, virtual_stages, k);
}

// forward / backward are a whole pipeline stage's seconds; with v virtual stages each
// chunk takes 1/v of them (the same model split finer). A schedule that splits the backward
// (zb-h1) runs `weight_fraction` of it as the weights' gradient (W), the rest as the input's (B).
Simulation simulate_schedule(const std::string& name, int stages, int micro_batches, int virtual_stages, int k,
                             double forward, double backward, double comm, double optimizer_step,
                             double weight_fraction, const std::vector<double>& rank_scale,
                             const std::vector<std::string>& rank_labels) {
  if (!(weight_fraction >= 0.0 && weight_fraction <= 1.0))
    throw support::ValidationError("simulate: weight_fraction must be in [0, 1], got " + std::to_string(weight_fraction));
  Simulation s;
  s.schedule = make_schedule(name, stages, micro_batches, virtual_stages, k);
  const int v = s.schedule.virtual_stages;
  const bool split = s.schedule.splits_backward();
  const auto n = static_cast<std::size_t>(s.schedule.total_stages());
  schedule::SimulationCosts costs;
  costs.forward.assign(n, forward / v);
  costs.backward.assign(n, (split ? backward * (1.0 - weight_fraction) : backward) / v);
  if (split) costs.weight.assign(n, backward * weight_fraction / v);
  // A heterogeneous pipeline: each rank's stages take its own multiple of the times.
  if (!rank_scale.empty()) {
    if (static_cast<int>(rank_scale.size()) != s.schedule.ranks)
      throw support::ValidationError("simulate: stage_scale has " + std::to_string(rank_scale.size()) +
                                     " entries for " + std::to_string(s.schedule.ranks) + " ranks");
    for (std::size_t g = 0; g < n; ++g) {
      const double scale = rank_scale[static_cast<std::size_t>(s.schedule.rank_of_stage(static_cast<int>(g)))];
      if (!(scale > 0)) throw support::ValidationError("simulate: stage_scale entries must be > 0");
      costs.forward[g] *= scale;
      costs.backward[g] *= scale;
      if (split) costs.weight[g] *= scale;
    }
  }
  if (!rank_labels.empty() && static_cast<int>(rank_labels.size()) != s.schedule.ranks)
    throw support::ValidationError("simulate: devices has " + std::to_string(rank_labels.size()) + " entries for " +
                                   std::to_string(s.schedule.ranks) + " ranks");
  s.rank_labels = rank_labels;
  if (comm > 0.0) costs.transfer = schedule::constant_transfer(comm);
  costs.optimizer_step = optimizer_step;
  s.result = schedule::simulate(s.schedule, costs);
  return s;
}

}  // namespace

void bind_schedule(py::module_& m) {
  py::class_<Simulation>(m, "Simulation")
      .def_property_readonly("step_time", [](const Simulation& s) { return s.result.step_time; })
      .def_property_readonly("bubble_fraction", [](const Simulation& s) { return s.result.bubble_fraction; })
      .def_property_readonly("bubble_overhead", [](const Simulation& s) { return s.result.bubble_overhead; })
      .def_property_readonly("peak_in_flight", [](const Simulation& s) { return s.result.peak_in_flight; })
      .def_property_readonly("busy", [](const Simulation& s) { return s.result.busy; })
      .def_property_readonly("ranks", [](const Simulation& s) { return s.schedule.ranks; })
      // The rank of each virtual stage (round-robin, or a V for zb-v): where the executor puts them.
      .def_property_readonly("stage_ranks",
                             [](const Simulation& s) {
                               std::vector<int> out;
                               for (int g = 0; g < s.schedule.total_stages(); ++g) out.push_back(s.schedule.rank_of_stage(g));
                               return out;
                             })
      .def_property_readonly("trace_event_count",
                             [](const Simulation& s) { return schedule::chrome_trace_event_count(s.result); })
      .def(
          "timeline_svg",
          [](const Simulation& s, const std::string& title, double width) {
            schedule::TimelineSvgOptions o;
            o.title = title;
            o.width = width;
            o.rank_labels = s.rank_labels;
            return schedule::timeline_svg(s.result, s.schedule, o);
          },
          py::arg("title") = "", py::arg("width") = 1000.0)
      .def("chrome_trace",
           [](const Simulation& s) { return schedule::chrome_trace(s.result, s.schedule, s.rank_labels); })
      .def("actions", [](const Simulation& s, int rank) {
        return schedule::to_string(s.schedule.per_rank.at(static_cast<std::size_t>(rank)));
      })
      .def(
          "action_list",
          [](const Simulation& s, int rank) {
            // The executor's form: (kind, micro-batch, stage, peer) per compute, send and
            // receive action ("F", "B", "W", "SA", "SG", "RA", "RG"); the rank-wide
            // optimizer step and gradient sync are the engine's own, so they are left out.
            py::list out;
            for (const schedule::Action& a : s.schedule.per_rank.at(static_cast<std::size_t>(rank)))
              if (a.is_compute() || a.is_send() || a.is_recv())
                out.append(py::make_tuple(std::string(schedule::action_kind_code(a.kind)), a.micro_batch, a.stage,
                                          a.peer));
            return out;
          },
          "Rank `rank`'s actions as (kind, micro_batch, stage, peer) tuples, in order (peer -1 "
          "for compute); the optimizer step and gradient sync left out.")
      .def(
          "p2p_channels",
          [](const Simulation& s) {
            py::list out;
            for (const schedule::P2PChannel& c : schedule::p2p_channels(s.schedule))
              out.append(py::make_tuple(c.sender, c.receiver, c.gradient));
            return out;
          },
          "The channels the schedule's sends and receives travel on, (sender, receiver, gradient) "
          "with pipeline ranks, sorted; raises ValidationError when its lists would receive out of "
          "their senders' order or hang where receives meet sends by order (NCCL).");
  m.def("simulate_schedule", &simulate_schedule, py::arg("schedule"), py::arg("stages"), py::arg("micro_batches"),
        py::arg("virtual_stages") = 1, py::arg("k") = 1, py::arg("forward") = 1.0, py::arg("backward") = 2.0,
        py::arg("comm") = 0.0, py::arg("optimizer_step") = 0.0, py::arg("weight_fraction") = 0.5,
        py::arg("rank_scale") = std::vector<double>{}, py::arg("rank_labels") = std::vector<std::string>{});
}

}  // namespace shardwise::python
