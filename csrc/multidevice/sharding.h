// Sharding queries on TensorViews (plain C++). A sharding is a tensor's mesh plus device parallel
// types on non-reduction loop axes (DESIGN.md section 4). A DID on a reduction axis means "reduced
// across devices" and counts as replicated here.
#pragma once

#include <cstdint>
#include <vector>

#include "ir/nodes.h"

namespace mf {

// How one device parallel type divides a tensor.
struct DeviceSplit {
  ParallelType pt = ParallelType::Serial;
  IterDomain* loop_id = nullptr;  // the non-reduction loop axis carrying pt
  // Index into the domain traced to (logical for shardedAxis, rootOrLogical for the consumer view).
  int64_t axis = -1;
  // true: the DID sits on that axis itself (logical split, local extent 1);
  // false: the DID is the outer part of an outer split of that axis by `num_devices`.
  bool whole_axis = false;
  int64_t num_devices = 1;
  bool operator==(const DeviceSplit& o) const {
    return pt == o.pt && axis == o.axis && whole_axis == o.whole_axis && num_devices == o.num_devices;
  }
};

// The non-reduction loop axis parallelized on pt, or nullptr.
IterDomain* shardedLoopId(const TensorView* tv, ParallelType pt);
bool isSharded(const TensorView* tv);
// How pt splits `tv`, traced to tv's logical domain (axis counts logicalNoReductions) or, with
// `to_root`, to its rootOrLogical domain (axis counts all of it). pt must be present.
DeviceSplit deviceSplit(const TensorView* tv, ParallelType pt, bool to_root = false);
// The runtime-tensor axis sharded on pt, or -1 when replicated along pt.
int64_t shardedAxis(const TensorView* tv, ParallelType pt);
// Per runtime-tensor axis: the number of shards (1 when not sharded). Local = global / shards.
// Read from the allocation domain when the tensor has one (finalize_allocation writes it for every
// sharded tensor, so that is what sizes the runtime's buffers), else from the loop domain.
std::vector<int64_t> shardsPerAxis(const TensorView* tv);
// Local extents from global ones (the runtime tensor shape on a device of the mesh).
std::vector<int64_t> localShape(const TensorView* tv, const std::vector<int64_t>& global_shape);

// True when `e` moves data between devices for some device parallel type: the producer's and the
// consumer's DIDs do not index the same mapped logical positions, or the meshes differ.
bool isResharding(const Expr* e);
// The device parallel types whose sharding differs between input `input_index` and the output
// (any of the outputs that hold input data, for an op of several outputs), in enum order.
std::vector<ParallelType> reshardedTypes(const Expr* e, size_t input_index);
// Indices of e's tensor outputs that hold input data: all but the registry's sharding-free ones
// (attention's RNG state), which are replicated whatever the inputs' shardings.
std::vector<size_t> dataOutputs(const Expr* e);

}  // namespace mf
