// The pieces of the shardwise._C module, one function per bound area. Each lives in
// its own file (bind_*.cc) apart from the algorithms it exposes.
#pragma once

#include <pybind11/pybind11.h>

namespace shardwise::python {

void bind_errors(pybind11::module_& m);
void bind_ir(pybind11::module_& m);
void bind_analysis(pybind11::module_& m);
void bind_cost(pybind11::module_& m);
void bind_models(pybind11::module_& m);
void bind_plan(pybind11::module_& m);
void bind_profile(pybind11::module_& m);
void bind_torchscript(pybind11::module_& m);
void bind_schedule(pybind11::module_& m);
void bind_transform(pybind11::module_& m);
void bind_log(pybind11::module_& m);

}  // namespace shardwise::python
