// A dense n-D array of unique ranks. DIDx is the last (innermost) axis, DIDy the one before,
// DIDz the one before that. An empty mesh means "not multi-device".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/types.h"

namespace mf {

class DeviceMesh {
 public:
  DeviceMesh() = default;
  // 1-D mesh.
  explicit DeviceMesh(std::vector<int64_t> devices);
  DeviceMesh(std::vector<int64_t> devices, std::vector<int64_t> shape);

  bool empty() const { return devices_.empty(); }
  int64_t size() const { return static_cast<int64_t>(devices_.size()); }
  int64_t rank() const { return static_cast<int64_t>(shape_.size()); }
  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<int64_t>& devices() const { return devices_; }

  // Mesh axis of a device parallel type, or -1 when the mesh has too few axes.
  int64_t axisOf(ParallelType pt) const;
  bool hasParallelType(ParallelType pt) const { return axisOf(pt) >= 0; }
  // Extent of pt's mesh axis; a user error when the mesh has no such axis.
  int64_t size(ParallelType pt) const;
  bool has(int64_t device) const;
  int64_t linearIndexOf(int64_t device) const;  // -1 when absent
  std::vector<int64_t> coordinatesOf(int64_t device) const;
  // The ranks that share `device`'s coordinates on every axis but pt's, in mesh order.
  std::vector<int64_t> slice(int64_t device, ParallelType pt) const;
  // Every such team along pt, in a deterministic order (used to create c10d groups identically).
  std::vector<std::vector<int64_t>> allSlices(ParallelType pt) const;

  bool operator==(const DeviceMesh& other) const {
    return devices_ == other.devices_ && shape_ == other.shape_;
  }
  bool operator!=(const DeviceMesh& other) const { return !(*this == other); }
  std::string toString() const;

 private:
  std::vector<int64_t> devices_;
  std::vector<int64_t> shape_;
};

}  // namespace mf
