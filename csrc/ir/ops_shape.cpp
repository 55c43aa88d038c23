// Builders of ops that query or change shapes: size/shape, reshape, slice, pad, cat, stride_order,
// broadcast_in_dim to runtime extents.
// Symbolic extents they derive are extent expressions (ir/extent_expr.h), evaluated at run time.
#include <algorithm>
#include <set>

#include "ir/extent_expr.h"
#include "ir/ops.h"
#include "support/error.h"
#include "support/text.h"

namespace mf {
namespace {

IterDomain* freshLike(Fusion& f, const IterDomain* id) { return f.newIterDomain(id->extent(), id->iterType()); }

IterDomain* axisOfExtent(Fusion& f, const Extent& e) {
  bool one = e.isConst() && e.value == 1;
  return f.newIterDomain(e, one ? IterType::Broadcast : IterType::Iteration);
}

std::string shapeString(const TensorView* tv) {
  std::vector<std::string> extents;
  for (const IterDomain* id : tv->logicalNoReductions()) extents.push_back(id->extent().toString());
  return listText(extents);
}

int64_t normalizeDim(int64_t d, int64_t rank, const char* op, const TensorView* x) {
  int64_t a = d < 0 ? d + rank : d;
  MF_USER_ARG_CHECK(a >= 0 && a < rank, op, ": dim ", d, " is out of range for ", x->toString(), " of rank ", rank);
  return a;
}

// The value of an integer constant scalar (which may be negative, unlike an Extent), else nullopt.
std::optional<int64_t> intConstant(const Val* v) {
  if (v->isTensor()) return std::nullopt;
  auto* s = static_cast<const Scalar*>(v);
  if (!s->value() || !isIntegral(s->dtype())) return std::nullopt;
  return static_cast<int64_t>(*s->value());
}

// An extent given as a Val: a non-negative integer constant, an integer scalar input, or a
// tensor's extent.
Extent extentOfVal(const Val* v, const char* op, const std::string& what) {
  MF_USER_ARG_CHECK(!v->isTensor(), op, ": ", what, " must be an int or a scalar; got tensor ", v->toString());
  auto* s = static_cast<const Scalar*>(v);
  MF_USER_ARG_CHECK(isIntegral(s->dtype()), op, ": ", what, " must be an integer; got a ", toString(s->dtype()),
                    " scalar ", s->toString());
  if (s->value()) {
    MF_USER_ARG_CHECK(*s->value() >= 0, op, ": ", what, " is ", *s->value(), "; expected a non-negative extent");
    return extentConst(static_cast<int64_t>(*s->value()));
  }
  if (s->isExtent()) return Extent{-1, s->extent()};
  MF_USER_ARG_CHECK(s->fusion()->isInput(s), op, ": ", what, " ", s->toString(), " is neither a constant nor an input");
  return Extent{-1, s->toString()};  // bound to the scalar input's value at run time
}

// A Val holding extent `e`: a constant or an extent scalar.
Scalar* scalarOfExtent(Fusion& f, const Extent& e) {
  if (e.isConst()) return f.newScalar(DataType::Int, static_cast<double>(e.value));
  return f.newScalar(DataType::Int, std::nullopt, e.symbol);
}

TensorView* reshapeTo(TensorView* x, std::vector<std::optional<Extent>> shape) {
  Fusion& f = *x->fusion();
  Extent total = extentConst(1);
  for (IterDomain* id : x->logicalNoReductions()) total = extentMul(total, id->extent());
  int64_t infer = -1;
  Extent given = extentConst(1);
  for (size_t i = 0; i < shape.size(); ++i) {
    if (!shape[i]) {
      MF_USER_ARG_CHECK(infer < 0, "reshape: at most one -1 in the new shape of ", x->toString());
      infer = static_cast<int64_t>(i);
      continue;
    }
    MF_USER_ARG_CHECK(!shape[i]->isConst() || shape[i]->value > 0, "reshape: new shape axis ", i, " has extent ",
                      shape[i]->value);
    given = extentMul(given, *shape[i]);
  }
  if (total.isConst() && given.isConst()) {
    if (infer >= 0) {
      MF_USER_ARG_CHECK(total.value % given.value == 0, "reshape: cannot infer -1 for ", x->toString(), " of shape ",
                        shapeString(x), " into ", given.value, "-element pieces");
    } else {
      MF_USER_ARG_CHECK(given.value == total.value, "reshape: ", x->toString(), " has shape ", shapeString(x), " (",
                        total.value, " elements) but the new shape has ", given.value, " elements");
    }
  }
  if (infer >= 0) shape[infer] = extentQuotient(f, total, given);
  std::vector<IterDomain*> ids;
  Ints global_shape;
  for (const auto& e : shape) {
    ids.push_back(axisOfExtent(f, *e));
    global_shape.push_back(e->isConst() ? e->value : -1);
  }
  TensorView* out = f.newTensor(x->dtype(), ids);
  f.newExpr(OpType::Reshape, {x}, {out}, {{"shape", global_shape}});
  return out;
}

}  // namespace

Scalar* size(TensorView* x, int64_t dim) {
  auto ids = x->logicalNoReductions();
  int64_t a = normalizeDim(dim, static_cast<int64_t>(ids.size()), "size", x);
  return scalarOfExtent(*x->fusion(), ids[a]->extent());
}

std::vector<Scalar*> shape(TensorView* x) {
  std::vector<Scalar*> r;
  for (size_t a = 0; a < x->logicalNoReductions().size(); ++a) r.push_back(size(x, static_cast<int64_t>(a)));
  return r;
}

TensorView* reshape(TensorView* x, const std::vector<int64_t>& shape) {
  std::vector<std::optional<Extent>> extents;
  for (int64_t s : shape) {
    MF_USER_ARG_CHECK(s == -1 || s > 0, "reshape: new shape of ", x->toString(), " has extent ", s,
                      "; expected -1 (inferred) or a positive extent");
    extents.push_back(s == -1 ? std::nullopt : std::optional<Extent>(extentConst(s)));
  }
  return reshapeTo(x, extents);
}

TensorView* reshapeExtents(TensorView* x, const std::vector<Val*>& shape) {
  std::vector<std::optional<Extent>> extents;
  for (size_t i = 0; i < shape.size(); ++i) {
    std::optional<int64_t> c = intConstant(shape[i]);
    MF_USER_ARG_CHECK(!c || *c == -1 || *c > 0, "reshape: new shape of ", x->toString(), " has extent ", *c,
                      " at axis ", i, "; expected -1 (inferred) or a positive extent");
    if (c && *c == -1) extents.push_back(std::nullopt);
    else extents.push_back(extentOfVal(shape[i], "reshape", mf::str("new shape axis ", i)));
  }
  return reshapeTo(x, extents);
}

TensorView* slice(TensorView* x, const std::vector<Val*>& starts, const std::vector<Val*>& ends,
                  const std::vector<int64_t>& strides_in, bool normalize) {
  Fusion& f = *x->fusion();
  auto in_ids = x->logicalNoReductions();
  size_t rank = in_ids.size();
  MF_USER_ARG_CHECK(starts.size() == rank && ends.size() == rank, "slice: ", x->toString(), " has ", rank,
                    " axes but start_indices has ", starts.size(), " and end_indices ", ends.size(), " entries");
  std::vector<int64_t> strides = strides_in.empty() ? std::vector<int64_t>(rank, 1) : strides_in;
  MF_USER_ARG_CHECK(strides.size() == rank, "slice: ", x->toString(), " has ", rank, " axes but strides has ",
                    strides.size(), " entries");
  std::vector<Val*> operands = {x};
  std::vector<IterDomain*> ids;
  for (size_t a = 0; a < rank; ++a) {
    MF_USER_ARG_CHECK(strides[a] > 0, "slice: axis ", a, " of ", x->toString(), " has stride ", strides[a],
                      "; strides must be positive");
    const Extent& extent = in_ids[a]->extent();
    Extent bounds[2];
    const Val* given[2] = {starts[a], ends[a]};
    for (int k = 0; k < 2; ++k) {
      std::optional<int64_t> c = intConstant(given[k]);
      if (!c) {
        bounds[k] = extentOfVal(given[k], "slice", mf::str(k == 0 ? "start" : "end", " of axis ", a));
        // A runtime bound: normalized when the call binds it (extent_expr.h, sliceIndex), unless
        // it is the axis's own extent or a constant, already in range.
        if (normalize && !bounds[k].isConst() && !(bounds[k] == extent)) {
          bounds[k] = extentSliceIndex(bounds[k], extent);
        }
      } else if (extent.isConst()) {
        // PyTorch's normalization of a static bound: negative counts from the end; clamped.
        bounds[k] = extentConst(std::clamp<int64_t>(*c < 0 ? *c + extent.value : *c, 0, extent.value));
      } else if (normalize && *c != 0) {
        // A constant on a symbolic axis: clamped when the extent is bound.
        bounds[k] = *c < 0 ? extentMax(extentSub(extent, extentConst(-*c)), extentConst(0))
                           : extentMin(extentConst(*c), extent);
      } else {
        bounds[k] = *c < 0 ? extentSub(extent, extentConst(-*c)) : extentConst(*c);
      }
    }
    if (bounds[0].isConst() && bounds[1].isConst() && bounds[1].value < bounds[0].value) bounds[1] = bounds[0];
    // An end before the start is an empty axis, as in PyTorch.
    // (A normalized start is at most the extent, so an end equal to the extent needs no guard.)
    if (normalize && !(bounds[0].isConst() && bounds[0].value == 0) && !(bounds[1] == extent)) {
      bounds[1] = extentMax(bounds[1], bounds[0]);
    }
    Extent length = extentSub(bounds[1], bounds[0]);
    Extent out_extent = length.isConst() ? extentConst((length.value + strides[a] - 1) / strides[a])
                                         : extentCeilDiv(length, strides[a]);
    bool whole = bounds[0].isConst() && bounds[0].value == 0 && bounds[1] == extent && strides[a] == 1;
    ids.push_back(whole ? freshLike(f, in_ids[a]) : axisOfExtent(f, out_extent));
    for (const Extent& b : bounds) operands.push_back(scalarOfExtent(f, b));
  }
  TensorView* out = f.newTensor(x->dtype(), ids);
  f.newExpr(OpType::Slice, operands, {out}, {{"strides", strides}});
  return out;
}

TensorView* pad(TensorView* x, const std::vector<int64_t>& pad_widths, Val* value) {
  Fusion& f = *x->fusion();
  auto in_ids = x->logicalNoReductions();
  size_t rank = in_ids.size();
  MF_USER_ARG_CHECK(pad_widths.size() % 2 == 0 && pad_widths.size() <= 2 * rank, "pad: pad_widths has ",
                    pad_widths.size(), " entries; expected pairs (last axis first) for at most the ", rank, " axes of ",
                    x->toString());
  if (value == nullptr) value = f.newScalar(isFloatingPoint(x->dtype()) ? DataType::Double : DataType::Int, 0.0);
  MF_USER_ARG_CHECK(!value->isTensor(), "pad: value must be a scalar; got tensor ", value->toString());
  std::vector<IterDomain*> ids;
  for (size_t a = 0; a < rank; ++a) {
    size_t from_last = rank - 1 - a;
    if (2 * from_last >= pad_widths.size()) {
      ids.push_back(freshLike(f, in_ids[a]));
      continue;
    }
    int64_t lo = pad_widths[2 * from_last], hi = pad_widths[2 * from_last + 1];
    const Extent& e = in_ids[a]->extent();
    MF_USER_ARG_CHECK(!e.isConst() || e.value + lo + hi >= 0, "pad: axis ", a, " of ", x->toString(), " has extent ",
                      e.value, "; widths ", lo, " and ", hi, " would make it negative");
    Extent padded = lo + hi >= 0 ? extentAdd(e, extentConst(lo + hi)) : extentSub(e, extentConst(-(lo + hi)));
    ids.push_back(lo == 0 && hi == 0 ? freshLike(f, in_ids[a]) : axisOfExtent(f, padded));
  }
  TensorView* out = f.newTensor(x->dtype(), ids);
  f.newExpr(OpType::Pad, {x, value}, {out}, {{"pad_widths", pad_widths}});
  return out;
}

TensorView* cat(const std::vector<TensorView*>& xs, int64_t dim) {
  MF_USER_ARG_CHECK(!xs.empty(), "cat: needs at least one tensor");
  Fusion& f = *xs[0]->fusion();
  auto first = xs[0]->logicalNoReductions();
  int64_t rank = static_cast<int64_t>(first.size());
  int64_t axis = normalizeDim(dim, rank, "cat", xs[0]);
  DataType dtype = xs[0]->dtype();
  Extent total = extentConst(0);
  for (size_t k = 0; k < xs.size(); ++k) {
    auto ids = xs[k]->logicalNoReductions();
    MF_USER_ARG_CHECK(static_cast<int64_t>(ids.size()) == rank, "cat: tensor ", k, " (", xs[k]->toString(), ") has ",
                      ids.size(), " axes but tensor 0 (", xs[0]->toString(), ") has ", rank);
    dtype = promote(dtype, xs[k]->dtype());
    total = extentAdd(total, ids[axis]->extent());
    for (int64_t a = 0; a < rank; ++a) {
      if (a == axis) continue;
      const Extent &e0 = first[a]->extent(), &e = ids[a]->extent();
      MF_USER_CHECK(!(e0.isConst() && e.isConst() && e0.value != e.value), "cat: tensor ", k, " (", xs[k]->toString(),
                    ") has extent ", e.value, " at axis ", a, " but tensor 0 has ", e0.value,
                    "; all axes but the concatenated one (", axis, ") must match");
      if (!e0.isConst() && !e.isConst()) f.unifySymbols(e0.symbol, e.symbol);
    }
  }
  std::vector<IterDomain*> ids;
  for (int64_t a = 0; a < rank; ++a) {
    if (a == axis) {
      ids.push_back(xs.size() == 1 ? freshLike(f, first[a]) : axisOfExtent(f, total));
      continue;
    }
    const IterDomain* pick = first[a];
    for (TensorView* x : xs) {
      const IterDomain* id = x->logicalNoReductions()[a];
      if (!pick->extent().isConst() && id->extent().isConst()) pick = id;
    }
    ids.push_back(freshLike(f, pick));
  }
  TensorView* out = f.newTensor(dtype, ids);
  f.newExpr(OpType::Cat, std::vector<Val*>(xs.begin(), xs.end()), {out}, {{"dim", axis}});
  return out;
}

TensorView* broadcastInDimExtents(TensorView* x, const std::vector<Val*>& shape, const std::vector<int64_t>& bdims) {
  const char* op = "broadcast_in_dim";
  std::vector<int64_t> ints;
  for (const Val* v : shape) {
    if (std::optional<int64_t> c = intConstant(v)) ints.push_back(*c);
  }
  if (ints.size() == shape.size()) return broadcastInDim(x, ints, bdims);
  Fusion& f = *x->fusion();
  auto in_ids = x->logicalNoReductions();
  MF_USER_ARG_CHECK(bdims.size() == in_ids.size(), op, ": broadcast_dims has ", bdims.size(), " entries but ",
                    x->toString(), " has ", in_ids.size(), " axes");
  // Each output extent: nullopt keeps the input's (-1), else a constant or a runtime extent.
  std::vector<std::optional<Extent>> want;
  for (size_t o = 0; o < shape.size(); ++o) {
    std::optional<int64_t> c = intConstant(shape[o]);
    if (c && *c == -1) want.push_back(std::nullopt);
    else want.push_back(extentOfVal(shape[o], op, mf::str("shape axis ", o)));
  }
  std::vector<IterDomain*> ids(shape.size(), nullptr);
  for (size_t i = 0; i < bdims.size(); ++i) {
    const int64_t o = bdims[i];
    MF_USER_ARG_CHECK(o >= 0 && o < static_cast<int64_t>(shape.size()), op, ": broadcast_dims[", i, "] = ", o,
                      " is out of range for an output of rank ", shape.size());
    MF_USER_ARG_CHECK(i == 0 || bdims[i] > bdims[i - 1], op, ": broadcast_dims must be increasing");
    const IterDomain* id = in_ids[i];
    const std::optional<Extent>& e = want[o];
    if (!e || (e->isConst() && e->value == 1 && id->isBroadcast()) || *e == id->extent()) {
      ids[o] = freshLike(f, id);
    } else if (id->isBroadcast()) {
      // Expanded to the given extent (a runtime one is an axis of that extent holding copies).
      ids[o] = f.newIterDomain(*e, e->isConst() ? IterType::Broadcast : IterType::Iteration);
    } else {
      MF_USER_ARG_CHECK(!(e->isConst() && id->extent().isConst()), op, ": input axis ", i, " of ", x->toString(),
                        " has extent ", id->extent().toString(), " but output axis ", o, " asks for ", e->toString());
      // A runtime extent over a non-broadcast axis must be that axis's extent (checked when it runs).
      if (!e->isConst() && !id->extent().isConst()) f.unifySymbols(id->extent().symbol, e->symbol);
      ids[o] = e->isConst() ? f.newIterDomain(*e, id->iterType()) : freshLike(f, id);
    }
  }
  Ints attr_shape;
  for (size_t o = 0; o < shape.size(); ++o) {
    const std::optional<Extent>& e = want[o];
    attr_shape.push_back(e && e->isConst() ? e->value : -1);
    if (ids[o] != nullptr) continue;
    MF_USER_ARG_CHECK(e.has_value(), op, ": new output axis ", o, " needs an extent; got -1");
    ids[o] = e->isConst() ? f.newIterDomain(*e, IterType::Broadcast) : f.newIterDomain(*e, IterType::Iteration);
  }
  TensorView* out = f.newTensor(x->dtype(), ids);
  f.newExpr(OpType::BroadcastInDim, {x}, {out}, {{"shape", attr_shape}, {"broadcast_dims", bdims}});
  return out;
}

TensorView* strideOrder(TensorView* x, const std::vector<int64_t>& stride_order) {
  Fusion& f = *x->fusion();
  auto in_ids = x->logicalNoReductions();
  MF_USER_ARG_CHECK(stride_order.size() == in_ids.size(), "stride_order: ", x->toString(), " has ", in_ids.size(),
                    " axes but stride_order has ", stride_order.size(), " entries");
  std::vector<int64_t> sorted = stride_order;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    MF_USER_ARG_CHECK(sorted[i] == static_cast<int64_t>(i), "stride_order: ", listText(stride_order),
                      " is not a permutation of 0..", static_cast<int64_t>(sorted.size()) - 1);
  }
  std::vector<IterDomain*> ids;
  for (IterDomain* id : in_ids) ids.push_back(freshLike(f, id));
  TensorView* out = f.newTensor(x->dtype(), ids);
  out->setStrideOrder(stride_order);
  f.newExpr(OpType::StrideOrder, {x}, {out}, {{"stride_order", stride_order}});
  return out;
}

}  // namespace mf
