#include "ir/printer.h"

#include <sstream>

namespace mf {
namespace {

std::string idList(const std::vector<IterDomain*>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? ", " : "") + ids[i]->toString();
  return s + "]";
}

std::string valName(const Val* v) {
  if (v->isTensor()) return v->toString();
  auto* s = static_cast<const Scalar*>(v);
  return s->value() ? s->toString() : s->toString() + "_" + toString(s->dtype());
}

std::string attrString(const Expr* e) {
  const ExprAttrs& a = e->attrs();
  auto ints = [](const std::vector<int64_t>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s + "]";
  };
  switch (e->op()) {
    case OpType::Cast: return std::string(", dtype=") + toString(a.dtype);
    case OpType::Sum:
    case OpType::Max:
    case OpType::Min: return ", dims=" + ints(a.dims);
    case OpType::Permute:
    case OpType::Squeeze: return ", dims=" + ints(a.dims);
    case OpType::BroadcastInDim: return ", shape=" + ints(a.shape) + ", broadcast_dims=" + ints(a.dims);
    case OpType::Reshape: return ", shape=" + ints(a.shape);
    default: return "";
  }
}

}  // namespace

std::string printTensor(const TensorView* tv) {
  std::ostringstream ss;
  ss << tv->domainString();
  if (tv->hasMesh()) ss << " mesh=" << tv->mesh().toString();
  if (!tv->contiguity().empty()) {
    ss << " contiguity=";
    for (bool c : tv->contiguity()) ss << (c ? "t" : "f");
  }
  if (!tv->strideOrder().empty()) {
    ss << " stride_order=";
    for (int64_t s : tv->strideOrder()) ss << s;
  }
  ss << "\n";
  if (!tv->root().empty()) ss << "    root: " << idList(tv->root()) << "\n";
  if (tv->loop() != tv->logical()) ss << "    loop: " << idList(tv->loop()) << "\n";
  if (tv->hasAllocation()) ss << "    allocation: " << idList(tv->allocation()) << "\n";
  return ss.str();
}

std::string printFusion(const Fusion& f) {
  std::ostringstream ss;
  ss << "Fusion {\n";
  for (Val* in : f.inputs()) {
    ss << "  input ";
    if (in->isTensor()) ss << printTensor(static_cast<TensorView*>(in));
    else ss << valName(in) << "\n";
  }
  for (Expr* e : f.exprs()) {
    ss << "  " << e->out()->toString() << " = " << toString(e->op()) << "(";
    for (size_t i = 0; i < e->inputs().size(); ++i) ss << (i ? ", " : "") << valName(e->input(i));
    ss << attrString(e) << ")\n    " << printTensor(e->out());
  }
  ss << "  outputs:";
  for (Val* out : f.outputs()) ss << " " << out->toString();
  ss << "\n}\n";
  return ss.str();
}

uint64_t fingerprint(const Fusion& f) {
  std::string text = printFusion(f);
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace mf

namespace mf {
std::string Expr::toString() const {
  std::string s;
  for (size_t i = 0; i < outputs_.size(); ++i) s += (i ? ", " : "") + outputs_[i]->toString();
  s += std::string(" = ") + mf::toString(op_) + "(";
  for (size_t i = 0; i < inputs_.size(); ++i) s += (i ? ", " : "") + valName(inputs_[i]);
  return s + attrString(this) + ")";
}
}  // namespace mf
