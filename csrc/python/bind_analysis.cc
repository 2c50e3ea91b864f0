// Python face of the analyses (csrc/analysis) and the graph passes the capture front
// ends run. Every function takes the graph first; results are plain dicts and lists.
#include <pybind11/stl.h>

#include "analysis/activation_bytes.h"
#include "analysis/batch_dim.h"
#include "analysis/flops.h"
#include "analysis/parameter_stats.h"
#include "analysis/repeated_blocks.h"
#include "analysis/shape_check.h"
#include "analysis/summary_table.h"
#include "analysis/unknown_ops.h"
#include "ir/graph.h"
#include "ops/op_table.h"
#include "ops/random_draws.h"
#include "python/bindings.h"
#include "transform/dead_code.h"

namespace py = pybind11;

namespace shardwise::python {

void bind_analysis(py::module_& m) {
  const auto& table = ops::OpTable::builtin();
  m.def("forward_flops", [&table](const ir::Graph& g) {
    auto report = analysis::forward_flops(table, g);
    py::dict d;
    d["total"] = report.total;
    d["matmul_total"] = report.matmul_total;
    d["per_node"] = report.per_node;
    return d;
  });
  m.def("training_precision", [](const ir::Graph& g) { return std::string(analysis::training_precision(g)); },
        "The precision a plan for the graph is priced in by default (csrc/analysis/parameter_stats.h).");
  m.def("parameter_stats", [](const ir::Graph& g) {
    auto stats = analysis::parameter_stats(g);
    py::dict d;
    d["parameters"] = stats.parameters;
    d["parameter_bytes"] = stats.parameter_bytes;
    d["buffers"] = stats.buffers;
    d["buffer_bytes"] = stats.buffer_bytes;
    return d;
  });
  m.def("builtin_op_names", [&table] {
    std::vector<std::string> names;
    for (const auto& spec : table.specs()) names.push_back(spec.name);
    return names;
  }, "Every op of the builtin op table (csrc/ops/op_table_builtin.cc), by its IR name.");
  m.def("random_draw", [](const std::string& op) { return std::string(ops::random_draw_name(ops::random_draw(op))); },
        "How the core treats the op's random draws on a block (csrc/ops/random_draws.h): "
        "'none', 'mask', 'like' or 'other'.");
  m.def("seeded_ops", [] {
    std::vector<std::string> names;
    for (const auto& [name, kind] : ops::seeded_ops()) names.emplace_back(name);
    return names;
  }, "The base names of the ops the core knows to draw random numbers (csrc/ops/random_draws.h).");
  m.def("activation_bytes", [](const ir::Graph& g) { return analysis::activation_bytes(g); });
  m.def("unknown_ops", [&table](const ir::Graph& g) {
    py::list out;
    for (const auto& u : analysis::unknown_ops(table, g)) {
      py::dict d;
      d["op"] = u.op;
      d["module_path"] = u.module_path;
      d["count"] = u.count;
      out.append(d);
    }
    return out;
  });
  m.def("repeated_blocks", [](const ir::Graph& g) {
    py::list out;
    for (const auto& group : analysis::find_repeated_blocks(g)) {
      py::dict d;
      d["parent"] = group.parent;
      d["module_paths"] = group.module_paths;
      d["nodes_per_block"] = group.nodes.empty() ? 0 : group.nodes.front().size();
      d["nodes"] = group.nodes;
      out.append(d);
    }
    return out;
  });
  m.def("summary", [&table](const ir::Graph& g) { return analysis::summary_table(table, g); });
  m.def("check_shapes", [&table](const ir::Graph& g) { analysis::check_shapes(table, g); });
  m.def("propagate_batch_dim", [&table](ir::Graph& g) { return analysis::propagate_batch_dim(table, g); },
        "Marks the batch dimension of every value reachable from the inputs; returns whether it changed anything.");
  m.def("eliminate_dead_code", [](ir::Graph& g) { return transform::eliminate_dead_code(g); },
        "Removes nodes no graph output depends on (parameters and inputs stay); returns whether it changed anything.");
}

}  // namespace shardwise::python
