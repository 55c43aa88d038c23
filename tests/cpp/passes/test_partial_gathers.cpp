// Text tests of the partial_gathers pass (vocab-parallel embedding): IR in, IR out.
// Regenerate an expected text with: build/dev/mf_opt partial_gathers case.ir
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
             R"IR(Fusion {
  input T0_int64[i0{4}] mesh=[0 1]
  input T1_float[i1{64}, i2{8}] mesh=[0 1]
    OuterSplit(i1{64}, factor 2) -> iDIDx3{2}, i4{32}
    loop: [iDIDx3{2}, i4{32}, i2{8}]
  T3 = embedding_fwd(T0, T1)
    T3_float[i10{4}, i11{8}, iDIDx13{2}rf, r14{32}rf] mesh=[0 1]
    root: [i10{4}, i11{8}, r12{64}]
    OuterSplit(r12{64}, factor 2) -> iDIDx13{2}rf, r14{32}rf
  T2 = sum(T3, dims=[2])
    T2_float[i5{4}, i6{8}, rDIDx15{2}] mesh=[0 1]
  outputs: T2
}
)IR");
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
  expectPass("partial_gathers", ir, ir);
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
  expectPass("partial_gathers", ir, ir);
}

}  // namespace
}  // namespace mf
