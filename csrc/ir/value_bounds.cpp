// Range facts about values (value_bounds.h). Every check asks the op registry; nothing here
// switches on an op's type.
#include "ir/value_bounds.h"

#include <cstdint>
#include <vector>

#include "ir/nodes.h"
#include "ir/op_registry.h"

namespace mf {
namespace {

// The same elements: one Val, or one deterministic unary op (same attributes) of one Val.
bool sameValue(const Val* a, const Val* b) {
  if (a == b) return true;
  const Expr* da = a->definition();
  const Expr* db = b->definition();
  if (da == nullptr || db == nullptr || da->op() != db->op()) return false;
  if (opInfo(da->op()).kind != OpKind::Unary || da->inputs().size() != 1 || db->inputs().size() != 1) return false;
  return da->input(0) == db->input(0) && da->attributes() == db->attributes() && a->dtype() == b->dtype();
}

// The position among t's runtime (non-reduction) axes of t->rootOrLogical()[i]; -1 for a
// reduction axis, or when t's root differs from its logical domain (then positions are unclear).
int64_t runtimeAxis(const TensorView* t, int64_t i) {
  if (!t->root().empty() || i < 0 || i >= static_cast<int64_t>(t->logical().size())) return -1;
  if (t->logical()[static_cast<size_t>(i)]->isReduction()) return -1;
  int64_t pos = 0;
  for (int64_t j = 0; j < i; ++j) pos += t->logical()[static_cast<size_t>(j)]->isReduction() ? 0 : 1;
  return pos;
}

// Where each runtime axis of e's input 0 lands among the runtime axes of e's output (-1: nowhere).
std::vector<int64_t> follow(const Expr* e, const std::vector<int64_t>& positions) {
  const std::vector<int64_t> map = opInfo(e->op()).axis_map(e, 0);
  std::vector<int64_t> out(positions.size(), -1);
  for (size_t k = 0; k < positions.size(); ++k) {
    const int64_t p = positions[k];
    if (p >= 0 && p < static_cast<int64_t>(map.size())) out[k] = runtimeAxis(e->out(), map[static_cast<size_t>(p)]);
  }
  return out;
}

}  // namespace

bool knownNonPositive(const Val* v) {
  const Expr* diff = v->definition();
  if (diff == nullptr || !opInfo(diff->op()).is_difference || diff->inputs().size() != 2) return false;
  const Val* a = diff->input(0);
  const Val* b = diff->input(1);
  if (!a->isTensor() || !b->isTensor()) return false;
  // b's producers back to an upper-bound reduction, through layouts that keep values and axes
  // (broadcast_in_dim, squeeze, permute; not reshape, slice, pad or cat).
  std::vector<const Expr*> layouts;
  const Expr* reduction = nullptr;
  for (const Val* cur = b; reduction == nullptr;) {
    const Expr* d = cur->definition();
    if (d == nullptr || d->outputs().size() != 1 || d->inputs().size() != 1) return false;
    const OpInfo& info = opInfo(d->op());
    if (info.kind == OpKind::Reduction && info.bounds_above) {
      reduction = d;
    } else if (info.kind == OpKind::Layout && !info.regroups_axes && info.axis_map != nullptr) {
      layouts.push_back(d);
      cur = d->input(0);
    } else {
      return false;
    }
  }
  const Val* source = reduction->input(0);
  if (!source->isTensor() || !sameValue(source, a)) return false;
  const auto* a_tv = static_cast<const TensorView*>(a);
  const auto* b_tv = static_cast<const TensorView*>(b);
  const size_t rank = a_tv->logicalNoReductions().size();
  const std::vector<IterDomain*> b_axes = b_tv->logicalNoReductions();
  if (b_axes.size() != rank || static_cast<const TensorView*>(source)->logicalNoReductions().size() != rank) return false;
  std::vector<int64_t> positions(rank);
  for (size_t k = 0; k < rank; ++k) positions[k] = static_cast<int64_t>(k);
  positions = follow(reduction, positions);
  const std::vector<bool> kept = [&] {
    std::vector<bool> r(rank);
    for (size_t k = 0; k < rank; ++k) r[k] = positions[k] >= 0;
    return r;
  }();
  for (auto it = layouts.rbegin(); it != layouts.rend(); ++it) positions = follow(*it, positions);
  // Kept axes back at their own positions; every other axis of b a broadcast of the bound.
  for (size_t k = 0; k < rank; ++k) {
    if (kept[k] && positions[k] != static_cast<int64_t>(k)) return false;
    if (!kept[k] && !b_axes[k]->isBroadcast()) return false;
  }
  return true;
}

}  // namespace mf
