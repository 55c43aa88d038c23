// Text tests of the validate_meshes pass: the IR it accepts unchanged, or the user error it raises.
// build/dev/mf_opt <pass> case.ir prints what a pass makes of an input.
#include "pass_text_test.h"

namespace mf {
namespace {

// Inputs with meshes pass through unchanged (intermediates need none yet).
TEST(ValidateMeshes, AcceptsAMeshOnEveryInput) {
  expectPassUnchanged("validate_meshes", R"IR(Fusion {
  input T0_float[i0{4}, i1{6}] mesh=[0 1]
    OuterSplit(i0{4}, factor 2) -> iDIDx2{2}, i3{2}
    loop: [iDIDx2{2}, i3{2}, i1{6}]
  T1 = relu(T0)
    T1_float[i4{4}, i5{6}]
  outputs: T1
}
)IR");
}

// Every input of a multi-device fusion needs a mesh.
TEST(ValidateMeshes, RefusesAnInputWithoutMesh) {
  expectPassError("validate_meshes", R"IR(Fusion {
  input T0_float[i0{4}] mesh=[0 1]
  input T1_float[i1{4}]
  T2 = add(T0, T1)
    T2_float[i2{4}]
  outputs: T2
}
)IR",
                  "fusion input T1 has no device mesh while T0 has mesh [0 1]");
}

// A stream axis is the trip count of a host loop: the outer part of a split (stream_loops decides
// at lowering whether the loop can be honoured).
TEST(ValidateMeshes, AcceptsAStreamSplit) {
  const char* ir = R"IR(Fusion {
  input T0_float[i0{4}, i1{6}] mesh=[0 1]
    OuterSplit(i0{4}, factor 2) -> iStream2{2}, i3{2}
    loop: [iStream2{2}, i3{2}, i1{6}]
  T1 = relu(T0)
    T1_float[i4{4}, i5{6}]
  outputs: T1
}
)IR";
  expectPassUnchanged("validate_meshes", ir);
}

TEST(ValidateMeshes, RefusesAStreamAxisThatIsNotTheOuterPartOfASplit) {
  expectPassError("validate_meshes", R"IR(Fusion {
  input T0_float[i0{4}, i1{6}] mesh=[0 1]
    OuterSplit(i0{4}, factor 2) -> i2{2}, iStream3{2}
    loop: [i2{2}, iStream3{2}, i1{6}]
  T1 = relu(T0)
    T1_float[i4{4}, i5{6}]
  outputs: T1
}
)IR",
                  "a stream axis must be a whole axis of constant extent or the outer part of a split");
}

TEST(ValidateMeshes, RefusesASwizzleOffAStreamAxis) {
  expectPassError("validate_meshes", R"IR(Fusion {
  input T0_float[i0{4}, i1{6}] mesh=[0 1]
    OuterSplit(i0{4}, factor 2) -> i2{2}~DIDx, i3{2}
    loop: [i2{2}~DIDx, i3{2}, i1{6}]
  T1 = relu(T0)
    T1_float[i4{4}, i5{6}]
  outputs: T1
}
)IR",
                  "swizzled (swizzle1d) but not parallelized on ParallelType.stream");
}

// A device-parallel axis needs a mesh (the verifier says so before the pass runs).
TEST(ValidateMeshes, RefusesDeviceAxisWithoutMesh) {
  expectPassError("validate_meshes", R"IR(Fusion {
  input T0_float[i0{4}, i1{6}]
    OuterSplit(i0{4}, factor 2) -> iDIDx2{2}, i3{2}
    loop: [iDIDx2{2}, i3{2}, i1{6}]
  T1 = relu(T0)
    T1_float[i4{4}, i5{6}]
  outputs: T1
}
)IR",
                  "is parallelized on DIDx but the tensor has no device mesh");
}

// split -> rfactor -> parallelize: the partial's per-device axis must end up on a mesh axis.
TEST(ValidateMeshes, RefusesARfactorLeftSerial) {
  expectPassError("validate_meshes", R"IR(Fusion {
  input T0_float[i0{4}, i1{3}] mesh=[0 1]
  T2 = sum(T0, dims=[0])
    T2_float[i5{2}rf, r6{2}rf, i3{3}] mesh=[0 1]
    root: [r4{4}, i3{3}]
    OuterSplit(r4{4}, factor 2) -> i5{2}rf, r6{2}rf
  T1 = sum(T2, dims=[0])
    T1_float[r7{2}, i8{3}] mesh=[0 1]
  outputs: T1
}
)IR",
                  "is the outer part of a split reduction that was rfactored");
}

}  // namespace
}  // namespace mf
