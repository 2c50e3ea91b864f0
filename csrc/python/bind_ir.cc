// Python face of the core IR: shardwise._C.Graph (csrc/ir/graph.h) with its text and
// JSON forms. Plain Python lists/dicts come out, so Python code never holds pointers
// into a graph that a pass may rebuild.
#include <pybind11/stl.h>

#include "ir/fingerprint.h"
#include "ir/graph.h"
#include "ir/json.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "python/bindings.h"
#include "python/ir_dicts.h"

namespace py = pybind11;

namespace shardwise::python {

void bind_ir(py::module_& m) {
  py::class_<ir::Graph>(m, "Graph")
      .def_static("from_json", [](const std::string& text) { return ir::graph_from_json_string(text); })
      .def_static("from_text", [](const std::string& text) { return ir::parse_graph(text); })
      .def("to_json", [](const ir::Graph& g, int indent) { return ir::graph_to_json_string(g, indent); },
           py::arg("indent") = -1)
      .def("__str__", [](const ir::Graph& g) { return ir::print_graph(g); })
      .def("__eq__", [](const ir::Graph& a, const ir::Graph& b) { return a == b; })
      .def("verify", [](const ir::Graph& g) { ir::verify_graph(g); })
      .def("fingerprint", [](const ir::Graph& g) { return ir::graph_fingerprint(g); },
           "Names, ops and dataflow, not shapes (csrc/ir/fingerprint.h): what a plan was searched on.")
      .def("num_nodes", [](const ir::Graph& g) { return g.nodes().size(); })
      .def("num_values", [](const ir::Graph& g) { return g.values().size(); })
      .def("nodes",
           [](const ir::Graph& g) {
             py::list out;
             for (const auto& n : g.nodes()) out.append(node_to_python(g, n));
             return out;
           })
      .def("values",
           [](const ir::Graph& g) {
             py::list out;
             for (const auto& v : g.values()) out.append(value_to_python(v));
             return out;
           })
      .def("input_names", [](const ir::Graph& g) { return value_names(g, g.inputs()); })
      .def("output_names", [](const ir::Graph& g) { return value_names(g, g.outputs()); });
}

}  // namespace shardwise::python
