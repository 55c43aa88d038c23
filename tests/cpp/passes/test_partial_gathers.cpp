// Text tests of the partial_gathers pass (vocab-parallel embedding): IR in, CHECK lines on the
// partial lookup and device sum it makes, or the IR left as it was.
// build/dev/mf_opt <pass> case.ir prints what a pass makes of an input.
#include "pass_text_test.h"

namespace mf {
namespace {

// A table of 64 rows split over 2 devices, 32 output elements: the lookup becomes a partial
// result over the rows (each device its 32) and a sum across devices.
TEST(PartialGathers, LargeRowShardedTableBecomesMaskedLookupPlusDeviceSum) {
  expectPass("partial_gathers", R"IR(Fusion {
  input T0_int64[i0{4}] mesh=[0 1]
  input T1_float[i1{64}, i2{8}] mesh=[0 1]
    OuterSplit(i1{64}, factor 2) -> iDIDx3{2}, i4{32}
    loop: [iDIDx3{2}, i4{32}, i2{8}]
  T2 = embedding_fwd(T0, T1)
    T2_float[i5{4}, i6{8}] mesh=[0 1]
  outputs: T2
}
)IR",
             R"CHECK(
CHECK: [[P:T[0-9]+]] = embedding_fwd(T0, T1)
CHECK-NEXT: [[P]]_float[{{i[0-9]+}}{4}, {{i[0-9]+}}{8}, [[D:iDIDx[0-9]+]]{2}rf, [[R:r[0-9]+]]{32}rf] mesh=[0 1]
CHECK-NEXT: root: [{{i[0-9]+}}{4}, {{i[0-9]+}}{8}, [[ROWS:r[0-9]+]]{64}]
CHECK-NEXT: OuterSplit([[ROWS]]{64}, factor 2) -> [[D]]{2}rf, [[R]]{32}rf
CHECK-NEXT: T2 = sum([[P]]
CHECK-NEXT: T2_float[i5{4}, i6{8}, {{rDIDx[0-9]+}}{2}] mesh=[0 1]
CHECK-NEXT: outputs: T2
)CHECK");
}

// A table of 4 rows: gathering it (32 elements) moves less than reducing the output (2 x 32), so
// the pass leaves it to decompose_reshardings.
TEST(PartialGathers, SmallTableIsLeftToBeGathered) {
  const char* ir = R"IR(Fusion {
  input T0_int64[i0{4}] mesh=[0 1]
  input T1_float[i1{4}, i2{8}] mesh=[0 1]
    OuterSplit(i1{4}, factor 2) -> iDIDx3{2}, i4{2}
    loop: [iDIDx3{2}, i4{2}, i2{8}]
  T2 = embedding_fwd(T0, T1)
    T2_float[i5{4}, i6{8}] mesh=[0 1]
  outputs: T2
}
)IR";
  expectPassUnchanged("partial_gathers", ir);
}

// Indices sharded on the table's mesh axis: no partial plan (the devices hold different indices).
TEST(PartialGathers, IndicesShardedOnTheSameAxisAreLeftAlone) {
  const char* ir = R"IR(Fusion {
  input T0_int64[i0{4}] mesh=[0 1]
    OuterSplit(i0{4}, factor 2) -> iDIDx7{2}, i8{2}
    loop: [iDIDx7{2}, i8{2}]
  input T1_float[i1{64}, i2{8}] mesh=[0 1]
    OuterSplit(i1{64}, factor 2) -> iDIDx3{2}, i4{32}
    loop: [iDIDx3{2}, i4{32}, i2{8}]
  T2 = embedding_fwd(T0, T1)
    T2_float[i5{4}, i6{8}] mesh=[0 1]
  outputs: T2
}
)IR";
  expectPassUnchanged("partial_gathers", ir);
}

}  // namespace
}  // namespace mf
