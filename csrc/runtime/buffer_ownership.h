// Whether the runtime may write into a tensor's buffer: nothing but the runtime's own references
// hold the tensor, and nothing else views its storage.
#pragma once

#include <ATen/ATen.h>

namespace mf {

// `references`: how many handles the runtime itself holds on `t` (its value map, a local list of
// arguments). A view whose base is held by that view alone counts as sole owner: ATen returns such
// views (a linear of a 3-D input is a 2-D GEMM's output viewed as 3-D), and with gradients enabled
// the view keeps its base, so the storage has two users though no one else can reach it.
inline bool ownsItsBuffer(const at::Tensor& t, size_t references) {
  if (t.use_count() != references) return false;
  const auto users = t.storage().use_count();
  if (users == 1) return true;
  return users == 2 && t.is_view() && t._base().use_count() == 1;
}

}  // namespace mf
