// Which consumer axis each producer axis becomes. This is the axis map of docs/design.md section 4:
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
std::vector<int64_t> mapPad(const Expr* e, size_t input_index);  // padded axes map to nothing
std::vector<int64_t> mapLinear(const Expr* e, size_t input_index);
std::vector<int64_t> mapMatmul(const Expr* e, size_t input_index);
// sdpfa_fwd/bwd: the leading axes ([batch.., heads]) of every operand map to the same leading axes
// of every output that has them; so does q's sequence onto attn and logsumexp in a forward without
// causal mask. Other sequence and head_dim axes map nowhere (they are contracted or mixed by the
// softmax), nor does anything map onto the RNG state.
std::vector<int64_t> mapAttention(const Expr* e, size_t input_index, size_t output_index);
std::vector<int64_t> mapEmbedding(const Expr* e, size_t input_index);

// Mixture-of-experts ops. Each sends the axis it reads across (attrs.dim; grouped_mm's rows and
// contraction) nowhere, so a device split there is gathered first; the other axes keep their place.
// topk/sort/argsort/cumsum: every axis but `dim` maps onto itself (for each output).
std::vector<int64_t> mapAlongDim(const Expr* e, size_t input_index);
std::vector<int64_t> mapAlongDimOutputs(const Expr* e, size_t input_index, size_t output_index);
// index_select(x, dim, index): x's other axes keep their place; the 1-D index becomes axis `dim`.
std::vector<int64_t> mapIndexSelect(const Expr* e, size_t input_index);
// gather(x, dim, index): the output is shaped like index (every index axis keeps its place); an
// axis of x other than `dim` maps onto the output's where their extents agree.
std::vector<int64_t> mapGatherAlong(const Expr* e, size_t input_index);
// scatter/index_add(x, dim, index, src): the output is shaped like x (every axis but `dim` keeps its
// place); index and src axes other than `dim` map where their extents agree with the output's.
std::vector<int64_t> mapScatter(const Expr* e, size_t input_index);
// grouped_mm: 3-D x 3-D keeps the group axis and mat1's rows and mat2's columns; the grouped forms
// (with offsets) keep mat2's columns and, for 2-D x 2-D, mat1's rows. Offsets map nowhere.
std::vector<int64_t> mapGroupedMm(const Expr* e, size_t input_index);
// bincount: the counted values map nowhere (the counts are over all of them).
std::vector<int64_t> mapNothing(const Expr* e, size_t input_index);

}  // namespace mf
