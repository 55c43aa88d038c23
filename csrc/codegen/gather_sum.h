// The kernels behind index_add and index_select along the rows on CUDA: an atomic-free segmented
// gather-sum, and a plain row gather.
//
// index_add(x, 0, index, src) adds row i of src into row index[i] of a copy of x. PyTorch runs it
// with one atomic add per element (bf16 atomics serialize on the rows that many src rows share: the
// MoE combine spent 1.71 ms on 400 MB). Sorting the index instead (the runtime: a stable sort and
// a searchsorted of the row ids) gives every output row the src rows that land on it, as
// order[offsets[row] .. offsets[row + 1]); this kernel then computes each output row once:
//   out[row] = x[row] + sum over j of src[order[j]]   (in float, rounded once: deterministic)
// reading every byte of x and src once and writing out once. index_select(src, 0, index) is the
// same kernel with one src row per output row and no x: out[row] = src[index[row]].
#pragma once

#include <cstdint>
#include <string>

#include "codegen/kernel.h"

namespace mf {

// What the kernel is generated for: rows of `width` elements of `dtype` (x, src and out share both),
// contiguous rows; `alignment_bytes` the smallest alignment of the three data pointers.
struct GatherSumShape {
  enum class Mode { Sum, Select };
  Mode mode = Mode::Sum;
  DataType dtype = DataType::Float;
  int64_t out_rows = 0;
  int64_t width = 0;
  int64_t alignment_bytes = 16;
};

// The kernel's parameters: x, src, order (int64), offsets (int64, out_rows + 1 entries), then out,
// then the double `src_rows` (checked against offsets[out_rows]: an index outside [0, out_rows)
// traps, as PyTorch's device-side assert does), then the count (out_rows x vector groups per row).
// Select mode: src, index (int64, out_rows entries), then out, then `src_rows` (an index outside
// [0, src_rows) traps), then the count. Float, half and bfloat16 only (the caller keeps ATen for
// the rest).
GeneratedKernel generateGatherSum(const GatherSumShape& shape, const DeviceLimits& device);
// Sets what depends on shape.out_rows alone (the count, the grid, the output's rows) on a kernel
// generateGatherSum made for the same dtype, width and alignment: the text does not change with the
// row count, so a caller keeps one kernel per text and sets its rows per call.
void setGatherSumRows(GeneratedKernel& kernel, const GatherSumShape& shape, const DeviceLimits& device);

}  // namespace mf
