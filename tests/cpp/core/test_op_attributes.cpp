// Typed op attributes (ir/attributes.h) and per-op checks (ir/op_checks.h): every op's declared
// attributes print and parse back; the parser refuses unknown, missing, mistyped and invalid
// attributes with a user error naming the line, the op and the attribute; an op's check runs on
// parsed IR and in the verifier, not only in its builder.
#include <gtest/gtest.h>

#include "ir/ops.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "support/error.h"

namespace mf {
namespace {

std::string parseError(const std::string& text) {
  try {
    parseFusion(text);
  } catch (const UserError& e) {
    return e.what();
  }
  return "no error";
}

// A fusion of one op `op_line` over a [4, 6] float input, its output described by `out`.
std::string oneOp(const std::string& op_line, const std::string& out = "T1_float[i2{6}, i3{4}]") {
  return "Fusion {\n  input T0_float[i0{4}, i1{6}]\n  T1 = " + op_line + "\n    " + out + "\n  outputs: T1\n}\n";
}

TEST(OpAttributesTest, WellFormedTextParses) {
  auto f = parseFusion(oneOp("permute(T0, dims=[1, 0])"));
  const Expr* e = f->exprs().at(0);
  EXPECT_EQ(e->attr<Ints>("dims"), (Ints{1, 0}));
  EXPECT_EQ(printFusion(*f), oneOp("permute(T0, dims=[1, 0])"));
}

TEST(OpAttributesTest, ParserRefusesUnknownAttributeNamingOpAndAttribute) {
  std::string msg = parseError(oneOp("permute(T0, dims=[1, 0], axes=[0, 1])"));
  EXPECT_NE(msg.find("line 3: permute: unknown attribute 'axes'; permute takes [dims]"), std::string::npos) << msg;
  msg = parseError(oneOp("neg(T0, dims=[0])", "T1_float[i2{4}, i3{6}]"));
  EXPECT_NE(msg.find("neg: unknown attribute 'dims'; neg takes no attributes"), std::string::npos) << msg;
}

TEST(OpAttributesTest, ParserRefusesMissingRequiredAttribute) {
  std::string msg = parseError(oneOp("permute(T0)"));
  EXPECT_NE(msg.find("line 3: permute: missing attribute 'dims' (int list)"), std::string::npos) << msg;
}

TEST(OpAttributesTest, ParserRefusesMistypedAndInvalidValues) {
  std::string msg = parseError(oneOp("permute(T0, dims=1)"));
  EXPECT_NE(msg.find("permute: attribute 'dims' must be a int list; got '1'"), std::string::npos) << msg;
  msg = parseError(oneOp("cast(T0, dtype=float7)", "T1_float[i2{4}, i3{6}]"));
  EXPECT_NE(msg.find("cast: attribute 'dtype' must be a dtype; got 'float7'"), std::string::npos) << msg;
  msg = parseError(oneOp("slice(T0, 0_int64, 4_int64, 0_int64, 6_int64, strides=[1, 0])", "T1_float[i2{4}, i3{6}]"));
  EXPECT_NE(msg.find("slice: attribute strides=[1, 0] is invalid; expected strides >= 1"), std::string::npos) << msg;
}

TEST(OpAttributesTest, OptionalAttributesTakeTheirDefaults) {
  // topk's largest and sorted default to true; the printer writes every attribute out.
  const std::string text =
      "Fusion {\n  input T0_float[i0{4}, i1{6}]\n  T1, T2 = topk(T0, k=2, dim=1)\n    T1_float[i2{4}, i3{2}]\n"
      "    T2_int64[i4{4}, i5{2}]\n  outputs: T1 T2\n}\n";
  auto f = parseFusion(text);
  const Expr* e = f->exprs().at(0);
  EXPECT_TRUE(e->attr<bool>("largest"));
  EXPECT_TRUE(e->attr<bool>("sorted"));
  EXPECT_NE(printFusion(*f).find("topk(T0, k=2, dim=1, largest=true, sorted=true)"), std::string::npos);
  // topk's check: k within the axis's extent.
  std::string msg = parseError(
      "Fusion {\n  input T0_float[i0{4}, i1{6}]\n  T1, T2 = topk(T0, k=7, dim=1)\n    T1_float[i2{4}, i3{7}]\n"
      "    T2_int64[i4{4}, i5{7}]\n  outputs: T1 T2\n}\n");
  EXPECT_NE(msg.find("k = 7 exceeds the extent 6 of axis 1 of T0"), std::string::npos) << msg;
}

TEST(OpAttributesTest, TheOpCheckRunsOnParsedIr) {
  // The builder would refuse these; parsed text goes through the same check.
  std::string msg = parseError(oneOp("permute(T0, dims=[1, 1])"));
  EXPECT_NE(msg.find("line 3: T1 = permute(T0, dims=[1, 1]): dims names axis 1 twice"), std::string::npos) << msg;
  msg = parseError(oneOp("sum(T0, dims=[2])", "T1_float[i2{4}, r3{6}]"));
  EXPECT_NE(msg.find("dims names axis 2 but T0 has rank 2"), std::string::npos) << msg;
  msg = parseError(oneOp("cast(T0, dtype=half)", "T1_float[i2{4}, i3{6}]"));
  EXPECT_NE(msg.find("the output is float but dtype is half"), std::string::npos) << msg;
}

TEST(OpAttributesTest, BuildersAndNewExprShareTheDeclaration) {
  Fusion f;
  TensorView* x = defineTensor(f, {4, 6}, DataType::Float);
  TensorView* out = f.newTensor(DataType::Float, {f.newIterDomain(Extent{6, ""}, IterType::Iteration),
                                                  f.newIterDomain(Extent{4, ""}, IterType::Iteration)});
  try {
    f.newExpr(OpType::Permute, {x}, {out}, {{"dims", Ints{0, 2}}});
    FAIL() << "expected an error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("dims names axis 2 but T0 has rank 2"), std::string::npos) << e.what();
  }
  EXPECT_EQ(out->definition(), nullptr);  // a refused expr leaves no trace
  EXPECT_TRUE(x->uses().empty());
  try {
    f.newExpr(OpType::Permute, {x}, {out}, {{"dims", int64_t{1}}});
    FAIL() << "expected an error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("permute: attribute 'dims' must be a int list; got a int (1)"),
              std::string::npos)
        << e.what();
  }
}

TEST(OpAttributesTest, EveryDeclaredAttributeRoundTripsThroughText) {
  for (const OpInfo& info : allOps()) {
    for (const AttrDef& d : info.attributes) {
      if (!d.default_value) continue;
      std::optional<AttrValue> back = parseAttrValue(d.type, attrValueText(*d.default_value));
      ASSERT_TRUE(back.has_value()) << info.name << "." << d.name;
      EXPECT_EQ(*back, *d.default_value) << info.name << "." << d.name;
    }
  }
  for (AttrValue v : {AttrValue(int64_t{-3}), AttrValue(true), AttrValue(0.125), AttrValue(OptionalFloat()),
                      AttrValue(OptionalFloat(2.5)), AttrValue(DataType::BFloat16), AttrValue(Ints{1, -2, 3})}) {
    std::optional<AttrValue> back = parseAttrValue(typeOf(v), attrValueText(v));
    ASSERT_TRUE(back.has_value()) << attrValueText(v);
    EXPECT_EQ(*back, v) << attrValueText(v);
  }
}

TEST(OpAttributesTest, VerifierRunsTheOpChecks) {
  Fusion f;
  TensorView* x = defineTensor(f, {4, 6}, DataType::Float);
  TensorView* y = permute(x, {1, 0});
  f.addOutput(y);
  verifyFusion(f);
  // A pass that broke the op (here: the input grew an axis) is caught by the verifier.
  x->setLogical({x->logical()[0], x->logical()[1], f.newIterDomain(Extent{2, ""}, IterType::Iteration)});
  try {
    verifyFusion(f);
    FAIL() << "expected an error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("must be a permutation of the 3 axes of T0"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mf
