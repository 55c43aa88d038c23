// Which consumer axis each producer axis becomes, per op. This is the "pairwise logical map" of
// DESIGN.md: it is how sharding propagates and how the resharding predicate lines axes up.
#pragma once

#include <vector>

#include "ir/nodes.h"

namespace mf {

// For expr `e` and its tensor input at `input_index`: result[p] is the index into the consumer's
// rootOrLogical() of the axis that the producer's p-th non-reduction logical axis maps to, or -1.
// Broadcast producer axes that meet a non-broadcast consumer axis map to -1 (they hold no data to
// shard).
std::vector<int64_t> mapProducerToConsumer(const Expr* e, size_t input_index);

}  // namespace mf
