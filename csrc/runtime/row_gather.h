// Row gathers on CUDA as generated kernels (codegen/gather_sum.h): index_add along the rows without
// atomics (sort the index, then one gather-sum kernel computes every output row once:
// deterministic, each row's src rows summed in ascending order, in float), and index_select along
// the rows (one vectorized row copy per output row). Where they do not apply, the caller runs ATen.
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace mf {

// index_add(x, dim, index, src) through the sorted path, or nullopt where it does not apply: not a
// CUDA tensor or no generated kernels (MESHFUSER_DISABLE=codegen), an axis other than the first, a
// dtype other than float, half or bfloat16, rows narrower than 64 elements (the sort would cost
// more than the atomics save), or MESHFUSER_INDEX_ADD=aten (for A/B timing).
// MESHFUSER_INDEX_ADD=sorted makes a call it cannot take a user error instead.
std::optional<at::Tensor> indexAddSorted(const at::Tensor& x, int64_t dim, const at::Tensor& index,
                                         const at::Tensor& src);

// index_select(x, dim, index) as a generated row gather, or nullopt where it does not apply (as
// above, without the width limit and the switch, and for a strided x, which ATen reads in place).
std::optional<at::Tensor> indexSelectRows(const at::Tensor& x, int64_t dim, const at::Tensor& index);

}  // namespace mf
