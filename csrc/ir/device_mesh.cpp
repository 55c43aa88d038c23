#include "ir/device_mesh.h"

#include <algorithm>
#include <functional>
#include <set>
#include <sstream>

#include "support/error.h"

namespace mf {

DeviceMesh::DeviceMesh(std::vector<int64_t> devices)
    : DeviceMesh(devices, {static_cast<int64_t>(devices.size())}) {}

DeviceMesh::DeviceMesh(std::vector<int64_t> devices, std::vector<int64_t> shape)
    : devices_(std::move(devices)), shape_(std::move(shape)) {
  int64_t numel = 1;
  for (int64_t s : shape_) {
    MF_USER_ARG_CHECK(s > 0, "DeviceMesh: every axis must have a positive extent; got extent ", s);
    numel *= s;
  }
  MF_USER_ARG_CHECK(numel == size(), "DeviceMesh: shape holds ", numel, " devices but ", size(), " were given");
  MF_USER_ARG_CHECK(rank() <= 3, "DeviceMesh: at most 3 axes (DIDz, DIDy, DIDx) are supported; got ", rank());
  std::set<int64_t> seen;
  for (int64_t d : devices_) {
    MF_USER_ARG_CHECK(d >= 0, "DeviceMesh: device ids must be non-negative ranks; got ", d);
    MF_USER_ARG_CHECK(seen.insert(d).second, "DeviceMesh: device ", d, " appears more than once; ranks must be unique");
  }
}

int64_t DeviceMesh::axisOf(ParallelType pt) const {
  MF_CHECK(isDeviceParallel(pt), "axisOf expects a device parallel type");
  int64_t offset = static_cast<int64_t>(pt) - static_cast<int64_t>(ParallelType::DIDx);
  int64_t axis = rank() - 1 - offset;
  return axis >= 0 ? axis : -1;
}

int64_t DeviceMesh::size(ParallelType pt) const {
  int64_t axis = axisOf(pt);
  MF_USER_CHECK(axis >= 0, "mesh ", toString(), " has no axis for ", mf::toString(pt), " (it has ", rank(), " axes)");
  return shape_[axis];
}

bool DeviceMesh::has(int64_t device) const { return linearIndexOf(device) >= 0; }

int64_t DeviceMesh::linearIndexOf(int64_t device) const {
  auto it = std::find(devices_.begin(), devices_.end(), device);
  return it == devices_.end() ? -1 : static_cast<int64_t>(it - devices_.begin());
}

std::vector<int64_t> DeviceMesh::coordinatesOf(int64_t device) const {
  int64_t index = linearIndexOf(device);
  MF_CHECK(index >= 0, "device ", device, " is not in mesh ", toString());
  std::vector<int64_t> coords(shape_.size());
  for (int64_t axis = rank() - 1; axis >= 0; --axis) {
    coords[axis] = index % shape_[axis];
    index /= shape_[axis];
  }
  return coords;
}

std::vector<int64_t> DeviceMesh::slice(int64_t device, ParallelType pt) const {
  int64_t axis = axisOf(pt);
  MF_CHECK(axis >= 0, "mesh has no axis for ", mf::toString(pt));
  std::vector<int64_t> coords = coordinatesOf(device);
  int64_t stride = 1;
  for (int64_t a = rank() - 1; a > axis; --a) stride *= shape_[a];
  int64_t base = 0;
  for (int64_t a = 0; a < rank(); ++a) {
    int64_t s = 1;
    for (int64_t b = a + 1; b < rank(); ++b) s *= shape_[b];
    if (a != axis) base += coords[a] * s;
  }
  std::vector<int64_t> team;
  for (int64_t i = 0; i < shape_[axis]; ++i) team.push_back(devices_[base + i * stride]);
  return team;
}

std::vector<std::vector<int64_t>> DeviceMesh::allSlices(ParallelType pt) const {
  std::vector<std::vector<int64_t>> teams;
  std::set<std::vector<int64_t>> seen;
  for (int64_t d : devices_) {
    auto team = slice(d, pt);
    if (seen.insert(team).second) teams.push_back(team);
  }
  return teams;
}

std::string DeviceMesh::toString() const {
  std::ostringstream ss;
  // Nested brackets, one level per axis, e.g. [[0 1] [2 3]].
  std::function<void(int64_t, int64_t)> print = [&](int64_t axis, int64_t offset) {
    ss << "[";
    int64_t stride = 1;
    for (int64_t a = axis + 1; a < rank(); ++a) stride *= shape_[a];
    for (int64_t i = 0; i < shape_[axis]; ++i) {
      if (i) ss << " ";
      if (axis + 1 == rank()) ss << devices_[offset + i];
      else print(axis + 1, offset + i * stride);
    }
    ss << "]";
  };
  if (empty()) return "[]";
  print(0, 0);
  return ss.str();
}

}  // namespace mf
