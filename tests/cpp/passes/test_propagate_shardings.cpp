// Text tests of the propagate_shardings pass: each case is IR in, IR out (or the user error it raises).
// Regenerate an expected text with: build/dev/mf_opt propagate_shardings case.ir
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
             R"IR(Fusion {
  input T0_float[i0{4}, i1{6}] mesh=[0 1]
    OuterSplit(i0{4}, factor 2) -> iDIDx6{2}, i7{2}
    loop: [iDIDx6{2}, i7{2}, i1{6}]
  T1 = relu(T0)
    T1_float[i2{4}, i3{6}] mesh=[0 1]
    OuterSplit(i2{4}, factor 2) -> iDIDx8{2}, i9{2}
    loop: [iDIDx8{2}, i9{2}, i3{6}]
  T2 = sum(T1, dims=[1])
    T2_float[i4{4}, r5{6}] mesh=[0 1]
    OuterSplit(i4{4}, factor 2) -> iDIDx10{2}, i11{2}
    loop: [iDIDx10{2}, i11{2}, r5{6}]
  outputs: T2
}
)IR");
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
             R"IR(Fusion {
  input T0_bfloat16[i0{s0}, i1{8}] mesh=[0 1]
  input T1_bfloat16[i2{6}, i3{8}] mesh=[0 1]
    OuterSplit(i2{6}, factor 2) -> iDIDx7{2}, i8{3}
    loop: [iDIDx7{2}, i8{3}, i3{8}]
  T2 = linear(T0, T1)
    T2_bfloat16[i4{s0}, i5{6}, r6{8}] mesh=[0 1]
    OuterSplit(i5{6}, factor 2) -> iDIDx9{2}, i10{3}
    loop: [i4{s0}, iDIDx9{2}, i10{3}, r6{8}]
  outputs: T2
}
)IR");
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
             R"IR(Fusion {
  input T0_float[i0{4}, i1{6}] mesh=[0 1]
  T1 = neg(T0)
    T1_float[i2{4}, i3{6}] mesh=[0 1]
    OuterSplit(i3{6}, factor 2) -> iDIDx8{2}, i9{3}
    loop: [i2{4}, iDIDx8{2}, i9{3}]
  T2 = exp(T1)
    T2_float[i4{4}, i5{6}] mesh=[0 1]
    OuterSplit(i5{6}, factor 2) -> iDIDx6{2}, i7{3}
    loop: [i4{4}, iDIDx6{2}, i7{3}]
  outputs: T2
}
)IR");
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
             R"IR(Fusion {
  input T0_float[iDIDx0{2}, i1{6}] mesh=[0 1]
  T1 = broadcast_in_dim(T0, shape=[2, 3, 6], broadcast_dims=[0, 2])
    T1_float[iDIDx2{2}, b3{3}, i4{6}] mesh=[0 1]
  outputs: T1
}
)IR");
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
             R"IR(Fusion {
  input T0_float[i0{8}, i1{64}] mesh=[0 1]
    OuterSplit(i1{64}, factor 2) -> iDIDx7{2}, i8{32}
    loop: [i0{8}, iDIDx7{2}, i8{32}]
  input T1_float[i2{4}, i3{64}] mesh=[0 1]
    OuterSplit(i3{64}, factor 2) -> iDIDx9{2}, i10{32}
    loop: [i2{4}, iDIDx9{2}, i10{32}]
  T2 = linear(T0, T1)
    T2_float[i4{8}, i5{4}, r6{64}] mesh=[0 1]
    OuterSplit(i4{8}, factor 2) -> iDIDx11{2}, i12{4}
    OuterSplit(r6{64}, factor 2) -> rDIDx13{2}, r14{32}
    loop: [iDIDx11{2}, i12{4}, i5{4}, rDIDx13{2}, r14{32}]
  outputs: T2
}
)IR");
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
             R"IR(Fusion {
  input T0_float[i0{6}, i1{4}] mesh=[0 1]
    InnerSplit(i0{6}, factor 2) -> i4{3}, iDIDx5{2}
    loop: [i4{3}, iDIDx5{2}, i1{4}]
  T1 = relu(T0)
    T1_float[i2{6}, i3{4}] mesh=[0 1]
    InnerSplit(i2{6}, factor 2) -> i6{3}, iDIDx7{2}
    loop: [i6{3}, iDIDx7{2}, i3{4}]
  outputs: T1
}
)IR");
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
             R"IR(Fusion {
  input T0_float[i0{12}] mesh=[[0 1 2] [3 4 5]]
    OuterSplit(i0{12}, factor 2) -> iDIDy2{2}, i3{6}
    OuterSplit(i3{6}, factor 3) -> iDIDx4{3}, i5{2}
    loop: [iDIDx4{3}, iDIDy2{2}, i5{2}]
  T1 = neg(T0)
    T1_float[i1{12}] mesh=[[0 1 2] [3 4 5]]
    OuterSplit(i1{12}, factor 2) -> iDIDy6{2}, i7{6}
    OuterSplit(i7{6}, factor 3) -> iDIDx8{3}, i9{2}
    loop: [iDIDy6{2}, iDIDx8{3}, i9{2}]
  outputs: T1
}
)IR");
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
             R"IR(Fusion {
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
    T3_float[i6{4}, i7{6}, r8{8}] mesh=[0 1]
    OuterSplit(i6{4}, factor 2) -> iDIDx21{2}, i22{2}
    OuterSplit(r8{8}, factor 2) -> rDIDx17{2}, r18{4}
    loop: [iDIDx21{2}, i22{2}, i7{6}, rDIDx17{2}, r18{4}]
  T4 = add(T2, T3)
    T4_float[i9{4}, i16{6}] mesh=[0 1]
    OuterSplit(i9{4}, factor 2) -> iDIDx19{2}, i20{2}
    loop: [iDIDx19{2}, i20{2}, i16{6}]
  outputs: T4
}
)IR");
}

}  // namespace
}  // namespace mf
