// Text tests of the finalize_allocation pass: IR in, CHECK lines on the allocation domains it adds.
// build/dev/mf_opt <pass> case.ir prints what a pass makes of an input.
#include "pass_text_test.h"

namespace mf {
namespace {

// Sharded tensors allocate their logical axes with the device split applied; replicated
// ones keep the default.
TEST(FinalizeAllocation, ShardedTensorsGetDeviceSplitAllocation) {
  expectPass("finalize_allocation", R"IR(Fusion {
  input T0_float[i0{4}, i1{6}] mesh=[0 1]
    OuterSplit(i1{6}, factor 2) -> iDIDx4{2}, i5{3}
    loop: [i0{4}, iDIDx4{2}, i5{3}]
  input T1_float[i2{6}] mesh=[0 1]
  T3 = add(T0, T1)
    T3_float[i6{4}, i7{6}] mesh=[0 1]
    OuterSplit(i7{6}, factor 2) -> iDIDx8{2}, i9{3}
    loop: [i6{4}, iDIDx8{2}, i9{3}]
  outputs: T3
}
)IR",
             R"CHECK(
CHECK: input T0_float
CHECK: loop: [i0{4}, iDIDx4{2}, i5{3}]
CHECK-NEXT: allocation: [i0{4}, iDIDx4{2}, i5{3}]
CHECK-NEXT: input T1_float[i2{6}] mesh=[0 1]
CHECK-NOT: allocation
CHECK: loop: [i6{4}, iDIDx8{2}, i9{3}]
CHECK-NEXT: allocation: [i6{4}, iDIDx8{2}, i9{3}]
)CHECK");
}

// An interleaved split allocates its device piece first, then the rows this device holds.
TEST(FinalizeAllocation, InterleavedSplitPutsTheDevicePieceFirst) {
  expectPass("finalize_allocation", R"IR(Fusion {
  input T0_float[i0{8}] mesh=[0 1]
    InnerSplit(i0{8}, factor 2) -> i1{4}, iDIDx2{2}
    loop: [i1{4}, iDIDx2{2}]
  outputs: T0
}
)IR",
             R"CHECK(
CHECK: loop: [i1{4}, iDIDx2{2}]
CHECK-NEXT: allocation: [iDIDx2{2}, i1{4}]
)CHECK");
}

}  // namespace
}  // namespace mf
