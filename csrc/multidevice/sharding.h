// Sharding queries on TensorViews (plain C++). A sharding is a tensor's mesh plus device parallel
// types on non-reduction loop axes (docs/design.md section 4). A DID on a reduction axis means "reduced
// across devices" and counts as replicated here.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ir/nodes.h"

namespace mf {

// How one device parallel type divides a tensor.
//
// A logical axis may be split several times (outer or inner splits, in any nesting); the leaves of
// that split tree, in row-major order, index the axis, and a DID on a leaf picks one index of it.
// Seen without the other device parallel types' leaves, the axis is [outer, num_devices, inner]
// (row-major) and this device holds [:, its index, :]. The usual outer split is outer = 1: each
// device holds one contiguous block ("blocked"). An inner split (DID on the inner part) gives
// inner = 1: the device holds every num_devices-th element ("interleaved").
struct DeviceSplit {
  ParallelType pt = ParallelType::Serial;
  IterDomain* loop_id = nullptr;  // the loop axis carrying pt
  // Index into the domain traced to (logical for shardedAxis, rootOrLogical for the consumer view).
  int64_t axis = -1;
  // true: the DID sits on that axis itself (logical split, local extent 1).
  bool whole_axis = false;
  int64_t num_devices = 1;
  // The constant extents around the device part; kRest: whatever the axis' extent leaves (one of
  // them is always constant, since every split has a constant factor). Both are known when the
  // axis' extent is.
  static constexpr int64_t kRest = -1;
  int64_t outer = 1;
  int64_t inner = kRest;
  // The product of everything after the device part, other device pieces included (kRest if
  // symbolic): how far apart this device's runs of elements sit.
  int64_t inner_all = kRest;
  // Device leaves of other parallel types before this one on the same axis (they pick the part of
  // the axis this one splits: [DIDx, DIDy, rest] splits DIDx's block on DIDy).
  int64_t depth = 0;
  // What decides which elements a device holds, as text: the leaves up to this one (device leaves
  // by type, runs of other leaves by their constant product or "?"), then the product of the
  // non-device leaves after it. Two tensors whose splits of pt have the same signature on the same
  // axis hold the same elements, whatever the split trees look like.
  std::string signature;
  // One contiguous block per device, in mesh order (what c10d collectives and DTensor's Shard use).
  bool blocked() const { return outer == 1 || num_devices == 1; }
  bool operator==(const DeviceSplit& o) const {
    return pt == o.pt && axis == o.axis && whole_axis == o.whole_axis && num_devices == o.num_devices &&
           signature == o.signature;
  }
};

// The non-reduction loop axis parallelized on pt, or nullptr.
IterDomain* shardedLoopId(const TensorView* tv, ParallelType pt);
bool isSharded(const TensorView* tv);
// How pt splits `tv`, traced to tv's logical domain (axis counts logicalNoReductions) or, with
// `to_root`, to its rootOrLogical domain (axis counts all of it). pt must be present.
DeviceSplit deviceSplit(const TensorView* tv, ParallelType pt, bool to_root = false);
// The same for a given loop axis (a reduction DID too), traced to `domain` (which must hold its root).
DeviceSplit deviceSplitOf(const TensorView* tv, IterDomain* loop_id, const std::vector<IterDomain*>& domain);
// The leaves of the split tree below `root` (an axis of tv's root or logical domain), row-major:
// what tv's loop domain makes of it. [root] when it is not split.
std::vector<IterDomain*> splitLeaves(const TensorView* tv, IterDomain* root);
// The global positions, in local order, of the elements this device holds along non-reduction
// logical axis `axis` of tv, whose global extent is `global_extent`. `index_of(pt)` gives this
// device's index along pt, or -1 to take pt's leaf whole (the tensor as gathered along pt). A user
// error when a split does not divide the extent it splits.
std::vector<int64_t> axisPositions(const TensorView* tv, int64_t axis, int64_t global_extent,
                                   const std::function<int64_t(ParallelType)>& index_of);
// `pts` ordered by their depth in tv (outer device splits first, unsharded types last), the order
// in which shardAxis must copy them to give another tensor the same layout.
std::vector<ParallelType> byDepth(const TensorView* tv, std::vector<ParallelType> pts);
// What keeps non-reduction logical axis `axis` of tv, of global extent `global_extent`, from
// splitting as its schedule says (a split that does not divide, a device piece not as long as the
// mesh), or "".
std::string unevenSplit(const TensorView* tv, int64_t axis, int64_t global_extent);
// True when every device split of tv is blocked (what DTensor's Shard and c10d's blocks describe).
bool allSplitsBlocked(const TensorView* tv);
// The runtime-tensor axis sharded on pt, or -1 when replicated along pt.
int64_t shardedAxis(const TensorView* tv, ParallelType pt);
// Per runtime-tensor axis: the number of shards (1 when not sharded). Local = global / shards.
// Read from the allocation domain when the tensor has one (finalize_allocation writes it for every
// sharded tensor, so that is what sizes the runtime's buffers), else from the loop domain.
std::vector<int64_t> shardsPerAxis(const TensorView* tv);
// Local extents from global ones (the runtime tensor shape on a device of the mesh). Nested
// splits that do not divide are refused once per call by the executor's check (unevenSplit).
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
