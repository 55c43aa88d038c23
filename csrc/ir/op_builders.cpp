// The generic builders (ir/build_op.h): each reads its operands and attributes and calls the op's
// typed builder (ir/ops.h), which makes the output and the Expr (whose attributes and check
// Fusion::newExpr validates).
#include "ir/build_op.h"
#include "ir/ops.h"
#include "support/error.h"
#include "support/text.h"

namespace mf {
namespace {

// Attributes of one build: a given value, else the declared default.
class Reader {
 public:
  Reader(OpType op, const Attributes& given) : info_(opInfo(op)), given_(given) {}
  template <typename T>
  T get(const char* name) const {
    if (given_.has(name)) return given_.get<T>(name);
    const AttrDef& d = def(name);
    MF_USER_ARG_CHECK(d.default_value.has_value(), info_.name, ": missing attribute '", name, "' (",
                      toString(d.type), ")");
    return std::get<T>(*d.default_value);
  }
  template <typename T>
  std::optional<T> optional(const char* name) const {
    if (!given_.has(name)) return std::nullopt;
    return given_.get<T>(name);
  }

 private:
  const AttrDef& def(const char* name) const {
    for (const AttrDef& d : info_.attributes) {
      if (std::string(d.name) == name) return d;
    }
    MF_THROW_INTERNAL(info_.name, " has no attribute ", name);
  }
  const OpInfo& info_;
  const Attributes& given_;
};

TensorView* tensorAt(OpType op, const std::vector<Val*>& in, size_t i) {
  MF_USER_ARG_CHECK(i < in.size() && in[i] != nullptr && in[i]->isTensor(), toString(op), ": operand ", i,
                    " must be a tensor");
  return static_cast<TensorView*>(in[i]);
}

TensorView* optionalTensorAt(OpType op, const std::vector<Val*>& in, size_t i) {
  return i < in.size() ? tensorAt(op, in, i) : nullptr;
}

std::vector<Val*> outputs(std::initializer_list<TensorView*> tvs) { return std::vector<Val*>(tvs.begin(), tvs.end()); }
std::vector<Val*> outputs(const std::vector<TensorView*>& tvs) { return std::vector<Val*>(tvs.begin(), tvs.end()); }

AttentionOptions attentionOptions(const Reader& r) {
  return {r.optional<double>("dropout_p"), r.optional<bool>("is_causal"), r.optional<OptionalFloat>("scale").value_or(
                                                                              OptionalFloat())};
}

}  // namespace

std::vector<Val*> buildOp(const std::string& name, const std::vector<Val*>& operands, const Attributes& attrs) {
  const OpInfo* info = findOp(name);
  if (info == nullptr) {
    std::vector<std::string> names;
    for (const OpInfo& i : allOps()) names.push_back(i.name);
    MF_USER_ARG_CHECK(false, "unknown op '", name, "'; the ops are ", listText(names));
  }
  const auto n = static_cast<int>(operands.size());
  MF_USER_ARG_CHECK(n >= info->min_inputs && n <= info->max_inputs, name, " takes ", info->min_inputs, "-",
                    info->max_inputs, " operands, got ", n);
  for (size_t i = 0; i < operands.size(); ++i) {
    MF_USER_ARG_CHECK(operands[i] != nullptr, name, ": operand ", i, " is null");
  }
  // Names and types against the declaration; values are the builder's to normalize and check.
  Attributes typed;
  for (const auto& [key, value] : attrs.items()) {
    const AttrDef* def = nullptr;
    for (const AttrDef& d : info->attributes) def = key == d.name ? &d : def;
    if (def == nullptr) {
      std::vector<std::string> names;
      for (const AttrDef& d : info->attributes) names.push_back(d.name);
      MF_USER_ARG_CHECK(false, name, ": unknown attribute '", key, "'; ", name, " takes ",
                        names.empty() ? std::string("no attributes") : listText(names));
    }
    AttrValue v = value;
    if (def->type == AttrType::Float && typeOf(v) == AttrType::Int) v = static_cast<double>(std::get<int64_t>(v));
    if (def->type == AttrType::OptionalFloat && typeOf(v) != AttrType::OptionalFloat) {
      if (typeOf(v) == AttrType::Int) v = static_cast<double>(std::get<int64_t>(v));
      if (typeOf(v) == AttrType::Float) v = OptionalFloat(std::get<double>(v));
    }
    MF_USER_ARG_CHECK(typeOf(v) == def->type, name, ": attribute '", key, "' must be a ", toString(def->type),
                      "; got a ", toString(typeOf(v)), " (", attrValueText(v), ")");
    typed.set(key, v);
  }
  MF_USER_ARG_CHECK(info->build != nullptr, name, " is not built by name: all_to_all_dispatch and all_to_all_combine ",
                    "build the exchanges");
  return info->build(info->op, operands, typed);
}

namespace builders {

std::vector<Val*> shapedLikeInput(OpType op, const std::vector<Val*>& in, const Attributes& a) {
  TensorView* x = tensorAt(op, in, 0);
  Fusion& f = *x->fusion();
  std::vector<IterDomain*> ids;
  for (const IterDomain* id : x->logicalNoReductions()) ids.push_back(f.newIterDomain(id->extent(), id->iterType()));
  TensorView* out = f.newTensor(x->dtype(), ids);
  f.newExpr(op, in, {out}, a);
  return {out};
}

std::vector<Val*> unary(OpType op, const std::vector<Val*>& in, const Attributes&) {
  return outputs({unaryOp(op, tensorAt(op, in, 0))});
}

std::vector<Val*> cast(OpType op, const std::vector<Val*>& in, const Attributes& a) {
  return outputs({castOp(tensorAt(op, in, 0), Reader(op, a).get<DataType>("dtype"))});
}

std::vector<Val*> binary(OpType op, const std::vector<Val*>& in, const Attributes&) {
  if (!in[0]->isTensor() && !in[1]->isTensor()) return {extentArithmetic(op, in[0], in[1])};
  return outputs({binaryOp(op, in[0], in[1])});
}

std::vector<Val*> where(OpType, const std::vector<Val*>& in, const Attributes&) {
  return outputs({whereOp(in[0], in[1], in[2])});
}

std::vector<Val*> reduction(OpType op, const std::vector<Val*>& in, const Attributes& a) {
  return outputs({reductionOp(op, tensorAt(op, in, 0), Reader(op, a).get<Ints>("dims"))});
}

std::vector<Val*> broadcastInDim(OpType op, const std::vector<Val*>& in, const Attributes& a) {
  Reader r(op, a);
  return outputs({mf::broadcastInDim(tensorAt(op, in, 0), r.get<Ints>("shape"), r.get<Ints>("broadcast_dims"))});
}

std::vector<Val*> squeeze(OpType op, const std::vector<Val*>& in, const Attributes& a) {
  return outputs({mf::squeeze(tensorAt(op, in, 0), Reader(op, a).get<Ints>("dims"))});
}

std::vector<Val*> permute(OpType op, const std::vector<Val*>& in, const Attributes& a) {
  return outputs({mf::permute(tensorAt(op, in, 0), Reader(op, a).get<Ints>("dims"))});
}

std::vector<Val*> reshape(OpType op, const std::vector<Val*>& in, const Attributes& a) {
  return outputs({mf::reshape(tensorAt(op, in, 0), Reader(op, a).get<Ints>("shape"))});
}

std::vector<Val*> slice(OpType op, const std::vector<Val*>& in, const Attributes& a) {
  TensorView* x = tensorAt(op, in, 0);
  MF_USER_ARG_CHECK(in.size() % 2 == 1, "slice: operands are the tensor, then a (start, end) pair per axis; got ",
                    in.size(), " operands");
  std::vector<Val*> starts, ends;
  for (size_t i = 1; i + 1 < in.size(); i += 2) {
    starts.push_back(in[i]);
    ends.push_back(in[i + 1]);
  }
  return outputs({mf::slice(x, starts, ends, Reader(op, a).optional<Ints>("strides").value_or(Ints{}))});
}

std::vector<Val*> pad(OpType op, const std::vector<Val*>& in, const Attributes& a) {
  return outputs({mf::pad(tensorAt(op, in, 0), Reader(op, a).get<Ints>("pad_widths"), in.size() > 1 ? in[1] : nullptr)});
}

std::vector<Val*> cat(OpType op, const std::vector<Val*>& in, const Attributes& a) {
  std::vector<TensorView*> xs;
  for (size_t i = 0; i < in.size(); ++i) xs.push_back(tensorAt(op, in, i));
  return outputs({mf::cat(xs, Reader(op, a).get<int64_t>("dim"))});
}

std::vector<Val*> strideOrder(OpType op, const std::vector<Val*>& in, const Attributes& a) {
  return outputs({mf::strideOrder(tensorAt(op, in, 0), Reader(op, a).get<Ints>("stride_order"))});
}

std::vector<Val*> uniform(OpType op, const std::vector<Val*>& in, const Attributes& a) {
  Reader r(op, a);
  return outputs({mf::uniform(in[0], in[1], r.get<Ints>("shape"), r.get<DataType>("dtype"), in[2], in[3])});
}

std::vector<Val*> embedding(OpType op, const std::vector<Val*>& in, const Attributes& a) {
  Ints padding = Reader(op, a).get<Ints>("padding_idx");
  MF_USER_ARG_CHECK(padding.size() <= 1, "embedding_fwd: padding_idx is [] or [index]; got ", listText(padding));
  std::optional<int64_t> p;
  if (!padding.empty()) p = padding[0];
  return outputs({embeddingFwd(tensorAt(op, in, 0), tensorAt(op, in, 1), p)});
}

std::vector<Val*> matmul(OpType op, const std::vector<Val*>& in, const Attributes&) {
  return outputs({mf::matmul(tensorAt(op, in, 0), tensorAt(op, in, 1))});
}

std::vector<Val*> linear(OpType op, const std::vector<Val*>& in, const Attributes&) {
  return outputs({mf::linear(tensorAt(op, in, 0), tensorAt(op, in, 1), optionalTensorAt(op, in, 2))});
}

std::vector<Val*> sdpfaFwd(OpType op, const std::vector<Val*>& in, const Attributes& a) {
  return outputs(mf::sdpfaFwd(tensorAt(op, in, 0), tensorAt(op, in, 1), tensorAt(op, in, 2),
                              attentionOptions(Reader(op, a))));
}

std::vector<Val*> sdpfaBwd(OpType op, const std::vector<Val*>& in, const Attributes& a) {
  std::vector<TensorView*> t;
  for (size_t i = 0; i < 8; ++i) t.push_back(tensorAt(op, in, i));
  return outputs(mf::sdpfaBwd(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], attentionOptions(Reader(op, a))));
}

std::vector<Val*> groupedMm(OpType op, const std::vector<Val*>& in, const Attributes&) {
  return outputs({mf::groupedMm(tensorAt(op, in, 0), tensorAt(op, in, 1), optionalTensorAt(op, in, 2))});
}

std::vector<Val*> topk(OpType op, const std::vector<Val*>& in, const Attributes& a) {
  Reader r(op, a);
  auto [values, indices] = mf::topk(tensorAt(op, in, 0), r.get<int64_t>("k"), r.get<int64_t>("dim"),
                                    r.get<bool>("largest"), r.get<bool>("sorted"));
  return outputs({values, indices});
}

std::vector<Val*> sort(OpType op, const std::vector<Val*>& in, const Attributes& a) {
  Reader r(op, a);
  auto [values, indices] =
      mf::sort(tensorAt(op, in, 0), r.get<int64_t>("dim"), r.get<bool>("descending"), r.get<bool>("stable"));
  return outputs({values, indices});
}

std::vector<Val*> argsort(OpType op, const std::vector<Val*>& in, const Attributes& a) {
  Reader r(op, a);
  return outputs(
      {mf::argsort(tensorAt(op, in, 0), r.get<int64_t>("dim"), r.get<bool>("descending"), r.get<bool>("stable"))});
}

std::vector<Val*> indexSelect(OpType op, const std::vector<Val*>& in, const Attributes& a) {
  return outputs({mf::indexSelect(tensorAt(op, in, 0), Reader(op, a).get<int64_t>("dim"), tensorAt(op, in, 1))});
}

std::vector<Val*> gather(OpType op, const std::vector<Val*>& in, const Attributes& a) {
  return outputs({mf::gather(tensorAt(op, in, 0), Reader(op, a).get<int64_t>("dim"), tensorAt(op, in, 1))});
}

std::vector<Val*> scatter(OpType op, const std::vector<Val*>& in, const Attributes& a) {
  return outputs({mf::scatter(tensorAt(op, in, 0), Reader(op, a).get<int64_t>("dim"), tensorAt(op, in, 1),
                              tensorAt(op, in, 2))});
}

std::vector<Val*> indexAdd(OpType op, const std::vector<Val*>& in, const Attributes& a) {
  return outputs({mf::indexAdd(tensorAt(op, in, 0), Reader(op, a).get<int64_t>("dim"), tensorAt(op, in, 1),
                               tensorAt(op, in, 2))});
}

std::vector<Val*> cumsum(OpType op, const std::vector<Val*>& in, const Attributes& a) {
  Reader r(op, a);
  return outputs({mf::cumsum(tensorAt(op, in, 0), r.get<int64_t>("dim"), r.optional<DataType>("dtype"))});
}

std::vector<Val*> bincount(OpType op, const std::vector<Val*>& in, const Attributes& a) {
  return outputs({mf::bincount(tensorAt(op, in, 0), Reader(op, a).get<int64_t>("minlength"))});
}

std::vector<Val*> scatterReduce(OpType op, const std::vector<Val*>& in, const Attributes& a) {
  Reader r(op, a);
  return outputs({mf::scatterReduce(tensorAt(op, in, 0), r.get<int64_t>("dim"), tensorAt(op, in, 1),
                                    tensorAt(op, in, 2), r.get<std::string>("reduce"), r.get<bool>("include_self"))});
}

}  // namespace builders
}  // namespace mf
