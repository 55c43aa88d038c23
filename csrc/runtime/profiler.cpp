#include "runtime/profiler.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace mf {

ProfileRecorder*& ProfileRecorder::active() {
  thread_local ProfileRecorder* recorder = nullptr;
  return recorder;
}

namespace {
c10::Stream currentStream(c10::Device device) {
  return c10::impl::getDeviceGuardImpl(device.type())->getStream(device);
}
}  // namespace

size_t ProfileRecorder::start(KernelProfile entry, c10::Device device) {
  kernels_.push_back(std::move(entry));
  Timing t;
  t.index = kernels_.size() - 1;
  if (device.is_cuda()) {
    // BACKEND_DEFAULT: events that record timing (PyTorch's default flag disables it).
    t.start = std::make_unique<c10::Event>(device.type(), c10::EventFlag::BACKEND_DEFAULT);
    t.end = std::make_unique<c10::Event>(device.type(), c10::EventFlag::BACKEND_DEFAULT);
    t.start->record(currentStream(device));
  }
  t.host_start = std::chrono::steady_clock::now();
  timings_.push_back(std::move(t));
  return kernels_.size() - 1;
}

void ProfiledStep::setBytes(int64_t sent, int64_t received) {
  if (recorder_ == nullptr) return;
  recorder_->kernels().at(index_).bytes_sent = sent;
  recorder_->kernels().at(index_).bytes_received = received;
}

void ProfileRecorder::stop(size_t index) {
  for (auto it = timings_.rbegin(); it != timings_.rend(); ++it) {
    if (it->index != index || it->stopped) continue;
    it->stopped = true;
    auto elapsed = std::chrono::steady_clock::now() - it->host_start;
    kernels_[index].host_ms = std::chrono::duration<double, std::milli>(elapsed).count();
    kernels_[index].device_ms = kernels_[index].host_ms;
    if (it->end) it->end->record(currentStream(it->start->device()));
    return;
  }
}

void ProfileRecorder::finish() {
  for (Timing& t : timings_) {
    if (!t.stopped || !t.start) continue;
    t.end->synchronize();
    kernels_[t.index].device_ms = t.start->elapsedTime(*t.end);
  }
  timings_.clear();
}

}  // namespace mf
