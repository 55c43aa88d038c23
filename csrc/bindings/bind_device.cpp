// Device limits for the kernel generator: meshfuser.DeviceLimits (read-only fields, the table's
// or the current device's), meshfuser.device_limits(arch=None, **overrides) and
// meshfuser.known_architectures(); _C._gather_sum_kernel (the row gathers' kernels, for tests and
// their CPU emulation). fd.cuda_kernels(inputs, arch=, device_limits=) resolves its
// arguments with deviceLimitsFromPython.
#include <pybind11/stl.h>

#include "bindings/bind.h"
#include "codegen/device_limits.h"
#include "codegen/gather_sum.h"
#include "runtime/cuda_kernel.h"
#include "support/error.h"

namespace py = pybind11;

namespace mf {
namespace {

DeviceLimits limitsWith(const std::optional<std::string>& arch, const py::dict& overrides) {
  std::map<std::string, int64_t> values;
  for (const auto& [key, value] : overrides) {
    const std::string name = py::str(key);
    MF_USER_ARG_CHECK(py::isinstance<py::int_>(value) && !py::isinstance<py::bool_>(value), "device_limits: ", name,
                      " must be an int, got ", std::string(py::str(py::repr(value))));
    values[name] = value.cast<int64_t>();
  }
  return withOverrides(arch ? deviceLimitsForArch(*arch) : currentDeviceLimits(), values);
}

}  // namespace

std::optional<DeviceLimits> deviceLimitsFromPython(const std::optional<std::string>& arch, const py::object& limits) {
  if (limits.is_none()) return arch ? std::optional<DeviceLimits>(deviceLimitsForArch(*arch)) : std::nullopt;
  if (py::isinstance<DeviceLimits>(limits)) {
    MF_USER_ARG_CHECK(!arch, "cuda_kernels: give arch= or a DeviceLimits as device_limits=, not both (a dict of "
                             "overrides goes with arch=)");
    DeviceLimits d = limits.cast<DeviceLimits>();
    checkDeviceLimits(d);
    return d;
  }
  MF_USER_ARG_CHECK(py::isinstance<py::dict>(limits), "cuda_kernels: device_limits must be a meshfuser.DeviceLimits or "
                    "a dict of fields to override, got ", std::string(py::str(py::type::of(limits).attr("__name__"))));
  return limitsWith(arch, limits.cast<py::dict>());
}

void bindDevice(py::module& m) {
  auto cls = py::class_<DeviceLimits>(m, "DeviceLimits")
                 .def_readonly("arch", &DeviceLimits::arch)
                 .def_readonly("device_name", &DeviceLimits::device_name)
                 .def("__eq__", [](const DeviceLimits& a, const DeviceLimits& b) { return a == b; })
                 .def("__repr__", [](const DeviceLimits& d) { return "DeviceLimits(" + d.toString() + ")"; })
                 .def("to_dict", [](const DeviceLimits& d) {
                   py::dict out;
                   out["arch"] = d.arch;
                   out["device_name"] = d.device_name;
                   for (const std::string& name : deviceLimitFieldNames()) out[name.c_str()] = deviceLimitField(d, name);
                   return out;
                 });
  for (const std::string& name : deviceLimitFieldNames()) {
    cls.def_property_readonly(name.c_str(), [name](const DeviceLimits& d) { return deviceLimitField(d, name); });
  }
  m.def(
      "device_limits",
      [](std::optional<std::string> arch, const py::kwargs& overrides) { return limitsWith(arch, overrides); },
      py::arg("arch") = py::none());
  m.def("known_architectures", &knownArchitectures);
  m.def(
      "_gather_sum_kernel",
      [](DataType dtype, int64_t rows, int64_t width, int64_t alignment_bytes, std::optional<std::string> arch,
         const std::string& mode) {
        MF_USER_ARG_CHECK(mode == "sum" || mode == "select", "_gather_sum_kernel: mode is sum or select, got ", mode);
        GatherSumShape shape;
        shape.mode = mode == "sum" ? GatherSumShape::Mode::Sum : GatherSumShape::Mode::Select;
        shape.dtype = dtype;
        shape.out_rows = rows;
        shape.width = width;
        shape.alignment_bytes = alignment_bytes;
        GeneratedKernel k = generateGatherSum(shape, arch ? deviceLimitsForArch(*arch) : currentDeviceLimits());
        py::dict d;
        d["name"] = k.name;
        d["source"] = k.source;
        d["count"] = k.count;
        d["grid"] = k.launch.grid_x;
        d["block"] = k.launch.block_x;
        d["choices"] = k.choices;
        return d;
      },
      py::arg("dtype"), py::arg("rows"), py::arg("width"), py::arg("alignment_bytes") = 16, py::arg("arch") = py::none(),
      py::arg("mode") = "sum");
}

}  // namespace mf
