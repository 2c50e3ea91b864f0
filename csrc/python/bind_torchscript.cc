#include "python/bindings.h"

namespace shardwise::python {

void bind_torchscript(pybind11::module_& m) {}

}  // namespace shardwise::python
