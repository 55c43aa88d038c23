// Text tests of the decompose_reshardings pass: each case is IR in and CHECK lines on the exprs it
// adds or rewrites (or the user error it raises). build/dev/mf_opt decompose_reshardings case.ir prints the IR out.
#include "pass_text_test.h"

namespace mf {
namespace {

// Seed 001: a linear with K sharded and the output scattered on the sequence becomes a local
// partial product (rfactor) and one reduction over the device axis (a ReduceScatter).
TEST(DecomposeReshardings, SeedLinearReduceScatter) {
  expectPass("decompose_reshardings", R"IR(Fusion {
  input T0_float[i0{s0}, i1{8}, i2{4}] mesh=[0 1]
    OuterSplit(i2{4}, factor 2) -> iDIDx9{2}, i10{2}
    loop: [i0{s0}, i1{8}, iDIDx9{2}, i10{2}]
  input T1_float[i3{3}, i4{4}] mesh=[0 1]
    OuterSplit(i4{4}, factor 2) -> iDIDx11{2}, i12{2}
    loop: [i3{3}, iDIDx11{2}, i12{2}]
  T2 = linear(T0, T1)
    T2_float[i5{s0}, i6{8}, i7{3}, r8{4}] mesh=[0 1]
    OuterSplit(i6{8}, factor 2) -> iDIDx15{2}, i16{4}
    OuterSplit(r8{4}, factor 2) -> rDIDx13{2}, r14{2}
    loop: [i5{s0}, iDIDx15{2}, i16{4}, i7{3}, rDIDx13{2}, r14{2}]
  outputs: T2
}
)IR",
             R"CHECK(
CHECK: [[P:T[0-9]+]] = linear(T0, T1)
CHECK-NEXT: [[P]]_float[{{i[0-9]+}}{s0}, {{i[0-9]+}}{8}, {{i[0-9]+}}{3}, [[D:iDIDx[0-9]+]]{2}rf, [[R:r[0-9]+]]{2}rf] mesh=[0 1]
CHECK-NEXT: root: [{{.*}}, [[K:r[0-9]+]]{4}]
CHECK-NEXT: OuterSplit([[K]]{4}, factor 2) -> [[D]]{2}rf, [[R]]{2}rf
CHECK: T2 = sum([[P]]
CHECK-NEXT: T2_float[i5{s0}, i6{8}, i7{3}, {{rDIDx[0-9]+}}{2}] mesh=[0 1]
CHECK-NEXT: OuterSplit(i6{8}, factor 2) -> iDIDx15{2}, i16{4}
CHECK-NOT: linear
CHECK: outputs: T2
)CHECK");
}

// Row-parallel linear with bias: the bias is added once, after the reduction across devices.
TEST(DecomposeReshardings, BiasAddedAfterTheReduction) {
  expectPass("decompose_reshardings", R"IR(Fusion {
  input T0_float[i0{5}, i1{4}] mesh=[0 1]
    OuterSplit(i1{4}, factor 2) -> iDIDx7{2}, i8{2}
    loop: [i0{5}, iDIDx7{2}, i8{2}]
  input T1_float[i2{3}, i3{4}] mesh=[0 1]
    OuterSplit(i3{4}, factor 2) -> iDIDx9{2}, i10{2}
    loop: [i2{3}, iDIDx9{2}, i10{2}]
  input T2_float[i4{3}] mesh=[0 1]
  T3 = linear(T0, T1, T2)
    T3_float[i5{5}, i11{3}, r6{4}] mesh=[0 1]
    OuterSplit(r6{4}, factor 2) -> rDIDx12{2}, r13{2}
    loop: [i5{5}, i11{3}, rDIDx12{2}, r13{2}]
  outputs: T3
}
)IR",
             R"CHECK(
CHECK: [[P:T[0-9]+]] = linear(T0, T1)
CHECK-NEXT: [[P]]_float[{{i[0-9]+}}{5}, {{i[0-9]+}}{3}, {{iDIDx[0-9]+}}{2}rf, {{r[0-9]+}}{2}rf] mesh=[0 1]
CHECK: [[S:T[0-9]+]] = sum([[P]]
CHECK-NEXT: [[S]]_float[{{i[0-9]+}}{5}, {{i[0-9]+}}{3}, {{rDIDx[0-9]+}}{2}] mesh=[0 1]
CHECK-NEXT: T3 = add([[S]], T2)
CHECK-NEXT: T3_float[i5{5}, i11{3}] mesh=[0 1]
CHECK-NEXT: outputs: T3
)CHECK");
}

// add of two differently sharded operands: the second is resharded (one set) before the add.
TEST(DecomposeReshardings, ReshardBeforeAnNaryOp) {
  expectPass("decompose_reshardings", R"IR(Fusion {
  input T0_float[i0{4}, i1{6}] mesh=[0 1]
    OuterSplit(i0{4}, factor 2) -> iDIDx6{2}, i7{2}
    loop: [iDIDx6{2}, i7{2}, i1{6}]
  input T1_float[i2{4}, i3{6}] mesh=[0 1]
    OuterSplit(i3{6}, factor 2) -> iDIDx8{2}, i9{3}
    loop: [i2{4}, iDIDx8{2}, i9{3}]
  T2 = add(T0, T1)
    T2_float[i4{4}, i5{6}] mesh=[0 1]
    OuterSplit(i4{4}, factor 2) -> iDIDx10{2}, i11{2}
    loop: [iDIDx10{2}, i11{2}, i5{6}]
  outputs: T2
}
)IR",
             R"CHECK(
CHECK: [[G:T[0-9]+]] = set(T1)
CHECK-NEXT: [[G]]_float[[[A:i[0-9]+]]{4}, [[B:i[0-9]+]]{6}] mesh=[0 1]
CHECK-NEXT: OuterSplit([[A]]{4}, factor 2) -> [[D:iDIDx[0-9]+]]{2}, [[R:i[0-9]+]]{2}
CHECK-NEXT: loop: [[[D]]{2}, [[R]]{2}, [[B]]{6}]
CHECK-NEXT: T2 = add(T0, [[G]])
)CHECK");
}

// A sharded sum into a replicated output runs locally, then one set gathers its result.
TEST(DecomposeReshardings, ReshardAfterAUnaryOp) {
  expectPass("decompose_reshardings", R"IR(Fusion {
  input T0_float[i0{4}, i1{6}] mesh=[0 1]
    OuterSplit(i0{4}, factor 2) -> iDIDx4{2}, i5{2}
    loop: [iDIDx4{2}, i5{2}, i1{6}]
  T1 = sum(T0, dims=[1])
    T1_float[i2{4}, r3{6}] mesh=[0 1]
  outputs: T1
}
)IR",
             R"CHECK(
CHECK: [[S:T[0-9]+]] = sum(T0
CHECK-NEXT: [[S]]_float[[[A:i[0-9]+]]{4}, {{r[0-9]+}}{6}] mesh=[0 1]
CHECK-NEXT: OuterSplit([[A]]{4}, factor 2) -> {{iDIDx[0-9]+}}{2}, {{i[0-9]+}}{2}
CHECK: T1 = set([[S]])
CHECK-NEXT: T1_float[i2{4}] mesh=[0 1]
CHECK-NEXT: outputs: T1
)CHECK");
}

// A set that changes both mesh axes becomes a chain of sets, one mesh axis each.
TEST(DecomposeReshardings, ChainOfSetsOnATwoDimensionalMesh) {
  expectPass("decompose_reshardings", R"IR(Fusion {
  input T0_float[i0{4}, i1{6}] mesh=[[0 1] [2 3]]
    OuterSplit(i0{4}, factor 2) -> iDIDy4{2}, i5{2}
    OuterSplit(i1{6}, factor 2) -> iDIDx6{2}, i7{3}
    loop: [iDIDy4{2}, i5{2}, iDIDx6{2}, i7{3}]
  T1 = set(T0)
    T1_float[i2{4}, i3{6}] mesh=[[0 1] [2 3]]
    OuterSplit(i2{4}, factor 2) -> iDIDx8{2}, i9{2}
    OuterSplit(i3{6}, factor 2) -> iDIDy10{2}, i11{3}
    loop: [iDIDx8{2}, i9{2}, iDIDy10{2}, i11{3}]
  outputs: T1
}
)IR",
             R"CHECK(
CHECK: [[A:T[0-9]+]] = set(T0)
CHECK-NEXT: [[A]]_float{{.*}} mesh=[[0 1] [2 3]]
CHECK-NEXT: OuterSplit({{.*}}) -> {{iDIDy[0-9]+}}{2}
CHECK-NOT: iDIDx
CHECK: [[B:T[0-9]+]] = set([[A]])
CHECK-NEXT: [[B]]_float{{.*}} mesh=[[0 1] [2 3]]
CHECK-NOT: Split
CHECK: [[C:T[0-9]+]] = set([[B]])
CHECK-NEXT: [[C]]_float{{.*}} mesh=[[0 1] [2 3]]
CHECK-NEXT: OuterSplit({{.*}}) -> {{iDIDx[0-9]+}}{2}
CHECK-NOT: iDIDy
CHECK: T1 = set([[C]])
)CHECK");
}

// Changing two mesh axes between different meshes cannot be split into single-axis moves.
TEST(DecomposeReshardings, RefusesTwoAxesBetweenMeshes) {
  expectPassError("decompose_reshardings", R"IR(Fusion {
  input T0_float[i0{4}, i1{6}] mesh=[[0 1] [2 3]]
    OuterSplit(i0{4}, factor 2) -> iDIDy4{2}, i5{2}
    OuterSplit(i1{6}, factor 2) -> iDIDx6{2}, i7{3}
    loop: [iDIDy4{2}, i5{2}, iDIDx6{2}, i7{3}]
  T1 = set(T0)
    T1_float[i2{4}, i3{6}] mesh=[[4 5] [6 7]]
  outputs: T1
}
)IR",
                  "changes 2 device parallel types at once");
}

// A reduction across devices along two mesh axes at once is refused.
TEST(DecomposeReshardings, RefusesReductionOverTwoDeviceAxes) {
  expectPassError("decompose_reshardings", R"IR(Fusion {
  input T0_float[i0{4}, i1{6}] mesh=[[0 1] [2 3]]
    OuterSplit(i0{4}, factor 2) -> iDIDy4{2}, i5{2}
    OuterSplit(i1{6}, factor 2) -> iDIDx6{2}, i7{3}
    loop: [iDIDy4{2}, i5{2}, iDIDx6{2}, i7{3}]
  T1 = sum(T0, dims=[0, 1])
    T1_float[r2{4}, r3{6}] mesh=[[0 1] [2 3]]
    OuterSplit(r2{4}, factor 2) -> rDIDy8{2}, r9{2}
    OuterSplit(r3{6}, factor 2) -> rDIDx10{2}, r11{3}
    loop: [rDIDy8{2}, r9{2}, rDIDx10{2}, r11{3}]
  outputs: T1
}
)IR",
                  "reduces across devices along several axes");
}

// A slice of the sharded axis cannot run on the shards (each holds another range): the input is
// gathered first (a set before the slice), not the result after it.
TEST(DecomposeReshardings, SliceOfTheShardedAxisGathersFirst) {
  expectPass("decompose_reshardings", R"IR(Fusion {
  input T0_float[i0{8}, i1{3}] mesh=[0 1]
    OuterSplit(i0{8}, factor 2) -> iDIDx4{2}, i5{4}
    loop: [iDIDx4{2}, i5{4}, i1{3}]
  T1 = slice(T0, 1_int64, 7_int64, 0_int64, 3_int64, strides=[1, 1])
    T1_float[i2{6}, i3{3}] mesh=[0 1]
  outputs: T1
}
)IR",
             R"CHECK(
CHECK: [[G:T[0-9]+]] = set(T0)
CHECK-NEXT: [[G]]_float[{{i[0-9]+}}{8}, {{i[0-9]+}}{3}] mesh=[0 1]
CHECK-NEXT: T1 = slice([[G]],
CHECK-NEXT: T1_float[i2{6}, i3{3}] mesh=[0 1]
)CHECK");
}

// cat along the sharded axis with a sharded result: each input is gathered, the concatenation runs
// unsharded, and the result is sliced locally (set T3 -> T2).
TEST(DecomposeReshardings, CatAlongTheShardedAxisGathersThenSlices) {
  expectPass("decompose_reshardings", R"IR(Fusion {
  input T0_float[i0{4}, i1{3}] mesh=[0 1]
    OuterSplit(i0{4}, factor 2) -> iDIDx6{2}, i7{2}
    loop: [iDIDx6{2}, i7{2}, i1{3}]
  input T1_float[i2{2}, i3{3}] mesh=[0 1]
    OuterSplit(i2{2}, factor 2) -> iDIDx8{2}, i9{1}
    loop: [iDIDx8{2}, i9{1}, i3{3}]
  T2 = cat(T0, T1, dim=0)
    T2_float[i4{6}, i5{3}] mesh=[0 1]
    OuterSplit(i4{6}, factor 2) -> iDIDx10{2}, i11{3}
    loop: [iDIDx10{2}, i11{3}, i5{3}]
  outputs: T2
}
)IR",
             R"CHECK(
CHECK: [[A:T[0-9]+]] = set(T0)
CHECK-NEXT: [[A]]_float[{{i[0-9]+}}{4}, {{i[0-9]+}}{3}] mesh=[0 1]
CHECK-NEXT: [[B:T[0-9]+]] = set(T1)
CHECK-NEXT: [[B]]_float[{{i[0-9]+}}{2}, {{i[0-9]+}}{3}] mesh=[0 1]
CHECK-NEXT: [[C:T[0-9]+]] = cat([[A]], [[B]]
CHECK-NEXT: [[C]]_float[{{i[0-9]+}}{6}, {{i[0-9]+}}{3}] mesh=[0 1]
CHECK-NEXT: T2 = set([[C]])
CHECK-NEXT: T2_float[i4{6}, i5{3}] mesh=[0 1]
)CHECK");
}

// A pad that shifts the sharded axis (widths [1, -1]: same extent) with a sharded result: gather,
// pad unsharded, slice locally; the shards never pad on their own.
TEST(DecomposeReshardings, PadOfTheShardedAxisGathersThenSlices) {
  expectPass("decompose_reshardings", R"IR(Fusion {
  input T0_float[i0{3}, i1{4}] mesh=[0 1]
    OuterSplit(i1{4}, factor 2) -> iDIDx4{2}, i5{2}
    loop: [i0{3}, iDIDx4{2}, i5{2}]
  T1 = pad(T0, 0_double, pad_widths=[1, -1])
    T1_float[i2{3}, i3{4}] mesh=[0 1]
    OuterSplit(i3{4}, factor 2) -> iDIDx6{2}, i7{2}
    loop: [i2{3}, iDIDx6{2}, i7{2}]
  outputs: T1
}
)IR",
             R"CHECK(
CHECK: [[G:T[0-9]+]] = set(T0)
CHECK-NEXT: [[G]]_float[{{i[0-9]+}}{3}, {{i[0-9]+}}{4}] mesh=[0 1]
CHECK-NEXT: [[P:T[0-9]+]] = pad([[G]],
CHECK-NEXT: [[P]]_float[{{i[0-9]+}}{3}, {{i[0-9]+}}{4}] mesh=[0 1]
CHECK-NEXT: T1 = set([[P]])
CHECK-NEXT: T1_float[i2{3}, i3{4}] mesh=[0 1]
)CHECK");
}

// Blocks to interleaved rows on the same axis: no collective maps one onto the other; gather, then slice.
TEST(DecomposeReshardings, BlocksToInterleavedGathersThenSlices) {
  expectPass("decompose_reshardings", R"IR(Fusion {
  input T0_float[i0{8}] mesh=[0 1]
    OuterSplit(i0{8}, factor 2) -> iDIDx2{2}, i3{4}
    loop: [iDIDx2{2}, i3{4}]
  T1 = set(T0)
    T1_float[i1{8}] mesh=[0 1]
    InnerSplit(i1{8}, factor 2) -> i4{4}, iDIDx5{2}
    loop: [i4{4}, iDIDx5{2}]
  outputs: T1
}
)IR",
             R"CHECK(
CHECK: [[G:T[0-9]+]] = set(T0)
CHECK-NEXT: [[G]]_float[{{i[0-9]+}}{8}] mesh=[0 1]
CHECK-NEXT: T1 = set([[G]])
CHECK-NEXT: T1_float[i1{8}] mesh=[0 1]
)CHECK");
}

}  // namespace
}  // namespace mf
