#include "ir/fusion.h"

#include <algorithm>
#include <cctype>
#include <functional>
#include <unordered_set>

#include "ir/op_checks.h"
#include "support/error.h"

namespace mf {

IterDomain* Fusion::newIterDomain(Extent extent, IterType type) {
  return newIterDomainNamed(next_id_name_, std::move(extent), type);
}

IterDomain* Fusion::newIterDomainNamed(int64_t name, Extent extent, IterType type) {
  ids_.push_back(std::make_unique<IterDomain>(name, std::move(extent), type));
  next_id_name_ = std::max(next_id_name_, name + 1);
  return ids_.back().get();
}

TensorView* Fusion::newTensorNamed(int64_t name, DataType dtype, std::vector<IterDomain*> logical) {
  int64_t saved = std::max(next_tensor_name_, name + 1);
  next_tensor_name_ = name;
  TensorView* tv = newTensor(dtype, std::move(logical));
  next_tensor_name_ = saved;
  return tv;
}

Scalar* Fusion::newScalarNamed(int64_t name, DataType dtype, std::optional<double> value, std::string extent) {
  int64_t saved = std::max(next_scalar_name_, name + 1);
  next_scalar_name_ = name;
  Scalar* s = newScalar(dtype, value, std::move(extent));
  next_scalar_name_ = saved;
  return s;
}

void Fusion::reserveSymbol(const std::string& symbol) {
  if (symbol.size() < 2 || symbol[0] != 's') return;
  size_t digits = 1;
  while (digits < symbol.size() && std::isdigit(static_cast<unsigned char>(symbol[digits]))) ++digits;
  if (digits == 1) return;
  next_symbol_ = std::max<int64_t>(next_symbol_, std::stoll(symbol.substr(1, digits - 1)) + 1);
}

void Fusion::setOverlap(const std::string& mode) {
  MF_USER_ARG_CHECK(mode.empty() || mode == "auto" || mode == "ring" || mode == "chunked", "overlap: expected None, ",
                    "\"auto\", \"ring\" or \"chunked\"; got \"", mode, "\"");
  bump();
  overlap_ = mode;
}

IterDomain* Fusion::cloneIterDomain(const IterDomain* id) {
  IterDomain* c = newIterDomain(id->extent(), id->iterType());
  c->parallelize(id->parallelType());
  c->setSwizzle(id->swizzle());
  return c;
}

IdTransform* Fusion::newTransform(IdTransform::Kind kind, std::vector<IterDomain*> in, std::vector<IterDomain*> out,
                                  int64_t factor, bool inner_split) {
  transforms_.push_back(std::make_unique<IdTransform>(kind, std::move(in), out, factor, inner_split));
  IdTransform* t = transforms_.back().get();
  for (IterDomain* o : out) o->setDefinition(t);
  return t;
}

TensorView* Fusion::newTensor(DataType dtype, std::vector<IterDomain*> logical) {
  vals_.push_back(std::make_unique<TensorView>(next_tensor_name_++, dtype, std::move(logical)));
  vals_.back()->setFusion(this);
  return static_cast<TensorView*>(vals_.back().get());
}

Scalar* Fusion::newScalar(DataType dtype, std::optional<double> value, std::string extent) {
  vals_.push_back(std::make_unique<Scalar>(next_scalar_name_++, dtype, value, std::move(extent)));
  vals_.back()->setFusion(this);
  return static_cast<Scalar*>(vals_.back().get());
}

Expr* Fusion::newExpr(OpType op, std::vector<Val*> inputs, std::vector<Val*> outputs, const Attributes& attrs) {
  for (const Val* in : inputs) {
    MF_USER_ARG_CHECK(in->fusion() == this, toString(op), ": operand ", in->toString(),
                      " belongs to another fusion definition; an op takes values of the definition it is built in");
  }
  const OpInfo& info = opInfo(op);
  auto candidate = std::make_unique<Expr>(static_cast<int64_t>(exprs_.size()), op, inputs, outputs,
                                          completeAttributes(info.name, info.attributes, attrs));
  checkExpr(candidate.get());  // before wiring: a refused expr leaves no trace
  exprs_.push_back(std::move(candidate));
  Expr* e = exprs_.back().get();
  bump();
  for (Val* in : inputs) in->addUse(e);
  for (Val* out : outputs) {
    MF_CHECK(out->definition() == nullptr, "value ", out->toString(), " already has a definition");
    out->setDefinition(e);
  }
  return e;
}

Extent Fusion::newSymbol() {
  Extent e;
  e.symbol = "s" + std::to_string(next_symbol_++);
  return e;
}

void Fusion::unifySymbols(const std::string& a, const std::string& b) {
  std::string ra = canonicalSymbol(a), rb = canonicalSymbol(b);
  if (ra == rb) return;
  // A plain symbol ("s3", bound by an input) represents a derived one ("s0+4"): inputs bind it.
  auto plain = [](const std::string& s) {
    return std::all_of(s.begin(), s.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)); });
  };
  if (plain(ra) != plain(rb)) {
    if (plain(ra)) symbol_parent_[rb] = ra;
    else symbol_parent_[ra] = rb;
    return;
  }
  symbol_parent_[std::max(ra, rb)] = std::min(ra, rb);
}

std::string Fusion::canonicalSymbol(const std::string& s) const {
  std::string cur = s;
  for (auto it = symbol_parent_.find(cur); it != symbol_parent_.end(); it = symbol_parent_.find(cur)) cur = it->second;
  return cur;
}

void Fusion::unlink(Expr* e) {
  for (Val* in : e->inputs()) in->removeUse(e);
  for (Val* out : e->outputs()) {
    if (out->definition() == e) out->setDefinition(nullptr);
  }
}

void Fusion::replaceInputOf(Expr* consumer_expr, Val* original, Val* replacement) {
  bool found = false;
  for (size_t i = 0; i < consumer_expr->inputs().size(); ++i) {
    if (consumer_expr->input(i) == original) {
      consumer_expr->replaceInput(i, replacement);
      found = true;
    }
  }
  MF_CHECK(found, original->toString(), " is not an input of ", consumer_expr->toString());
  original->removeUse(consumer_expr);
  replacement->addUse(consumer_expr);
}

void Fusion::addInput(Val* v) {
  MF_USER_CHECK(v->definition() == nullptr, "fusion input ", v->toString(), " must not be produced by an op");
  MF_USER_CHECK(!isInput(v), v->toString(), " is already a fusion input");
  inputs_.push_back(v);
  bump();
}

void Fusion::addOutput(Val* v) {
  MF_USER_ARG_CHECK(v->isTensor(), "add_output: only tensors can be outputs; got scalar ", v->toString());
  MF_USER_ARG_CHECK(v->fusion() == this, "add_output: ", v->toString(), " belongs to another fusion definition");
  outputs_.push_back(v);
  bump();
}

bool Fusion::isInput(const Val* v) const { return std::find(inputs_.begin(), inputs_.end(), v) != inputs_.end(); }
bool Fusion::isOutput(const Val* v) const { return std::find(outputs_.begin(), outputs_.end(), v) != outputs_.end(); }

std::vector<Expr*> Fusion::exprs() const {
  std::vector<Expr*> order;
  std::unordered_set<const Expr*> visited;
  std::function<void(const Val*)> visit = [&](const Val* v) {
    Expr* def = v->definition();
    if (def == nullptr || visited.count(def)) return;
    visited.insert(def);
    for (Val* in : def->inputs()) visit(in);
    order.push_back(def);
  };
  for (Val* out : outputs_) visit(out);
  return order;
}

std::vector<TensorView*> Fusion::allTensors() const {
  std::vector<TensorView*> tvs;
  std::unordered_set<const Val*> seen;
  auto add = [&](Val* v) {
    if (v->isTensor() && seen.insert(v).second) tvs.push_back(static_cast<TensorView*>(v));
  };
  for (Val* in : inputs_) add(in);
  for (Expr* e : exprs()) {
    for (Val* in : e->inputs()) add(in);
    for (Val* out : e->outputs()) add(out);
  }
  return tvs;
}

std::unique_ptr<Fusion> Fusion::clone(std::unordered_map<const Val*, Val*>* out_map) const {
  auto f = std::make_unique<Fusion>();
  f->next_symbol_ = next_symbol_;
  f->overlap_ = overlap_;
  f->next_id_name_ = next_id_name_;
  f->symbol_parent_ = symbol_parent_;
  std::unordered_map<const IterDomain*, IterDomain*> id_map;
  // IterDomains keep their names so that printed IR of a clone reads like the original.
  for (const auto& id : ids_) {
    f->ids_.push_back(std::make_unique<IterDomain>(id->name(), id->extent(), id->iterType()));
    IterDomain* c = f->ids_.back().get();
    c->parallelize(id->parallelType());
    c->setRFactorProduct(id->isRFactorProduct());
    c->setSwizzle(id->swizzle());
    id_map[id.get()] = c;
  }
  auto map_ids = [&](const std::vector<IterDomain*>& ids) {
    std::vector<IterDomain*> out;
    for (IterDomain* id : ids) out.push_back(id_map.at(id));
    return out;
  };
  for (const auto& t : transforms_) {
    f->newTransform(t->kind(), map_ids(t->inputs()), map_ids(t->outputs()), t->factor(), t->innerSplit());
  }
  std::unordered_map<const Val*, Val*> val_map;
  for (const auto& v : vals_) {
    std::unique_ptr<Val> c;
    if (v->isTensor()) {
      auto* tv = static_cast<const TensorView*>(v.get());
      auto ctv = std::make_unique<TensorView>(tv->name(), tv->dtype(), map_ids(tv->logical()));
      ctv->setRoot(map_ids(tv->root()));
      ctv->setLoop(map_ids(tv->loop()));
      if (tv->hasAllocation()) ctv->setAllocation(map_ids(tv->allocation()));
      ctv->setContiguity(tv->contiguity());
      ctv->setStrideOrder(tv->strideOrder());
      ctv->setDeviceMesh(tv->mesh());
      if (!tv->userName().empty()) ctv->setUserName(tv->userName());
      c = std::move(ctv);
    } else {
      auto* s = static_cast<const Scalar*>(v.get());
      auto cs = std::make_unique<Scalar>(s->name(), s->dtype(), s->value(), s->extent());
      if (s->computation()) {  // its operands were made before it, so they are mapped already
        Scalar::Computation comp = *s->computation();
        for (Val*& operand : comp.operands) operand = val_map.at(operand);
        cs->setComputation(comp);
      }
      c = std::move(cs);
    }
    c->setFusion(f.get());
    val_map[v.get()] = c.get();
    f->vals_.push_back(std::move(c));
  }
  f->next_tensor_name_ = next_tensor_name_;
  f->next_scalar_name_ = next_scalar_name_;
  auto map_vals = [&](const std::vector<Val*>& vals) {
    std::vector<Val*> out;
    for (Val* v : vals) out.push_back(val_map.at(v));
    return out;
  };
  for (const auto& e : exprs_) {
    // Unlinked exprs are copied too (cheap) but only live ones are wired.
    bool live = !e->outputs().empty() && e->outputs()[0]->definition() == e.get();
    if (!live) continue;
    f->newExpr(e->op(), map_vals(e->inputs()), map_vals(e->outputs()), e->attributes());
  }
  f->inputs_ = map_vals(inputs_);
  f->outputs_ = map_vals(outputs_);
  if (out_map) *out_map = val_map;
  return f;
}

}  // namespace mf
