#include "ir/printer.h"

#include <algorithm>
#include <functional>
#include <iomanip>
#include <map>
#include <sstream>

#include "support/text.h"

namespace mf {
namespace {

std::string idList(const std::vector<IterDomain*>& ids) {
  std::vector<std::string> items;
  for (const IterDomain* id : ids) items.push_back(id->toString());
  return listText(items);
}

std::string valName(const Val* v) {
  if (v->isTensor()) return v->toString();
  auto* s = static_cast<const Scalar*>(v);
  return s->value() ? s->toString() : s->toString() + "_" + toString(s->dtype());
}


// ", name=value" per attribute, in declaration order (the parser reads them back by name).
std::string attrString(const Expr* e) {
  std::string s;
  for (const AttrDef& d : opInfo(e->op()).attributes) {
    const AttrValue& value = e->attributes().value(d.name);
    if (d.omitted_when_default && d.default_value && value == *d.default_value) continue;
    s += std::string(", ") + d.name + "=" + attrValueText(value);
  }
  return s;
}

// Operands as printFusion writes them: constants carry their dtype so that the text parses back.
std::string typedValName(const Val* v) {
  if (v->isTensor()) return v->toString();
  return v->toString() + "_" + toString(v->dtype());
}

}  // namespace

std::vector<const IdTransform*> transformsOf(const TensorView* tv) {
  const auto& base = tv->rootOrLogical();
  std::vector<const IdTransform*> order;
  std::function<void(const IterDomain*)> visit = [&](const IterDomain* id) {
    if (std::find(base.begin(), base.end(), id) != base.end()) return;
    const IdTransform* t = id->definition();
    if (t == nullptr || std::find(order.begin(), order.end(), t) != order.end()) return;
    for (const IterDomain* in : t->inputs()) visit(in);
    order.push_back(t);
  };
  for (const auto* ids : {&tv->logical(), &tv->loop(), &tv->allocation()}) {
    for (const IterDomain* id : *ids) visit(id);
  }
  return order;
}

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
  if (!tv->userName().empty()) ss << " name=" << tv->userName();
  ss << "\n";
  if (!tv->root().empty()) ss << "    root: " << idList(tv->root()) << "\n";
  for (const IdTransform* t : transformsOf(tv)) ss << "    " << t->toString() << "\n";
  if (tv->loop() != tv->logical()) ss << "    loop: " << idList(tv->loop()) << "\n";
  if (tv->hasAllocation()) ss << "    allocation: " << idList(tv->allocation()) << "\n";
  return ss.str();
}

std::string printFusion(const Fusion& f) {
  std::ostringstream ss;
  ss << "Fusion {\n";
  if (!f.symbolEqualities().empty()) {
    std::map<std::string, std::string> sorted(f.symbolEqualities().begin(), f.symbolEqualities().end());
    ss << "  symbols:";
    for (const auto& [a, b] : sorted) ss << " " << a << "=" << b;
    ss << "\n";
  }
  if (!f.overlap().empty()) ss << "  overlap: " << f.overlap() << "\n";
  for (Val* in : f.inputs()) {
    ss << "  input ";
    if (in->isTensor()) ss << printTensor(static_cast<TensorView*>(in));
    else ss << valName(in) << "\n";
  }
  for (Expr* e : f.exprs()) {
    ss << "  ";
    for (size_t i = 0; i < e->outputs().size(); ++i) ss << (i ? ", " : "") << e->output(i)->toString();
    ss << " = " << toString(e->op()) << "(";
    for (size_t i = 0; i < e->inputs().size(); ++i) ss << (i ? ", " : "") << typedValName(e->input(i));
    ss << attrString(e) << ")\n";
    for (const Val* out : e->outputs()) ss << "    " << printTensor(static_cast<const TensorView*>(out));
  }
  ss << "  outputs:";
  for (Val* out : f.outputs()) ss << " " << out->toString();
  ss << "\n}\n";
  return ss.str();
}

uint64_t fingerprint(const Fusion& f) { return fnv1a(printFusion(f)); }

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
