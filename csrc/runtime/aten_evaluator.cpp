#include "runtime/aten_evaluator.h"

#include <algorithm>

#include "ir/fusion.h"
#include "multidevice/sharding.h"
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
    auto it = bindings.find(tv->fusion()->canonicalSymbol(id->extent().symbol));
    MF_USER_CHECK(it != bindings.end(), tv->toString(), ": the extent ", id->extent().symbol,
                  " is not known on this rank (no input of this rank binds it); give it a concrete extent");
    shape.push_back(it->second);
  }
  return shape;
}

namespace {

at::Tensor binary(OpType op, const RuntimeValue& a, const RuntimeValue& b) {
  auto call = [&](auto fn_tt, auto fn_ts, auto fn_st) -> at::Tensor {
    if (a.is_tensor && b.is_tensor) return fn_tt(a.tensor, b.tensor);
    if (a.is_tensor) return fn_ts(a.tensor, b.scalar);
    return fn_st(a.scalar, b.tensor);
  };
  auto wrap = [](const c10::Scalar& s, const at::Tensor& like) { return at::scalar_tensor(s, like.options().dtype(s.type())); };
  switch (op) {
    case OpType::Add:
      return call([](auto x, auto y) { return at::add(x, y); }, [](auto x, auto s) { return at::add(x, s); },
                  [](auto s, auto y) { return at::add(y, s); });
    case OpType::Sub:
      return call([](auto x, auto y) { return at::sub(x, y); }, [](auto x, auto s) { return at::sub(x, s); },
                  [](auto s, auto y) { return at::rsub(y, s); });
    case OpType::Mul:
      return call([](auto x, auto y) { return at::mul(x, y); }, [](auto x, auto s) { return at::mul(x, s); },
                  [](auto s, auto y) { return at::mul(y, s); });
    case OpType::Div:
      return call([](auto x, auto y) { return at::div(x, y); }, [](auto x, auto s) { return at::div(x, s); },
                  [&](auto s, auto y) { return at::div(wrap(s, y), y); });
    case OpType::Maximum:
      return call([](auto x, auto y) { return at::maximum(x, y); }, [&](auto x, auto s) { return at::maximum(x, wrap(s, x)); },
                  [&](auto s, auto y) { return at::maximum(wrap(s, y), y); });
    case OpType::Minimum:
      return call([](auto x, auto y) { return at::minimum(x, y); }, [&](auto x, auto s) { return at::minimum(x, wrap(s, x)); },
                  [&](auto s, auto y) { return at::minimum(wrap(s, y), y); });
    case OpType::Pow:
      return call([](auto x, auto y) { return at::pow(x, y); }, [](auto x, auto s) { return at::pow(x, s); },
                  [](auto s, auto y) { return at::pow(s, y); });
    case OpType::Eq:
      return call([](auto x, auto y) { return at::eq(x, y); }, [](auto x, auto s) { return at::eq(x, s); },
                  [](auto s, auto y) { return at::eq(y, s); });
    case OpType::Ne:
      return call([](auto x, auto y) { return at::ne(x, y); }, [](auto x, auto s) { return at::ne(x, s); },
                  [](auto s, auto y) { return at::ne(y, s); });
    case OpType::Lt:
      return call([](auto x, auto y) { return at::lt(x, y); }, [](auto x, auto s) { return at::lt(x, s); },
                  [](auto s, auto y) { return at::gt(y, s); });
    case OpType::Le:
      return call([](auto x, auto y) { return at::le(x, y); }, [](auto x, auto s) { return at::le(x, s); },
                  [](auto s, auto y) { return at::ge(y, s); });
    case OpType::Gt:
      return call([](auto x, auto y) { return at::gt(x, y); }, [](auto x, auto s) { return at::gt(x, s); },
                  [](auto s, auto y) { return at::lt(y, s); });
    case OpType::Ge:
      return call([](auto x, auto y) { return at::ge(x, y); }, [](auto x, auto s) { return at::ge(x, s); },
                  [](auto s, auto y) { return at::le(y, s); });
    default: MF_THROW_INTERNAL("not a binary op: ", toString(op));
  }
}

at::Tensor unary(OpType op, const at::Tensor& x) {
  switch (op) {
    case OpType::Set: return x;
    case OpType::Neg: return at::neg(x);
    case OpType::Abs: return at::abs(x);
    case OpType::Exp: return at::exp(x);
    case OpType::Log: return at::log(x);
    case OpType::Tanh: return at::tanh(x);
    case OpType::Relu: return at::relu(x);
    case OpType::Gelu: return at::gelu(x);
    case OpType::Sigmoid: return at::sigmoid(x);
    case OpType::Sqrt: return at::sqrt(x);
    case OpType::Reciprocal: return at::reciprocal(x);
    default: MF_THROW_INTERNAL("not a unary op: ", toString(op));
  }
}

}  // namespace

static at::Tensor evaluateUnchecked(const Expr* e, const std::vector<RuntimeValue>& in, const ExtentBindings& bindings);

at::Tensor evaluateExpr(const Expr* e, const std::vector<RuntimeValue>& in, const ExtentBindings& bindings) {
  try {
    return evaluateUnchecked(e, in, bindings);
  } catch (const c10::Error& err) {
    MF_THROW_USER("while running ", e->toString(), ": ", err.what_without_backtrace());
  }
}

static at::Tensor evaluateUnchecked(const Expr* e, const std::vector<RuntimeValue>& in, const ExtentBindings& bindings) {
  const TensorView* out = e->out();
  OpType op = e->op();
  at::Tensor result;
  if (op == OpType::Cast) {
    result = in[0].tensor.to(toAten(e->attrs().dtype));
  } else if (isUnary(op)) {
    at::Tensor x = in[0].tensor;
    if (!isFloatingPoint(fromAten(x.scalar_type())) && op != OpType::Set && op != OpType::Neg && op != OpType::Abs &&
        op != OpType::Relu) {
      x = x.to(at::kFloat);
    }
    result = unary(op, x);
  } else if (isBinary(op)) {
    result = binary(op, in[0], in[1]);
  } else if (op == OpType::Where) {
    auto t = [&](const RuntimeValue& v, const at::Tensor& like) {
      return v.is_tensor ? v.tensor : at::scalar_tensor(v.scalar, like.options().dtype(toAten(out->dtype())));
    };
    at::Tensor like = in[0].is_tensor ? in[0].tensor : (in[1].is_tensor ? in[1].tensor : in[2].tensor);
    at::Tensor cond = in[0].is_tensor ? in[0].tensor : at::scalar_tensor(in[0].scalar, like.options().dtype(at::kBool));
    result = at::where(cond, t(in[1], like), t(in[2], like));
  } else if (isReduction(op)) {
    std::vector<int64_t> dims;
    const auto& domain = out->rootOrLogical();
    for (size_t i = 0; i < domain.size(); ++i) {
      if (domain[i]->isReduction()) dims.push_back(static_cast<int64_t>(i));
    }
    at::Tensor x = in[0].tensor;
    if (op == OpType::Sum) result = at::sum(x, dims, /*keepdim=*/false, toAten(out->dtype()));
    else if (op == OpType::Max) result = dims.empty() ? x : at::amax(x, dims);
    else result = dims.empty() ? x : at::amin(x, dims);
  } else if (op == OpType::Linear) {
    result = in.size() == 3 ? at::linear(in[0].tensor, in[1].tensor, in[2].tensor) : at::linear(in[0].tensor, in[1].tensor);
  } else if (op == OpType::Matmul) {
    result = at::matmul(in[0].tensor, in[1].tensor);
  } else if (op == OpType::Permute) {
    result = in[0].tensor.permute(e->attrs().dims);
  } else if (op == OpType::Squeeze) {
    result = in[0].tensor;
    auto dims = e->attrs().dims;
    std::sort(dims.rbegin(), dims.rend());
    for (int64_t d : dims) result = result.squeeze(d);
  } else if (op == OpType::BroadcastInDim) {
    const ExprAttrs& a = e->attrs();
    std::vector<int64_t> view_shape(a.shape.size(), 1);
    for (size_t i = 0; i < a.dims.size(); ++i) view_shape[a.dims[i]] = in[0].tensor.size(static_cast<int64_t>(i));
    // Mapped axes keep the input's (already local) extent; expanded axes are divided by their shards.
    auto ids = out->logicalNoReductions();
    auto shards = shardsPerAxis(out);
    std::vector<int64_t> target = view_shape;
    for (size_t o = 0; o < ids.size(); ++o) {
      bool mapped = std::find(a.dims.begin(), a.dims.end(), static_cast<int64_t>(o)) != a.dims.end();
      if (!mapped || (ids[o]->isBroadcast() && ids[o]->extent().isConst() && ids[o]->extent().value != 1)) {
        if (ids[o]->extent().isConst()) target[o] = ids[o]->extent().value / shards[o];
      }
    }
    result = in[0].tensor.reshape(view_shape).expand(target);
  } else if (op == OpType::Reshape) {
    result = in[0].tensor.reshape(localShape(out, e->attrs().shape));
  } else {
    MF_THROW_INTERNAL("the ATen evaluator cannot run ", toString(op));
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

}  // namespace mf
