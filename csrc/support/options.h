// Debug dumps and feature switches, read once from MESHFUSER_DUMP and MESHFUSER_DISABLE
// (comma-separated names). Unknown names are a user error that lists the valid ones.
#pragma once

#include <climits>
#include <cstdint>
#include <string>
#include <vector>

namespace mf {

enum class DumpOption {
  FusionIr, PassIr, HostProgram, CudaKernel, Fallback, Communication, Recompile, Partitions, Heuristics, kCount
};
enum class DisableOption { Codegen, CollectiveValidation, InplaceOutputs, GemmAccumulate, kCount };

bool isDumpEnabled(DumpOption opt);
bool isDisabled(DisableOption opt);
// Re-reads the environment (tests change it at run time).
void reloadOptions();

// The one reader of meshfuser's (and the launchers') environment variables. envString: the value,
// or `fallback` when unset or empty. envInt: an integer, a user error naming the variable when it
// is not one or is below `min`.
std::string envString(const char* name, const std::string& fallback = "");
int64_t envInt(const char* name, int64_t fallback, int64_t min = INT64_MIN);

}  // namespace mf
