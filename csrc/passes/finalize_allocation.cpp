// finalize_allocation
// Requires: decompose_reshardings ran.
// Guarantees: every sharded tensor's allocation domain is its logical domain in logical order with
//   each device split applied (the DID part, local size 1, just before the local part). Tensors
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
        IterDomain* did = nullptr;
        for (IterDomain* l : tv->loop()) {
          IdTransform* t = l->definition();
          if (l->isDeviceDim() && t && t->kind() == IdTransform::Kind::Split && t->inputs()[0] == id) did = l;
        }
        if (did == nullptr) {
          alloc.push_back(id);
        } else {
          alloc.push_back(did);
          alloc.push_back(did->definition()->outputs()[1]);
        }
      }
      tv->setAllocation(alloc);
    }
  }
};

}  // namespace

std::unique_ptr<Pass> makeFinalizeAllocationPass() { return std::make_unique<FinalizeAllocationPass>(); }

}  // namespace mf
