// Helpers that copy a device sharding from one tensor to a neighbour through an expr's axis map.
// Used by propagate_shardings and decompose_reshardings.
#pragma once

#include <set>
#include <vector>

#include "ir/nodes.h"
#include "multidevice/sharding.h"

namespace mf {

// Shards tv's rootOrLogical axis `axis` on pt like `num_devices` / `whole_axis` describe: either
// parallelizes the axis itself or outer-splits it and parallelizes the outer part. Returns false
// (and changes nothing) when tv already uses pt or the axis is no longer a loop axis.
// With `beside_other_kind`, an axis of the other kind (iteration vs reduction) already carrying pt
// does not block it: a ReduceScatter's result is reduced over pt and sharded on pt at once.
bool shardAxis(TensorView* tv, int64_t axis, ParallelType pt, int64_t num_devices, bool whole_axis,
               bool beside_other_kind = false);
// The same with the layout of `like` (another tensor's split of pt, possibly interleaved): the
// axis, or the one part of it that other device splits leave, is split so that, seen without the
// other device parts, it is [like.outer, num_devices, like.inner].
bool shardAxis(TensorView* tv, int64_t axis, const DeviceSplit& like, bool beside_other_kind = false);

// Whether split `s` of axis `from` can be copied onto axis `to` that `e` maps it to: always for an
// op that keeps its axes (pointwise, reductions); for one that regroups them (reshape): a block per
// device always can (a reshape's outer rows hold the same elements), an interleaved split only
// when the op keeps the axis whole (the same extent); a reshape that splits or merges it would
// pair different elements.
bool layoutCarriesOver(const Expr* e, const DeviceSplit& s, const IterDomain* from, const IterDomain* to);

// Copies the producer's (input `input_index` of e) shardings for `pts` onto e's outputs (those
// that hold input data), leaving the outputs in `keep` as they are. Sets an output's mesh from the
// producer when it has none.
void shardConsumerLikeProducer(const Expr* e, size_t input_index, const std::vector<ParallelType>& pts,
                               const std::set<const TensorView*>* keep = nullptr);
// Copies the consumer's shardings for `pts` (reduction DIDs included, through the consumer's
// root) back onto `producer`, which plays the role of input `input_index` of e. With several
// outputs, each parallel type comes from the first output that maps it onto the producer.
void shardProducerLikeConsumer(const Expr* e, size_t input_index, TensorView* producer,
                               const std::vector<ParallelType>& pts, bool include_reduction_dids);

// A new tensor with tv's dtype, global shape and mesh, unscheduled. With `keep_reductions` its
// logical domain keeps tv's reduction axes (for a new definition of a reduction's result).
TensorView* newTensorLike(TensorView* tv, bool keep_reductions = false);

}  // namespace mf
