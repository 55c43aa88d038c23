// The table of known architectures and the named access to DeviceLimits' fields.
#include "codegen/device_limits.h"

#include <algorithm>

#include "support/error.h"

namespace mf {
namespace {

constexpr int64_t kKiB = 1024;
constexpr int64_t kMiB = 1024 * 1024;

struct Field {
  const char* name;
  int64_t DeviceLimits::*member;
};

// One row per integer field: toString, overrides and the Python binding walk it.
const std::vector<Field>& fields() {
  static const std::vector<Field> table = {
      {"compute_capability", &DeviceLimits::compute_capability},
      {"sm_count", &DeviceLimits::sm_count},
      {"warp_size", &DeviceLimits::warp_size},
      {"max_threads_per_block", &DeviceLimits::max_threads_per_block},
      {"max_threads_per_sm", &DeviceLimits::max_threads_per_sm},
      {"max_blocks_per_sm", &DeviceLimits::max_blocks_per_sm},
      {"shared_mem_per_block", &DeviceLimits::shared_mem_per_block},
      {"shared_mem_per_block_optin", &DeviceLimits::shared_mem_per_block_optin},
      {"shared_mem_per_sm", &DeviceLimits::shared_mem_per_sm},
      {"reserved_shared_mem_per_block", &DeviceLimits::reserved_shared_mem_per_block},
      {"registers_per_block", &DeviceLimits::registers_per_block},
      {"registers_per_sm", &DeviceLimits::registers_per_sm},
      {"max_registers_per_thread", &DeviceLimits::max_registers_per_thread},
      {"l2_bytes", &DeviceLimits::l2_bytes},
      {"max_grid_x", &DeviceLimits::max_grid_x},
      {"max_vector_bytes", &DeviceLimits::max_vector_bytes},
  };
  return table;
}

// cc: compute capability; the resident-thread, resident-block and shared-memory limits differ
// between capabilities, the register file and the per-block limits do not (sm_80 .. sm_120).
DeviceLimits entry(const char* arch, const char* part, int64_t cc, int64_t sms, int64_t threads_per_sm,
                   int64_t blocks_per_sm, int64_t smem_per_sm_kib, int64_t l2) {
  DeviceLimits d;
  d.arch = arch;
  d.device_name = std::string(part) + " (" + arch + " table)";
  d.compute_capability = cc;
  d.sm_count = sms;
  d.max_threads_per_sm = threads_per_sm;
  d.max_blocks_per_sm = blocks_per_sm;
  d.shared_mem_per_sm = smem_per_sm_kib * kKiB;
  d.shared_mem_per_block_optin = (smem_per_sm_kib - 1) * kKiB;  // the SM's less the 1 KiB reserved per block
  d.l2_bytes = l2;
  return d;
}

const std::vector<DeviceLimits>& table() {
  static const std::vector<DeviceLimits> t = {
      entry("sm_80", "A100 SXM", 80, 108, 2048, 32, 164, 40 * kMiB),
      entry("sm_86", "A40", 86, 84, 1536, 16, 100, 6 * kMiB),
      entry("sm_87", "Jetson AGX Orin", 87, 16, 2048, 16, 164, 4 * kMiB),
      entry("sm_89", "L40S", 89, 142, 1536, 24, 100, 96 * kMiB),
      DeviceLimits{},  // sm_90: H100/H200 SXM, the defaults
      entry("sm_100", "B200", 100, 148, 2048, 32, 228, 126 * kMiB),
      entry("sm_120", "RTX 5090", 120, 170, 1536, 32, 100, 96 * kMiB),
  };
  return t;
}

}  // namespace

bool DeviceLimits::operator==(const DeviceLimits& o) const {
  if (arch != o.arch || device_name != o.device_name) return false;
  return std::all_of(fields().begin(), fields().end(), [&](const Field& f) { return this->*f.member == o.*f.member; });
}

std::string DeviceLimits::toString() const {
  std::string text = arch + " [" + device_name + "]";
  for (const Field& f : fields()) text += str(" ", f.name, " ", this->*f.member);
  return text;
}

DeviceLimits deviceLimitsForArch(const std::string& arch) {
  for (const DeviceLimits& d : table()) {
    if (d.arch == arch) return d;
  }
  std::string known;
  for (const std::string& a : knownArchitectures()) known += (known.empty() ? "" : ", ") + a;
  MF_THROW_USER("unknown GPU architecture '", arch, "'; known architectures: ", known,
                " (give another device's limits with device_limits=)");
}

std::vector<std::string> knownArchitectures() {
  std::vector<std::string> names;
  for (const DeviceLimits& d : table()) names.push_back(d.arch);
  return names;
}

std::vector<std::string> deviceLimitFieldNames() {
  std::vector<std::string> names;
  for (const Field& f : fields()) names.push_back(f.name);
  return names;
}

int64_t deviceLimitField(const DeviceLimits& limits, const std::string& name) {
  for (const Field& f : fields()) {
    if (name == f.name) return limits.*f.member;
  }
  MF_THROW_INTERNAL("no device limit named ", name);
}

DeviceLimits withOverrides(DeviceLimits limits, const std::map<std::string, int64_t>& overrides) {
  for (const auto& [name, value] : overrides) {
    auto it = std::find_if(fields().begin(), fields().end(), [&](const Field& f) { return name == f.name; });
    if (it == fields().end()) {
      std::string valid;
      for (const std::string& n : deviceLimitFieldNames()) valid += (valid.empty() ? "" : ", ") + n;
      MF_THROW_USER("device_limits: unknown field '", name, "'; the fields are: ", valid);
    }
    limits.*(it->member) = value;
  }
  if (!overrides.empty()) limits.device_name += " with overrides";
  checkDeviceLimits(limits);
  return limits;
}

void checkDeviceLimits(const DeviceLimits& d) {
  for (const Field& f : fields()) {
    MF_USER_CHECK(d.*f.member > 0, "device_limits: ", f.name, " must be positive, got ", d.*f.member);
  }
  MF_USER_CHECK(d.warp_size == 32,
                "device_limits: warp_size must be 32 (the generated kernels' shuffles use 32 lanes), got ", d.warp_size);
  MF_USER_CHECK(d.max_threads_per_block >= d.warp_size && d.max_threads_per_block <= d.max_threads_per_sm,
                "device_limits: max_threads_per_block must be between warp_size (", d.warp_size,
                ") and max_threads_per_sm (", d.max_threads_per_sm, "), got ", d.max_threads_per_block);
  MF_USER_CHECK(d.shared_mem_per_block <= d.shared_mem_per_block_optin &&
                    d.shared_mem_per_block_optin <= d.shared_mem_per_sm,
                "device_limits: shared memory must satisfy shared_mem_per_block (", d.shared_mem_per_block,
                ") <= shared_mem_per_block_optin (", d.shared_mem_per_block_optin, ") <= shared_mem_per_sm (",
                d.shared_mem_per_sm, ")");
  MF_USER_CHECK(d.max_vector_bytes >= 4 && (d.max_vector_bytes & (d.max_vector_bytes - 1)) == 0,
                "device_limits: max_vector_bytes must be a power of two >= 4, got ", d.max_vector_bytes);
}

}  // namespace mf
