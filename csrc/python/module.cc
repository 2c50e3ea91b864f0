// shardwise._C: bindings only. Import torch before this module (shardwise/__init__.py does).
#include <pybind11/pybind11.h>

#include "python/bindings.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "shardwise core bindings";
  shardwise::python::bind_errors(m);
  shardwise::python::bind_ir(m);
  shardwise::python::bind_analysis(m);
  shardwise::python::bind_cost(m);
  shardwise::python::bind_models(m);
  shardwise::python::bind_plan(m);
  shardwise::python::bind_profile(m);
  shardwise::python::bind_torchscript(m);
  shardwise::python::bind_schedule(m);
  shardwise::python::bind_transform(m);
  shardwise::python::bind_log(m);
}
