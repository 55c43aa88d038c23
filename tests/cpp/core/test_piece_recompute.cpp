// Values handed from one kernel to the next that the next recomputes (codegen/piece_recompute.cpp):
// a LayerNorm backward's row kernel, then its weight/bias column sums.
#include <gtest/gtest.h>

#include <algorithm>

#include "codegen/piece_recompute.h"
#include "ir/ops.h"

namespace mf {
namespace {

bool has(const std::vector<Expr*>& exprs, const Val* out) {
  return std::any_of(exprs.begin(), exprs.end(), [&](const Expr* e) { return e->output(0) == out; });
}

struct NormBackward {
  std::unique_ptr<Fusion> f = std::make_unique<Fusion>();
  TensorView *dy16, *x16, *dy, *x, *mean, *rstd, *centered, *xhat, *product, *dx;
  std::vector<Expr*> row, columns;  // the row kernel's exprs, the column sums'

  NormBackward() {
    dy16 = defineTensor(*f, {4, 64}, DataType::BFloat16);
    x16 = defineTensor(*f, {4, 64}, DataType::BFloat16);
    dy = castOp(dy16, DataType::Float);
    x = castOp(x16, DataType::Float);
    mean = broadcastInDim(reductionOp(OpType::Sum, x, {1}), {4, 1}, {0});
    centered = binaryOp(OpType::Sub, x, mean);
    rstd = broadcastInDim(reductionOp(OpType::Sum, binaryOp(OpType::Mul, centered, centered), {1}), {4, 1}, {0});
    xhat = binaryOp(OpType::Mul, centered, rstd);
    dx = castOp(binaryOp(OpType::Mul, binaryOp(OpType::Mul, dy, xhat), rstd), DataType::BFloat16);
    product = binaryOp(OpType::Mul, dy, xhat);
    TensorView* dw = reductionOp(OpType::Sum, product, {0});
    TensorView* db = reductionOp(OpType::Sum, dy, {0});
    f->addOutput(dx);
    f->addOutput(dw);
    f->addOutput(db);
    for (Expr* e : f->exprs()) {
      const bool column = e->output(0) == dw || e->output(0) == db;
      (column ? columns : row).push_back(e);
    }
  }
};

TEST(PieceRecomputeTest, ColumnSumsRecomputeFloatValuesFromTheirNarrowInputs) {
  NormBackward n;
  Recompute r = recomputeInNextPiece(n.row, n.columns, *n.f);
  // dy and xhat * dy in float are computed again from the bf16 inputs and the statistics.
  EXPECT_TRUE(r.values.count(n.dy) && r.values.count(n.product) && r.values.count(n.xhat));
  EXPECT_TRUE(has(r.exprs, n.dy) && has(r.exprs, n.x) && has(r.exprs, n.centered) && has(r.exprs, n.product));
  EXPECT_TRUE(r.leaves.count(n.mean) && r.leaves.count(n.rstd));  // the row kernel stores the statistics
  EXPECT_EQ(r.leaves.size(), 2u);
  // In the row kernel's order (each after what makes its inputs).
  auto pos = [&](const Val* v) {
    return std::find_if(r.exprs.begin(), r.exprs.end(), [&](const Expr* e) { return e->output(0) == v; });
  };
  EXPECT_LT(pos(n.x), pos(n.centered));
  EXPECT_LT(pos(n.xhat), pos(n.product));
}

TEST(PieceRecomputeTest, AValueReadAfterTheSegmentOrAsAnOutputIsStored) {
  NormBackward n;
  n.f->addOutput(n.product);  // the caller reads it: stored, whatever recomputing would save
  Recompute r = recomputeInNextPiece(n.row, n.columns, *n.f);
  EXPECT_FALSE(r.values.count(n.product));
  EXPECT_TRUE(r.values.count(n.dy));
}

TEST(PieceRecomputeTest, NothingWhenRecomputingReadsAsMuchAsStoring) {
  // A bf16 sum of two bf16 inputs: reading both again (4 bytes) is no cheaper than storing and
  // loading the result (2 + 2).
  auto f = std::make_unique<Fusion>();
  TensorView* a = defineTensor(*f, {4, 64}, DataType::BFloat16);
  TensorView* b = defineTensor(*f, {4, 64}, DataType::BFloat16);
  TensorView* s = binaryOp(OpType::Add, a, b);
  TensorView* rows = reductionOp(OpType::Sum, s, {1});
  TensorView* cols = reductionOp(OpType::Sum, s, {0});
  f->addOutput(rows);
  f->addOutput(cols);
  std::vector<Expr*> row = {s->definition(), rows->definition()}, rest = {cols->definition()};
  EXPECT_TRUE(recomputeInNextPiece(row, rest, *f).exprs.empty());
}

}  // namespace
}  // namespace mf
