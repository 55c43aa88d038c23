// Text tests of the decompose_reshardings pass: each case is IR in, IR out (or the user error it raises).
// Regenerate an expected text with: build/dev/mf_opt decompose_reshardings case.ir
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
             R"IR(Fusion {
  input T0_float[i0{s0}, i1{8}, i2{4}] mesh=[0 1]
    OuterSplit(i2{4}, factor 2) -> iDIDx9{2}, i10{2}
    loop: [i0{s0}, i1{8}, iDIDx9{2}, i10{2}]
  input T1_float[i3{3}, i4{4}] mesh=[0 1]
    OuterSplit(i4{4}, factor 2) -> iDIDx11{2}, i12{2}
    loop: [i3{3}, iDIDx11{2}, i12{2}]
  T3 = linear(T0, T1)
    T3_float[i17{s0}, i18{8}, i19{3}, iDIDx23{2}rf, r24{2}rf] mesh=[0 1]
    root: [i17{s0}, i18{8}, i19{3}, r20{4}]
    OuterSplit(r20{4}, factor 2) -> iDIDx23{2}rf, r24{2}rf
    OuterSplit(i18{8}, factor 2) -> i21{2}, i22{4}
    loop: [i17{s0}, i21{2}, i22{4}, i19{3}, iDIDx23{2}rf, r24{2}rf]
  T2 = sum(T3, dims=[3])
    T2_float[i5{s0}, i6{8}, i7{3}, rDIDx25{2}] mesh=[0 1]
    OuterSplit(i6{8}, factor 2) -> iDIDx15{2}, i16{4}
    loop: [i5{s0}, iDIDx15{2}, i16{4}, i7{3}, rDIDx25{2}]
  outputs: T2
}
)IR");
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
             R"IR(Fusion {
  input T0_float[i0{5}, i1{4}] mesh=[0 1]
    OuterSplit(i1{4}, factor 2) -> iDIDx7{2}, i8{2}
    loop: [i0{5}, iDIDx7{2}, i8{2}]
  input T1_float[i2{3}, i3{4}] mesh=[0 1]
    OuterSplit(i3{4}, factor 2) -> iDIDx9{2}, i10{2}
    loop: [i2{3}, iDIDx9{2}, i10{2}]
  input T2_float[i4{3}] mesh=[0 1]
  T5 = linear(T0, T1)
    T5_float[i19{5}, i20{3}, iDIDx22{2}rf, r23{2}rf] mesh=[0 1]
    root: [i19{5}, i20{3}, r21{4}]
    OuterSplit(r21{4}, factor 2) -> iDIDx22{2}rf, r23{2}rf
  T4 = sum(T5, dims=[2])
    T4_float[i14{5}, i15{3}, rDIDx24{2}] mesh=[0 1]
  T3 = add(T4, T2)
    T3_float[i5{5}, i11{3}] mesh=[0 1]
  outputs: T3
}
)IR");
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
             R"IR(Fusion {
  input T0_float[i0{4}, i1{6}] mesh=[0 1]
    OuterSplit(i0{4}, factor 2) -> iDIDx6{2}, i7{2}
    loop: [iDIDx6{2}, i7{2}, i1{6}]
  input T1_float[i2{4}, i3{6}] mesh=[0 1]
    OuterSplit(i3{6}, factor 2) -> iDIDx8{2}, i9{3}
    loop: [i2{4}, iDIDx8{2}, i9{3}]
  T3 = set(T1)
    T3_float[i12{4}, i13{6}] mesh=[0 1]
    OuterSplit(i12{4}, factor 2) -> iDIDx14{2}, i15{2}
    loop: [iDIDx14{2}, i15{2}, i13{6}]
  T2 = add(T0, T3)
    T2_float[i4{4}, i5{6}] mesh=[0 1]
    OuterSplit(i4{4}, factor 2) -> iDIDx10{2}, i11{2}
    loop: [iDIDx10{2}, i11{2}, i5{6}]
  outputs: T2
}
)IR");
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
             R"IR(Fusion {
  input T0_float[i0{4}, i1{6}] mesh=[0 1]
    OuterSplit(i0{4}, factor 2) -> iDIDx4{2}, i5{2}
    loop: [iDIDx4{2}, i5{2}, i1{6}]
  T2 = sum(T0, dims=[1])
    T2_float[i6{4}, r7{6}] mesh=[0 1]
    OuterSplit(i6{4}, factor 2) -> iDIDx8{2}, i9{2}
    loop: [iDIDx8{2}, i9{2}, r7{6}]
  T1 = set(T2)
    T1_float[i2{4}] mesh=[0 1]
  outputs: T1
}
)IR");
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
             R"IR(Fusion {
  input T0_float[i0{4}, i1{6}] mesh=[[0 1] [2 3]]
    OuterSplit(i0{4}, factor 2) -> iDIDy4{2}, i5{2}
    OuterSplit(i1{6}, factor 2) -> iDIDx6{2}, i7{3}
    loop: [iDIDy4{2}, i5{2}, iDIDx6{2}, i7{3}]
  T4 = set(T0)
    T4_float[i20{4}, i21{6}] mesh=[[0 1] [2 3]]
    OuterSplit(i20{4}, factor 2) -> iDIDy22{2}, i23{2}
    loop: [iDIDy22{2}, i23{2}, i21{6}]
  T5 = set(T4)
    T5_float[i24{4}, i25{6}] mesh=[[0 1] [2 3]]
  T6 = set(T5)
    T6_float[i26{4}, i27{6}] mesh=[[0 1] [2 3]]
    OuterSplit(i26{4}, factor 2) -> iDIDx28{2}, i29{2}
    loop: [iDIDx28{2}, i29{2}, i27{6}]
  T1 = set(T6)
    T1_float[i2{4}, i3{6}] mesh=[[0 1] [2 3]]
    OuterSplit(i2{4}, factor 2) -> iDIDx8{2}, i9{2}
    OuterSplit(i3{6}, factor 2) -> iDIDy10{2}, i11{3}
    loop: [iDIDx8{2}, i9{2}, iDIDy10{2}, i11{3}]
  outputs: T1
}
)IR");
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
             R"IR(Fusion {
  input T0_float[i0{8}, i1{3}] mesh=[0 1]
    OuterSplit(i0{8}, factor 2) -> iDIDx4{2}, i5{4}
    loop: [iDIDx4{2}, i5{4}, i1{3}]
  T3 = set(T0)
    T3_float[i8{8}, i9{3}] mesh=[0 1]
  T1 = slice(T3, 1_int64, 7_int64, 0_int64, 3_int64, strides=[1, 1])
    T1_float[i2{6}, i3{3}] mesh=[0 1]
  outputs: T1
}
)IR");
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
             R"IR(Fusion {
  input T0_float[i0{4}, i1{3}] mesh=[0 1]
    OuterSplit(i0{4}, factor 2) -> iDIDx6{2}, i7{2}
    loop: [iDIDx6{2}, i7{2}, i1{3}]
  input T1_float[i2{2}, i3{3}] mesh=[0 1]
    OuterSplit(i2{2}, factor 2) -> iDIDx8{2}, i9{1}
    loop: [iDIDx8{2}, i9{1}, i3{3}]
  T4 = set(T0)
    T4_float[i14{4}, i15{3}] mesh=[0 1]
  T5 = set(T1)
    T5_float[i16{2}, i17{3}] mesh=[0 1]
  T3 = cat(T4, T5, dim=0)
    T3_float[i12{6}, i13{3}] mesh=[0 1]
  T2 = set(T3)
    T2_float[i4{6}, i5{3}] mesh=[0 1]
    OuterSplit(i4{6}, factor 2) -> iDIDx10{2}, i11{3}
    loop: [iDIDx10{2}, i11{3}, i5{3}]
  outputs: T2
}
)IR");
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
             R"IR(Fusion {
  input T0_float[i0{3}, i1{4}] mesh=[0 1]
    OuterSplit(i1{4}, factor 2) -> iDIDx4{2}, i5{2}
    loop: [i0{3}, iDIDx4{2}, i5{2}]
  T5 = set(T0)
    T5_float[i14{3}, i15{4}] mesh=[0 1]
  T3 = pad(T5, 0_double, pad_widths=[1, -1])
    T3_float[i10{3}, i11{4}] mesh=[0 1]
  T1 = set(T3)
    T1_float[i2{3}, i3{4}] mesh=[0 1]
    OuterSplit(i3{4}, factor 2) -> iDIDx6{2}, i7{2}
    loop: [i2{3}, iDIDx6{2}, i7{2}]
  outputs: T1
}
)IR");
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
             R"IR(Fusion {
  input T0_float[i0{8}] mesh=[0 1]
    OuterSplit(i0{8}, factor 2) -> iDIDx2{2}, i3{4}
    loop: [iDIDx2{2}, i3{4}]
  T2 = set(T0)
    T2_float[i6{8}] mesh=[0 1]
  T1 = set(T2)
    T1_float[i1{8}] mesh=[0 1]
    InnerSplit(i1{8}, factor 2) -> i4{4}, iDIDx5{2}
    loop: [i4{4}, iDIDx5{2}]
  outputs: T1
}
)IR");
}

}  // namespace
}  // namespace mf
