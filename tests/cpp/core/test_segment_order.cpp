// Segment formation order (host/segment_order.cpp): fusible work split by an independent GEMM
// meets its consumers in one segment; work that only feeds outputs joins its producer's segment;
// the exprs that run alone keep their order.
#include <gtest/gtest.h>

#include <algorithm>

#include "../support/check_lines.h"
#include "host/host_program.h"
#include "host/segment_order.h"
#include "ir/ops.h"

namespace mf {
namespace {

void expectHostProgram(std::unique_ptr<Fusion> f, const std::string& checks) {
  std::string text = lowerToHostProgram(std::move(f), 0)->toString();
  CheckLinesResult r = checkLines(text, checks);
  EXPECT_TRUE(r.ok) << r.message << "\n" << text;
}

// The inputs of an MLP's GELU backward: dy [4, 8], W2 [8, 6], the saved pre-activation [4, 6], W1
// [6, 8] and the MLP's input x [4, 8].
struct MlpBackwardInputs {
  TensorView *dy, *w2, *pre, *w1, *x;
};
MlpBackwardInputs mlpBackwardInputs(Fusion& f) {
  return {defineTensor(f, {4, 8}, DataType::Float), defineTensor(f, {8, 6}, DataType::Float),
          defineTensor(f, {4, 6}, DataType::Float), defineTensor(f, {6, 8}, DataType::Float),
          defineTensor(f, {4, 8}, DataType::Float)};
}

// SwiGLU as written: silu(gate) is defined before the up projection, mul after it.
TEST(SegmentOrderTest, PointwiseSplitByAnIndependentGemmIsOneSegment) {
  auto f = std::make_unique<Fusion>();
  TensorView* x = defineTensor(*f, {4, 8}, DataType::Float);
  TensorView* w_gate = defineTensor(*f, {6, 8}, DataType::Float);
  TensorView* w_up = defineTensor(*f, {6, 8}, DataType::Float);
  TensorView* w_down = defineTensor(*f, {8, 6}, DataType::Float);
  TensorView* gate = unaryOp(OpType::Silu, linear(x, w_gate));
  TensorView* act = binaryOp(OpType::Mul, gate, linear(x, w_up));
  f->addOutput(linear(act, w_down));
  expectHostProgram(std::move(f), R"CHECK(
CHECK: run segment 0: [[G:T[0-9]+]] = linear(T0, T1)
CHECK: run segment 1: [[U:T[0-9]+]] = linear(T0, T2)
CHECK: run segment 2: [[S:T[0-9]+]] = silu([[G]]); [[M:T[0-9]+]] = mul([[S]], [[U]])
CHECK: run segment 3: {{T[0-9]+}} = linear([[M]], T3)
)CHECK");
}

// A bias gradient's column sum only feeds an output: it joins the pointwise segment that makes its
// operand, not a segment of its own after the last GEMM.
TEST(SegmentOrderTest, ReductionThatOnlyFeedsAnOutputJoinsItsProducer) {
  auto f = std::make_unique<Fusion>();
  TensorView* dy = defineTensor(*f, {4, 8}, DataType::Float);
  TensorView* pre = defineTensor(*f, {4, 8}, DataType::Float);
  TensorView* w = defineTensor(*f, {8, 6}, DataType::Float);
  TensorView* grad = binaryOp(OpType::Mul, dy, unaryOp(OpType::Sigmoid, pre));
  TensorView* dx = matmul(grad, w);
  TensorView* dw = matmul(permute(grad, {1, 0}), pre);
  f->addOutput(dx);
  f->addOutput(dw);
  f->addOutput(reductionOp(OpType::Sum, grad, {0}));
  expectHostProgram(std::move(f), R"CHECK(
CHECK: run segment 0: [[S:T[0-9]+]] = sigmoid(T1); [[G:T[0-9]+]] = mul(T0, [[S]]); {{T[0-9]+}} = sum([[G]], dims=[0])
CHECK-NOT: sum(
CHECK: matmul(
CHECK-NOT: sum(
CHECK: matmul(
CHECK-NOT: sum(
CHECK: outputs:
)CHECK");
}

// A weight gradient's GEMM listed last by the outputs runs as soon as its operands exist, beside
// the dx GEMM that reads the same activation gradient: d_pre is freed before the rest of the
// backward instead of being held to its end (it was a block backward's peak).
TEST(SegmentOrderTest, WeightGradientGemmRunsAsSoonAsItsOperandsExist) {
  auto f = std::make_unique<Fusion>();
  auto [dy, w2, pre, w1, x] = mlpBackwardInputs(*f);
  TensorView* w3 = defineTensor(*f, {8, 8}, DataType::Float);
  TensorView* d_pre = binaryOp(OpType::Mul, matmul(dy, w2), unaryOp(OpType::Sigmoid, pre));
  TensorView* dx = matmul(d_pre, w1);
  f->addOutput(matmul(unaryOp(OpType::Exp, dx), w3));  // the rest of the backward
  f->addOutput(matmul(permute(d_pre, {1, 0}), x));     // dW, last in output order
  expectHostProgram(std::move(f), R"CHECK(
CHECK: run segment 0: {{T[0-9]+}} = matmul(T0, T1)
CHECK: run segment 1: {{.*}}[[D:T[0-9]+]] = mul(
CHECK: [[P:T[0-9]+]] = permute([[D]], dims=[1, 0])
CHECK: matmul([[P]], T4)
CHECK: run segment {{[0-9]+}}: [[DX:T[0-9]+]] = matmul([[D]], T3)
CHECK: deallocate [[D]]
CHECK: exp([[DX]])
CHECK: outputs:
)CHECK");
}

// The activation a weight gradient's GEMM reads (gelu(pre), recomputed from the saved input) is made
// by the kernel that already reads `pre` after dy's GEMM (the GELU backward), not by a kernel of its
// own that reads `pre` again; the weight gradient's GEMM follows at once, so the activation is not
// held longer than `pre` was.
TEST(SegmentOrderTest, RecomputedActivationJoinsTheKernelReadingTheSameSavedInput) {
  auto f = std::make_unique<Fusion>();
  auto [dy, w2, pre, w1, x] = mlpBackwardInputs(*f);
  (void)x;
  TensorView* d_act = matmul(dy, w2);  // as linear_backward writes it: dx's GEMM, then dW's
  TensorView* act = unaryOp(OpType::Gelu, pre);
  TensorView* dw2 = matmul(permute(dy, {1, 0}), act);
  TensorView* d_pre = binaryOp(OpType::Mul, d_act, unaryOp(OpType::Sigmoid, pre));
  f->addOutput(matmul(d_pre, w1));
  f->addOutput(reductionOp(OpType::Sum, d_pre, {0}));  // the bias gradient: d_pre is not the dx GEMM's alone
  f->addOutput(dw2);
  expectHostProgram(std::move(f), R"CHECK(
CHECK: run segment 0: {{.*}}matmul(
CHECK-NOT: gelu(
CHECK: run segment {{[0-9]+}}: {{.*}}sigmoid(T2){{.*}}[[A:T[0-9]+]] = gelu(T2)
CHECK-NOT: gelu(
CHECK: run segment {{[0-9]+}}: {{.*}}matmul({{T[0-9]+}}, [[A]])
CHECK-NEXT: deallocate [[A]]
)CHECK");
}

// Two weight-gradient GEMMs whose operands exist at the same point: the one that is the last reader
// of an operand (dW2 of gelu(pre)) runs first, so that operand is freed before dW1's output is
// allocated; dW1's d_pre lives on for the dx GEMM either way.
TEST(SegmentOrderTest, WeightGradientThatFreesAnOperandRunsFirst) {
  auto f = std::make_unique<Fusion>();
  auto [dy, w2, pre, w1, x] = mlpBackwardInputs(*f);
  TensorView* d_act = matmul(dy, w2);
  TensorView* dw2 = matmul(permute(dy, {1, 0}), unaryOp(OpType::Gelu, pre));
  TensorView* d_pre = binaryOp(OpType::Mul, d_act, unaryOp(OpType::Sigmoid, pre));
  f->addOutput(matmul(d_pre, w1));
  f->addOutput(matmul(permute(d_pre, {1, 0}), x));  // dW1: first in the output order
  f->addOutput(dw2);
  expectHostProgram(std::move(f), R"CHECK(
CHECK: run segment 1: {{.*}}[[D:T[0-9]+]] = mul({{.*}}[[A:T[0-9]+]] = gelu(T2)
CHECK: run segment 2: {{T[0-9]+}} = matmul({{T[0-9]+}}, [[A]])
CHECK-NEXT: deallocate [[A]]
CHECK: run segment {{[0-9]+}}: {{T[0-9]+}} = matmul({{T[0-9]+}}, T4)
CHECK: = matmul([[D]], T3)
)CHECK");
}

// SwiGLU's backward as AOTAutograd writes it: the saved gate and up arrive 2-d and are broadcast
// (views of fusion inputs) where each chain reads them. d_up's chain runs before dW_up's GEMM and
// d_gate's after it; the views no longer hold d_gate's chain in its gap: both are one segment that
// reads dy @ W_down and the gate once.
TEST(SegmentOrderTest, ViewOfAnInputMovesWithTheWorkThatReadsIt) {
  auto f = std::make_unique<Fusion>();
  TensorView* dy = defineTensor(*f, {1, 4, 8}, DataType::Float);
  TensorView* w_down = defineTensor(*f, {8, 6}, DataType::Float);
  TensorView* gate = defineTensor(*f, {4, 6}, DataType::Float);
  TensorView* up = defineTensor(*f, {4, 6}, DataType::Float);
  TensorView* x = defineTensor(*f, {4, 8}, DataType::Float);
  TensorView* w_up = defineTensor(*f, {6, 8}, DataType::Float);
  TensorView* d_act = matmul(dy, w_down);
  TensorView* gate3 = broadcastInDim(gate, {1, 4, 6}, {1, 2});
  TensorView* d_up = binaryOp(OpType::Mul, d_act, unaryOp(OpType::Silu, gate3));
  TensorView* dw_up = matmul(permute(squeeze(d_up, {0}), {1, 0}), x);
  TensorView* up3 = broadcastInDim(up, {1, 4, 6}, {1, 2});
  TensorView* d_gate = binaryOp(OpType::Mul, binaryOp(OpType::Mul, d_act, up3), unaryOp(OpType::Sigmoid, gate3));
  f->addOutput(dw_up);
  f->addOutput(matmul(permute(squeeze(d_gate, {0}), {1, 0}), x));
  f->addOutput(binaryOp(OpType::Add, matmul(d_up, w_up), matmul(d_gate, w_up)));
  expectHostProgram(std::move(f), R"CHECK(
CHECK: run segment 0: {{T[0-9]+}} = matmul(T0, T1)
CHECK: run segment 1: {{.*}}silu({{.*}}broadcast_in_dim(T3{{.*}}sigmoid(
CHECK-NOT: sigmoid(
CHECK: outputs:
)CHECK");
}

// Work on inputs alone that feeds a later reduction is not hoisted into the first segment: it stays
// with what reads it.
TEST(SegmentOrderTest, WorkOnInputsStaysWithItsConsumers) {
  auto f = std::make_unique<Fusion>();
  TensorView* x = defineTensor(*f, {4, 8}, DataType::Float);
  TensorView* w = defineTensor(*f, {8, 8}, DataType::Float);
  TensorView* scale = binaryOp(OpType::Mul, x, x);  // only feeds the sum below
  TensorView* y = matmul(unaryOp(OpType::Exp, x), w);
  f->addOutput(y);
  f->addOutput(reductionOp(OpType::Sum, binaryOp(OpType::Mul, y, scale), {0}));
  expectHostProgram(std::move(f), R"CHECK(
CHECK: run segment 0: [[E:T[0-9]+]] = exp(T0)
CHECK-NOT: mul(
CHECK: run segment 1: [[Y:T[0-9]+]] = matmul([[E]], T1)
CHECK: run segment 2: [[S:T[0-9]+]] = mul(T0, T0); [[P:T[0-9]+]] = mul([[Y]], [[S]]); {{T[0-9]+}} = sum([[P]], dims=[0])
)CHECK");
}

// SwiGLU's backward: both gradients read the same GEMM output; the one its GEMM needs later joins
// the first one's segment (one kernel, one read of dy) instead of running after the first GEMM.
TEST(SegmentOrderTest, SiblingsReadingOneGemmOutputShareASegment) {
  auto f = std::make_unique<Fusion>();
  TensorView* g = defineTensor(*f, {4, 8}, DataType::Float);
  TensorView* w_down = defineTensor(*f, {8, 6}, DataType::Float);
  TensorView* gate = defineTensor(*f, {4, 6}, DataType::Float);
  TensorView* up = defineTensor(*f, {4, 6}, DataType::Float);
  TensorView* w_gate = defineTensor(*f, {6, 8}, DataType::Float);
  TensorView* w_up = defineTensor(*f, {6, 8}, DataType::Float);
  TensorView* dy = matmul(g, w_down);
  TensorView* sig = unaryOp(OpType::Sigmoid, gate);  // silu(gate) = gate * sig, as the Llama block writes it
  TensorView* d_gate = binaryOp(OpType::Mul, binaryOp(OpType::Mul, dy, up), sig);
  TensorView* dx_gate = matmul(d_gate, w_gate);
  TensorView* d_up = binaryOp(OpType::Mul, dy, binaryOp(OpType::Mul, gate, sig));
  f->addOutput(binaryOp(OpType::Add, dx_gate, matmul(d_up, w_up)));
  expectHostProgram(std::move(f), R"CHECK(
CHECK: run segment 0: [[DY:T[0-9]+]] = matmul(T0, T1)
CHECK: run segment 1: {{.*}}[[S:T[0-9]+]] = sigmoid(T2){{.*}}[[G:T[0-9]+]] = mul(T2, [[S]]); {{T[0-9]+}} = mul([[DY]], [[G]])
CHECK: run segment 2: {{T[0-9]+}} = matmul(
CHECK-NOT: mul(
CHECK: run segment 3: {{T[0-9]+}} = matmul(
)CHECK");
}

// A chain that reads a value made early but is read only by fusible work after a later GEMM is not
// pulled toward that value: stored there it would be written and read back, where the kernel after
// the GEMM computes it in registers (silu's derivative in an autograd graph of SwiGLU).
TEST(SegmentOrderTest, ChainReadOnlyAfterALaterGemmStaysWithItsConsumer) {
  auto f = std::make_unique<Fusion>();
  TensorView* gate = defineTensor(*f, {4, 6}, DataType::Float);
  TensorView* up = defineTensor(*f, {4, 6}, DataType::Float);
  TensorView* g = defineTensor(*f, {4, 8}, DataType::Float);
  TensorView* w_down = defineTensor(*f, {8, 6}, DataType::Float);
  TensorView* w_gate = defineTensor(*f, {6, 8}, DataType::Float);
  TensorView* sig = unaryOp(OpType::Sigmoid, gate);
  TensorView* act = binaryOp(OpType::Mul, binaryOp(OpType::Mul, gate, sig), up);
  TensorView* dw = matmul(permute(act, {1, 0}), g);
  TensorView* deriv = binaryOp(OpType::Mul, sig, unaryOp(OpType::Exp, binaryOp(OpType::Add, gate, sig)));
  TensorView* dy = matmul(g, w_down);
  TensorView* d_gate = binaryOp(OpType::Mul, binaryOp(OpType::Mul, dy, up), deriv);
  f->addOutput(dw);
  f->addOutput(matmul(d_gate, w_gate));
  expectHostProgram(std::move(f), R"CHECK(
CHECK: run segment 0: {{.*}}sigmoid(T0)
CHECK-NOT: exp(
CHECK: = matmul(T2, T3)
CHECK-NOT: run segment
CHECK: run segment {{[0-9]+}}: {{.*}}[[A:T[0-9]+]] = add(T0, {{T[0-9]+}}); [[E:T[0-9]+]] = exp([[A]]){{.*}}mul(
)CHECK");
}

// The exprs that run alone keep their given order, whatever the fusible work around them.
TEST(SegmentOrderTest, ExprsThatRunAloneKeepTheirOrder) {
  auto f = std::make_unique<Fusion>();
  TensorView* a = defineTensor(*f, {4, 4}, DataType::Float);
  TensorView* b = defineTensor(*f, {4, 4}, DataType::Float);
  TensorView* m1 = matmul(a, b);
  TensorView* m2 = matmul(b, a);
  TensorView* m3 = matmul(unaryOp(OpType::Exp, m1), b);
  f->addOutput(binaryOp(OpType::Add, m2, m3));
  std::vector<Expr*> given = f->exprs();
  std::vector<Expr*> order = orderForSegments(given, closesSegment);
  auto matmuls = [](const std::vector<Expr*>& exprs) {
    std::vector<Expr*> m;
    for (Expr* e : exprs) {
      if (e->op() == OpType::Matmul) m.push_back(e);
    }
    return m;
  };
  ASSERT_EQ(matmuls(order).size(), 3u);
  EXPECT_EQ(matmuls(order), matmuls(given));
  // exp(m1) feeds only m3: it runs right before m3, after the other two.
  auto exp = std::find_if(order.begin(), order.end(), [](Expr* e) { return e->op() == OpType::Exp; });
  ASSERT_NE(exp, order.end());
  EXPECT_EQ(exp[1]->out(), m3);
  EXPECT_EQ(exp - order.begin(), 2);
}

}  // namespace
}  // namespace mf
