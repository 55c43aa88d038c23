// Symbolic extents as expressions: evaluation from bound symbols and scalar inputs, folding, and
// the product view that the reshape axis map compares.
#include <gtest/gtest.h>

#include "ir/extent_expr.h"
#include "ir/fusion.h"
#include "support/error.h"

namespace mf {
namespace {

Extent sym(const std::string& s) { return Extent{-1, s}; }

TEST(ExtentExprTest, EvaluatesFromBindings) {
  Fusion f;
  std::unordered_map<std::string, int64_t> b = {{"s0", 10}, {"s1", 4}, {"S2", 3}};
  EXPECT_EQ(evaluateExtent(f, sym("s0"), b), 10);
  EXPECT_EQ(evaluateExtent(f, sym("s0+s1*2"), b), 18);
  EXPECT_EQ(evaluateExtent(f, sym("(s0-S2)/2"), b), 3);
  EXPECT_EQ(evaluateExtent(f, sym("ceilDiv(s0-S2, 2)"), b), 4);
  EXPECT_EQ(evaluateExtent(f, sym("max(s1-7, 0)"), b), 0);
  EXPECT_EQ(evaluateExtent(f, sym("min(s1, S2)"), b), 3);
  EXPECT_EQ(evaluateExtent(f, sym("s9+1"), b), std::nullopt);  // unbound
  EXPECT_EQ(evaluateExtent(f, extentConst(7), b), 7);
}

TEST(ExtentExprTest, UnifiedSymbolsResolveThroughThePlainOne) {
  Fusion f;
  f.reserveSymbol("s2");
  f.unifySymbols("s0+s1", "s2");  // e.g. a cat's extent met an input's symbolic axis
  EXPECT_EQ(f.canonicalSymbol("s0+s1"), "s2");
  EXPECT_EQ(evaluateExtent(f, sym("s0+s1"), {{"s2", 9}}), 9);
  EXPECT_EQ(evaluateExtent(f, sym("s0+s1"), {{"s0", 4}, {"s1", 6}}), 10);
}

TEST(ExtentExprTest, BuildersFoldConstants) {
  EXPECT_EQ(extentAdd(extentConst(3), extentConst(4)), extentConst(7));
  EXPECT_EQ(extentAdd(extentConst(4), sym("s0")).symbol, "s0+4");
  EXPECT_EQ(extentSub(sym("s0+4"), extentConst(1)).symbol, "(s0+4)-1");
  EXPECT_EQ(extentMul(sym("s0"), extentConst(1)), sym("s0"));
  EXPECT_EQ(extentCeilDiv(sym("s0"), 2).symbol, "ceilDiv(s0, 2)");
  EXPECT_EQ(extentSub(sym("s0"), sym("s0")), extentConst(0));
}

TEST(ExtentExprTest, ProductsCompareAndDivide) {
  Fusion f;
  ExtentFactors a = factorsOf(f, sym("s0*4"));
  EXPECT_EQ(a.constant, 4);
  EXPECT_EQ(a.atoms, (std::vector<std::string>{"s0"}));
  EXPECT_TRUE(factorsOf(f, sym("s0")).divides(a));
  EXPECT_FALSE(a.divides(factorsOf(f, sym("s0*6"))));
  EXPECT_EQ(extentQuotient(f, sym("s0*s1*8"), sym("s1*2")).symbol, "4*s0");
  EXPECT_EQ(extentQuotient(f, extentConst(12), extentConst(4)), extentConst(3));
  EXPECT_EQ(extentQuotient(f, sym("s0"), extentConst(3)).symbol, "s0/3");  // not known to divide
  // A quotient or sum is one atom, not a product.
  EXPECT_EQ(factorsOf(f, sym("s0+4")).atoms, (std::vector<std::string>{"s0+4"}));
  EXPECT_EQ(factorsOf(f, sym("(s0+4)*s1")).atoms, (std::vector<std::string>{"(s0+4)", "s1"}));
  EXPECT_EQ(factorsOf(f, sym("(s0*s1)/2")).atoms, (std::vector<std::string>{"(s0*s1)/2"}));
}

// A product nested in parentheses is the same product: the extent a reshape's -1 leaves for
// [s0, s1, s2] -> [-1, s2] is "(s0*s1)", which must equal (and divide into) s0 * s1.
TEST(ExtentExprTest, NestedProductsFlatten) {
  Fusion f;
  ExtentFactors nested = factorsOf(f, sym("(s0*s1)"));
  EXPECT_EQ(nested.atoms, (std::vector<std::string>{"s0", "s1"}));
  EXPECT_EQ(nested, factorsOf(f, sym("s1*s0")));
  ExtentFactors deep = factorsOf(f, sym("((s0*2)*s1)*s2"));
  EXPECT_EQ(deep.constant, 2);
  EXPECT_EQ(deep.atoms, (std::vector<std::string>{"s0", "s1", "s2"}));
  EXPECT_TRUE(factorsOf(f, sym("s0")).divides(nested));
  EXPECT_EQ(extentQuotient(f, sym("((s0*s1)*s2)"), sym("s2")).symbol, "s0*s1");
}

}  // namespace
}  // namespace mf
