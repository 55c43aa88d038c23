// Text tests of the sum_partials pass: IR in, CHECK lines on the device sums it merges, or the IR
// left as it was.
// build/dev/mf_opt <pass> case.ir prints what a pass makes of an input.
#include "pass_text_test.h"

namespace mf {
namespace {

// Two row-parallel products (contraction split over 2 devices), each a local partial and a device
// sum, added: the partials are added locally and summed across devices once (one Allreduce).
const char* kTwoDeviceSumsAdded = R"IR(Fusion {
  input T0_float[i0{4}, i1{8}] mesh=[0 1]
    OuterSplit(i1{8}, factor 2) -> iDIDx16{2}, i17{4}
    loop: [i0{4}, iDIDx16{2}, i17{4}]
  input T1_float[i2{8}, i3{6}] mesh=[0 1]
    OuterSplit(i2{8}, factor 2) -> iDIDx18{2}, i19{4}
    loop: [iDIDx18{2}, i19{4}, i3{6}]
  input T2_float[i4{4}, i5{8}] mesh=[0 1]
    OuterSplit(i5{8}, factor 2) -> iDIDx20{2}, i21{4}
    loop: [i4{4}, iDIDx20{2}, i21{4}]
  input T3_float[i6{8}, i7{6}] mesh=[0 1]
    OuterSplit(i6{8}, factor 2) -> iDIDx22{2}, i23{4}
    loop: [iDIDx22{2}, i23{4}, i7{6}]
  T7 = matmul(T0, T1)
    T7_float[i28{4}, i29{6}, iDIDx31{2}rf, r32{4}rf] mesh=[0 1]
    root: [i28{4}, i29{6}, r30{8}]
    OuterSplit(r30{8}, factor 2) -> iDIDx31{2}rf, r32{4}rf
  T4 = sum(T7, dims=[2])
    T4_float[i8{4}, i9{6}, rDIDx33{2}] mesh=[0 1]
  T8 = matmul(T2, T3)
    T8_float[i34{4}, i35{6}, iDIDx37{2}rf, r38{4}rf] mesh=[0 1]
    root: [i34{4}, i35{6}, r36{8}]
    OuterSplit(r36{8}, factor 2) -> iDIDx37{2}rf, r38{4}rf
  T5 = sum(T8, dims=[2])
    T5_float[i11{4}, i12{6}, rDIDx39{2}] mesh=[0 1]
  T6 = add(T4, T5)
    T6_float[i14{4}, i15{6}] mesh=[0 1]
  outputs: T6
}
)IR";

TEST(SumPartials, AddOfTwoDeviceSumsBecomesOneDeviceSumOfTheAddedPartials) {
  expectPass("sum_partials", kTwoDeviceSumsAdded, R"CHECK(
CHECK: T7 = matmul(T0, T1)
CHECK-NOT: sum(
CHECK: T8 = matmul(T2, T3)
CHECK-NOT: sum(
CHECK: [[A:T[0-9]+]] = add(T7, T8)
CHECK-NEXT: [[A]]_float[{{i[0-9]+}}{4}, {{i[0-9]+}}{6}, {{iDIDx[0-9]+}}{2}] mesh=[0 1]
CHECK-NEXT: T6 = sum([[A]]
CHECK-NEXT: T6_float[i14{4}, i15{6}, {{rDIDx[0-9]+}}{2}] mesh=[0 1]
CHECK-NEXT: outputs: T6
)CHECK");
}

// A device sum that is also a fusion output must be computed on its own: nothing changes.
TEST(SumPartials, DeviceSumReadElsewhereIsLeftAlone) {
  std::string ir = kTwoDeviceSumsAdded;
  ir.replace(ir.find("outputs: T6"), 11, "outputs: T6 T4");
  expectPassUnchanged("sum_partials", ir);
}

// The same sums reduce-scattered (each result split over the devices on its rows, as the add's):
// one device sum of the added partials, split as the add's output was (one ReduceScatter).
const char* kTwoReduceScattersAdded = R"IR(Fusion {
  input T0_float[i0{4}, i1{8}] mesh=[0 1]
    OuterSplit(i1{8}, factor 2) -> iDIDx16{2}, i17{4}
    loop: [i0{4}, iDIDx16{2}, i17{4}]
  input T1_float[i2{8}, i3{6}] mesh=[0 1]
    OuterSplit(i2{8}, factor 2) -> iDIDx18{2}, i19{4}
    loop: [iDIDx18{2}, i19{4}, i3{6}]
  input T2_float[i4{4}, i5{8}] mesh=[0 1]
    OuterSplit(i5{8}, factor 2) -> iDIDx20{2}, i21{4}
    loop: [i4{4}, iDIDx20{2}, i21{4}]
  input T3_float[i6{8}, i7{6}] mesh=[0 1]
    OuterSplit(i6{8}, factor 2) -> iDIDx22{2}, i23{4}
    loop: [iDIDx22{2}, i23{4}, i7{6}]
  T7 = matmul(T0, T1)
    T7_float[i28{4}, i29{6}, iDIDx31{2}rf, r32{4}rf] mesh=[0 1]
    root: [i28{4}, i29{6}, r30{8}]
    OuterSplit(r30{8}, factor 2) -> iDIDx31{2}rf, r32{4}rf
  T4 = sum(T7, dims=[2])
    T4_float[i8{4}, i9{6}, rDIDx33{2}] mesh=[0 1]
    OuterSplit(i8{4}, factor 2) -> iDIDx44{2}, i45{2}
    loop: [iDIDx44{2}, i45{2}, i9{6}, rDIDx33{2}]
  T8 = matmul(T2, T3)
    T8_float[i34{4}, i35{6}, iDIDx37{2}rf, r38{4}rf] mesh=[0 1]
    root: [i34{4}, i35{6}, r36{8}]
    OuterSplit(r36{8}, factor 2) -> iDIDx37{2}rf, r38{4}rf
  T5 = sum(T8, dims=[2])
    T5_float[i11{4}, i12{6}, rDIDx39{2}] mesh=[0 1]
    OuterSplit(i11{4}, factor 2) -> iDIDx46{2}, i47{2}
    loop: [iDIDx46{2}, i47{2}, i12{6}, rDIDx39{2}]
  T6 = add(T4, T5)
    T6_float[i14{4}, i15{6}] mesh=[0 1]
    OuterSplit(i14{4}, factor 2) -> iDIDx48{2}, i49{2}
    loop: [iDIDx48{2}, i49{2}, i15{6}]
  outputs: T6
}
)IR";

TEST(SumPartials, AddOfTwoReduceScattersBecomesOneReduceScatterOfTheAddedPartials) {
  expectPass("sum_partials", kTwoReduceScattersAdded, R"CHECK(
CHECK: T7 = matmul(T0, T1)
CHECK-NOT: sum(
CHECK: T8 = matmul(T2, T3)
CHECK-NOT: sum(
CHECK: [[A:T[0-9]+]] = add(T7, T8)
CHECK-NEXT: [[A]]_float[{{i[0-9]+}}{4}, {{i[0-9]+}}{6}, {{iDIDx[0-9]+}}{2}] mesh=[0 1]
CHECK-NEXT: T6 = sum([[A]]
CHECK-NEXT: T6_float[i14{4}, i15{6}, [[R:rDIDx[0-9]+]]{2}] mesh=[0 1]
CHECK-NEXT: OuterSplit(i14{4}, factor 2) -> iDIDx48{2}, i49{2}
CHECK-NEXT: loop: [iDIDx48{2}, i49{2}, i15{6}, [[R]]{2}]
CHECK-NEXT: outputs: T6
)CHECK");
}

// One sum reduce-scattered, the other whole: their results are laid out differently, so adding the
// partials would change what each device holds; nothing changes.
TEST(SumPartials, SumsShardedDifferentlyAreLeftAlone) {
  std::string ir = kTwoReduceScattersAdded;
  const std::string split = "    OuterSplit(i11{4}, factor 2) -> iDIDx46{2}, i47{2}\n"
                            "    loop: [iDIDx46{2}, i47{2}, i12{6}, rDIDx39{2}]\n";
  ir.erase(ir.find(split), split.size());
  expectPassUnchanged("sum_partials", ir);
}

}  // namespace
}  // namespace mf
