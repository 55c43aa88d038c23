// Composite ops: built from primitive ops, so sharding, planning, codegen and the evaluator treat
// them as the primitives they are made of (a sharded reduced axis gives a partial sum plus an
// Allreduce, with no rule of their own).
#include <cmath>
#include <set>

#include "ir/extent_expr.h"
#include "ir/ops.h"
#include "support/error.h"

namespace mf {
namespace {

// x with the reduced axes put back as broadcast axes (keepdim).
TensorView* keepReducedAxes(TensorView* x, const std::set<int64_t>& reduced, int64_t rank) {
  std::vector<int64_t> shape, kept;
  for (int64_t a = 0; a < rank; ++a) {
    shape.push_back(reduced.count(a) ? 1 : -1);
    if (!reduced.count(a)) kept.push_back(a);
  }
  return broadcastInDim(x, shape, kept);
}

Val* extentScalar(Fusion& f, const Extent& e) {
  if (e.isConst()) return f.newScalar(DataType::Double, static_cast<double>(e.value));
  return f.newScalar(DataType::Int, std::nullopt, e.symbol);
}

}  // namespace

std::pair<TensorView*, TensorView*> varMean(TensorView* x, std::vector<int64_t> dims, double correction, bool keepdim) {
  Fusion& f = *x->fusion();
  auto ids = x->logicalNoReductions();
  int64_t rank = static_cast<int64_t>(ids.size());
  MF_USER_ARG_CHECK(isFloatingPoint(x->dtype()), "var_mean: ", x->toString(), " has dtype ", toString(x->dtype()),
                    "; var_mean needs a floating-point tensor");
  MF_USER_ARG_CHECK(correction >= 0, "var_mean: correction must be non-negative; got ", correction);
  MF_USER_ARG_CHECK(!dims.empty(), "var_mean: no axis to reduce of ", x->toString(),
                    " (dims is empty; list the axes, all of them to reduce everything)");
  std::set<int64_t> reduced;
  for (int64_t d : dims) {
    int64_t a = d < 0 ? d + rank : d;
    MF_USER_ARG_CHECK(a >= 0 && a < rank, "var_mean: dim ", d, " is out of range for ", x->toString(), " of rank ",
                      rank);
    MF_USER_ARG_CHECK(reduced.insert(a).second, "var_mean: dim ", d, " of ", x->toString(), " is given twice");
  }
  Extent count = extentConst(1);
  for (int64_t a : reduced) count = extentMul(count, ids[a]->extent());
  std::vector<int64_t> axes(reduced.begin(), reduced.end());

  // Half and bfloat16 accumulate in float, as PyTorch does; the results are rounded back.
  bool low_precision = x->dtype() == DataType::Half || x->dtype() == DataType::BFloat16;
  TensorView* xf = low_precision ? castOp(x, DataType::Float) : x;
  TensorView* mean = binaryOp(OpType::Div, reductionOp(OpType::Sum, xf, axes), extentScalar(f, count));
  TensorView* centered = binaryOp(OpType::Sub, xf, keepReducedAxes(mean, reduced, rank));
  TensorView* sum_sq = reductionOp(OpType::Sum, binaryOp(OpType::Mul, centered, centered), axes);
  // PyTorch divides by max(N - correction, 0) (so N <= correction gives inf or nan).
  Val* dof = nullptr;
  if (count.isConst()) {
    dof = f.newScalar(DataType::Double, std::max(static_cast<double>(count.value) - correction, 0.0));
  } else {
    MF_USER_ARG_CHECK(correction == std::floor(correction), "var_mean: correction ", correction,
                      " must be an integer when the reduced extent (", count.symbol, ") is symbolic");
    Extent c = extentConst(static_cast<int64_t>(correction));
    dof = f.newScalar(DataType::Int, std::nullopt, "max(" + extentSub(count, c).symbol + ", 0)");
  }
  TensorView* var = binaryOp(OpType::Div, sum_sq, dof);
  if (keepdim) {
    var = keepReducedAxes(var, reduced, rank);
    mean = keepReducedAxes(mean, reduced, rank);
  }
  if (low_precision) {
    var = castOp(var, x->dtype());
    mean = castOp(mean, x->dtype());
  }
  return {var, mean};
}

}  // namespace mf
