// Records what an execute() ran (segments and communications) while a Profiler is active, and
// emits torch.profiler ranges for them. Costs one branch per step when inactive.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mf {

struct KernelProfile {
  std::string name;       // e.g. "segment 0: linear" or "ReduceScatter T4 <- T3"
  std::string scheduler;  // "communication", "expr_eval", "pointwise", "reduction"
  int64_t bytes_sent = 0;  // communications: what this rank sent and received
  int64_t bytes_received = 0;
};

class ProfileRecorder {
 public:
  static ProfileRecorder*& active();  // thread-local; null when not profiling
  std::vector<KernelProfile>& kernels() { return kernels_; }

 private:
  std::vector<KernelProfile> kernels_;
};

}  // namespace mf
