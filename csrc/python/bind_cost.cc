// Python face of the cluster description and the collective cost model (csrc/cost):
// shardwise._C.Cluster, the presets and the device catalogue. python/shardwise/cluster.py
// wraps it as shardwise.Cluster. Results are plain Python values (dicts, lists, floats).
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "analysis/selective_recompute.h"
#include "cost/cluster.h"
#include "cost/cluster_presets.h"
#include "cost/collective_cost.h"
#include "cost/constants.h"
#include "cost/op_cost.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace shardwise::python {
namespace {

py::dict device_type_to_python(const cost::DeviceType& t) {
  py::dict flops;
  for (cost::Precision p : cost::kAllPrecisions)
    flops[py::str(std::string(cost::precision_name(p)))] = t.peak_flops.at(p);
  for (cost::Precision p : cost::kOptionalPrecisions)  // listed only where the device has the units
    if (t.peak_flops.at(p) > 0) flops[py::str(std::string(cost::precision_name(p)))] = t.peak_flops.at(p);
  py::dict d;
  d["name"] = t.name;
  d["peak_flops"] = flops;
  d["memory_bytes"] = t.memory_bytes;
  d["memory_bandwidth"] = t.memory_bandwidth;
  return d;
}

cost::CollectiveEstimate estimate(const cost::Cluster& c, const std::string& kind, const std::vector<int>& ranks,
                                  std::int64_t bytes, const std::string& algorithm) {
  return cost::estimate_collective(c, cost::collective_kind_from_name(kind), ranks, bytes,
                                   cost::algorithm_from_name(algorithm));
}

}  // namespace

void bind_cost(py::module_& m) {
  py::class_<cost::Cluster>(m, "Cluster")
      .def_static("from_json", [](const std::string& text) { return cost::cluster_from_json_string(text); })
      .def_static(
          "preset", [](const std::string& name, int nodes) { return cost::preset(name, nodes); }, py::arg("name"),
          py::arg("nodes") = 1)
      .def(
          "to_json", [](const cost::Cluster& c, int indent) { return cost::cluster_to_json_string(c, indent); },
          py::arg("indent") = -1)
      .def_property_readonly("name", &cost::Cluster::name)
      .def_property_readonly("world_size", &cost::Cluster::world_size)
      .def_property_readonly("num_nodes", &cost::Cluster::num_nodes)
      .def_property_readonly("heterogeneous", &cost::Cluster::heterogeneous)
      .def("devices",
           [](const cost::Cluster& c) {
             std::vector<std::string> names;
             for (int r = 0; r < c.world_size(); ++r) names.push_back(c.device_of(r).name);
             return names;
           })
      .def("device_of", [](const cost::Cluster& c, int rank) { return device_type_to_python(c.device_of(rank)); })
      .def("node_of", &cost::Cluster::node_of)
      .def("local_rank", &cost::Cluster::local_rank)
      .def("span_of",
           [](const cost::Cluster& c, const std::vector<int>& ranks) {
             const cost::GroupSpan s = c.span_of(ranks);
             py::dict d;
             d["level"] = s.level;
             d["link"] = c.links()[static_cast<std::size_t>(s.level)].name;
             d["nodes"] = s.nodes;
             d["devices_per_node"] = s.devices_per_node;
             d["uniform"] = s.uniform;
             return d;
           })
      .def(
          "collective_estimate",
          [](const cost::Cluster& c, const std::string& kind, const std::vector<int>& ranks, std::int64_t bytes,
             const std::string& algorithm) {
            const cost::CollectiveEstimate e = estimate(c, kind, ranks, bytes, algorithm);
            return py::make_tuple(e.seconds, std::string(cost::algorithm_name(e.algorithm)));
          },
          py::arg("kind"), py::arg("ranks"), py::arg("bytes"), py::arg("algorithm") = "auto")
      .def(
          "collective_time",
          [](const cost::Cluster& c, const std::string& kind, const std::vector<int>& ranks, std::int64_t bytes,
             const std::string& algorithm) { return estimate(c, kind, ranks, bytes, algorithm).seconds; },
          py::arg("kind"), py::arg("ranks"), py::arg("bytes"), py::arg("algorithm") = "auto")
      .def("summary", &cost::Cluster::summary)
      .def("first_ranks", [](const cost::Cluster& c, int count) { return cost::first_ranks(c, count); },
           py::arg("count"))
      .def("rank_range", [](const cost::Cluster& c, int first, int count) { return cost::rank_range(c, first, count); },
           py::arg("first"), py::arg("count"))
      .def("__eq__", [](const cost::Cluster& a, const cost::Cluster& b) { return a == b; }, py::is_operator());

  // The cost model's constants the Python runtime reads (cost/constants.h: defined once there).
  m.attr("GRADIENT_BUCKET_BYTES") = cost::kGradientBucketBytes;
  m.attr("MEMORY_FRACTION") = cost::kMemoryFraction;
  // The dispatcher ops whose outputs selective recomputation keeps (analysis/selective_recompute.h):
  // runtime/recompute.py's policy, the planner's price.
  {
    py::tuple ops(analysis::selective_recompute_saved_ops().size());
    for (std::size_t i = 0; i < ops.size(); ++i) ops[i] = std::string(analysis::selective_recompute_saved_ops()[i]);
    m.attr("SELECTIVE_RECOMPUTE_SAVED_OPS") = ops;
  }

  // What Cluster.detect writes for what it measured (cost/op_cost.h): the model's terms.
  m.def(
      "peak_for_measured_gemm",
      [](double measured_flops, std::int64_t n) {
        return cost::peak_for_measured_gemm(cost::AnalyticConstants{}, measured_flops, n);
      },
      py::arg("measured_flops"), py::arg("n"),
      "The peak FLOP/s under which the analytic model prices an n x n x n GEMM at the measured rate.");
  m.def(
      "bandwidth_for_measured_copy",
      [](double measured) { return cost::bandwidth_for_measured_copy(cost::AnalyticConstants{}, measured); },
      py::arg("measured_bytes_per_second"),
      "The memory bandwidth under which the analytic model prices a copy at the measured rate.");
  m.def(
      "cluster_overlap_interference", [](const cost::Cluster& cluster) { return cost::overlap_interference(cluster); },
      py::arg("cluster"),
      "What a second of a collective beside compute adds to a step on the cluster (cost/cluster.h: the largest "
      "node's Node::overlap_interference, kOverlapInterference where unset).");
  m.def("cluster_preset_names", &cost::preset_names);
  m.def("known_device_types", [] {
    py::list out;
    for (const auto& t : cost::known_device_types()) out.append(device_type_to_python(t));
    return out;
  });
}

}  // namespace shardwise::python
