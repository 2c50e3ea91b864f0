// Python face of the core IR: shardwise._C.Graph (csrc/ir/graph.h) with its text and
// JSON forms. Plain Python lists/dicts come out, so Python code never holds pointers
// into a graph that a pass may rebuild.
#include <pybind11/stl.h>

#include <variant>

#include "ir/graph.h"
#include "ir/json.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace shardwise::python {
namespace {

py::object attr_to_python(const ir::AttrValue& value) {
  return std::visit(
      [](const auto& v) -> py::object {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, ir::NoneAttr>) {
          return py::none();
        } else {
          return py::cast(v);
        }
      },
      value);
}

py::dict value_to_python(const ir::Value& v) {
  py::dict d;
  d["name"] = v.name;
  d["dtype"] = std::string(ir::dtype_name(v.type.dtype));
  d["shape"] = v.type.shape;
  d["batch_dim"] = v.type.batch_dim ? py::cast(*v.type.batch_dim) : py::none();
  d["role"] = std::string(ir::role_name(v.role));
  return d;
}

py::dict node_to_python(const ir::Graph& g, const ir::Node& n) {
  py::dict d;
  d["op"] = n.op;
  py::list inputs, outputs;
  for (auto id : n.inputs) inputs.append(g.value(id).name);
  for (auto id : n.outputs) outputs.append(g.value(id).name);
  d["inputs"] = inputs;
  d["outputs"] = outputs;
  d["module"] = n.module_path;
  py::dict attrs;
  for (const auto& [key, value] : n.attrs) attrs[py::str(key)] = attr_to_python(value);
  d["attrs"] = attrs;
  return d;
}

py::list names(const ir::Graph& g, const std::vector<ir::ValueId>& ids) {
  py::list out;
  for (auto id : ids) out.append(g.value(id).name);
  return out;
}

}  // namespace

void bind_ir(py::module_& m) {
  py::class_<ir::Graph>(m, "Graph")
      .def_static("from_json", [](const std::string& text) { return ir::graph_from_json_string(text); })
      .def_static("from_text", [](const std::string& text) { return ir::parse_graph(text); })
      .def("to_json", [](const ir::Graph& g, int indent) { return ir::graph_to_json_string(g, indent); },
           py::arg("indent") = -1)
      .def("__str__", [](const ir::Graph& g) { return ir::print_graph(g); })
      .def("__eq__", [](const ir::Graph& a, const ir::Graph& b) { return a == b; })
      .def("verify", [](const ir::Graph& g) { ir::verify_graph(g); })
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
      .def("input_names", [](const ir::Graph& g) { return names(g, g.inputs()); })
      .def("output_names", [](const ir::Graph& g) { return names(g, g.outputs()); });
}

}  // namespace shardwise::python
