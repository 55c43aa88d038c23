// The blocked layout of a communicated axis: the axis cut into n equal blocks, block i moved to
// position i of a new outermost axis (what a ReduceScatter or AllToAll sends to team member i, and
// what an Allgather receives), and back. Used by single communications (run_communication.cpp) and
// by stream loops' per-chunk communications (run_stream_loop.cpp), so both check divisibility alike.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace mf {

// t's `axis` split into [n, extent/n] with the n part moved to the front (contiguous): [n, ...].
// An extent that n does not divide is an internal error (the executor's validation refuses such
// shapes before anything runs).
at::Tensor blocksOutermost(const at::Tensor& t, int64_t axis, int64_t n);

// The inverse for a buffer [n, ...rest]: the blocks concatenated along `axis` of rest.
at::Tensor mergeBlocks(const at::Tensor& buf, int64_t axis);

}  // namespace mf
