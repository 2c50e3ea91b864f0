// Bindings of the TorchScript importer (csrc/torch/torchscript_import.h):
//
//   _C.import_torchscript(graph, module_tensors, input_names=[], module_constants={}, ...) -> _C.Graph
//   _C._torchscript_import_debug(<same arguments>) -> dict   (plain Python data, for tests and debugging)
//
// `graph` is a torch._C.Graph (ScriptModule.graph); it casts to
// std::shared_ptr<torch::jit::Graph> because this extension is built with the pybind11
// bundled in torch (see TORCH-NOTES). `module_tensors` is a sequence of
// (name, canonical_name, "parameter" | "buffer", tensor) rows, one per alias, built by
// python/shardwise/_torchscript.py; only each tensor's shape and dtype are read
// (meta tensors are fine).
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/utils/pybind.h>

#include <string>
#include <variant>
#include <vector>

#include "ir/graph.h"
#include "python/bindings.h"
#include "python/ir_dicts.h"
#include "torch/torchscript_import.h"

namespace py = pybind11;

namespace shardwise::python {
namespace {

using torchbridge::ModuleTensor;
using torchbridge::TorchScriptImportError;
using torchbridge::TorchScriptImportOptions;

ir::AttrValue attr_from_python(const std::string& key, const py::handle& v) {
  if (v.is_none()) return ir::NoneAttr{};
  if (py::isinstance<py::bool_>(v)) return v.cast<bool>();
  if (py::isinstance<py::int_>(v)) return v.cast<std::int64_t>();
  if (py::isinstance<py::float_>(v)) return v.cast<double>();
  if (py::isinstance<py::str>(v)) return v.cast<std::string>();
  if (py::isinstance<py::list>(v) || py::isinstance<py::tuple>(v)) {
    std::vector<std::int64_t> ints;
    std::vector<double> doubles;
    bool all_int = true;
    for (const py::handle& e : v) {
      if (py::isinstance<py::bool_>(e) || py::isinstance<py::int_>(e)) {
        ints.push_back(e.cast<std::int64_t>());
        doubles.push_back(static_cast<double>(ints.back()));
      } else if (py::isinstance<py::float_>(e)) {
        all_int = false;
        doubles.push_back(e.cast<double>());
      } else {
        throw TorchScriptImportError("module constant '" + key + "': lists may hold numbers only");
      }
    }
    if (all_int) return ints;
    return doubles;
  }
  throw TorchScriptImportError("module constant '" + key + "' has unsupported type " +
                               std::string(py::str(py::type::of(v)).cast<std::string>()));
}

TorchScriptImportOptions make_options(const py::sequence& module_tensors, const std::vector<std::string>& input_names,
                                      const py::dict& module_constants, bool scalar_constants_as_attributes,
                                      bool remove_mutation, bool canonicalize_convolution, bool elide_no_ops) {
  TorchScriptImportOptions options;
  for (const py::handle& row : module_tensors) {
    auto fields = row.cast<py::sequence>();
    if (fields.size() != 4) {
      throw TorchScriptImportError("module_tensors rows must be (name, canonical_name, role, tensor)");
    }
    ModuleTensor t;
    t.name = fields[0].cast<std::string>();
    t.canonical = fields[1].cast<std::string>();
    const auto role = fields[2].cast<std::string>();
    if (role == "parameter") t.role = ir::ValueRole::Parameter;
    else if (role == "buffer") t.role = ir::ValueRole::Buffer;
    else throw TorchScriptImportError("module tensor '" + t.name + "': role must be 'parameter' or 'buffer', got '" +
                                      role + "'");
    const auto tensor = fields[3].cast<at::Tensor>();
    auto dtype = torchbridge::to_ir_dtype(tensor.scalar_type());
    if (!dtype) {
      throw TorchScriptImportError("module tensor '" + t.name + "' has dtype " +
                                   std::string(c10::toString(tensor.scalar_type())) +
                                   ", which the IR does not support");
    }
    t.type = ir::TensorType{*dtype, tensor.sizes().vec(), std::nullopt};
    options.module_tensors.push_back(std::move(t));
  }
  for (const auto& [key, value] : module_constants) {
    const auto name = key.cast<std::string>();
    options.module_constants.emplace(name, attr_from_python(name, value));
  }
  options.input_names = input_names;
  options.scalar_constants_as_attributes = scalar_constants_as_attributes;
  options.remove_mutation = remove_mutation;
  options.canonicalize_convolution = canonicalize_convolution;
  options.elide_no_ops = elide_no_ops;
  return options;
}

// The graph as plain Python data: what tests need without the _C.Graph binding.
py::dict graph_to_python(const ir::Graph& g) {
  py::list values;
  for (const ir::Value& v : g.values()) values.append(value_to_python(v));
  py::list nodes;
  for (const ir::Node& n : g.nodes()) nodes.append(node_to_python(g, n));
  py::dict out;
  out["values"] = values;
  out["nodes"] = nodes;
  out["inputs"] = value_names(g, g.inputs());
  out["outputs"] = value_names(g, g.outputs());
  return out;
}

ir::Graph run_import(const std::shared_ptr<torch::jit::Graph>& graph, const py::sequence& module_tensors,
                     const std::vector<std::string>& input_names, const py::dict& module_constants,
                     bool scalar_constants_as_attributes, bool remove_mutation, bool canonicalize_convolution,
                     bool elide_no_ops) {
  const auto options = make_options(module_tensors, input_names, module_constants, scalar_constants_as_attributes,
                                    remove_mutation, canonicalize_convolution, elide_no_ops);
  return torchbridge::import_torchscript(graph, options);
}

}  // namespace

void bind_torchscript(py::module_& m) {
  const char* doc =
      "Imports a TorchScript graph (torch._C.Graph of a traced module) into the shardwise IR.\n"
      "module_tensors: (name, canonical_name, 'parameter'|'buffer', tensor) per alias of every\n"
      "parameter and buffer; input_names: forward() argument names of the tensor inputs;\n"
      "module_constants: non-tensor module attributes a scripted graph reads, by qualified name.\n"
      "Use shardwise._torchscript.import_torchscript, which builds these from a module.";
  // ir::Graph is registered by bind_ir (py::class_<ir::Graph>), before this runs.
  m.def("import_torchscript", &run_import, doc, py::arg("graph"), py::arg("module_tensors"),
        py::arg("input_names") = std::vector<std::string>{}, py::arg("module_constants") = py::dict(),
        py::arg("scalar_constants_as_attributes") = true, py::arg("remove_mutation") = true,
        py::arg("canonicalize_convolution") = true, py::arg("elide_no_ops") = true);
  m.def(
      "_torchscript_import_debug",
      [](const std::shared_ptr<torch::jit::Graph>& graph, const py::sequence& module_tensors,
         const std::vector<std::string>& input_names, const py::dict& module_constants,
         bool scalar_constants_as_attributes, bool remove_mutation, bool canonicalize_convolution,
         bool elide_no_ops) {
        return graph_to_python(run_import(graph, module_tensors, input_names, module_constants,
                                          scalar_constants_as_attributes, remove_mutation, canonicalize_convolution,
                                          elide_no_ops));
      },
      "Same as import_torchscript, but returns the graph as a dict: values (name, dtype, shape,\n"
      "batch_dim, role), nodes (op, inputs, outputs, attrs, module_path), inputs, outputs.",
      py::arg("graph"), py::arg("module_tensors"), py::arg("input_names") = std::vector<std::string>{},
      py::arg("module_constants") = py::dict(), py::arg("scalar_constants_as_attributes") = true,
      py::arg("remove_mutation") = true, py::arg("canonicalize_convolution") = true,
      py::arg("elide_no_ops") = true);
}

}  // namespace shardwise::python
