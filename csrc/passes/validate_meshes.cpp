// validate_meshes
// Requires: a Fusion as the user defined and scheduled it.
// Guarantees: either no tensor has a device mesh (single-device program), or every fusion input
//   tensor has one; every device-parallel loop axis has the extent of its mesh axis (verifier);
//   no mesh holds a rank twice (DeviceMesh); a stream axis is a whole constant axis or the outer
//   part of a split with a constant chunk count, at most one per tensor, and only stream axes are swizzled (whether the
//   loop can be honoured is decided at lowering, host/stream_loops.cpp); the per-device axis an
//   rfactor of a split reduction leaves is on a mesh axis. Errors name the tensor and the axis.
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
      int64_t stream_axes = 0;
      for (IterDomain* id : tv->loop()) {
        if (id->parallelType() == ParallelType::Stream) {
          // The chunk count is the trip count of a host loop: a constant, a whole axis or the outer
          // part of a split.
          IdTransform* t = id->definition();
          bool outer_part = t != nullptr && t->kind() == IdTransform::Kind::Split && t->outputs()[0] == id;
          MF_USER_CHECK((t == nullptr || outer_part) && id->extent().isConst(), tv->toString(), " has axis ",
                        id->toString(), " parallelized on ParallelType.stream, but a stream axis must be a whole ",
                        "axis of constant extent or the outer part of a split with a constant chunk count ",
                        "(outer_split(axis, chunks))");
          ++stream_axes;
        }
        MF_USER_CHECK(id->swizzle() == ParallelType::Serial || id->parallelType() == ParallelType::Stream,
                      tv->toString(), " has axis ", id->toString(), " swizzled (swizzle1d) but not parallelized on ",
                      "ParallelType.stream; only a stream axis can visit its chunks in ring order");
        MF_USER_CHECK(stream_axes <= 1, tv->toString(), " has ", stream_axes,
                      " axes on ParallelType.stream; at most one");
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
