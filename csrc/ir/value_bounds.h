// What is known about a value's range from how it is computed. Codegen asks it to pick an op's
// cheaper form where that form is accurate on the known range (op_registry.h, cuda_nonpositive).
#pragma once

namespace mf {

class Val;

// True when every element of `v` is <= 0 or NaN by construction: v = a - b where b is an
// upper-bound reduction of a (max, op_registry.h `bounds_above`) over some axes, broadcast back
// so that each kept axis returns to its own position and each reduced one is a broadcast axis
// (softmax's x - max(x, keepdim=True)). a and the reduction's input must be the same value: the
// same Val, or the same deterministic unary op (a cast) of the same Val. False when unsure.
bool knownNonPositive(const Val* v);

}  // namespace mf
