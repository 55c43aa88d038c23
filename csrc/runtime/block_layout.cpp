#include "runtime/block_layout.h"

#include <vector>

#include "support/error.h"

namespace mf {

at::Tensor blocksOutermost(const at::Tensor& t, int64_t axis, int64_t n) {
  std::vector<int64_t> shape = t.sizes().vec();
  MF_CHECK(axis >= 0 && axis < static_cast<int64_t>(shape.size()), "axis ", axis, " of a ", shape.size(), "-D tensor");
  MF_CHECK(n > 0 && shape[axis] % n == 0, "axis ", axis, " of extent ", shape[axis], " does not split into ", n,
           " blocks");
  shape[axis] /= n;
  shape.insert(shape.begin() + axis, n);
  return t.reshape(shape).movedim(axis, 0).contiguous();
}

at::Tensor mergeBlocks(const at::Tensor& buf, int64_t axis) {
  at::Tensor moved = buf.movedim(0, axis);
  std::vector<int64_t> shape = moved.sizes().vec();
  shape[axis] *= shape[axis + 1];
  shape.erase(shape.begin() + axis + 1);
  return moved.reshape(shape);
}

}  // namespace mf
