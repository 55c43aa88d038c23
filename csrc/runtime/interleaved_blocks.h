// Send and receive layouts of a communication whose device split is interleaved (an inner split,
// or a device part that is not the outermost piece of its axis): each team member's elements along
// the communicated axis are picked and placed by their global positions (sharding.h's
// axisPositions), one index_select or index_copy each way. Blocked splits never come here: they
// are reshapes (run_communication.cpp).
#pragma once

#include <ATen/ATen.h>

#include "ir/nodes.h"
#include "runtime/aten_evaluator.h"

namespace mf {

// Where the communicated axis' elements of every team member (along pt) sit within a tensor.
struct TeamIndex {
  const TensorView* member_view = nullptr;  // the tensor whose pt-split picks each member's elements
  int64_t member_axis = -1;                 // its axis (logical, without reductions)
  const TensorView* whole_view = nullptr;   // the tensor the members' elements are placed in
  int64_t whole_axis = -1;
  ParallelType pt = ParallelType::DIDx;
  // When the members' elements are picked from a tensor other than the whole view (LocalSlice,
  // ReduceScatter): that tensor and axis, whose elements must be exactly the whole view's.
  const TensorView* source_view = nullptr;
  int64_t source_axis = -1;
};

// For members 0..n-1 of the team along pt, concatenated: each member's elements' indices along the
// whole view's axis (which this rank holds with pt taken whole).
at::Tensor teamIndex(const TeamIndex& t, int64_t rank, int64_t n, const ExtentBindings& bindings, at::Device device);

// x's `axis` (the whole view) cut into the members' elements: [n, ...] with member j's first.
at::Tensor memberBlocksByIndex(const at::Tensor& x, int64_t axis, const at::Tensor& index, int64_t n);
// Inverse: the received [n, ...] buffer placed along `axis` of a new tensor by `index`.
at::Tensor mergeMembersByIndex(const at::Tensor& buf, int64_t axis, const at::Tensor& index);

}  // namespace mf
