// Sums of GEMM outputs accumulated by the GEMMs (host/gemm_accumulate.cpp): the add joins the
// later GEMM's segment, marked gemm_accumulate; nothing folds where a buffer or the GEMM is needed
// as it is.
#include <gtest/gtest.h>

#include "../support/check_lines.h"
#include "host/host_program.h"
#include "ir/ops.h"

namespace mf {
namespace {

std::unique_ptr<HostProgram> lower(std::unique_ptr<Fusion> f) { return lowerToHostProgram(std::move(f), 0); }

void expectText(const HostProgram& hp, const std::string& checks) {
  std::string text = hp.toString();
  CheckLinesResult r = checkLines(text, checks);
  EXPECT_TRUE(r.ok) << r.message << "\n" << text;
}

int accumulatingSegments(const HostProgram& hp) {
  int n = 0;
  for (const Segment& s : hp.segments()) n += s.gemm_accumulate ? 1 : 0;
  return n;
}

// dx = dq @ Wq + dk @ Wk + dv @ Wv, as a backward sums its input-gradient partials.
TEST(GemmAccumulateTest, ChainOfSumsFoldsIntoTheLaterGemms) {
  auto f = std::make_unique<Fusion>();
  std::vector<TensorView*> dys, ws;
  for (int i = 0; i < 3; ++i) {
    dys.push_back(defineTensor(*f, {4, 6}, DataType::Float));
    ws.push_back(defineTensor(*f, {6, 8}, DataType::Float));
  }
  TensorView* sum = binaryOp(OpType::Add, matmul(dys[0], ws[0]), matmul(dys[1], ws[1]));
  f->addOutput(binaryOp(OpType::Add, sum, matmul(dys[2], ws[2])));
  auto hp = lower(std::move(f));
  expectText(*hp, R"CHECK(
CHECK: run segment 0: [[Q:T[0-9]+]] = matmul(T0, T1)
CHECK: run segment 1: [[K:T[0-9]+]] = matmul(T2, T3); [[S:T[0-9]+]] = add([[Q]], [[K]])
CHECK: run segment 2: [[V:T[0-9]+]] = matmul(T4, T5); {{T[0-9]+}} = add([[S]], [[V]])
CHECK-NOT: run segment 3
)CHECK");
  EXPECT_EQ(accumulatingSegments(*hp), 2);
  EXPECT_FALSE(hp->segments()[0].gemm_accumulate);
}

// The sum's other work stays where it was: only the add moves.
TEST(GemmAccumulateTest, OnlyTheSumLeavesItsSegment) {
  auto f = std::make_unique<Fusion>();
  TensorView* a = defineTensor(*f, {4, 6}, DataType::Float);
  TensorView* b = defineTensor(*f, {4, 5}, DataType::Float);
  TensorView* w1 = defineTensor(*f, {8, 6}, DataType::Float);
  TensorView* w2 = defineTensor(*f, {8, 5}, DataType::Float);
  TensorView* sum = binaryOp(OpType::Add, linear(a, w1), linear(b, w2));
  f->addOutput(unaryOp(OpType::Tanh, sum));
  auto hp = lower(std::move(f));
  expectText(*hp, R"CHECK(
CHECK: run segment 0: [[P:T[0-9]+]] = linear(T0, T2)
CHECK: run segment 1: [[G:T[0-9]+]] = linear(T1, T3); [[S:T[0-9]+]] = add([[P]], [[G]])
CHECK: run segment 2: {{T[0-9]+}} = tanh([[S]])
)CHECK");
  EXPECT_EQ(accumulatingSegments(*hp), 1);
}

TEST(GemmAccumulateTest, NoFoldWhenThePartialIsReadAgainOrIsAnInput) {
  for (int variant = 0; variant < 2; ++variant) {
    auto f = std::make_unique<Fusion>();
    TensorView* a = defineTensor(*f, {4, 6}, DataType::Float);
    TensorView* w1 = defineTensor(*f, {6, 8}, DataType::Float);
    TensorView* b = defineTensor(*f, {4, 6}, DataType::Float);
    TensorView* w2 = defineTensor(*f, {6, 8}, DataType::Float);
    TensorView* partial = variant == 0 ? matmul(a, w1) : defineTensor(*f, {4, 8}, DataType::Float);
    f->addOutput(binaryOp(OpType::Add, partial, matmul(b, w2)));
    if (variant == 0) f->addOutput(partial);  // the caller sees the partial: its buffer is not ours
    auto hp = lower(std::move(f));
    EXPECT_EQ(accumulatingSegments(*hp), 0) << hp->toString();
  }
}

TEST(GemmAccumulateTest, NoFoldIntoABiasedGemmOrAcrossDtypes) {
  {
    auto f = std::make_unique<Fusion>();
    TensorView* a = defineTensor(*f, {4, 6}, DataType::Float);
    TensorView* w = defineTensor(*f, {8, 6}, DataType::Float);
    TensorView* bias = defineTensor(*f, {8}, DataType::Float);
    TensorView* p = matmul(defineTensor(*f, {4, 5}, DataType::Float), defineTensor(*f, {5, 8}, DataType::Float));
    f->addOutput(binaryOp(OpType::Add, p, linear(a, w, bias)));
    auto hp = lower(std::move(f));
    // The bias makes the later GEMM unfit; the earlier one has no earlier partial.
    EXPECT_EQ(accumulatingSegments(*hp), 0) << hp->toString();
  }
  {
    auto f = std::make_unique<Fusion>();
    TensorView* p = matmul(defineTensor(*f, {4, 5}, DataType::BFloat16), defineTensor(*f, {5, 8}, DataType::BFloat16));
    TensorView* g = matmul(defineTensor(*f, {4, 6}, DataType::Float), defineTensor(*f, {6, 8}, DataType::Float));
    f->addOutput(binaryOp(OpType::Add, p, g));  // promotes: the float GEMM cannot add into bf16
    auto hp = lower(std::move(f));
    EXPECT_EQ(accumulatingSegments(*hp), 0) << hp->toString();
  }
}

}  // namespace
}  // namespace mf
