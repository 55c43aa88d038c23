// Range facts (ir/value_bounds.h) on small IR: x - max(x) over the reduced axes, broadcast back,
// is known to be <= 0; anything that only resembles it is not.
#include <gtest/gtest.h>

#include <string>

#include "ir/fusion.h"
#include "ir/nodes.h"
#include "ir/parser.h"
#include "ir/value_bounds.h"

namespace mf {
namespace {

// knownNonPositive of the tensor named `name` ("T4") in `ir`.
bool nonPositive(const std::string& ir, const std::string& name) {
  auto f = parseFusion(ir);
  for (const Expr* e : f->exprs()) {
    for (const Val* out : e->outputs()) {
      if (out->toString() == name) return knownNonPositive(out);
    }
  }
  ADD_FAILURE() << name << " is not defined in the IR";
  return false;
}

// `bound` is the op of T3's reduction, `b_source` what it reduces, `first`/`second` sub's operands.
std::string rowBoundIr(const std::string& bound, const std::string& b_source, const std::string& first,
                       const std::string& second) {
  return R"IR(Fusion {
  input T0_bfloat16[i0{s0}, i1{s1}]
  input T10_float[i20{s0}, i21{s1}]
  T1 = cast(T0, dtype=float)
    T1_float[i2{s0}, i3{s1}]
  T11 = cast(T0, dtype=float)
    T11_float[i22{s0}, i23{s1}]
  T2 = )IR" + bound + "(" + b_source + R"IR(, dims=[1])
    T2_float[i4{s0}, r5{s1}]
  T3 = broadcast_in_dim(T2, shape=[-1, 1], broadcast_dims=[0])
    T3_float[i6{s0}, b7{1}]
  T4 = sub()IR" + first + ", " + second + R"IR()
    T4_float[i8{s0}, i9{s1}]
  T5 = exp(T4)
    T5_float[i10{s0}, i11{s1}]
  outputs: T5
}
)IR";
}

TEST(ValueBounds, SoftmaxShiftIsNonPositive) {
  EXPECT_TRUE(nonPositive(rowBoundIr("max", "T1", "T1", "T3"), "T4"));
  // The same cast of the same input, written twice, is the same value.
  EXPECT_TRUE(nonPositive(rowBoundIr("max", "T11", "T1", "T3"), "T4"));
  // The exp of it is not a difference.
  EXPECT_FALSE(nonPositive(rowBoundIr("max", "T1", "T1", "T3"), "T5"));
}

TEST(ValueBounds, LookalikesAreNotNonPositive) {
  EXPECT_FALSE(nonPositive(rowBoundIr("max", "T1", "T3", "T1"), "T4"));   // max(x) - x >= 0
  EXPECT_FALSE(nonPositive(rowBoundIr("min", "T1", "T1", "T3"), "T4"));   // x - min(x) >= 0
  EXPECT_FALSE(nonPositive(rowBoundIr("sum", "T1", "T1", "T3"), "T4"));   // a sum bounds nothing
  EXPECT_FALSE(nonPositive(rowBoundIr("max", "T10", "T1", "T3"), "T4"));  // the max of another tensor
}

// T1[4, 4] reduced over `reduced` ("[0]" or "[1]"), whose kept axis is broadcast back to `kept_at`.
std::string squareBoundIr(const std::string& reduced, const std::string& reduced_domain, const std::string& kept_at) {
  return R"IR(Fusion {
  input T1_float[i2{4}, i3{4}]
  T2 = max(T1, dims=)IR" + reduced + R"IR()
    T2_float[)IR" + reduced_domain + R"IR(]
  T3 = broadcast_in_dim(T2, shape=[1, 4], broadcast_dims=)IR" + kept_at + R"IR()
    T3_float[b6{1}, i7{4}]
  T4 = sub(T1, T3)
    T4_float[i8{4}, i9{4}]
  outputs: T4
}
)IR";
}

// Reducing axis 0 and broadcasting back along axis 0 is a bound; putting the row maxima of a square
// tensor along the other axis (T1[i, j] - max_k T1[j, k]) is not.
TEST(ValueBounds, BoundMustReturnToItsOwnAxes) {
  EXPECT_TRUE(nonPositive(squareBoundIr("[0]", "r4{4}, i5{4}", "[1]"), "T4"));
  EXPECT_FALSE(nonPositive(squareBoundIr("[1]", "i4{4}, r5{4}", "[1]"), "T4"));
}

}  // namespace
}  // namespace mf
