#include "runtime/aten_evaluator.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <cmath>

#include "ir/domain_map.h"
#include "ir/extent_expr.h"
#include "ir/fusion.h"
#include "multidevice/sharding.h"
#include "runtime/attention.h"
#include "runtime/moe_ops.h"
#include "runtime/uniform.h"
#include "support/counter_rng.h"
#include "support/error.h"

namespace mf {

at::ScalarType toAten(DataType dt) {
  switch (dt) {
    case DataType::Float: return at::kFloat;
    case DataType::Half: return at::kHalf;
    case DataType::BFloat16: return at::kBFloat16;
    case DataType::Double: return at::kDouble;
    case DataType::Int: return at::kLong;
    case DataType::Int32: return at::kInt;
    case DataType::Bool: return at::kBool;
  }
  MF_THROW_INTERNAL("bad DataType");
}

DataType fromAten(at::ScalarType st) {
  switch (st) {
    case at::kFloat: return DataType::Float;
    case at::kHalf: return DataType::Half;
    case at::kBFloat16: return DataType::BFloat16;
    case at::kDouble: return DataType::Double;
    case at::kLong: return DataType::Int;
    case at::kInt: return DataType::Int32;
    case at::kBool: return DataType::Bool;
    default: MF_THROW_USER("dtype ", st, " is not supported by meshfuser");
  }
}

std::vector<int64_t> globalShape(const TensorView* tv, const ExtentBindings& bindings) {
  std::vector<int64_t> shape;
  for (const IterDomain* id : tv->logicalNoReductions()) {
    if (id->extent().isConst()) {
      shape.push_back(id->extent().value);
      continue;
    }
    std::optional<int64_t> v = evaluateExtent(*tv->fusion(), id->extent(), bindings);
    MF_USER_CHECK(v.has_value(), tv->toString(), ": the extent ", id->extent().symbol,
                  " is not known on this rank (no input of this rank binds it); give it a concrete extent");
    MF_USER_CHECK(*v >= 0, tv->toString(), ": the extent ", id->extent().symbol, " evaluates to ", *v,
                  " for these inputs; extents must be non-negative");
    shape.push_back(*v);
  }
  return shape;
}

namespace {

// The dispatcher's handle for a registry name such as "aten::sum.dim_IntList" (cached: looking a
// schema up costs more than calling it).
const c10::OperatorHandle& atenOp(const char* qualified) {
  // Keyed by the registry's string (its address is stable); per thread, so no lock on the hot path.
  thread_local std::unordered_map<const char*, c10::OperatorHandle> handles;
  auto it = handles.find(qualified);
  if (it != handles.end()) return it->second;
  std::string name = qualified, overload;
  size_t dot = name.find('.');
  if (dot != std::string::npos) {
    overload = name.substr(dot + 1);
    name = name.substr(0, dot);
  }
  auto handle = c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), overload.c_str());
  return handles.emplace(qualified, handle).first->second;
}

}  // namespace

// Calls `qualified` with positional `args`; `named` fills later arguments by name where the schema
// has them (e.g. sum's dtype, which amax does not take); the schema's defaults fill the rest.
std::vector<c10::IValue> callAtenAll(const char* qualified, std::vector<c10::IValue> args,
                                     const std::vector<std::pair<const char*, c10::IValue>>& named) {
  const c10::OperatorHandle& op = atenOp(qualified);
  const auto& params = op.schema().arguments();
  for (size_t i = args.size(); i < params.size(); ++i) {
    auto given = std::find_if(named.begin(), named.end(), [&](const auto& n) { return params[i].name() == n.first; });
    if (given != named.end()) {
      args.push_back(given->second);
      continue;
    }
    MF_CHECK(params[i].default_value().has_value(), qualified, ": argument ", params[i].name(), " has no default");
    args.push_back(*params[i].default_value());
  }
  torch::jit::Stack stack(std::make_move_iterator(args.begin()), std::make_move_iterator(args.end()));
  op.callBoxed(&stack);
  return std::vector<c10::IValue>(stack.begin(), stack.end());
}

at::Tensor callAten(const char* qualified, std::vector<c10::IValue> args,
                    const std::vector<std::pair<const char*, c10::IValue>>& named) {
  return callAtenAll(qualified, std::move(args), named).at(0).toTensor();
}

namespace {

// A Python number as ATen sees one: a 0-dim "wrapped number" that promotes by category only.
at::Tensor wrappedNumber(const c10::Scalar& s) {
  at::Tensor t = at::scalar_tensor(s, at::TensorOptions().dtype(s.type()));
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

std::vector<int64_t> reducedAxes(const TensorView* out) {
  std::vector<int64_t> dims;
  const auto& domain = out->rootOrLogical();
  for (size_t i = 0; i < domain.size(); ++i) {
    if (domain[i]->isReduction()) dims.push_back(static_cast<int64_t>(i));
  }
  return dims;
}

// An attribute as an ATen argument.
c10::IValue attributeValue(const AttrValue& v) {
  switch (typeOf(v)) {
    case AttrType::Int: return std::get<int64_t>(v);
    case AttrType::Bool: return std::get<bool>(v);
    case AttrType::Float: return std::get<double>(v);
    case AttrType::OptionalFloat: {
      const OptionalFloat& f = std::get<OptionalFloat>(v);
      return f ? c10::IValue(*f) : c10::IValue();
    }
    case AttrType::Dtype: return toAten(std::get<DataType>(v));
    case AttrType::Ints: return std::get<Ints>(v);
    case AttrType::Name: return std::get<std::string>(v);
  }
  MF_THROW_INTERNAL("bad attribute");
}

at::Tensor broadcastInDim(const Expr* e, const at::Tensor& x, const ExtentBindings& bindings) {
  const Ints& bdims = e->attr<Ints>("broadcast_dims");
  const TensorView* out = e->out();
  std::vector<int64_t> view_shape(e->attr<Ints>("shape").size(), 1);
  for (size_t i = 0; i < bdims.size(); ++i) view_shape[bdims[i]] = x.size(static_cast<int64_t>(i));
  // Mapped axes keep the input's (already local) extent; expanded axes are divided by their shards.
  auto ids = out->logicalNoReductions();
  auto shards = shardsPerAxis(out);
  std::vector<int64_t> target = view_shape;
  std::vector<int64_t> local;  // this rank's output shape, for axes of runtime extents
  for (size_t o = 0; o < ids.size(); ++o) {
    if (!ids[o]->extent().isConst()) {
      if (local.empty()) local = localShape(out, globalShape(out, bindings));
      target[o] = local[o];
      continue;
    }
    auto mapped = std::find(bdims.begin(), bdims.end(), static_cast<int64_t>(o));
    if (mapped == bdims.end() || (ids[o]->isBroadcast() && ids[o]->extent().isConst() && ids[o]->extent().value != 1)) {
      if (ids[o]->extent().isConst()) target[o] = ids[o]->extent().value / shards[o];
    } else if (ids[o]->extent().isConst()) {  // a concrete output extent over a symbolic input axis
      const int64_t want = ids[o]->extent().value / shards[o];
      const int64_t i = mapped - bdims.begin();
      MF_USER_CHECK(view_shape[o] == want || view_shape[o] == 1, "broadcast_in_dim: input axis ", i, " of ",
                    e->input(0)->toString(), " has extent ", view_shape[o], " but output axis ", o, " asks for ", want,
                    " (the input's extent must equal it or be 1)");
      target[o] = want;
    }
  }
  return x.reshape(view_shape).expand(target);
}

// x[start:end:step] on each axis the slice resizes (kept axes may be sharded: they pass through).
at::Tensor sliceAxes(const Expr* e, const std::vector<RuntimeValue>& in) {
  at::Tensor x = in[0].tensor;
  std::vector<int64_t> kept = opInfo(e->op()).axis_map(e, 0);
  for (int64_t a = 0; a < x.dim(); ++a) {
    if (kept[a] >= 0) continue;
    int64_t start = in[1 + 2 * a].scalar.toLong(), end = in[2 + 2 * a].scalar.toLong(), step = e->attr<Ints>("strides")[a];
    MF_USER_CHECK(0 <= start && start <= end && end <= x.size(a), "slice: axis ", a, " of ",
                  e->input(0)->toString(), " has extent ", x.size(a), " but the bounds are [", start, ", ", end,
                  "); scalar bounds must satisfy 0 <= start <= end <= extent");
    x = x.slice(a, start, end, step);
  }
  return x;
}

// A seed or offset of uniform: an integer in [0, 2^53) (checked here for runtime scalars).
int64_t rngWord(const Expr* e, const RuntimeValue& v, const char* what) {
  double d = v.scalar.toDouble();
  MF_USER_CHECK(v.scalar.isIntegral(false) && d >= 0 && d < static_cast<double>(kMaxRngSeed), e->toString(), ": ", what,
                " is ", v.scalar.toDouble(), "; expected an integer in [0, 2^53)");
  return v.scalar.toLong();
}

at::Tensor uniform(const Expr* e, const std::vector<RuntimeValue>& in, const ExtentBindings& bindings,
                   const EvalContext& context) {
  const TensorView* out = e->out();
  double low = in[0].scalar.toDouble(), high = in[1].scalar.toDouble();
  MF_USER_CHECK(std::isfinite(low) && std::isfinite(high) && low <= high, e->toString(), ": low (", low, ") and high (",
                high, ") must be finite with low <= high");
  int64_t seed = rngWord(e, in[2], "rng_seed"), offset = rngWord(e, in[3], "rng_offset");
  std::vector<int64_t> global = globalShape(out, bindings);
  at::Tensor indices = shardGlobalIndices(out, context.rank, global, at::TensorOptions().device(context.device));
  return counterUniform(indices, low, high, seed, offset, toAten(out->dtype()));
}

// embedding_fwd; as partial_gathers rewrote it (a trailing reduction over the table's rows), this
// rank holds rows [start, start + rows) of the table: it looks up the indices among them and leaves
// zeros elsewhere, and the reduction across devices completes the lookup.
at::Tensor embedding(const Expr* e, const std::vector<RuntimeValue>& in, const EvalContext& context) {
  const Ints& padding = e->attr<Ints>("padding_idx");
  const at::Tensor& indices = in[0].tensor;
  const at::Tensor& weight = in[1].tensor;
  int64_t padding_idx = padding.empty() ? -1 : padding[0];
  if (e->out()->root().empty()) return callAten(opInfo(e->op()).aten, {weight, indices, padding_idx});
  const auto* table = static_cast<const TensorView*>(e->input(1));
  std::vector<int64_t> local(weight.sizes().begin(), weight.sizes().end());
  int64_t start = shardStart(table, context.rank, local)[0];
  int64_t rows = weight.size(0);
  int64_t all_rows = rows * shardsPerAxis(table)[0];
  // Every rank of the team holds these indices, so all of them raise this together.
  bool checkable = indices.numel() > 0 && !indices.is_meta();
  if (checkable) {
    auto [lo, hi] = hostMinMax(indices);
    MF_USER_CHECK(lo >= 0 && hi < all_rows, e->toString(), ": indices must lie in [0, ", all_rows,
                  ") (the table's rows); got values in [", lo, ", ", hi, "]");
  }
  at::Tensor shifted = indices - start;
  at::Tensor here = (shifted >= 0).logical_and_(shifted < rows);
  at::Tensor clamped = shifted.clamp(0, std::max<int64_t>(rows - 1, 0));
  at::Tensor looked_up = callAten(opInfo(e->op()).aten, {weight, clamped, int64_t{-1}});
  return looked_up.masked_fill_(here.logical_not().unsqueeze(-1), 0);
}

}  // namespace

at::Tensor withStrideOrder(const at::Tensor& t, const std::vector<int64_t>& stride_order) {
  if (stride_order.empty()) return t.is_contiguous() ? t : t.contiguous();
  // Outermost (largest stride_order) first; contiguous in that order, then viewed back.
  std::vector<int64_t> perm(stride_order.size());
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int64_t>(i);
  std::sort(perm.begin(), perm.end(), [&](int64_t a, int64_t b) { return stride_order[a] > stride_order[b]; });
  std::vector<int64_t> inverse(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inverse[perm[i]] = static_cast<int64_t>(i);
  return t.permute(perm).contiguous().permute(inverse);
}

std::pair<int64_t, int64_t> hostMinMax(const at::Tensor& t) {
  auto [lo, hi] = at::aminmax(t);
  at::Tensor both = at::stack({lo, hi}).to(at::kCPU, at::kLong);
  return {both[0].item<int64_t>(), both[1].item<int64_t>()};
}

namespace {

at::Tensor evaluateUnchecked(const Expr* e, const std::vector<RuntimeValue>& in, const ExtentBindings& bindings,
                             const EvalContext& context) {
  const TensorView* out = e->out();
  const OpInfo& info = opInfo(e->op());
  const at::Tensor& x = in[0].tensor;
  at::Tensor result;
  switch (info.aten_args) {
    case AtenArgs::Identity: result = x; break;
    case AtenArgs::Dtype: result = callAten(info.aten, {x, toAten(e->attr<DataType>("dtype"))}); break;
    case AtenArgs::AttrDims: result = callAten(info.aten, {x, e->attr<Ints>("dims")}); break;
    case AtenArgs::LocalShape: result = callAten(info.aten, {x, localShape(out, globalShape(out, bindings))}); break;
    case AtenArgs::Slice: result = sliceAxes(e, in); break;
    case AtenArgs::Pad: result = callAten(info.aten, {x, e->attr<Ints>("pad_widths"), in[1].scalar}); break;
    case AtenArgs::Cat: {
      c10::List<at::Tensor> parts;
      for (const RuntimeValue& v : in) parts.push_back(v.tensor.to(toAten(out->dtype())));
      result = callAten(info.aten, {parts, e->attr<int64_t>("dim")});
      break;
    }
    case AtenArgs::StrideOrder: result = withStrideOrder(x, e->attr<Ints>("stride_order")); break;
    case AtenArgs::BroadcastInDim: result = broadcastInDim(e, x, bindings); break;
    case AtenArgs::ReducedAxes: {
      std::vector<int64_t> dims = reducedAxes(out);
      result = dims.empty() ? x : callAten(info.aten, {x, dims}, {{"dtype", toAten(out->dtype())}});
      break;
    }
    case AtenArgs::FoldedWeight: {
      at::Tensor w = in[1].tensor;
      if (w.dim() <= 2) {
        result = callAten(info.aten, in.size() > 2 ? std::vector<c10::IValue>{x, w, in[2].tensor}
                                                    : std::vector<c10::IValue>{x, w});
        break;
      }
      std::vector<int64_t> out_axes(w.sizes().begin(), w.sizes().end() - 1);
      at::Tensor w2 = w.reshape({-1, w.size(-1)});
      c10::IValue bias;
      if (in.size() > 2) bias = in[2].tensor.dim() > 1 ? in[2].tensor.reshape({-1}) : in[2].tensor;
      at::Tensor flat = callAten(info.aten, {x, w2, bias});
      std::vector<int64_t> shape(flat.sizes().begin(), flat.sizes().end() - 1);
      shape.insert(shape.end(), out_axes.begin(), out_axes.end());
      result = flat.reshape(shape).movedim(-2, 0).contiguous();  // [a, batch.., b] (ops.cpp linear)
      break;
    }
    case AtenArgs::Attention: MF_THROW_INTERNAL("attention is evaluated by evaluateAttention");
    case AtenArgs::CounterRng: result = uniform(e, in, bindings, context); break;
    case AtenArgs::Embedding: result = embedding(e, in, context); break;
    case AtenArgs::GroupedMm:
    case AtenArgs::Topk:
    case AtenArgs::Sort:
    case AtenArgs::DimIndex:
    case AtenArgs::DimIndexSrc:
    case AtenArgs::Cumsum:
    case AtenArgs::Bincount:
    case AtenArgs::ScatterReduce: MF_THROW_INTERNAL("mixture-of-experts ops are evaluated by evaluateMoeOp");
    case AtenArgs::Communication: MF_THROW_INTERNAL(info.name, " is a communication, lowered to the host program");
    case AtenArgs::Operands: {
      if (info.refuses_negative_integer_exponent && in.size() == 2 && in[0].is_tensor && !in[1].is_tensor) {
        const bool integer_base = at::isIntegralType(in[0].tensor.scalar_type(), /*includeBool=*/true);
        MF_USER_CHECK(!(integer_base && in[1].scalar.isIntegral(false) && in[1].scalar.toLong() < 0), info.name,
                      ": the base has dtype ", in[0].tensor.scalar_type(), " and the runtime exponent ",
                      in[1].scalar.toLong(), " is a negative integer; integers to negative integer powers are not "
                      "allowed (as in PyTorch)");
      }
      std::vector<c10::IValue> args;
      // A half/bfloat16 result with a Python-scalar operand computes in float, then rounds (below):
      // ATen keeps a scalar in float only as the second operand, and cast 70000.0 * h's scalar to
      // half first (inf). Generated kernels compute in float too.
      const bool low_precision_out = out->dtype() == DataType::Half || out->dtype() == DataType::BFloat16;
      const bool in_float = low_precision_out && std::any_of(in.begin(), in.end(), [](const RuntimeValue& v) {
        return !v.is_tensor;
      });
      for (const RuntimeValue& v : in) {
        if (!v.is_tensor) {
          args.emplace_back(wrappedNumber(v.scalar));
        } else if (info.dtype_rule == DtypeRule::FloatIfIntegral && !isFloatingPoint(fromAten(v.tensor.scalar_type()))) {
          args.emplace_back(v.tensor.to(toAten(out->dtype())));  // exp(int) computes in float
        } else if (in_float && (v.tensor.scalar_type() == at::kHalf || v.tensor.scalar_type() == at::kBFloat16)) {
          args.emplace_back(v.tensor.to(at::kFloat));
        } else {
          args.emplace_back(v.tensor);
        }
      }
      // Then the attributes, in declaration order (an op whose ATen form is op(x, attr...): triu).
      for (const auto& [name, value] : e->attributes().items()) args.push_back(attributeValue(value));
      result = callAten(info.aten, std::move(args));
      break;
    }
  }
  if (!out->root().empty()) {
    // rfactor partials gain their device axes (local extent 1).
    auto ids = out->logicalNoReductions();
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i]->isRFactorProduct()) result = result.unsqueeze(static_cast<int64_t>(i));
    }
  }
  if (result.scalar_type() != toAten(out->dtype())) result = result.to(toAten(out->dtype()));
  return result;
}

}  // namespace

std::vector<at::Tensor> evaluateExpr(const Expr* e, const std::vector<RuntimeValue>& in,
                                     const ExtentBindings& bindings, const EvalContext& context) {
  try {
    if (opInfo(e->op()).aten_args == AtenArgs::Attention) return evaluateAttention(e, in);
    // Routing ops with an ATen form of their own; one of plain operands and attributes is generic.
    const OpInfo& info = opInfo(e->op());
    if (info.kind == OpKind::Routing && info.aten_args != AtenArgs::Operands) {
      std::vector<at::Tensor> results = evaluateMoeOp(e, in);
      // An rfactored partial (row-parallel grouped_mm) gains its device axis (local extent 1).
      const TensorView* out = e->outTensor(0);
      if (!out->root().empty()) {
        auto ids = out->logicalNoReductions();
        for (size_t i = 0; i < ids.size(); ++i) {
          if (ids[i]->isRFactorProduct()) results[0] = results[0].unsqueeze(static_cast<int64_t>(i));
        }
      }
      return results;
    }
    return {evaluateUnchecked(e, in, bindings, context)};
  } catch (const c10::Error& err) {
    MF_THROW_USER("while running ", e->toString(), ": ", err.what_without_backtrace());
  }
}

}  // namespace mf
