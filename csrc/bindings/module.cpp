// The _C extension module: registers each area's bindings and translates C++ errors into
// meshfuser.Error (user errors; also ValueError for bad arguments) and meshfuser.InternalError.
#include <pybind11/pybind11.h>

#include "bindings/bind.h"
#include "support/error.h"
#include "support/version.h"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "meshfuser: sharded tensor programs on many devices";
  m.attr("__version__") = mf::kVersion;
#ifdef MESHFUSER_BUILT_WITH_TORCH
  m.attr("_built_with_torch") = MESHFUSER_BUILT_WITH_TORCH;
#endif
  static py::exception<mf::UserError> error(m, "Error", PyExc_RuntimeError);
  // ArgumentError is both a meshfuser.Error and a ValueError.
  py::object bases = py::make_tuple(error, py::handle(PyExc_ValueError));
  static py::object argument_error = py::reinterpret_steal<py::object>(
      PyErr_NewException("meshfuser._C.ArgumentError", bases.ptr(), nullptr));
  m.attr("ArgumentError") = argument_error;
  static py::exception<mf::InternalError> internal(m, "InternalError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const mf::UserError& e) {
      PyErr_SetString(e.badArgument() ? argument_error.ptr() : error.ptr(), e.what());
    } catch (const mf::InternalError& e) {
      PyErr_SetString(internal.ptr(), e.what());
    }
  });
  mf::bindIr(m);
  mf::bindRuntime(m);
  mf::bindCommunicator(m);
  mf::bindDevice(m);
}
