// Debug dumps and feature switches, read once from MESHFUSER_DUMP and MESHFUSER_DISABLE
// (comma-separated names). Unknown names are a user error that lists the valid ones.
#pragma once

#include <string>
#include <vector>

namespace mf {

enum class DumpOption {
  FusionIr, PassIr, HostProgram, CudaKernel, Fallback, Communication, Recompile, Partitions, kCount
};
enum class DisableOption { Codegen, CollectiveValidation, kCount };

bool isDumpEnabled(DumpOption opt);
bool isDisabled(DisableOption opt);
// Re-reads the environment (tests change it at run time).
void reloadOptions();

}  // namespace mf
