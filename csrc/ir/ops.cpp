#include "ir/ops.h"

#include <algorithm>
#include <set>

#include "support/counter_rng.h"
#include "support/error.h"

namespace mf {
namespace {

IterDomain* freshLike(Fusion& f, const IterDomain* id, IterType type) { return f.newIterDomain(id->extent(), type); }

TensorView* newOutput(Fusion& f, DataType dtype, const std::vector<IterDomain*>& ids) { return f.newTensor(dtype, ids); }

// The fusion all operands belong to (checked before an op touches any of them).
Fusion& fusionOf(std::initializer_list<Val*> vals) {
  Fusion* f = nullptr;
  for (Val* v : vals) {
    if (v == nullptr) continue;
    if (f == nullptr) f = v->fusion();
    MF_USER_ARG_CHECK(v->fusion() == f, "operand ", v->toString(), " belongs to another fusion definition than ",
                      "the other operands; an op takes values of one definition");
  }
  MF_CHECK(f != nullptr, "op without operands");
  return *f;
}

}  // namespace

TensorView* defineTensor(Fusion& f, const std::vector<int64_t>& shape, DataType dtype,
                         const std::vector<bool>& contiguity, const std::vector<int64_t>& stride_order) {
  std::vector<IterDomain*> ids;
  for (size_t i = 0; i < shape.size(); ++i) {
    int64_t s = shape[i];
    MF_USER_ARG_CHECK(s == -1 || s >= 0, "define_tensor: axis ", i, " has extent ", s, "; expected -1 (symbolic) or >= 0");
    if (s == -1) ids.push_back(f.newIterDomain(f.newSymbol(), IterType::Iteration));
    else ids.push_back(f.newIterDomain(Extent{s, ""}, s == 1 ? IterType::Broadcast : IterType::Iteration));
  }
  MF_USER_ARG_CHECK(contiguity.empty() || contiguity.size() == shape.size(), "define_tensor: contiguity has ",
                    contiguity.size(), " entries but the shape has ", shape.size(), " axes");
  if (!stride_order.empty()) {
    MF_USER_ARG_CHECK(stride_order.size() == shape.size(), "define_tensor: stride_order has ", stride_order.size(),
                      " entries but the shape has ", shape.size(), " axes");
    std::vector<int64_t> sorted = stride_order;
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < sorted.size(); ++i) {
      MF_USER_ARG_CHECK(sorted[i] == static_cast<int64_t>(i), "define_tensor: stride_order must be a permutation of 0..",
                        shape.size() - 1);
    }
  }
  TensorView* tv = f.newTensor(dtype, ids);
  tv->setContiguity(contiguity);
  tv->setStrideOrder(stride_order);
  f.addInput(tv);
  return tv;
}

Scalar* defineScalar(Fusion& f, DataType dtype, std::optional<double> value) {
  Scalar* s = f.newScalar(dtype, value);
  if (!value.has_value()) f.addInput(s);
  return s;
}

TensorView* unaryOp(OpType op, TensorView* x) {
  const OpInfo& info = opInfo(op);
  MF_CHECK(info.kind == OpKind::Unary && info.dtype_rule != DtypeRule::Attribute, "not a unary op: ", info.name);
  Fusion& f = *x->fusion();
  std::vector<IterDomain*> ids;
  for (IterDomain* id : x->logicalNoReductions()) ids.push_back(freshLike(f, id, id->iterType()));
  DataType dt = x->dtype();
  if (info.dtype_rule == DtypeRule::FloatIfIntegral && !isFloatingPoint(dt)) dt = DataType::Float;
  TensorView* out = newOutput(f, dt, ids);
  f.newExpr(op, {x}, {out});
  return out;
}

TensorView* castOp(TensorView* x, DataType dtype) {
  Fusion& f = *x->fusion();
  std::vector<IterDomain*> ids;
  for (IterDomain* id : x->logicalNoReductions()) ids.push_back(freshLike(f, id, id->iterType()));
  TensorView* out = newOutput(f, dtype, ids);
  f.newExpr(OpType::Cast, {x}, {out}, {{"dtype", dtype}});
  return out;
}

namespace {
// Output axes of a broadcasting n-ary op. Returns ids; checks constant extents agree.
std::vector<IterDomain*> broadcastShapes(Fusion& f, OpType op, const std::vector<Val*>& operands) {
  size_t rank = 0;
  for (Val* v : operands) {
    if (v->isTensor()) rank = std::max(rank, static_cast<TensorView*>(v)->logicalNoReductions().size());
  }
  std::vector<IterDomain*> out(rank, nullptr);
  for (size_t k = 0; k < rank; ++k) {
    const IterDomain* pick = nullptr;
    for (size_t oi = 0; oi < operands.size(); ++oi) {
      Val* v = operands[oi];
      if (!v->isTensor()) continue;
      auto ids = static_cast<TensorView*>(v)->logicalNoReductions();
      int64_t pos = static_cast<int64_t>(k) - static_cast<int64_t>(rank - ids.size());
      if (pos < 0) continue;
      const IterDomain* id = ids[pos];
      if (pick == nullptr || pick->isBroadcast()) {
        if (pick != nullptr && pick->isBroadcast() && !id->isBroadcast()) pick = id;
        else if (pick == nullptr) pick = id;
        continue;
      }
      if (id->isBroadcast()) continue;
      MF_USER_CHECK(!(pick->extent().isConst() && id->extent().isConst() && pick->extent().value != id->extent().value),
                    toString(op), ": operand ", oi, " (", v->toString(), ") has extent ", id->extent().value,
                    " at output axis ", k, " but another operand has ", pick->extent().value,
                    "; extents must match or be 1");
      if (!pick->extent().isConst() && !id->extent().isConst()) f.unifySymbols(pick->extent().symbol, id->extent().symbol);
      if (!pick->extent().isConst() && id->extent().isConst()) pick = id;
    }
    out[k] = freshLike(f, pick, pick->isBroadcast() ? IterType::Broadcast : IterType::Iteration);
  }
  return out;
}

}  // namespace

DataType resultType(const std::vector<const Val*>& operands) {
  // PyTorch's three tiers: tensors with axes, then 0-dim tensors, then Python scalars (a float
  // scalar counts as the default float32, an integer as int64); a lower tier only matters when it
  // is of a higher category (torch's combine_categories): int32[n] + int64[] stays int32,
  // half[n] + float32[] stays half, int32[n] + float64[] is float64.
  std::optional<DataType> dim_type, zero_type, scalar_type;
  for (const Val* v : operands) {
    auto& slot = !v->isTensor() ? scalar_type
                 : static_cast<const TensorView*>(v)->logicalNoReductions().empty() ? zero_type : dim_type;
    slot = slot ? promote(*slot, v->dtype()) : v->dtype();
  }
  if (!dim_type && !zero_type) return *scalar_type;
  auto combine = [](std::optional<DataType> higher, std::optional<DataType> lower) -> std::optional<DataType> {
    if (!higher) return lower;
    if (!lower || isFloatingPoint(*higher)) return higher;
    if (*higher == DataType::Bool || isFloatingPoint(*lower)) return promote(*higher, *lower);
    return higher;
  };
  std::optional<DataType> wrapped;
  if (scalar_type) wrapped = isFloatingPoint(*scalar_type) ? DataType::Float : isIntegral(*scalar_type) ? DataType::Int : DataType::Bool;
  return *combine(dim_type, combine(zero_type, wrapped));
}

Scalar* extentArithmetic(OpType op, Val* a, Val* b) {
  auto* sa = dynamic_cast<Scalar*>(a);
  auto* sb = dynamic_cast<Scalar*>(b);
  MF_USER_ARG_CHECK(sa && sb, toString(op), ": at least one operand must be a tensor");
  bool extent_op = op == OpType::Add || op == OpType::Sub || op == OpType::Mul;
  MF_USER_ARG_CHECK(extent_op && isIntegral(sa->dtype()) && isIntegral(sb->dtype()), toString(op),
                    ": at least one operand must be a tensor (got ", sa->toString(), " and ", sb->toString(),
                    "); scalar-only arithmetic is supported for add, sub and mul of integers (extents)");
  Fusion& f = *sa->fusion();
  if (sa->value() && sb->value()) {
    double x = *sa->value(), y = *sb->value();
    return f.newScalar(DataType::Int, op == OpType::Add ? x + y : op == OpType::Sub ? x - y : x * y);
  }
  auto text = [](const Scalar* s) {
    // A negative constant as (0-c): extent text has no unary minus ("s1+-2" would not evaluate).
    if (s->value()) {
      const auto c = static_cast<int64_t>(*s->value());
      return c < 0 ? "(0-" + std::to_string(-c) + ")" : std::to_string(c);
    }
    return "(" + (s->isExtent() ? s->extent() : s->toString()) + ")";
  };
  auto usable = [&](const Scalar* s) { return s->value() || s->isExtent() || f.isInput(s); };
  MF_USER_ARG_CHECK(usable(sa) && usable(sb), toString(op), ": scalar operands must be constants, inputs or extents");
  const char* sym = op == OpType::Add ? "+" : op == OpType::Sub ? "-" : "*";
  return f.newScalar(DataType::Int, std::nullopt, text(sa) + sym + text(sb));
}

TensorView* binaryOp(OpType op, Val* a, Val* b) {
  const OpInfo& info = opInfo(op);
  MF_CHECK(info.kind == OpKind::Binary, "not a binary op: ", info.name);
  MF_USER_ARG_CHECK(a->isTensor() || b->isTensor(), info.name, ": at least one operand must be a tensor");
  const bool integer_base = isIntegral(a->dtype()) || a->dtype() == DataType::Bool;
  if (info.refuses_negative_integer_exponent && integer_base && !b->isTensor()) {
    const auto* e = static_cast<const Scalar*>(b);
    MF_USER_ARG_CHECK(!(isIntegral(b->dtype()) && e->value() && *e->value() < 0), "pow: ", a->toString(), " has dtype ",
                      toString(a->dtype()), " and the exponent ", *e->value(),
                      " is a negative integer; integers to negative integer powers are not allowed (as in PyTorch)");
  }
  Fusion& f = fusionOf({a, b});
  std::vector<IterDomain*> ids = broadcastShapes(f, op, {a, b});
  DataType dt = info.dtype_rule == DtypeRule::Bool ? DataType::Bool : resultType({a, b});
  if (info.dtype_rule == DtypeRule::TrueDivide && !isFloatingPoint(dt)) dt = DataType::Float;
  TensorView* out = newOutput(f, dt, ids);
  f.newExpr(op, {a, b}, {out});
  return out;
}

TensorView* whereOp(Val* cond, Val* a, Val* b) {
  MF_USER_ARG_CHECK(cond->isTensor() || a->isTensor() || b->isTensor(), "where: at least one operand must be a tensor");
  // As torch.where: the condition is bool (compare first, e.g. fd.ops.ne(x, 0)), said when the
  // program is defined rather than by ATen when it runs.
  MF_USER_ARG_CHECK(cond->dtype() == DataType::Bool, "where: the condition ", cond->toString(), " has dtype ",
                    toString(cond->dtype()), "; it must be bool");
  Fusion& f = fusionOf({cond, a, b});
  std::vector<IterDomain*> ids = broadcastShapes(f, OpType::Where, {cond, a, b});
  DataType dt = resultType({a, b});
  // Two Python-number branches give PyTorch's default dtype, as torch.where(c, 2.5, -1.0) does.
  if (!a->isTensor() && !b->isTensor() && dt == DataType::Double) dt = DataType::Float;
  TensorView* out = newOutput(f, dt, ids);
  f.newExpr(OpType::Where, {cond, a, b}, {out});
  return out;
}

TensorView* reductionOp(OpType op, TensorView* x, std::vector<int64_t> dims, std::optional<DataType> dtype) {
  MF_CHECK(opInfo(op).kind == OpKind::Reduction, "not a reduction: ", toString(op));
  Fusion& f = *x->fusion();
  auto in_ids = x->logicalNoReductions();
  int64_t rank = static_cast<int64_t>(in_ids.size());
  // nvFuser refuses an empty list; torch.sum(x, dim=[]) would reduce every axis. Neither silently.
  MF_USER_ARG_CHECK(!dims.empty(), toString(op), ": no axis to reduce of ", x->toString(),
                    " (dims is empty; list the axes, all of them to reduce everything)");
  std::set<int64_t> reduced;
  for (int64_t d : dims) {
    int64_t a = d < 0 ? d + rank : d;
    MF_USER_ARG_CHECK(a >= 0 && a < rank, toString(op), ": dim ", d, " is out of range for ", x->toString(), " of rank ", rank);
    MF_USER_ARG_CHECK(reduced.insert(a).second, toString(op), ": dim ", d, " of ", x->toString(), " is given twice");
  }
  DataType dt = dtype.value_or(x->dtype());
  // Like PyTorch, a sum of bool or int32 accumulates in int64 unless a dtype is given.
  if (op == OpType::Sum && !dtype && (x->dtype() == DataType::Bool || x->dtype() == DataType::Int32)) dt = DataType::Int;
  // Like torch.sum(x, dtype=...), each element is converted before it is summed: sum(0.5s,
  // dtype=int32) is 0, not the float sum truncated once (a generated kernel did that).
  if (dtype && *dtype != x->dtype()) {
    x = castOp(x, *dtype);
    in_ids = x->logicalNoReductions();
  }
  std::vector<IterDomain*> ids;
  for (int64_t a = 0; a < rank; ++a) {
    ids.push_back(freshLike(f, in_ids[a], reduced.count(a) ? IterType::Reduction : in_ids[a]->iterType()));
  }
  TensorView* out = newOutput(f, dt, ids);
  f.newExpr(op, {x}, {out}, {{"dims", Ints(reduced.begin(), reduced.end())}});
  return out;
}

TensorView* broadcastInDim(TensorView* x, const std::vector<int64_t>& shape, const std::vector<int64_t>& bdims) {
  Fusion& f = *x->fusion();
  auto in_ids = x->logicalNoReductions();
  MF_USER_ARG_CHECK(bdims.size() == in_ids.size(), "broadcast_in_dim: broadcast_dims has ", bdims.size(),
                    " entries but ", x->toString(), " has ", in_ids.size(), " axes");
  std::vector<IterDomain*> ids(shape.size(), nullptr);
  for (size_t i = 0; i < bdims.size(); ++i) {
    int64_t o = bdims[i];
    MF_USER_ARG_CHECK(o >= 0 && o < static_cast<int64_t>(shape.size()), "broadcast_in_dim: broadcast_dims[", i, "] = ", o,
                      " is out of range for an output of rank ", shape.size());
    MF_USER_ARG_CHECK(i == 0 || bdims[i] > bdims[i - 1], "broadcast_in_dim: broadcast_dims must be increasing");
    const IterDomain* id = in_ids[i];
    // -1 keeps the input's extent (keepdim passes -1 for every kept axis, broadcast ones too).
    bool expand = id->isBroadcast() && shape[o] != 1 && shape[o] != -1;
    MF_USER_ARG_CHECK(expand || shape[o] == -1 || !id->extent().isConst() || id->extent().value == shape[o],
                      "broadcast_in_dim: input axis ", i, " of ", x->toString(), " has extent ", id->extent().toString(),
                      " but output axis ", o, " asks for ", shape[o]);
    MF_USER_ARG_CHECK(!(expand && shape[o] < 0), "broadcast_in_dim: output axis ", o,
                      " expands a broadcast axis and needs a concrete extent; got ", shape[o]);
    if (expand) ids[o] = f.newIterDomain(Extent{shape[o], ""}, IterType::Broadcast);
    // A symbolic input axis under a concrete output extent takes that extent (PyTorch's expand: the
    // input's runtime extent must be it or 1, checked when the program runs).
    else if (!id->extent().isConst() && shape[o] >= 0) ids[o] = f.newIterDomain(Extent{shape[o], ""}, id->iterType());
    else ids[o] = freshLike(f, id, id->iterType());
  }
  for (size_t o = 0; o < shape.size(); ++o) {
    if (ids[o] != nullptr) continue;
    MF_USER_ARG_CHECK(shape[o] >= 0, "broadcast_in_dim: new output axis ", o, " needs a concrete extent; got ", shape[o]);
    ids[o] = f.newIterDomain(Extent{shape[o], ""}, IterType::Broadcast);
  }
  TensorView* out = newOutput(f, x->dtype(), ids);
  f.newExpr(OpType::BroadcastInDim, {x}, {out}, {{"shape", shape}, {"broadcast_dims", bdims}});
  return out;
}

TensorView* squeeze(TensorView* x, std::vector<int64_t> dims) {
  Fusion& f = *x->fusion();
  auto in_ids = x->logicalNoReductions();
  int64_t rank = static_cast<int64_t>(in_ids.size());
  std::set<int64_t> drop;
  for (int64_t d : dims) {
    int64_t a = d < 0 ? d + rank : d;
    MF_USER_ARG_CHECK(a >= 0 && a < rank, "squeeze: dim ", d, " is out of range for ", x->toString(), " of rank ", rank);
    MF_USER_ARG_CHECK(in_ids[a]->extent().isConst() && in_ids[a]->extent().value == 1, "squeeze: axis ", a, " of ",
                      x->toString(), " has extent ", in_ids[a]->extent().toString(), "; only extent-1 axes can be squeezed");
    drop.insert(a);
  }
  std::vector<IterDomain*> ids;
  for (int64_t a = 0; a < rank; ++a) {
    if (!drop.count(a)) ids.push_back(freshLike(f, in_ids[a], in_ids[a]->iterType()));
  }
  TensorView* out = newOutput(f, x->dtype(), ids);
  f.newExpr(OpType::Squeeze, {x}, {out}, {{"dims", Ints(drop.begin(), drop.end())}});
  return out;
}

TensorView* permute(TensorView* x, const std::vector<int64_t>& dims) {
  Fusion& f = *x->fusion();
  auto in_ids = x->logicalNoReductions();
  int64_t rank = static_cast<int64_t>(in_ids.size());
  MF_USER_ARG_CHECK(static_cast<int64_t>(dims.size()) == rank, "permute: ", dims.size(), " dims given for ", x->toString(),
                    " of rank ", rank);
  std::vector<int64_t> norm;
  std::set<int64_t> seen;
  for (int64_t d : dims) {
    int64_t a = d < 0 ? d + rank : d;
    MF_USER_ARG_CHECK(a >= 0 && a < rank && seen.insert(a).second, "permute: dims must be a permutation of 0..", rank - 1);
    norm.push_back(a);
  }
  std::vector<IterDomain*> ids;
  for (int64_t a : norm) ids.push_back(freshLike(f, in_ids[a], in_ids[a]->iterType()));
  TensorView* out = newOutput(f, x->dtype(), ids);
  f.newExpr(OpType::Permute, {x}, {out}, {{"dims", norm}});
  return out;
}

TensorView* matmul(TensorView* a, TensorView* b) {
  Fusion& f = *a->fusion();
  auto ai = a->logicalNoReductions();
  auto bi = b->logicalNoReductions();
  MF_USER_ARG_CHECK(ai.size() >= 1 && bi.size() >= 1, "matmul: operands need at least one axis");
  MF_USER_ARG_CHECK(a->dtype() == b->dtype(), "matmul: operand dtypes differ: ", toString(a->dtype()), " vs ",
                    toString(b->dtype()));
  const IterDomain* ka = ai.back();
  const IterDomain* kb = bi.size() == 1 ? bi[0] : bi[bi.size() - 2];
  MF_USER_CHECK(!(ka->extent().isConst() && kb->extent().isConst() && ka->extent().value != kb->extent().value),
                "matmul: contraction extents differ: ", a->toString(), " has K = ", ka->extent().value, " (last axis), ",
                b->toString(), " has K = ", kb->extent().value);
  if (!ka->extent().isConst() && !kb->extent().isConst()) f.unifySymbols(ka->extent().symbol, kb->extent().symbol);
  std::vector<IterDomain*> ids;
  // Batch axes broadcast like a binary op.
  size_t a_batch = ai.size() >= 2 ? ai.size() - 2 : 0;
  size_t b_batch = bi.size() >= 2 ? bi.size() - 2 : 0;
  size_t batch = std::max(a_batch, b_batch);
  for (size_t k = 0; k < batch; ++k) {
    const IterDomain* pick = nullptr;
    int64_t pa = static_cast<int64_t>(k) - static_cast<int64_t>(batch - a_batch);
    int64_t pb = static_cast<int64_t>(k) - static_cast<int64_t>(batch - b_batch);
    if (pa >= 0) pick = ai[pa];
    if (pb >= 0 && (pick == nullptr || pick->isBroadcast())) pick = bi[pb];
    ids.push_back(freshLike(f, pick, pick->iterType()));
  }
  if (ai.size() >= 2) ids.push_back(freshLike(f, ai[ai.size() - 2], ai[ai.size() - 2]->iterType()));
  if (bi.size() >= 2) ids.push_back(freshLike(f, bi.back(), bi.back()->iterType()));
  ids.push_back(freshLike(f, ka, IterType::Reduction));
  TensorView* out = newOutput(f, a->dtype(), ids);
  f.newExpr(OpType::Matmul, {a, b}, {out});
  return out;
}

TensorView* linear(TensorView* x, TensorView* w, TensorView* bias) {
  Fusion& f = *x->fusion();
  auto xi = x->logicalNoReductions();
  auto wi = w->logicalNoReductions();
  MF_USER_ARG_CHECK(xi.size() >= 1, "linear: input ", x->toString(), " needs at least one axis");
  // A 3-D weight [a, b, k] is the 2-D weight [a*b, k] with its output features split logically
  // (e.g. [d, n/d, k] sharded on its first axis). As in nvFuser, its leading axis leads the output:
  // [a, batch.., b, r{k}].
  MF_USER_ARG_CHECK(wi.size() >= 1 && wi.size() <= 3, "linear: weight ", w->toString(), " must be 1-D, 2-D or 3-D; got ",
                    wi.size(), "-D");
  MF_USER_ARG_CHECK(x->dtype() == w->dtype(), "linear: input and weight dtypes differ: ", toString(x->dtype()), " vs ",
                    toString(w->dtype()));
  const IterDomain* kx = xi.back();
  const IterDomain* kw = wi.back();
  MF_USER_CHECK(!(kx->extent().isConst() && kw->extent().isConst() && kx->extent().value != kw->extent().value),
                "linear: input ", x->toString(), " has in_features ", kx->extent().value, " (last axis) but weight ",
                w->toString(), " has ", kw->extent().value, " (last axis)");
  if (!kx->extent().isConst() && !kw->extent().isConst()) f.unifySymbols(kx->extent().symbol, kw->extent().symbol);
  std::vector<IterDomain*> ids;
  if (wi.size() == 3) ids.push_back(freshLike(f, wi[0], wi[0]->iterType()));
  for (size_t i = 0; i + 1 < xi.size(); ++i) ids.push_back(freshLike(f, xi[i], xi[i]->iterType()));
  if (wi.size() >= 2) ids.push_back(freshLike(f, wi[wi.size() - 2], wi[wi.size() - 2]->iterType()));
  ids.push_back(freshLike(f, kx, IterType::Reduction));
  if (bias != nullptr) {
    auto bi = bias->logicalNoReductions();
    MF_USER_ARG_CHECK(bi.size() <= 1 || bi.size() + 1 == wi.size(), "linear: bias ", bias->toString(),
                      " must be 0-D, 1-D or have the weight's output axes (", wi.size() - 1, "-D); got ", bi.size(), "-D");
    MF_USER_ARG_CHECK(bias->dtype() == x->dtype(), "linear: bias dtype ", toString(bias->dtype()), " differs from input dtype ",
                      toString(x->dtype()));
    if (bi.size() == 1 && wi.size() == 2) {
      MF_USER_CHECK(!(bi[0]->extent().isConst() && wi[0]->extent().isConst() && bi[0]->extent().value != wi[0]->extent().value),
                    "linear: bias ", bias->toString(), " has ", bi[0]->extent().value, " features but weight ", w->toString(),
                    " has out_features ", wi[0]->extent().value);
    }
  }
  TensorView* out = newOutput(f, x->dtype(), ids);
  std::vector<Val*> ins = {x, w};
  if (bias != nullptr) ins.push_back(bias);
  f.newExpr(OpType::Linear, ins, {out});
  return out;
}

}  // namespace mf

namespace mf {
namespace {

// A constant scalar operand's value, or nullopt when it is a runtime input.
std::optional<double> constantOf(const Val* v) { return static_cast<const Scalar*>(v)->value(); }

void checkRngWord(const Val* v, const char* what) {
  MF_USER_ARG_CHECK(!v->isTensor(), "uniform: ", what, " must be a scalar (a Python number or fd.define_scalar); got tensor ",
                    v->toString());
  MF_USER_ARG_CHECK(isIntegral(v->dtype()), "uniform: ", what, " must be an integer scalar; got ", toString(v->dtype()));
  std::optional<double> c = constantOf(v);
  MF_USER_ARG_CHECK(!c || (*c >= 0 && *c < static_cast<double>(kMaxRngSeed)), "uniform: ", what, " is ",
                    static_cast<int64_t>(c.value_or(0)), "; expected an integer in [0, 2^53)");
}

}  // namespace

TensorView* uniform(Val* low, Val* high, const std::vector<int64_t>& shape, DataType dtype, Val* seed, Val* offset) {
  Fusion& f = fusionOf({low, high, seed, offset});
  MF_USER_ARG_CHECK(isFloatingPoint(dtype), "uniform: dtype must be float, half, bfloat16 or double; got ", toString(dtype));
  for (const auto& [v, what] : {std::pair<Val*, const char*>{low, "low"}, {high, "high"}}) {
    MF_USER_ARG_CHECK(!v->isTensor(), "uniform: ", what, " must be a scalar (a Python number or fd.define_scalar); got tensor ",
                      v->toString());
    MF_USER_ARG_CHECK(v->dtype() != DataType::Bool, "uniform: ", what, " must be a number; got a bool scalar");
  }
  if (constantOf(low) && constantOf(high)) {
    MF_USER_ARG_CHECK(*constantOf(low) <= *constantOf(high), "uniform: low (", *constantOf(low), ") must not exceed high (",
                      *constantOf(high), ")");
  }
  checkRngWord(seed, "rng_seed");
  checkRngWord(offset, "rng_offset");
  std::vector<IterDomain*> ids;
  for (size_t i = 0; i < shape.size(); ++i) {
    MF_USER_ARG_CHECK(shape[i] >= 0, "uniform: shape axis ", i, " has extent ", shape[i],
                      "; expected a static extent >= 0 (symbolic extents are not supported by uniform yet)");
    ids.push_back(f.newIterDomain(Extent{shape[i], ""}, shape[i] == 1 ? IterType::Broadcast : IterType::Iteration));
  }
  TensorView* out = newOutput(f, dtype, ids);
  f.newExpr(OpType::Uniform, {low, high, seed, offset}, {out}, {{"dtype", dtype}, {"shape", shape}});
  return out;
}

TensorView* embeddingFwd(TensorView* indices, TensorView* weight, std::optional<int64_t> padding_idx) {
  Fusion& f = *indices->fusion();
  MF_USER_ARG_CHECK(indices->dtype() == DataType::Int || indices->dtype() == DataType::Int32,
                    "embedding_fwd: indices ", indices->toString(), " must be int64 or int32; got ",
                    toString(indices->dtype()));
  auto wi = weight->logicalNoReductions();
  MF_USER_ARG_CHECK(wi.size() == 2, "embedding_fwd: weight ", weight->toString(),
                    " must be 2-D [num_embeddings, embedding_dim]; got ", wi.size(), "-D");
  std::vector<IterDomain*> ids;
  for (IterDomain* id : indices->logicalNoReductions()) ids.push_back(freshLike(f, id, id->iterType()));
  ids.push_back(freshLike(f, wi[1], wi[1]->iterType()));
  Ints padding;
  if (padding_idx) {
    const Extent& vocab = wi[0]->extent();
    int64_t p = *padding_idx;
    MF_USER_ARG_CHECK(!vocab.isConst() || (p >= -vocab.value && p < vocab.value), "embedding_fwd: padding_idx ", p,
                      " is out of range for a weight of ", vocab.value, " embeddings; expected [", -vocab.value, ", ",
                      vocab.value, ")");
    padding = {p < 0 && vocab.isConst() ? p + vocab.value : p};  // as torch.nn.functional.embedding
  }
  TensorView* out = newOutput(f, weight->dtype(), ids);
  f.newExpr(OpType::EmbeddingFwd, {indices, weight}, {out}, {{"padding_idx", padding}});
  return out;
}

}  // namespace mf
