// TensorView and the scheduling transforms on its loop domain.
#include <algorithm>
#include <cctype>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>

#include "ir/fusion.h"
#include "ir/nodes.h"
#include "support/error.h"
#include "support/text.h"

namespace mf {

std::string IterDomain::toString() const {
  std::ostringstream ss;
  ss << mf::toString(type_);
  if (ptype_ != ParallelType::Serial) ss << mf::toString(ptype_);
  ss << name_ << "{" << extent_.toString() << "}";
  if (rfactor_product_) ss << "rf";
  if (swizzle_ != ParallelType::Serial) ss << "~" << mf::toString(swizzle_);
  return ss.str();
}

std::string IdTransform::toString() const {
  std::ostringstream ss;
  auto names = [](const std::vector<IterDomain*>& ids) {
    std::string s;
    for (IterDomain* id : ids) s += (s.empty() ? "" : ", ") + id->toString();
    return s;
  };
  if (kind_ == Kind::Split) {
    ss << (inner_split_ ? "InnerSplit" : "OuterSplit") << "(" << names(inputs_) << ", factor " << factor_ << ") -> "
       << names(outputs_);
  } else {
    ss << "Merge(" << names(inputs_) << ") -> " << names(outputs_);
  }
  return ss.str();
}

void Val::removeUse(Expr* e) {
  auto it = std::find(uses_.begin(), uses_.end(), e);
  if (it != uses_.end()) uses_.erase(it);
}

std::string Scalar::toString() const {
  if (value_.has_value()) {
    // Shortest round trip: the printed text is the cache key, so 1.0000001 and 1.0000002 differ.
    return numberText(*value_);
  }
  if (isExtent()) return "S" + std::to_string(name()) + "{" + extent_ + "}";
  if (computation_) {
    // "S5[mul(S3_double, 2_double)]": the op and its typed operands, so that the text parses back.
    std::string s = "S" + std::to_string(name()) + "[" + mf::toString(computation_->op) + "(";
    for (size_t i = 0; i < computation_->operands.size(); ++i) {
      const Val* v = computation_->operands[i];
      s += (i ? ", " : "") + v->toString() + "_" + mf::toString(v->dtype());
    }
    return s + ")]";
  }
  return "S" + std::to_string(name());
}

TensorView* Expr::out() const {
  MF_CHECK(outputs_.size() == 1 && outputs_[0]->isTensor(), "expr has no single tensor output");
  return static_cast<TensorView*>(outputs_[0]);
}

TensorView* Expr::outTensor(size_t i) const {
  MF_CHECK(i < outputs_.size() && outputs_[i]->isTensor(), "expr has no tensor output ", i);
  return static_cast<TensorView*>(outputs_[i]);
}

TensorView::TensorView(int64_t name, DataType dtype, std::vector<IterDomain*> logical)
    : Val(ValKind::Tensor, name, dtype), logical_(logical), loop_(std::move(logical)) {}

std::vector<IterDomain*> TensorView::logicalNoReductions() const {
  std::vector<IterDomain*> ids;
  for (IterDomain* id : logical_) {
    if (!id->isReduction()) ids.push_back(id);
  }
  return ids;
}

int64_t TensorView::normalizeAxis(int64_t axis, int64_t ndims, const char* what) const {
  int64_t a = axis < 0 ? axis + ndims : axis;
  MF_USER_ARG_CHECK(a >= 0 && a < ndims, what, ": axis ", axis, " is out of range for ", toString(), " whose loop domain has ",
                    ndims, " axes ", domainString());
  return a;
}

IterDomain* TensorView::axis(int64_t i) const { return loop_[normalizeAxis(i, nDims(), "axis")]; }

namespace {
Extent divideExtent(const Extent& e, int64_t factor, bool ceil) {
  Extent r;
  if (e.isConst()) {
    r.value = ceil ? (e.value + factor - 1) / factor : e.value / factor;
  } else {
    // A compound extent ("s0-(min(1, s0))") is parenthesized before dividing.
    const bool name = std::all_of(e.symbol.begin(), e.symbol.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)); });
    const std::string operand = name ? e.symbol : "(" + e.symbol + ")";
    r.symbol = ceil ? "ceilDiv(" + e.symbol + ", " + std::to_string(factor) + ")" : operand + "/" + std::to_string(factor);
  }
  return r;
}
}  // namespace

void TensorView::split(int64_t axis_in, int64_t factor, bool inner_split) {
  fusion()->bump();
  int64_t a = normalizeAxis(axis_in, nDims(), "split");
  MF_USER_ARG_CHECK(factor > 0, "split: factor must be positive for ", toString(), " axis ", axis_in, "; got ", factor);
  IterDomain* id = loop_[a];
  Fusion* f = fusion();
  // The factor side has the constant extent; the other side divides (exactly for an even split,
  // which the runtime checks against actual extents).
  bool even = id->extent().isConst() && id->extent().value % factor == 0;
  Extent factor_extent{factor, ""};
  Extent rest = divideExtent(id->extent(), factor, !even && id->extent().isConst());
  if (!id->extent().isConst()) rest = divideExtent(id->extent(), factor, /*ceil=*/false);
  IterDomain* outer = f->newIterDomain(inner_split ? rest : factor_extent, id->iterType());
  IterDomain* inner = f->newIterDomain(inner_split ? factor_extent : rest, id->iterType());
  f->newTransform(IdTransform::Kind::Split, {id}, {outer, inner}, factor, inner_split);
  loop_[a] = outer;
  loop_.insert(loop_.begin() + a + 1, inner);
}

void TensorView::merge(int64_t axis_outer, int64_t axis_inner) {
  fusion()->bump();
  int64_t o = normalizeAxis(axis_outer, nDims(), "merge");
  int64_t i = normalizeAxis(axis_inner, nDims(), "merge");
  MF_USER_ARG_CHECK(o != i, "merge: cannot merge axis ", o, " of ", toString(), " with itself");
  IterDomain* a = loop_[o];
  IterDomain* b = loop_[i];
  MF_USER_ARG_CHECK(a->isReduction() == b->isReduction(), "merge: ", toString(), " axes ", o, " (", a->toString(),
                    ") and ", i, " (", b->toString(), ") must both be reductions or both not");
  Extent e;
  if (a->extent().isConst() && b->extent().isConst()) e.value = a->extent().value * b->extent().value;
  else e.symbol = a->extent().toString() + "*" + b->extent().toString();
  IterDomain* m = fusion()->newIterDomain(e, a->iterType());
  fusion()->newTransform(IdTransform::Kind::Merge, {a, b}, {m}, 0, false);
  std::vector<IterDomain*> result;
  for (int64_t k = 0; k < nDims(); ++k) {
    if (k == std::min(o, i)) result.push_back(m);
    else if (k != o && k != i) result.push_back(loop_[k]);
  }
  loop_ = result;
}

void TensorView::reorder(const std::vector<std::pair<int64_t, int64_t>>& old_to_new) {
  fusion()->bump();
  int64_t n = nDims();
  std::vector<IterDomain*> result(n, nullptr);
  std::set<int64_t> used_old;
  for (auto [o, nw] : old_to_new) {
    int64_t a = normalizeAxis(o, n, "reorder");
    int64_t b = normalizeAxis(nw, n, "reorder");
    MF_USER_ARG_CHECK(result[b] == nullptr, "reorder: two axes of ", toString(), " are moved to position ", b);
    MF_USER_ARG_CHECK(used_old.insert(a).second, "reorder: axis ", a, " of ", toString(), " is moved twice");
    result[b] = loop_[a];
  }
  size_t next = 0;
  for (int64_t a = 0; a < n; ++a) {
    if (used_old.count(a)) continue;
    while (result[next] != nullptr) ++next;
    result[next] = loop_[a];
  }
  loop_ = result;
}

void TensorView::parallelize(int64_t axis_in, ParallelType pt) {
  fusion()->bump();
  int64_t a = normalizeAxis(axis_in, nDims(), "parallelize");
  loop_[a]->parallelize(pt);
}

void TensorView::swizzle1d(int64_t axis_in, ParallelType pt) {
  fusion()->bump();
  int64_t a = normalizeAxis(axis_in, nDims(), "swizzle1d");
  MF_USER_ARG_CHECK(isDeviceParallel(pt), "swizzle1d: ", toString(), " axis ", axis_in,
                    ": the ring runs along a mesh axis (ParallelType.mesh_x/y/z); got ", mf::toString(pt));
  loop_[a]->setSwizzle(pt);
}

void TensorView::setAllocationAsLoop() {
  fusion()->bump();
  std::vector<IterDomain*> alloc;
  for (IterDomain* id : loop_) alloc.push_back(id);
  allocation_ = alloc;
}

void TensorView::setDeviceMesh(const DeviceMesh& mesh) {
  mesh_ = mesh;
  if (fusion() != nullptr) fusion()->bump();
}

std::string TensorView::toString() const { return "T" + std::to_string(name()); }

void TensorView::setUserName(std::string name) {
  bool word = !name.empty() && !std::isdigit(static_cast<unsigned char>(name[0]));
  for (char c : name) word = word && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.');
  MF_USER_ARG_CHECK(word, "define_tensor: name '", name, "' for ", toString(), " must be a word of letters, digits, '_' ",
                    "and '.' that does not start with a digit (e.g. \"hidden_states\")");
  user_name_ = std::move(name);
}

std::string TensorView::label() const { return user_name_.empty() ? toString() : toString() + " (" + user_name_ + ")"; }

std::string TensorView::domainString() const {
  auto list = [](const std::vector<IterDomain*>& ids) {
    std::string s = "[";
    for (size_t i = 0; i < ids.size(); ++i) s += (i ? ", " : "") + ids[i]->toString();
    return s + "]";
  };
  std::ostringstream ss;
  ss << toString() << "_" << mf::toString(dtype()) << list(logical_);
  return ss.str();
}

}  // namespace mf
