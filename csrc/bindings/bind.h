#pragma once

#include <pybind11/pybind11.h>

namespace mf {
void bindIr(pybind11::module& m);            // bind_ir.cpp: enums, mesh, Fusion, TensorView, ops
void bindRuntime(pybind11::module& m);       // bind_runtime.cpp: execute, caches, profiler
void bindCommunicator(pybind11::module& m);  // bind_communicator.cpp: Communicator, collectives
}  // namespace mf
