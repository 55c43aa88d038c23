// Text tests of the propagate_shardings pass: each case is IR in and CHECK lines on the shardings it
// adds (or the user error it raises). build/dev/mf_opt propagate_shardings case.ir prints the IR out.
#include "pass_text_test.h"

namespace mf {
namespace {

// Forward: relu and sum take the input's sharding of axis 0.
TEST(PropagateShardings, ForwardThroughPointwiseAndReduction) {
  expectPass("propagate_shardings", R"IR(Fusion {
  input T0_float[i0{4}, i1{6}] mesh=[0 1]
    OuterSplit(i0{4}, factor 2) -> iDIDx6{2}, i7{2}
    loop: [iDIDx6{2}, i7{2}, i1{6}]
  T1 = relu(T0)
    T1_float[i2{4}, i3{6}]
  T2 = sum(T1, dims=[1])
    T2_float[i4{4}, r5{6}]
  outputs: T2
}
)IR",
             R"CHECK(
CHECK: T1 = relu(T0)
CHECK-NEXT: T1_float[i2{4}, i3{6}] mesh=[0 1]
CHECK-NEXT: OuterSplit(i2{4}, factor 2) -> [[D1:iDIDx[0-9]+]]{2}, [[R1:i[0-9]+]]{2}
CHECK-NEXT: loop: [[[D1]]{2}, [[R1]]{2}, i3{6}]
CHECK: T2 = sum(T1
CHECK-NEXT: T2_float[i4{4}, r5{6}] mesh=[0 1]
CHECK-NEXT: OuterSplit(i4{4}, factor 2) -> [[D2:iDIDx[0-9]+]]{2}, [[R2:i[0-9]+]]{2}
CHECK-NEXT: loop: [[[D2]]{2}, [[R2]]{2}, r5{6}]
)CHECK");
}

// linear prefers its weight: out_features sharded, the replicated input stays replicated.
TEST(PropagateShardings, LinearTakesTheWeightsSharding) {
  expectPass("propagate_shardings", R"IR(Fusion {
  input T0_bfloat16[i0{s0}, i1{8}] mesh=[0 1]
  input T1_bfloat16[i2{6}, i3{8}] mesh=[0 1]
    OuterSplit(i2{6}, factor 2) -> iDIDx7{2}, i8{3}
    loop: [iDIDx7{2}, i8{3}, i3{8}]
  T2 = linear(T0, T1)
    T2_bfloat16[i4{s0}, i5{6}, r6{8}]
  outputs: T2
}
)IR",
             R"CHECK(
CHECK: input T0_bfloat16[i0{s0}, i1{8}] mesh=[0 1]
CHECK-NEXT: input T1_bfloat16
CHECK: T2 = linear(T0, T1)
CHECK-NEXT: T2_bfloat16[i4{s0}, i5{6}, r6{8}] mesh=[0 1]
CHECK-NEXT: OuterSplit(i5{6}, factor 2) -> [[D:iDIDx[0-9]+]]{2}, [[R:i[0-9]+]]{3}
CHECK-NEXT: loop: [i4{s0}, [[D]]{2}, [[R]]{3}, r6{8}]
)CHECK");
}

// Backward: an unannotated intermediate takes its consumer's sharding; fusion inputs keep theirs.
TEST(PropagateShardings, BackwardFromAnnotatedOutput) {
  expectPass("propagate_shardings", R"IR(Fusion {
  input T0_float[i0{4}, i1{6}] mesh=[0 1]
  T1 = neg(T0)
    T1_float[i2{4}, i3{6}]
  T2 = exp(T1)
    T2_float[i4{4}, i5{6}] mesh=[0 1]
    OuterSplit(i5{6}, factor 2) -> iDIDx6{2}, i7{3}
    loop: [i4{4}, iDIDx6{2}, i7{3}]
  outputs: T2
}
)IR",
             R"CHECK(
CHECK: input T0_float[i0{4}, i1{6}] mesh=[0 1]
CHECK-NEXT: T1 = neg(T0)
CHECK-NEXT: T1_float[i2{4}, i3{6}] mesh=[0 1]
CHECK-NEXT: OuterSplit(i3{6}, factor 2) -> [[D:iDIDx[0-9]+]]{2}, [[R:i[0-9]+]]{3}
CHECK-NEXT: loop: [i2{4}, [[D]]{2}, [[R]]{3}]
)CHECK");
}

// A logical device axis propagates as a logical device axis (broadcast_in_dim keeps it).
TEST(PropagateShardings, WholeAxisDeviceSplitPropagates) {
  expectPass("propagate_shardings", R"IR(Fusion {
  input T0_float[iDIDx0{2}, i1{6}] mesh=[0 1]
  T1 = broadcast_in_dim(T0, shape=[2, 3, 6], broadcast_dims=[0, 2])
    T1_float[i2{2}, b3{3}, i4{6}]
  outputs: T1
}
)IR",
             R"CHECK(
CHECK: T1 = broadcast_in_dim(T0
CHECK-NEXT: T1_float[iDIDx2{2}, b3{3}, i4{6}] mesh=[0 1]
CHECK-NOT: Split
)CHECK");
}

// The output is annotated with only its sequence split; its operands are sharded along the
// contraction, and a partial product plus a ReduceScatter (32 elements) moves fewer bytes than
// resharding x and w (768 elements), so the reduction axis gets the device split (rDIDx).
TEST(PropagateShardings, AnnotatedReductionGetsTheCheaperDeviceSplit) {
  expectPass("propagate_shardings", R"IR(Fusion {
  input T0_float[i0{8}, i1{64}] mesh=[0 1]
    OuterSplit(i1{64}, factor 2) -> iDIDx7{2}, i8{32}
    loop: [i0{8}, iDIDx7{2}, i8{32}]
  input T1_float[i2{4}, i3{64}] mesh=[0 1]
    OuterSplit(i3{64}, factor 2) -> iDIDx9{2}, i10{32}
    loop: [i2{4}, iDIDx9{2}, i10{32}]
  T2 = linear(T0, T1)
    T2_float[i4{8}, i5{4}, r6{64}] mesh=[0 1]
    OuterSplit(i4{8}, factor 2) -> iDIDx11{2}, i12{4}
    loop: [iDIDx11{2}, i12{4}, i5{4}, r6{64}]
  outputs: T2
}
)IR",
             R"CHECK(
CHECK: T2 = linear(T0, T1)
CHECK-NEXT: T2_float[i4{8}, i5{4}, r6{64}] mesh=[0 1]
CHECK-NEXT: OuterSplit(i4{8}, factor 2) -> iDIDx11{2}, i12{4}
CHECK-NEXT: OuterSplit(r6{64}, factor 2) -> [[D:rDIDx[0-9]+]]{2}, [[R:r[0-9]+]]{32}
CHECK-NEXT: loop: [iDIDx11{2}, i12{4}, i5{4}, [[D]]{2}, [[R]]{32}]
)CHECK");
}

// An axis whose extent does not divide by the mesh size cannot take the sharding.
TEST(PropagateShardings, RefusesIndivisibleExtent) {
  expectPassError("propagate_shardings", R"IR(Fusion {
  input T0_float[i0{4}, i1{6}] mesh=[0 1 2]
  T1 = neg(T0)
    T1_float[i2{4}, i3{6}]
  T2 = exp(T1)
    T2_float[i4{4}, i5{6}] mesh=[0 1 2]
    OuterSplit(i4{4}, factor 3) -> iDIDx6{3}, i7{2}
    loop: [iDIDx6{3}, i7{2}, i5{6}]
  outputs: T2
}
)IR",
                  "whose extent 4 is not divisible by the 3 devices along DIDx");
}

// An inner split with the DID on the inner part (interleaved rows) is replayed as an inner split.
TEST(PropagateShardings, ForwardKeepsAnInterleavedSplit) {
  expectPass("propagate_shardings", R"IR(Fusion {
  input T0_float[i0{6}, i1{4}] mesh=[0 1]
    InnerSplit(i0{6}, factor 2) -> i4{3}, iDIDx5{2}
    loop: [i4{3}, iDIDx5{2}, i1{4}]
  T1 = relu(T0)
    T1_float[i2{6}, i3{4}]
  outputs: T1
}
)IR",
             R"CHECK(
CHECK: T1 = relu(T0)
CHECK-NEXT: T1_float[i2{6}, i3{4}] mesh=[0 1]
CHECK-NEXT: InnerSplit(i2{6}, factor 2) -> [[R:i[0-9]+]]{3}, [[D:iDIDx[0-9]+]]{2}
CHECK-NEXT: loop: [[[R]]{3}, [[D]]{2}, i3{4}]
)CHECK");
}

// One axis split over two mesh axes: the outer device split is copied first, so the consumer holds the same elements.
TEST(PropagateShardings, NestedSplitsKeepTheirOrder) {
  expectPass("propagate_shardings", R"IR(Fusion {
  input T0_float[i0{12}] mesh=[[0 1 2] [3 4 5]]
    OuterSplit(i0{12}, factor 2) -> iDIDy2{2}, i3{6}
    OuterSplit(i3{6}, factor 3) -> iDIDx4{3}, i5{2}
    loop: [iDIDx4{3}, iDIDy2{2}, i5{2}]
  T1 = neg(T0)
    T1_float[i1{12}]
  outputs: T1
}
)IR",
             R"CHECK(
CHECK: T1 = neg(T0)
CHECK-NEXT: T1_float[i1{12}] mesh=[[0 1 2] [3 4 5]]
CHECK-NEXT: OuterSplit(i1{12}, factor 2) -> [[Y:iDIDy[0-9]+]]{2}, [[REST:i[0-9]+]]{6}
CHECK-NEXT: OuterSplit([[REST]]{6}, factor 3) -> [[X:iDIDx[0-9]+]]{3}, [[R:i[0-9]+]]{2}
CHECK-NEXT: loop: [[[Y]]{2}, [[X]]{3}, [[R]]{2}]
)CHECK");
}

// A partial product nobody annotated, read only by an add split on the rows: it is scattered on the
// rows (one ReduceScatter later), not reduced whole and sliced.
TEST(PropagateShardings, PartialReadOnlySplitIsScattered) {
  expectPass("propagate_shardings", R"IR(Fusion {
  input T0_float[i0{4}, i1{8}] mesh=[0 1]
    OuterSplit(i1{8}, factor 2) -> iDIDx10{2}, i11{4}
    loop: [i0{4}, iDIDx10{2}, i11{4}]
  input T1_float[i2{6}, i3{8}] mesh=[0 1]
    OuterSplit(i3{8}, factor 2) -> iDIDx12{2}, i13{4}
    loop: [i2{6}, iDIDx12{2}, i13{4}]
  input T2_float[i4{4}, i5{6}] mesh=[0 1]
    OuterSplit(i4{4}, factor 2) -> iDIDx14{2}, i15{2}
    loop: [iDIDx14{2}, i15{2}, i5{6}]
  T3 = linear(T0, T1)
    T3_float[i6{4}, i7{6}, r8{8}]
  T4 = add(T2, T3)
    T4_float[i9{4}, i16{6}]
  outputs: T4
}
)IR",
             R"CHECK(
CHECK: T3 = linear(T0, T1)
CHECK-NEXT: T3_float[i6{4}, i7{6}, r8{8}] mesh=[0 1]
CHECK-NEXT: OuterSplit(i6{4}, factor 2) -> [[D:iDIDx[0-9]+]]{2}, [[R:i[0-9]+]]{2}
CHECK-NEXT: OuterSplit(r8{8}, factor 2) -> [[RD:rDIDx[0-9]+]]{2}, [[RR:r[0-9]+]]{4}
CHECK-NEXT: loop: [[[D]]{2}, [[R]]{2}, i7{6}, [[RD]]{2}, [[RR]]{4}]
CHECK: T4 = add(T2, T3)
CHECK-NEXT: T4_float[i9{4}, i16{6}] mesh=[0 1]
CHECK-NEXT: OuterSplit(i9{4}, factor 2) -> [[D4:iDIDx[0-9]+]]{2}, [[R4:i[0-9]+]]{2}
CHECK-NEXT: loop: [[[D4]]{2}, [[R4]]{2}, i16{6}]
)CHECK");
}

// [s0, s1, s2] sharded on s2, reshaped to [-1, s2]: the -1 is the product s0*s1 (printed nested),
// the last axis is kept whole, so it stays sharded as it would with constant extents.
TEST(PropagateShardings, SymbolicReshapeToRowsKeepsTheShardedAxis) {
  expectPass("propagate_shardings", R"IR(Fusion {
  input T0_float[i0{s0}, i1{s1}, i2{s2}] mesh=[0 1]
    OuterSplit(i2{s2}, factor 2) -> iDIDx5{2}, i6{s2/2}
    loop: [i0{s0}, i1{s1}, iDIDx5{2}, i6{s2/2}]
  T1 = reshape(T0, shape=[-1, -1])
    T1_float[i3{(s0*s1)}, i4{s2}]
  outputs: T1
}
)IR",
             R"CHECK(
CHECK: T1 = reshape(T0
CHECK-NEXT: T1_float[i3{{.*}}, i4{s2}] mesh=[0 1]
CHECK-NEXT: OuterSplit(i4{s2}, factor 2) -> [[D:iDIDx[0-9]+]]{2}, [[R:i[0-9]+]]{s2/2}
CHECK-NEXT: loop: [i3{{.*}}, [[D]]{2}, [[R]]{s2/2}]
)CHECK");
}

// The weight gradient of a row-parallel linear: x [s3, s4, s5] is sharded on s5; matmul unified its
// rows s3*s4 with the gradient's s0*s1, but the reshape's rows are read as written (s3 * s4), so x's
// rows group and the sharded s5 carries over to the product's columns.
TEST(PropagateShardings, ReshapeReadsAUnifiedProductAsWritten) {
  expectPass("propagate_shardings", R"IR(Fusion {
  symbols: s3*s4=s0*s1
  input T0_float[i0{s0}, i1{s1}, i2{s2}] mesh=[0 1]
  input T1_float[i3{s3}, i4{s4}, i5{s5}] mesh=[0 1]
    OuterSplit(i5{s5}, factor 2) -> iDIDx15{2}, i16{s5/2}
    loop: [i3{s3}, i4{s4}, iDIDx15{2}, i16{s5/2}]
  T2 = reshape(T0, shape=[-1, -1])
    T2_float[i6{s0*s1}, i7{s2}]
  T4 = permute(T2, dims=[1, 0])
    T4_float[i10{s2}, i11{s0*s1}]
  T3 = reshape(T1, shape=[-1, -1])
    T3_float[i8{s3*s4}, i9{s5}]
  T5 = matmul(T4, T3)
    T5_float[i12{s2}, i13{s5}, r14{s0*s1}]
  outputs: T5
}
)IR",
             R"CHECK(
CHECK: T3 = reshape(T1
CHECK-NEXT: T3_float[i8{s3*s4}, i9{s5}] mesh=[0 1]
CHECK-NEXT: OuterSplit(i9{s5}, factor 2) -> [[D:iDIDx[0-9]+]]{2}
CHECK: T5 = matmul(T4, T3)
CHECK-NEXT: T5_float[i12{s2}, i13{s5}, r14{s0*s1}] mesh=[0 1]
CHECK-NEXT: OuterSplit(i13{s5}, factor 2) -> [[D5:iDIDx[0-9]+]]{2}
CHECK-NOT: rDIDx
)CHECK");
}

}  // namespace
}  // namespace mf
