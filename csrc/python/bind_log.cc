// _C.set_log_sink(fn, least): the core's log lines (support/log.h) into Python's logging.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "python/bindings.h"
#include "support/log.h"

namespace py = pybind11;

namespace shardwise::python {

void bind_log(py::module_& m) {
  m.def(
      "set_log_sink",
      [](const py::object& sink, int least) {
        if (sink.is_none()) {
          support::set_log_sink({});
          return;
        }
        // Dropped wherever the last line in flight ends, so the reference is released under the GIL.
        std::shared_ptr<py::function> fn(new py::function(sink.cast<py::function>()), [](py::function* f) {
          py::gil_scoped_acquire gil;
          delete f;
        });
        // A search logs without the GIL held; the Python call takes it, and a Python error in
        // the sink is reported as unraisable here, under the GIL, rather than carried into C++
        // (logging never changes results, support/log.h).
        support::set_log_sink(
            [fn](support::LogLevel level, const std::string& line) {
              py::gil_scoped_acquire gil;
              try {
                (*fn)(static_cast<int>(level), line);
              } catch (py::error_already_set& e) {
                // A Ctrl-C that lands while the sink runs Python raises KeyboardInterrupt here;
                // dropping it would lose the user's interrupt, so it is armed again and the
                // search's next progress callback raises it.
                if (e.matches(PyExc_KeyboardInterrupt))
                  PyErr_SetInterrupt();
                else
                  e.discard_as_unraisable("shardwise log sink");
              }
            },
            static_cast<support::LogLevel>(least));
      },
      py::arg("sink"), py::arg("least") = 20,
      "Send the core's log lines to sink(level, line) (Python logging levels); None: drop them. Remove it "
      "before the interpreter exits (shardwise does, at exit).");
}

}  // namespace shardwise::python
