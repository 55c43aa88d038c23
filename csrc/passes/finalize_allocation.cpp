// finalize_allocation
// Requires: decompose_reshardings ran.
// Guarantees: every sharded tensor's allocation domain is its logical domain in logical order with
//   each device split applied: an axis split across devices becomes its device pieces (local size
//   1) followed by its other split pieces in row-major order, which is how a device lays out its
//   elements whether the split is one block per device or interleaved. Tensors
//   without device splits keep what they had. The runtime sizes its buffers from these
//   (shardsPerAxis reads the allocation domain), and lays them out in logical order.
#include <algorithm>

#include "multidevice/sharding.h"
#include "passes/pass.h"

namespace mf {
namespace {

class FinalizeAllocationPass : public Pass {
 public:
  const char* name() const override { return "finalize_allocation"; }
  void run(Fusion& fusion) override {
    for (TensorView* tv : fusion.allTensors()) {
      if (!tv->hasMesh() || !isSharded(tv)) continue;
      std::vector<IterDomain*> alloc;
      for (IterDomain* id : tv->logical()) {
        // The split leaves of the axis: its device pieces first, then the rest in row-major order
        // (the local layout of an interleaved split too).
        std::vector<IterDomain*> leaves = splitLeaves(tv, id);
        bool sharded = std::any_of(leaves.begin(), leaves.end(), [](IterDomain* l) { return l->isDeviceDim(); });
        if (!sharded || leaves.size() == 1) {
          alloc.push_back(id);
          continue;
        }
        for (IterDomain* l : leaves) {
          if (l->isDeviceDim()) alloc.push_back(l);
        }
        for (IterDomain* l : leaves) {
          if (!l->isDeviceDim()) alloc.push_back(l);
        }
      }
      tv->setAllocation(alloc);
    }
  }
};

}  // namespace

std::unique_ptr<Pass> makeFinalizeAllocationPass() { return std::make_unique<FinalizeAllocationPass>(); }

}  // namespace mf
