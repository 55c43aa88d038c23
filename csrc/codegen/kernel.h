// Generated kernels: the contract between codegen (this directory, plain C++ text generation,
// no CUDA runtime dependency) and the runtime (csrc/runtime/cuda_kernel.cpp: NVRTC + driver API).
//
// A compute segment (a list of non-resharding exprs in topological order) plus the concrete
// shapes/strides/dtypes of its tensor inputs goes in; CUDA C++ source and a launch configuration
// come out, or a reason why the segment is not supported (the runtime then falls back to the ATen
// evaluator and MESHFUSER_DUMP=fallback prints the reason).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "codegen/device_limits.h"
#include "ir/nodes.h"

namespace mf {

// One tensor argument as the kernel will see it: local (per-device) sizes and strides in
// elements, and the byte alignment of its data pointer (for vectorization decisions).
struct KernelTensorArg {
  DataType dtype = DataType::Float;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t alignment_bytes = 16;
};

struct KernelLaunch {
  int64_t grid_x = 1, grid_y = 1, grid_z = 1;
  int64_t block_x = 1, block_y = 1, block_z = 1;
  int64_t shared_mem_bytes = 0;
  int64_t min_blocks = 0;  // resident blocks per SM asked of ptxas in __launch_bounds__ (0: none)
  // Global scratch the kernel needs (0: none): the runtime allocates workspace_bytes per launch,
  // zeroes the bytes from workspace_zero_offset on (counters), and passes the pointer last.
  int64_t workspace_bytes = 0;
  int64_t workspace_zero_offset = 0;
};

struct GeneratedKernel {
  std::string name;       // the __global__ function's name (extern "C")
  std::string source;     // self-contained CUDA C++ (compiled by NVRTC; no #include of system headers)
  std::string scheduler;  // "pointwise" or "reduction"
  KernelLaunch launch;
  // Kernel parameters, in order: one pointer per segment input tensor (segment input order), then
  // one pointer per segment output tensor (segment output order), then one `double` per runtime
  // scalar input of the segment (segment scalar order), then `count` as a `long long`, then the
  // workspace pointer (null when launch.workspace_bytes is 0; outer reductions declare it). Outputs are
  // allocated by the runtime as contiguous tensors of `output_sizes[i]` and dtype of the output
  // TensorView.
  std::vector<std::vector<int64_t>> output_sizes;
  // The extent-dependent loop bound (rows, vector groups, tiles): a launch argument, not part of the
  // source, so inputs that differ only in their outer extents share one source (and one compile)
  // whenever the scheduler makes the same choices for them. `launch` and `output_sizes` are those
  // of the inputs the kernel was generated for.
  int64_t count = 0;
  // The scheduler's choices that shape the text ("vec 8, unroll 4, index 32, block 256x1"), named in
  // MESHFUSER_DUMP=recompile when another extent needs another kernel.
  std::string choices;
  // The device limits and the scheduler's parameters derived from them, then its choices for these
  // inputs: what MESHFUSER_DUMP=heuristics prints.
  std::string heuristics;
};

// A segment to generate code for. `inputs` are the Vals read from outside the segment (tensors
// and non-constant scalars, in a deterministic order), `outputs` the tensors read after it or
// returned by the fusion.
struct KernelSegment {
  std::vector<const Expr*> exprs;
  std::vector<const Val*> inputs;
  std::vector<const TensorView*> outputs;
};

// Splits a segment's exprs into the inputs/outputs lists above. `live_after` says whether a
// tensor is used after the segment (or is a fusion output).
KernelSegment makeKernelSegment(const std::vector<Expr*>& exprs, const std::function<bool(const Val*)>& live_after);

// The device the kernel is generated for (default: the sm_90 table, H100/H200 SXM).
struct CodegenOptions {
  DeviceLimits device;
};

// Generates one kernel for the whole segment, or returns nullopt with `why_not` set.
std::optional<GeneratedKernel> generateKernel(const KernelSegment& segment, const std::vector<KernelTensorArg>& inputs,
                                              const CodegenOptions& options, std::string* why_not);

}  // namespace mf
