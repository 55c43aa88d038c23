// validate_meshes
// Requires: a Fusion as the user defined and scheduled it.
// Guarantees: either no tensor has a device mesh (single-device program), or every fusion input
//   tensor has one; every device-parallel loop axis has the extent of its mesh axis (verifier);
//   no mesh holds a rank twice (DeviceMesh); no axis is stream-parallel (not honoured yet, so it
//   is refused rather than ignored); the per-device axis an rfactor of a split reduction leaves is
//   on a mesh axis. Errors name the tensor and the axis.
#include "multidevice/sharding.h"
#include "passes/pass.h"
#include "support/error.h"

namespace mf {
namespace {

class ValidateMeshesPass : public Pass {
 public:
  const char* name() const override { return "validate_meshes"; }
  void run(Fusion& fusion) override {
    const TensorView* with_mesh = nullptr;
    for (const TensorView* tv : fusion.allTensors()) {
      if (tv->hasMesh()) with_mesh = tv;
    }
    for (const TensorView* tv : fusion.allTensors()) {
      for (IterDomain* id : tv->loop()) {
        MF_USER_CHECK(id->parallelType() != ParallelType::Stream, tv->toString(), " has axis ", id->toString(),
                      " parallelized on ParallelType.stream; stream-parallel (overlapped) loops are not ",
                      "implemented yet, and a schedule that is not honoured is refused rather than ignored");
        MF_USER_CHECK(!id->isDeviceDim() || tv->hasMesh(), tv->toString(), " has axis ", id->toString(),
                      " parallelized on a mesh axis but no device mesh; call set_device_mesh");
      }
    }
    // rfactor of a split reduction leaves the partial one axis per device (its outer part): it must
    // be on a mesh axis by now, or the partial would need a local split reduction nobody runs.
    for (const TensorView* tv : fusion.allTensors()) {
      if (tv->root().empty()) continue;
      for (IterDomain* id : tv->logical()) {
        IdTransform* t = id->definition();
        bool split_part = t != nullptr && t->kind() == IdTransform::Kind::Split;
        MF_USER_CHECK(!id->isRFactorProduct() || id->isReduction() || !split_part || id->isDeviceDim(), tv->toString(),
                      ": axis ", id->toString(), " is the outer part of a split reduction that was rfactored, but it is ",
                      "not parallelized on a mesh axis; parallelize it (and the reduction's matching axis) on one");
      }
    }
    if (with_mesh == nullptr) return;
    for (Val* in : fusion.inputs()) {
      if (!in->isTensor()) continue;
      auto* tv = static_cast<TensorView*>(in);
      MF_USER_CHECK(tv->hasMesh(), "fusion input ", tv->toString(), " has no device mesh while ", with_mesh->toString(),
                    " has mesh ", with_mesh->mesh().toString(),
                    "; every input of a multi-device fusion needs one (set_device_mesh; leave it unsplit for a ",
                    "replicated input)");
    }
  }
};

}  // namespace

std::unique_ptr<Pass> makeValidateMeshesPass() { return std::make_unique<ValidateMeshesPass>(); }

}  // namespace mf
