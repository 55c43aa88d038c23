// Text tests of sharding through attention (sdpfa_fwd: several outputs, the RNG state among them)
// in propagate_shardings and decompose_reshardings: IR in, CHECK lines on what each pass changes.
// build/dev/mf_opt <pass> case.ir prints what a pass makes of an input.
#include "pass_text_test.h"

namespace mf {
namespace {

// Heads split on q, k, v pass to the attention output and logsumexp; the RNG state gets the mesh
// and stays replicated. Nothing is left to reshard.
TEST(AttentionSharding, HeadsPropagateToEveryDataOutput) {
  expectPass("propagate_shardings", R"IR(Fusion {
  input T0_float[i0{2}, i1{4}, i2{4}] mesh=[0 1]
    OuterSplit(i0{2}, factor 2) -> iDIDx20{2}, i21{1}
    loop: [iDIDx20{2}, i21{1}, i1{4}, i2{4}]
  input T1_float[i3{2}, i4{4}, i5{4}] mesh=[0 1]
    OuterSplit(i3{2}, factor 2) -> iDIDx22{2}, i23{1}
    loop: [iDIDx22{2}, i23{1}, i4{4}, i5{4}]
  input T2_float[i6{2}, i7{4}, i8{4}] mesh=[0 1]
    OuterSplit(i6{2}, factor 2) -> iDIDx24{2}, i25{1}
    loop: [iDIDx24{2}, i25{1}, i7{4}, i8{4}]
  T3, T4, T5, T6 = sdpfa_fwd(T0, T1, T2, dropout_p=0, is_causal=false, scale=0.5)
    T3_float[i9{2}, i10{4}, i11{4}]
    T4_float[i12{2}, i13{4}]
    T5_int64[]
    T6_int64[]
  outputs: T3 T4
}
)IR",
             R"CHECK(
CHECK: T3, T4, T5, T6 = sdpfa_fwd(T0, T1, T2
CHECK-NEXT: T3_float[i9{2}, i10{4}, i11{4}] mesh=[0 1]
CHECK-NEXT: OuterSplit(i9{2}, factor 2) -> [[D3:iDIDx[0-9]+]]{2}, [[R3:i[0-9]+]]{1}
CHECK-NEXT: loop: [[[D3]]{2}, [[R3]]{1}, i10{4}, i11{4}]
CHECK-NEXT: T4_float[i12{2}, i13{4}] mesh=[0 1]
CHECK-NEXT: OuterSplit(i12{2}, factor 2) -> [[D4:iDIDx[0-9]+]]{2}, [[R4:i[0-9]+]]{1}
CHECK-NEXT: loop: [[[D4]]{2}, [[R4]]{1}, i13{4}]
CHECK-NEXT: T5_int64[] mesh=[0 1]
CHECK-NEXT: T6_int64[] mesh=[0 1]
)CHECK");
  // The propagated IR (as propagate_shardings prints it) has nothing to reshard.
  expectPassUnchanged("decompose_reshardings", R"IR(Fusion {
  input T0_float[i0{2}, i1{4}, i2{4}] mesh=[0 1]
    OuterSplit(i0{2}, factor 2) -> iDIDx20{2}, i21{1}
    loop: [iDIDx20{2}, i21{1}, i1{4}, i2{4}]
  input T1_float[i3{2}, i4{4}, i5{4}] mesh=[0 1]
    OuterSplit(i3{2}, factor 2) -> iDIDx22{2}, i23{1}
    loop: [iDIDx22{2}, i23{1}, i4{4}, i5{4}]
  input T2_float[i6{2}, i7{4}, i8{4}] mesh=[0 1]
    OuterSplit(i6{2}, factor 2) -> iDIDx24{2}, i25{1}
    loop: [iDIDx24{2}, i25{1}, i7{4}, i8{4}]
  T3, T4, T5, T6 = sdpfa_fwd(T0, T1, T2, dropout_p=0, is_causal=false, scale=0.5)
    T3_float[i9{2}, i10{4}, i11{4}] mesh=[0 1]
    OuterSplit(i9{2}, factor 2) -> iDIDx26{2}, i27{1}
    loop: [iDIDx26{2}, i27{1}, i10{4}, i11{4}]
    T4_float[i12{2}, i13{4}] mesh=[0 1]
    OuterSplit(i12{2}, factor 2) -> iDIDx28{2}, i29{1}
    loop: [iDIDx28{2}, i29{1}, i13{4}]
    T5_int64[] mesh=[0 1]
    T6_int64[] mesh=[0 1]
  outputs: T3 T4
}
)IR");
}

// head_dim of q split: gathered before the op (a set, an Allgather); logsumexp annotated as split
// is computed whole and set into place (a LocalSlice).
TEST(AttentionSharding, ContractedAxisGatheredBeforeAndSplitOutputSlicedAfter) {
  expectPass("decompose_reshardings", R"IR(Fusion {
  input T0_float[i0{2}, i1{4}, i2{4}] mesh=[0 1]
    OuterSplit(i2{4}, factor 2) -> iDIDx20{2}, i21{2}
    loop: [i0{2}, i1{4}, iDIDx20{2}, i21{2}]
  input T1_float[i3{2}, i4{4}, i5{4}] mesh=[0 1]
  input T2_float[i6{2}, i7{4}, i8{4}] mesh=[0 1]
  T3, T4, T5, T6 = sdpfa_fwd(T0, T1, T2, dropout_p=0, is_causal=true, scale=none)
    T3_float[i9{2}, i10{4}, i11{4}] mesh=[0 1]
    T4_float[i12{2}, i13{4}] mesh=[0 1]
    OuterSplit(i13{4}, factor 2) -> iDIDx22{2}, i23{2}
    loop: [i12{2}, iDIDx22{2}, i23{2}]
    T5_int64[] mesh=[0 1]
    T6_int64[] mesh=[0 1]
  outputs: T3 T4
}
)IR",
             R"CHECK(
CHECK: [[G:T[0-9]+]] = set(T0)
CHECK-NEXT: [[G]]_float[{{i[0-9]+}}{2}, {{i[0-9]+}}{4}, {{i[0-9]+}}{4}] mesh=[0 1]
CHECK-NEXT: T3, [[L:T[0-9]+]], T5, T6 = sdpfa_fwd([[G]], T1, T2
CHECK-NEXT: T3_float[i9{2}, i10{4}, i11{4}] mesh=[0 1]
CHECK-NEXT: [[L]]_float[{{i[0-9]+}}{2}, {{i[0-9]+}}{4}] mesh=[0 1]
CHECK-NEXT: T5_int64[] mesh=[0 1]
CHECK-NEXT: T6_int64[] mesh=[0 1]
CHECK-NEXT: T4 = set([[L]])
CHECK-NEXT: T4_float[i12{2}, i13{4}] mesh=[0 1]
CHECK-NEXT: OuterSplit(i13{4}, factor 2)
)CHECK");
}

// Without a causal mask the query's sequence split passes to attn and logsumexp; k (split on its
// sequence) is gathered, v stays whole.
TEST(AttentionSharding, QuerySequenceSplitStaysWithoutCausalMask) {
  expectPass("decompose_reshardings", R"IR(Fusion {
  input T0_float[i0{2}, i1{4}, i2{4}] mesh=[0 1]
    OuterSplit(i1{4}, factor 2) -> iDIDx20{2}, i21{2}
    loop: [i0{2}, iDIDx20{2}, i21{2}, i2{4}]
  input T1_float[i3{2}, i4{4}, i5{4}] mesh=[0 1]
    OuterSplit(i4{4}, factor 2) -> iDIDx22{2}, i23{2}
    loop: [i3{2}, iDIDx22{2}, i23{2}, i5{4}]
  input T2_float[i6{2}, i7{4}, i8{4}] mesh=[0 1]
  T3, T4, T5, T6 = sdpfa_fwd(T0, T1, T2, dropout_p=0, is_causal=false, scale=none)
    T3_float[i9{2}, i10{4}, i11{4}] mesh=[0 1]
    OuterSplit(i10{4}, factor 2) -> iDIDx24{2}, i25{2}
    loop: [i9{2}, iDIDx24{2}, i25{2}, i11{4}]
    T4_float[i12{2}, i13{4}] mesh=[0 1]
    OuterSplit(i13{4}, factor 2) -> iDIDx26{2}, i27{2}
    loop: [i12{2}, iDIDx26{2}, i27{2}]
    T5_int64[] mesh=[0 1]
    T6_int64[] mesh=[0 1]
  outputs: T3 T4
}
)IR",
             R"CHECK(
CHECK: [[G:T[0-9]+]] = set(T1)
CHECK-NEXT: [[G]]_float[{{i[0-9]+}}{2}, {{i[0-9]+}}{4}, {{i[0-9]+}}{4}] mesh=[0 1]
CHECK-NOT: Split
CHECK-NOT: set(T2)
CHECK: T3, T4, T5, T6 = sdpfa_fwd(T0, [[G]], T2
CHECK-NEXT: T3_float[i9{2}, i10{4}, i11{4}] mesh=[0 1]
CHECK-NEXT: OuterSplit(i10{4}, factor 2)
CHECK: T4_float[i12{2}, i13{4}] mesh=[0 1]
CHECK-NEXT: OuterSplit(i13{4}, factor 2)
CHECK-NOT: set(
)CHECK");
}

}  // namespace
}  // namespace mf
