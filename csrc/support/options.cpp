#include "support/options.h"

#include <array>
#include <cstdlib>
#include <mutex>
#include <sstream>

#include "support/error.h"

namespace mf {
namespace {

constexpr std::array<const char*, static_cast<size_t>(DumpOption::kCount)> kDumpNames = {
    "fusion_ir", "pass_ir", "host_program", "cuda_kernel", "fallback", "communication", "recompile",
    "partitions", "heuristics"};  // partitions: read by the torch.compile backend (python/meshfuser/dynamo)
constexpr std::array<const char*, static_cast<size_t>(DisableOption::kCount)> kDisableNames = {
    "codegen", "collective_validation", "inplace_outputs", "gemm_accumulate"};

template <size_t N>
std::array<bool, N> parse(const char* env_name, const std::array<const char*, N>& names) {
  std::array<bool, N> enabled{};
  const char* value = std::getenv(env_name);
  if (value == nullptr) return enabled;
  std::stringstream ss(value);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    bool found = false;
    for (size_t i = 0; i < N; ++i) {
      if (item == names[i]) enabled[i] = found = true;
    }
    if (!found) {
      std::string valid;
      for (const char* n : names) valid += std::string(valid.empty() ? "" : ", ") + n;
      MF_THROW_USER(env_name, ": unknown option '", item, "'; valid options are: ", valid);
    }
  }
  return enabled;
}

struct Options {
  std::array<bool, kDumpNames.size()> dump{};
  std::array<bool, kDisableNames.size()> disable{};
  void load() {
    dump = parse("MESHFUSER_DUMP", kDumpNames);
    disable = parse("MESHFUSER_DISABLE", kDisableNames);
  }
};

Options& options() {
  static Options opts = [] {
    Options o;
    o.load();
    return o;
  }();
  return opts;
}

}  // namespace

bool isDumpEnabled(DumpOption opt) { return options().dump[static_cast<size_t>(opt)]; }
bool isDisabled(DisableOption opt) { return options().disable[static_cast<size_t>(opt)]; }
void reloadOptions() { options().load(); }

std::string envString(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : fallback;
}

int64_t envInt(const char* name, int64_t fallback, int64_t min) {
  std::string v = envString(name);
  if (v.empty()) return fallback;
  char* end = nullptr;
  long long n = std::strtoll(v.c_str(), &end, 10);
  MF_USER_CHECK(end != v.c_str() && *end == '\0', "environment variable ", name, "=", v, " is not an integer");
  MF_USER_CHECK(n >= min, "environment variable ", name, "=", v, ": expected an integer >= ", min);
  return static_cast<int64_t>(n);
}

}  // namespace mf
