#include "python/ir_dicts.h"

#include <pybind11/stl.h>

#include <type_traits>
#include <variant>

namespace py = pybind11;

namespace shardwise::python {

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
  d["inputs"] = value_names(g, n.inputs);
  d["outputs"] = value_names(g, n.outputs);
  d["module"] = n.module_path;
  py::dict attrs;
  for (const auto& [key, value] : n.attrs) attrs[py::str(key)] = attr_to_python(value);
  d["attrs"] = attrs;
  return d;
}

py::list value_names(const ir::Graph& g, const std::vector<ir::ValueId>& ids) {
  py::list out;
  for (auto id : ids) out.append(g.value(id).name);
  return out;
}

}  // namespace shardwise::python
