// Maps the core's exception types to Python exception types in shardwise._C:
//   ShardwiseError (base, RuntimeError) > ParseError, ValidationError.
#include "python/bindings.h"
#include "support/error.h"

namespace py = pybind11;

namespace shardwise::python {

void bind_errors(py::module_& m) {
  // register_exception_translator order matters: most derived first.
  static py::exception<support::Error> base(m, "ShardwiseError", PyExc_RuntimeError);
  static py::exception<support::ParseError> parse(m, "ParseError", base.ptr());
  static py::exception<support::ValidationError> validation(m, "ValidationError", base.ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const support::ParseError& e) {
      py::set_error(parse, e.what());
    } catch (const support::ValidationError& e) {
      py::set_error(validation, e.what());
    } catch (const support::Error& e) {
      py::set_error(base, e.what());
    }
  });
}

}  // namespace shardwise::python
