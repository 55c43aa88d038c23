#pragma once

#include <pybind11/pybind11.h>

#include <optional>
#include <string>

#include "codegen/device_limits.h"

namespace mf {
void bindIr(pybind11::module& m);            // bind_ir.cpp: enums, mesh, Fusion, TensorView, ops
void bindRuntime(pybind11::module& m);       // bind_runtime.cpp: execute, caches, profiler
void bindCommunicator(pybind11::module& m);  // bind_communicator.cpp: Communicator, collectives
void bindDevice(pybind11::module& m);        // bind_device.cpp: DeviceLimits, device_limits()
// cuda_kernels' arch= and device_limits= (a DeviceLimits, a dict of overrides or None) as limits;
// nullopt: neither given (the current device).
std::optional<DeviceLimits> deviceLimitsFromPython(const std::optional<std::string>& arch,
                                                   const pybind11::object& limits);
}  // namespace mf
