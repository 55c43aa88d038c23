#include "codegen/piece_recompute.h"

#include <algorithm>
#include <functional>
#include <unordered_map>

#include "ir/op_registry.h"

namespace mf {
namespace {

// How many exprs one value may take to compute again.
constexpr size_t kMaxChain = 6;

bool elementwise(const Expr* e) {
  const OpInfo& info = opInfo(e->op());
  return info.kind == OpKind::Unary || info.kind == OpKind::Binary || info.kind == OpKind::Ternary ||
         e->op() == OpType::BroadcastInDim;
}

// `small` has a broadcast axis where `big` has an iteration axis: a per-row statistic beside a row.
bool smallBeside(const Val* small, const Val* big) {
  if (!small->isTensor() || !big->isTensor()) return true;  // scalars
  auto s = static_cast<const TensorView*>(small)->logicalNoReductions();
  auto b = static_cast<const TensorView*>(big)->logicalNoReductions();
  if (s.size() != b.size()) return s.size() < b.size();
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i]->isBroadcast() && !b[i]->isBroadcast()) return true;
  }
  return false;
}

}  // namespace

Recompute recomputeInNextPiece(const std::vector<Expr*>& group, const std::vector<Expr*>& rest, const Fusion& fusion) {
  std::unordered_map<const Val*, Expr*> made_here;
  for (Expr* e : group) {
    for (Val* v : e->outputs()) made_here[v] = e;
  }
  std::unordered_set<const Expr*> in_rest(rest.begin(), rest.end()), in_group(group.begin(), group.end());
  Recompute r;
  std::unordered_set<const Expr*> chosen;
  for (const Expr* consumer : rest) {
    for (const Val* v : consumer->inputs()) {
      if (!made_here.count(v) || r.values.count(v) || !v->isTensor()) continue;
      // Its chain: the group's elementwise exprs back to values it did not make or small ones.
      std::vector<Expr*> chain;
      std::unordered_set<const Val*> leaves;
      int64_t narrow_bytes = 0;
      bool ok = true;
      std::function<void(const Val*)> walk = [&](const Val* x) {
        auto it = made_here.find(x);
        if (!ok || !x->isTensor()) return;
        if (it == made_here.end() || (x != v && smallBeside(x, v))) {
          if (it != made_here.end()) leaves.insert(x);
          else if (!smallBeside(x, v)) narrow_bytes += sizeInBytes(x->dtype());
          return;
        }
        Expr* p = it->second;
        if (!elementwise(p) || p->outputs().size() != 1 || chain.size() >= kMaxChain) {
          ok = false;
          return;
        }
        if (std::find(chain.begin(), chain.end(), p) != chain.end()) return;
        for (const Val* in : p->inputs()) walk(in);
        chain.push_back(p);
      };
      walk(v);
      // Nothing else may need the stored value, and recomputing must read less than storing and
      // loading it (an elementwise expr reads each of its inputs once per element).
      for (const Expr* use : v->uses()) ok = ok && (in_group.count(use) || in_rest.count(use));
      ok = ok && !fusion.isOutput(v) && narrow_bytes < 2 * sizeInBytes(v->dtype());
      if (!ok) continue;
      for (Expr* p : chain) {
        if (chosen.insert(p).second) r.exprs.push_back(p);
        for (const Val* out : p->outputs()) {
          // Stored still where something past this segment or the fusion's caller reads it.
          bool inside = !fusion.isOutput(out);
          for (const Expr* use : out->uses()) inside = inside && (in_group.count(use) || in_rest.count(use));
          if (inside) r.values.insert(out);
        }
      }
      r.leaves.insert(leaves.begin(), leaves.end());
    }
  }
  // The group's order: each expr after the ones that make its inputs.
  std::vector<Expr*> ordered;
  for (Expr* e : group) {
    if (chosen.count(e)) ordered.push_back(e);
  }
  r.exprs = ordered;
  return r;
}

}  // namespace mf
