#include "runtime/profiler.h"

namespace mf {

ProfileRecorder*& ProfileRecorder::active() {
  thread_local ProfileRecorder* recorder = nullptr;
  return recorder;
}

}  // namespace mf
