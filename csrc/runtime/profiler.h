// Records what an execute() ran (segments and communications) with host and device times while a
// Profiler is active. Costs one branch per step when inactive.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Event.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mf {

struct KernelProfile {
  std::string name;       // e.g. "segment 0" or "ReduceScatter T4 <- T3 on DIDx team=[0, 1]"
  std::string scheduler;  // "communication", "expr_eval", "pointwise", "reduction", "stream_loop", ...
  int64_t bytes_sent = 0;  // communications: what this rank sent and received
  int64_t bytes_received = 0;
  // Host time from the start of the step to its end (a communication: from its post to the end of
  // its wait). Device time: the same interval measured by events on the current stream of a CUDA
  // device (the work the step queued, included); equal to the host time for CPU tensors. A segment
  // run as several kernels carries the segment's times on its first entry (0 on the others).
  double host_ms = 0.0;
  double device_ms = 0.0;
};

class ProfileRecorder {
 public:
  static ProfileRecorder*& active();  // thread-local; null when not profiling
  std::vector<KernelProfile>& kernels() { return kernels_; }

  // Appends an entry and starts timing it on `device`; returns its index for stop().
  size_t start(KernelProfile entry, c10::Device device);
  // Ends the timing of entry `index` (started on the same device).
  void stop(size_t index);
  // Waits for the device events and fills every device_ms. Idempotent.
  void finish();

 private:
  struct Timing {
    size_t index;
    std::chrono::steady_clock::time_point host_start;
    bool stopped = false;
    std::unique_ptr<c10::Event> start, end;  // CUDA only
  };
  std::vector<KernelProfile> kernels_;
  std::vector<Timing> timings_;
};

// Host and device time of one step, on whatever recorder is active when it is made. Nothing when
// no Profiler is active.
class ProfiledStep {
 public:
  ProfiledStep() = default;
  ProfiledStep(KernelProfile entry, c10::Device device) {
    if (ProfileRecorder* r = ProfileRecorder::active()) {
      recorder_ = r;
      index_ = r->start(std::move(entry), device);
    }
  }
  ProfiledStep(ProfiledStep&& o) noexcept : recorder_(o.recorder_), index_(o.index_) { o.recorder_ = nullptr; }
  ProfiledStep& operator=(ProfiledStep&& o) noexcept {
    stop();
    recorder_ = o.recorder_;
    index_ = o.index_;
    o.recorder_ = nullptr;
    return *this;
  }
  ~ProfiledStep() { stop(); }
  // Bytes known only once the step ran (the expert-parallel exchanges).
  void setBytes(int64_t sent, int64_t received);
  void stop() {
    if (recorder_ != nullptr) recorder_->stop(index_);
    recorder_ = nullptr;
  }

 private:
  ProfileRecorder* recorder_ = nullptr;
  size_t index_ = 0;
};

}  // namespace mf
