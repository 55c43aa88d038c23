#include "runtime/interleaved_blocks.h"

#include <algorithm>

#include "multidevice/sharding.h"
#include "support/error.h"

namespace mf {

at::Tensor teamIndex(const TeamIndex& t, int64_t rank, int64_t n, const ExtentBindings& bindings, at::Device device) {
  auto positions = [&](const TensorView* tv, int64_t axis, int64_t member) {
    std::vector<int64_t> coords = tv->mesh().coordinatesOf(rank);
    int64_t extent = globalShape(tv, bindings).at(static_cast<size_t>(axis));
    return axisPositions(tv, axis, extent, [&](ParallelType q) {
      return q == t.pt ? member : coords.at(static_cast<size_t>(tv->mesh().axisOf(q)));
    });
  };
  // Both lists are ascending: local order is row-major over the split leaves.
  std::vector<int64_t> whole = positions(t.whole_view, t.whole_axis, -1);
  if (t.source_view != nullptr) {
    MF_CHECK(positions(t.source_view, t.source_axis, -1) == whole, t.source_view->toString(), " axis ", t.source_axis,
             " does not hold the elements ", t.whole_view->toString(), " takes along ", toString(t.pt), " on rank ",
             rank, ": the plan pairs tensors split differently");
  }
  std::vector<int64_t> index;
  index.reserve(whole.size());
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t p : positions(t.member_view, t.member_axis, j)) {
      auto it = std::lower_bound(whole.begin(), whole.end(), p);
      MF_CHECK(it != whole.end() && *it == p, t.member_view->toString(), ": element ", p, " of member ", j,
               " along ", toString(t.pt), " is not in ", t.whole_view->toString(), "'s elements on rank ", rank);
      index.push_back(it - whole.begin());
    }
  }
  MF_CHECK(index.size() == whole.size(), "the team's elements along ", toString(t.pt), " (", index.size(),
           ") do not cover ", t.whole_view->toString(), "'s axis (", whole.size(), ")");
  return at::tensor(index, at::TensorOptions().dtype(at::kLong)).to(device);
}

at::Tensor memberBlocksByIndex(const at::Tensor& x, int64_t axis, const at::Tensor& index, int64_t n) {
  MF_CHECK(x.size(axis) == index.numel(), "axis ", axis, " of extent ", x.size(axis), " vs an index of ",
           index.numel());
  at::Tensor picked = x.index_select(axis, index);
  std::vector<int64_t> shape = picked.sizes().vec();
  shape[static_cast<size_t>(axis)] /= n;
  shape.insert(shape.begin() + axis, n);
  return picked.reshape(shape).movedim(axis, 0).contiguous();
}

at::Tensor mergeMembersByIndex(const at::Tensor& buf, int64_t axis, const at::Tensor& index) {
  at::Tensor moved = buf.movedim(0, axis);
  std::vector<int64_t> shape = moved.sizes().vec();
  shape[static_cast<size_t>(axis)] *= shape[static_cast<size_t>(axis) + 1];
  shape.erase(shape.begin() + axis + 1);
  at::Tensor merged = moved.reshape(shape);
  return at::empty_like(merged, at::MemoryFormat::Contiguous).index_copy_(axis, index, merged);
}

}  // namespace mf
