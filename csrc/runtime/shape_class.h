// Shape classes: what of a call's inputs decides the compiled program, and the limits of the caches
// that hold compiled programs and kernels.
//
// Two calls of one definition share an executor (pass pipeline, lowering, segmentation) when their
// inputs have the same shape class: per input, a scalar's kind, or a tensor's dtype, device, rank,
// which axes have extent 1, and its layout (the order of its strides and whether it is dense in that
// order; a tensor that is not dense, e.g. a slice, also by its exact strides). Extents are not part
// of it: the host program is written in extent expressions bound per call, and kernels take their
// extent-dependent bound as an argument (codegen/kernel.h). What a kernel specializes on beyond the
// class (vector width by alignment and divisibility, size buckets of the scheduler) it decides per
// call from the arguments, with the same source whenever the choices agree (segment_kernels.h).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/aten_evaluator.h"

namespace mf {

struct ShapeClass {
  std::vector<int64_t> key;        // what the cache compares
  std::vector<std::string> texts;  // per input, the same in words (for MESHFUSER_DUMP=recompile)
  bool operator==(const ShapeClass& o) const { return key == o.key; }
};

ShapeClass shapeClassOf(const std::vector<RuntimeValue>& inputs);

// Why `now` needed a new program when `before` was the last one compiled: the first input whose
// class differs, in words ("input 0: float32 -> bfloat16 ...").
std::string classChange(const ShapeClass& before, const ShapeClass& now);

// How many entries the caches keep (least recently used out). MESHFUSER_EXECUTOR_CACHE_SIZE and
// MESHFUSER_KERNEL_CACHE_SIZE set the defaults; meshfuser.set_cache_limits() changes them.
struct CacheLimits {
  int64_t executors_per_definition = 32;  // shape classes per definition
  int64_t kernel_modules = 1024;          // loaded CUDA modules, process-wide
};
CacheLimits& cacheLimits();

}  // namespace mf
