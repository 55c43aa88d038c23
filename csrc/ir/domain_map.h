// Which consumer axis each producer axis becomes. This is the "pairwise logical map" of DESIGN.md:
// it is how sharding propagates and how the resharding predicate lines axes up. Each op's rule is
// one of the functions below, named by its registry entry (ir/op_registry.cpp).
#pragma once

#include <vector>

#include "ir/nodes.h"

namespace mf {

// For expr `e` and its tensor input at `input_index`: result[p] is the index into the consumer's
// rootOrLogical() of the axis that the producer's p-th non-reduction logical axis maps to, or -1.
// Broadcast producer axes of extent 1 that meet a non-broadcast consumer axis map to -1 (they hold
// no data to shard); expanded broadcast axes (extent > 1) map like any other axis.
// `output_index` picks the consumer among the outputs of an op that has several.
std::vector<int64_t> mapProducerToConsumer(const Expr* e, size_t input_index, size_t output_index = 0);

// Per-op rules (registry entries point at these).
std::vector<int64_t> mapRightAligned(const Expr* e, size_t input_index);  // pointwise, reductions
std::vector<int64_t> mapBroadcastInDim(const Expr* e, size_t input_index);
std::vector<int64_t> mapSqueeze(const Expr* e, size_t input_index);
std::vector<int64_t> mapPermute(const Expr* e, size_t input_index);
std::vector<int64_t> mapReshape(const Expr* e, size_t input_index);
// slice, pad, cat: right-aligned, but an axis whose extent the op changes maps to nothing.
std::vector<int64_t> mapResized(const Expr* e, size_t input_index);
std::vector<int64_t> mapLinear(const Expr* e, size_t input_index);
std::vector<int64_t> mapMatmul(const Expr* e, size_t input_index);
// sdpfa_fwd/bwd: the leading axes ([batch.., heads]) of every operand map to the same leading axes
// of every output that has them; sequence and head_dim axes map nowhere (they are contracted or
// mixed by the softmax), nor does anything map onto the RNG state.
std::vector<int64_t> mapAttention(const Expr* e, size_t input_index, size_t output_index);

}  // namespace mf
