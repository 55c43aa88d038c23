// What the kernel generator needs to know about the GPU it generates for: the SM count, the
// compute capability and the per-block / per-SM resource limits. The runtime fills it from the
// current device (runtime/cuda_kernel.h: currentDeviceLimits); without a GPU it comes from a table
// of known architectures (fd.cuda_kernels(inputs, arch="sm_80")), possibly with fields overridden.
//
// Guarantees: a default-constructed DeviceLimits is the sm_90 entry (H100/H200 SXM, 132 SMs), so
// code that never names a device generates exactly what it did when the heuristics were tuned on
// the H200. Every per-architecture number is the published limit of that compute capability (CUDA
// C++ Programming Guide, "Technical Specifications per Compute Capability"); the SM count and L2
// size are those of one representative part, named in `device_name`.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace mf {

struct DeviceLimits {
  std::string arch = "sm_90";                   // "sm_<major><minor>"
  std::string device_name = "H100/H200 SXM (sm_90 table)";
  int64_t compute_capability = 90;              // major * 10 + minor
  int64_t sm_count = 132;
  int64_t warp_size = 32;
  int64_t max_threads_per_block = 1024;
  int64_t max_threads_per_sm = 2048;
  int64_t max_blocks_per_sm = 32;
  int64_t shared_mem_per_block = 48 * 1024;     // static + dynamic without opting in
  int64_t shared_mem_per_block_optin = 232448;  // dynamic, after cuFuncSetAttribute (227 KiB)
  int64_t shared_mem_per_sm = 233472;           // 228 KiB
  int64_t reserved_shared_mem_per_block = 1024;  // taken by the system from every resident block
  int64_t registers_per_block = 65536;          // 32-bit registers
  int64_t registers_per_sm = 65536;
  int64_t max_registers_per_thread = 255;
  int64_t l2_bytes = 50 * 1024 * 1024;
  int64_t max_grid_x = 2147483647;
  // The widest global memory access the generator emits per thread (16 bytes: ld.global.v4.b32).
  int64_t max_vector_bytes = 16;

  bool operator==(const DeviceLimits& o) const;
  bool operator!=(const DeviceLimits& o) const { return !(*this == o); }
  // Every field as "name value" on one line, for dumps and reprs.
  std::string toString() const;
  // cp.async (asynchronous global -> shared copies) exists from sm_80.
  bool hasCpAsync() const { return compute_capability >= 80; }
};

// The table entry for `arch` ("sm_90"); a user error listing the known ones otherwise.
DeviceLimits deviceLimitsForArch(const std::string& arch);
// The architectures of the table, oldest first.
std::vector<std::string> knownArchitectures();
// The integer fields by name (what overrides may set), in declaration order.
std::vector<std::string> deviceLimitFieldNames();
int64_t deviceLimitField(const DeviceLimits& limits, const std::string& name);
// `limits` with integer fields replaced by name; a user error naming the field for an unknown name
// or a value that no device has (see checkDeviceLimits).
DeviceLimits withOverrides(DeviceLimits limits, const std::map<std::string, int64_t>& overrides);
// User errors for limits no device has: non-positive counts, a warp size other than 32 (the
// generated kernels' shuffles assume 32 lanes), blocks larger than an SM, shared memory per block
// beyond the SM's.
void checkDeviceLimits(const DeviceLimits& limits);

}  // namespace mf
