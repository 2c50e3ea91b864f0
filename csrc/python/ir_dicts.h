// Core IR values as plain Python data (dicts, lists), shared by every binding that hands
// a graph's contents to Python: the Graph class (bind_ir.cc) and the TorchScript debug
// import (bind_torchscript.cc). One spelling of the keys: name/dtype/shape/batch_dim/role
// for values, op/inputs/outputs/attrs/module for nodes.
#pragma once

#include <pybind11/pybind11.h>

#include "ir/graph.h"

namespace shardwise::python {

pybind11::object attr_to_python(const ir::AttrValue& value);
pybind11::dict value_to_python(const ir::Value& value);
pybind11::dict node_to_python(const ir::Graph& graph, const ir::Node& node);
pybind11::list value_names(const ir::Graph& graph, const std::vector<ir::ValueId>& ids);

}  // namespace shardwise::python
