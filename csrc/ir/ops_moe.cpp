// Builders of the mixture-of-experts ops: grouped_mm and the routing ops (topk, sort, argsort,
// index_select, gather, scatter, index_add, cumsum, bincount). Each checks its operands' ranks,
// dtypes and the extents it can see, makes the output TensorViews (global shapes) and the Expr.
// What the ops compute is PyTorch's meaning (runtime/moe_ops.cpp evaluates them on ATen); how they
// shard is their axis map (ir/domain_map.cpp).
#include "ir/ops.h"
#include "support/error.h"
#include "support/text.h"

namespace mf {
namespace {

std::vector<IterDomain*> axesOf(const TensorView* tv) { return tv->logicalNoReductions(); }
int64_t rankOf(const TensorView* tv) { return static_cast<int64_t>(axesOf(tv).size()); }

std::string shapeOf(const TensorView* tv) {
  std::vector<std::string> extents;
  for (const IterDomain* id : axesOf(tv)) extents.push_back(id->extent().toString());
  return listText(extents);
}

IterDomain* copyOf(Fusion& f, const IterDomain* id) { return f.newIterDomain(id->extent(), id->iterType()); }

IterDomain* axisOfExtent(Fusion& f, int64_t extent) {
  return f.newIterDomain(Extent{extent, ""}, extent == 1 ? IterType::Broadcast : IterType::Iteration);
}

std::vector<IterDomain*> copiesOf(Fusion& f, const TensorView* tv) {
  std::vector<IterDomain*> ids;
  for (const IterDomain* id : axesOf(tv)) ids.push_back(copyOf(f, id));
  return ids;
}

Fusion& fusionOf(const char* op, const std::vector<TensorView*>& tvs) {
  Fusion* f = tvs.at(0)->fusion();
  for (size_t i = 1; i < tvs.size(); ++i) {
    MF_USER_ARG_CHECK(tvs[i]->fusion() == f, op, ": operand ", i, " (", tvs[i]->label(),
                      ") belongs to another fusion definition than operand 0 (", tvs[0]->label(),
                      "); an op takes values of one definition");
  }
  return *f;
}

// `dim` of x normalized (negative counts from the end).
int64_t normalizedDim(const char* op, const TensorView* x, int64_t dim) {
  const int64_t rank = rankOf(x);
  const int64_t d = dim < 0 ? dim + rank : dim;
  MF_USER_ARG_CHECK(rank > 0 && d >= 0 && d < rank, op, ": dim ", dim, " is out of range for ", x->label(),
                    " of shape ", shapeOf(x), "; expected [", -rank, ", ", rank, ")");
  return d;
}

void requireIndexDtype(const char* op, const char* what, const TensorView* index) {
  MF_USER_ARG_CHECK(index->dtype() == DataType::Int || index->dtype() == DataType::Int32, op, ": ", what, " ",
                    index->label(), " must be int64 or int32; got ", toString(index->dtype()));
}

// scatter / index_add write src's values into x: one dtype.
void requireSrcDtype(const char* op, const TensorView* src, const TensorView* x) {
  MF_USER_ARG_CHECK(src->dtype() == x->dtype(), op, ": src ", src->label(), " has dtype ", toString(src->dtype()),
                    " but the input ", x->label(), " has ", toString(x->dtype()), "; they must agree");
}

void requireRank(const char* op, const char* what, const TensorView* tv, int64_t rank) {
  MF_USER_ARG_CHECK(rankOf(tv) == rank, op, ": ", what, " ", tv->label(), " has shape ", shapeOf(tv),
                    " (", rankOf(tv), "-D); expected ", rank, "-D");
}

// Axis `a` of `t` must hold exactly (`exact`) or at most `limit`'s axis `b` (when both are known);
// equal symbolic extents are unified.
void requireExtent(Fusion& f, const char* op, const char* what_t, const TensorView* t, int64_t a, const char* what_l,
                   const TensorView* limit, int64_t b, bool exact) {
  const Extent& et = axesOf(t)[a]->extent();
  const Extent& el = axesOf(limit)[b]->extent();
  if (et.isConst() && el.isConst()) {
    MF_USER_CHECK(exact ? et.value == el.value : et.value <= el.value, op, ": ", what_t, " ", t->label(), " has ",
                  et.value, " at axis ", a, " (shape ", shapeOf(t), "); expected ", exact ? "" : "at most ", el.value,
                  ", the extent of ", what_l, " ", limit->label(), " at axis ", b, " (shape ", shapeOf(limit), ")");
  } else if (exact && !et.isConst() && !el.isConst()) {
    f.unifySymbols(et.symbol, el.symbol);
  }
}

}  // namespace

TensorView* groupedMm(TensorView* mat1, TensorView* mat2, TensorView* offsets) {
  const char* op = "grouped_mm";
  Fusion& f = offsets ? fusionOf(op, {mat1, mat2, offsets}) : fusionOf(op, {mat1, mat2});
  const int64_t r1 = rankOf(mat1), r2 = rankOf(mat2);
  MF_USER_ARG_CHECK(isFloatingPoint(mat1->dtype()) && mat1->dtype() == mat2->dtype(), op, ": mat1 ", mat1->label(),
                    " (", toString(mat1->dtype()), ") and mat2 ", mat2->label(), " (", toString(mat2->dtype()),
                    ") must have one floating-point dtype");
  MF_USER_ARG_CHECK((r1 == 2 || r1 == 3) && (r2 == 2 || r2 == 3) && !(r1 == 3 && r2 == 2), op, ": mat1 ",
                    mat1->label(), " has shape ", shapeOf(mat1), " and mat2 ", mat2->label(), " has shape ",
                    shapeOf(mat2), "; expected 2-D x 3-D (offsets split mat1's rows), 3-D x 3-D (no offsets) or "
                    "2-D x 2-D (offsets split the contraction)");
  const bool batched = r1 == 3 && r2 == 3;
  MF_USER_ARG_CHECK(batched == (offsets == nullptr), op, ": ",
                    batched ? "3-D x 3-D takes no offsets (each group is a whole matrix); got "
                            : "a 2-D mat1 needs offsets (int32 cumulative group ends); got ",
                    offsets ? offsets->label() : "none");
  requireExtent(f, op, "mat2", mat2, r2 - 2, "mat1", mat1, r1 - 1, /*exact=*/true);  // k
  std::vector<IterDomain*> ids;
  const auto a1 = axesOf(mat1), a2 = axesOf(mat2);
  if (offsets != nullptr) {
    MF_USER_ARG_CHECK(offsets->dtype() == DataType::Int32, op, ": offsets ", offsets->label(),
                      " must be int32; got ", toString(offsets->dtype()));
    requireRank(op, "offsets", offsets, 1);
    if (r2 == 3) requireExtent(f, op, "offsets", offsets, 0, "mat2", mat2, 0, /*exact=*/true);
  }
  if (batched) {
    requireExtent(f, op, "mat2", mat2, 0, "mat1", mat1, 0, /*exact=*/true);
    ids = {copyOf(f, a1[0]), copyOf(f, a1[1]), copyOf(f, a2[2])};
  } else if (r2 == 3) {
    ids = {copyOf(f, a1[0]), copyOf(f, a2[2])};
  }
  if (r2 == 3) {
    // The contraction, as linear's output ends with it: a split of k gives partial sums.
    ids.push_back(f.newIterDomain(a1[r1 - 1]->extent(), IterType::Reduction));
  } else {
    ids = {copyOf(f, axesOf(offsets)[0]), copyOf(f, a1[0]), copyOf(f, a2[1])};
  }
  TensorView* out = f.newTensor(mat1->dtype(), ids);
  std::vector<Val*> ins = {mat1, mat2};
  if (offsets != nullptr) ins.push_back(offsets);
  f.newExpr(OpType::GroupedMm, ins, {out});
  return out;
}

std::pair<TensorView*, TensorView*> topk(TensorView* x, int64_t k, int64_t dim, bool largest, bool sorted) {
  const char* op = "topk";
  Fusion& f = *x->fusion();
  const int64_t d = normalizedDim(op, x, dim);
  MF_USER_ARG_CHECK(x->dtype() != DataType::Bool, op, ": ", x->label(), " is bool; topk needs numbers");
  const Extent& n = axesOf(x)[d]->extent();
  MF_USER_ARG_CHECK(k >= 0 && (!n.isConst() || k <= n.value), op, ": k = ", k, " is out of range for axis ", d, " of ",
                    x->label(), " (shape ", shapeOf(x), "); expected 0 <= k <= ", n.toString());
  std::vector<IterDomain*> values = copiesOf(f, x), indices = copiesOf(f, x);
  values[d] = axisOfExtent(f, k);
  indices[d] = axisOfExtent(f, k);
  TensorView* v = f.newTensor(x->dtype(), values);
  TensorView* i = f.newTensor(DataType::Int, indices);
  f.newExpr(OpType::Topk, {x}, {v, i}, {{"k", k}, {"dim", d}, {"largest", largest}, {"sorted", sorted}});
  return {v, i};
}

namespace {
Attributes sortAttrs(const char* op, const TensorView* x, int64_t dim, bool descending, bool stable) {
  MF_USER_ARG_CHECK(x->dtype() != DataType::Bool, op, ": ", x->label(), " is bool; ", op, " needs numbers");
  return {{"dim", normalizedDim(op, x, dim)}, {"descending", descending}, {"stable", stable}};
}
}  // namespace

std::pair<TensorView*, TensorView*> sort(TensorView* x, int64_t dim, bool descending, bool stable) {
  Attributes attrs = sortAttrs("sort", x, dim, descending, stable);
  Fusion& f = *x->fusion();
  TensorView* v = f.newTensor(x->dtype(), copiesOf(f, x));
  TensorView* i = f.newTensor(DataType::Int, copiesOf(f, x));
  f.newExpr(OpType::Sort, {x}, {v, i}, attrs);
  return {v, i};
}

TensorView* argsort(TensorView* x, int64_t dim, bool descending, bool stable) {
  Attributes attrs = sortAttrs("argsort", x, dim, descending, stable);
  Fusion& f = *x->fusion();
  TensorView* i = f.newTensor(DataType::Int, copiesOf(f, x));
  f.newExpr(OpType::Argsort, {x}, {i}, attrs);
  return i;
}

TensorView* indexSelect(TensorView* x, int64_t dim, TensorView* index) {
  const char* op = "index_select";
  Fusion& f = fusionOf(op, {x, index});
  const int64_t axis = normalizedDim(op, x, dim);
  requireIndexDtype(op, "index", index);
  requireRank(op, "index", index, 1);
  std::vector<IterDomain*> ids = copiesOf(f, x);
  ids[axis] = copyOf(f, axesOf(index)[0]);
  TensorView* out = f.newTensor(x->dtype(), ids);
  f.newExpr(OpType::IndexSelect, {x, index}, {out}, {{"dim", axis}});
  return out;
}

TensorView* gather(TensorView* x, int64_t dim, TensorView* index, bool exact_extents) {
  const char* op = exact_extents ? "take_along_axis" : "gather";
  Fusion& f = fusionOf(op, {x, index});
  const int64_t axis = normalizedDim(op, x, dim);
  requireIndexDtype(op, "index", index);
  requireRank(op, "index", index, rankOf(x));
  for (int64_t a = 0; a < rankOf(x); ++a) {
    if (a != axis) requireExtent(f, op, "index", index, a, "input", x, a, exact_extents);
  }
  TensorView* out = f.newTensor(x->dtype(), copiesOf(f, index));
  f.newExpr(OpType::GatherAlong, {x, index}, {out}, {{"dim", axis}});
  return out;
}

namespace {
// scatter and scatter_reduce: index of x's rank, at most src's extents, and at most x's off `dim`.
TensorView* scatterLike(const char* op, OpType type, TensorView* x, int64_t dim, TensorView* index, TensorView* src,
                        Attributes attrs) {
  Fusion& f = fusionOf(op, {x, index, src});
  const int64_t axis = normalizedDim(op, x, dim);
  attrs.set("dim", axis);
  requireIndexDtype(op, "index", index);
  requireRank(op, "index", index, rankOf(x));
  requireRank(op, "src", src, rankOf(x));
  requireSrcDtype(op, src, x);
  for (int64_t a = 0; a < rankOf(x); ++a) {
    requireExtent(f, op, "index", index, a, "src", src, a, /*exact=*/false);
    if (a != axis) requireExtent(f, op, "index", index, a, "input", x, a, /*exact=*/false);
  }
  TensorView* out = f.newTensor(x->dtype(), copiesOf(f, x));
  f.newExpr(type, {x, index, src}, {out}, attrs);
  return out;
}
}  // namespace

TensorView* scatter(TensorView* x, int64_t dim, TensorView* index, TensorView* src) {
  return scatterLike("scatter", OpType::Scatter, x, dim, index, src, Attributes{});
}

TensorView* scatterReduce(TensorView* x, int64_t dim, TensorView* index, TensorView* src, const std::string& reduce,
                          bool include_self) {
  const char* op = "scatter_reduce";
  ScatterReduction r;
  MF_USER_ARG_CHECK(parseScatterReduction(reduce, r), op, ": reduce is '", reduce,
                    "'; expected one of sum, prod, mean, amax, amin (PyTorch's names)");
  MF_USER_ARG_CHECK(x->dtype() != DataType::Bool, op, ": ", x->label(), " is bool; scatter_reduce needs numbers");
  return scatterLike(op, OpType::ScatterReduce, x, dim, index, src,
                     {{"reduce", std::string(toString(r))}, {"include_self", include_self}});
}

TensorView* indexAdd(TensorView* x, int64_t dim, TensorView* index, TensorView* src) {
  const char* op = "index_add";
  Fusion& f = fusionOf(op, {x, index, src});
  const int64_t axis = normalizedDim(op, x, dim);
  requireIndexDtype(op, "index", index);
  requireRank(op, "index", index, 1);
  requireRank(op, "src", src, rankOf(x));
  requireSrcDtype(op, src, x);
  for (int64_t a = 0; a < rankOf(x); ++a) {
    if (a == axis) requireExtent(f, op, "src", src, a, "index", index, 0, /*exact=*/true);
    else requireExtent(f, op, "src", src, a, "input", x, a, /*exact=*/true);
  }
  TensorView* out = f.newTensor(x->dtype(), copiesOf(f, x));
  f.newExpr(OpType::IndexAdd, {x, index, src}, {out}, {{"dim", axis}});
  return out;
}

TensorView* cumsum(TensorView* x, int64_t dim, std::optional<DataType> dtype) {
  const char* op = "cumsum";
  Fusion& f = *x->fusion();
  const int64_t axis = normalizedDim(op, x, dim);
  // As torch.cumsum: integers and bool accumulate in int64 unless a dtype is given.
  const DataType out_dtype = dtype.value_or(isFloatingPoint(x->dtype()) ? x->dtype() : DataType::Int);
  TensorView* out = f.newTensor(out_dtype, copiesOf(f, x));
  f.newExpr(OpType::Cumsum, {x}, {out}, {{"dtype", out_dtype}, {"dim", axis}});
  return out;
}

TensorView* bincount(TensorView* x, int64_t minlength) {
  const char* op = "bincount";
  Fusion& f = *x->fusion();
  requireIndexDtype(op, "input", x);
  requireRank(op, "input", x, 1);
  MF_USER_ARG_CHECK(minlength >= 1, op, ": minlength is ", minlength,
                    "; expected >= 1 (the output has exactly minlength bins, e.g. the number of experts)");
  TensorView* out = f.newTensor(DataType::Int, {axisOfExtent(f, minlength)});
  f.newExpr(OpType::Bincount, {x}, {out}, {{"minlength", minlength}});
  return out;
}

}  // namespace mf
