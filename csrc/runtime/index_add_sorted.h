// index_add along the rows on CUDA without atomics: sort the index, then one generated gather-sum
// kernel (codegen/gather_sum.h) computes every output row once. Deterministic (each row's src rows
// are summed in ascending order, in float) where ATen's atomics are not.
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace mf {

// index_add(x, dim, index, src) through the sorted path, or nullopt where it does not apply: not a
// CUDA tensor or no generated kernels, an axis other than the first, a dtype other than float,
// half or bfloat16, rows narrower than a warp's worth of elements (the sort would cost more than the
// atomics save), or MESHFUSER_INDEX_ADD=aten (for A/B timing). MESHFUSER_INDEX_ADD=sorted makes a
// call it cannot take a user error instead.
std::optional<at::Tensor> indexAddSorted(const at::Tensor& x, int64_t dim, const at::Tensor& index,
                                         const at::Tensor& src);

}  // namespace mf
