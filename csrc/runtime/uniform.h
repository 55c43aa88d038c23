// fd.ops.uniform on the ATen path: the counter-based generator of support/counter_rng.h computed
// with int64 tensor ops (identical on CPU and CUDA tensors) over the global indices of the
// elements this rank holds.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <vector>

#include "ir/nodes.h"

namespace mf {

// Global row-major indices of the elements `rank` holds of `tv` (global shape `global_shape`),
// for any device split (blocked or interleaved), as an int64 tensor of the local shape.
at::Tensor shardGlobalIndices(const TensorView* tv, int64_t rank, const std::vector<int64_t>& global_shape,
                              const at::TensorOptions& options);

// Per runtime axis of `tv`, the global index of the first element `rank` holds (0 where the axis
// is not sharded): the rank's mesh coordinate times the local extent, for every device split.
std::vector<int64_t> shardStart(const TensorView* tv, int64_t rank, const std::vector<int64_t>& local_shape);

// Values of dtype `dtype` in [low, high) for the elements at `indices`.
at::Tensor counterUniform(const at::Tensor& indices, double low, double high, int64_t seed, int64_t offset,
                          at::ScalarType dtype);

}  // namespace mf
