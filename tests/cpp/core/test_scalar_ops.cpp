// Ops on scalar values (ir/ops_scalar.cpp): constants fold, integer add/sub/mul of extents stay
// extents, anything else is a computed scalar that prints, parses back and clones with its operands.
#include <gtest/gtest.h>

#include "ir/ops.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "support/error.h"

namespace mf {
namespace {

TEST(ScalarOpsTest, ConstantsFold) {
  Fusion f;
  Scalar* half = scalarOp(OpType::Reciprocal, {f.newScalar(DataType::Double, 2.0)});
  ASSERT_TRUE(half->value().has_value());
  EXPECT_EQ(*half->value(), 0.5);
  Scalar* truth = scalarOp(OpType::Lt, {half, f.newScalar(DataType::Int, 1.0)});
  EXPECT_EQ(truth->dtype(), DataType::Bool);
  EXPECT_EQ(*truth->value(), 1.0);
  // An integer result of integers truncates; true division of integers is a double.
  Scalar* q = scalarOp(OpType::Div, {f.newScalar(DataType::Int, 7.0), f.newScalar(DataType::Int, 2.0)});
  EXPECT_EQ(q->dtype(), DataType::Double);
  EXPECT_EQ(*q->value(), 3.5);
}

TEST(ScalarOpsTest, IntegerArithmeticOfExtentsStaysAnExtent) {
  Fusion f;
  TensorView* x = defineTensor(f, {-1, 4}, DataType::Float);
  Scalar* n = scalarOp(OpType::Mul, {size(x, 0), size(x, 1)});
  EXPECT_TRUE(n->isExtent()) << n->toString();
  EXPECT_FALSE(n->computation().has_value());
}

TEST(ScalarOpsTest, ComputedScalarsPrintParseAndClone) {
  Fusion f;
  TensorView* x = defineTensor(f, {-1, 4}, DataType::Float);
  Scalar* s = defineScalar(f, DataType::Double, std::nullopt);
  Scalar* r = scalarOp(OpType::Reciprocal, {s});
  Scalar* m = scalarOp(OpType::Mul, {r, size(x, 0)});
  EXPECT_EQ(m->dtype(), DataType::Double);
  ASSERT_TRUE(m->computation().has_value());
  EXPECT_EQ(m->computation()->op, OpType::Mul);
  f.addOutput(binaryOp(OpType::Mul, x, m));
  const std::string text = printFusion(f);
  EXPECT_NE(text.find("[mul(S"), std::string::npos) << text;
  EXPECT_NE(text.find("[reciprocal(S"), std::string::npos) << text;
  EXPECT_EQ(printFusion(*parseFusion(text)), text);
  EXPECT_EQ(printFusion(*f.clone()), text);
}

TEST(ScalarOpsTest, TensorsAndOpsWithoutAScalarFormAreRefused) {
  Fusion f;
  TensorView* x = defineTensor(f, {4}, DataType::Float);
  try {
    scalarOp(OpType::Neg, {x});
    FAIL() << "expected an error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("neg: T0 is a tensor; a scalar op takes scalars"), std::string::npos)
        << e.what();
  }
  try {
    scalarOp(OpType::Matmul, {f.newScalar(DataType::Double, 1.0), f.newScalar(DataType::Double, 1.0)});
    FAIL() << "expected an error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("matmul takes tensors; it has no form on scalars"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace mf
