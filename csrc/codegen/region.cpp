// Iteration regions and their index plans.
//
// Requires: an Analysis (local shapes of every tensor). Guarantees: buildRegion maps every tensor
// axis walked by a region onto one domain axis (or none, for local extent 1), consistently across
// all uses, and refuses a tensor that would have to be walked in two different orders (e.g. T and
// permute(T) both feeding outputs of a square shape); planIndexing merges adjacent domain axes that
// every loaded tensor walks contiguously, so most kernels decompose a flat index into 1-2 coordinates.
#include <algorithm>
#include <unordered_set>

#include "codegen/internal.h"
#include "support/error.h"

namespace mf {
namespace codegen {
namespace {

std::string mapText(const std::vector<int>& m) {
  std::string t = "[";
  for (size_t i = 0; i < m.size(); ++i) t += (i ? ", " : "") + std::to_string(m[i]);
  return t + "]";
}

}  // namespace

std::vector<int> inputMap(const Analysis& a, const Expr* e, const TensorView* in, const std::vector<int>& out_map) {
  const auto& in_shape = a.shape.at(in);
  std::vector<int> m(in_shape.size(), -1);
  size_t index = std::find(e->inputs().begin(), e->inputs().end(), in) - e->inputs().begin();
  std::vector<int64_t> p2c = opInfo(e->op()).axis_map(e, index);
  std::vector<int64_t> no_reduction = nonReductionPositions(e->out());
  for (size_t i = 0; i < m.size(); ++i) {
    int64_t c = p2c[i] < 0 ? -1 : no_reduction[p2c[i]];
    if (c >= 0 && in_shape[i] != 1) m[i] = out_map.at(static_cast<size_t>(c));
  }
  return m;
}

namespace {

bool setMap(const Analysis& a, Region* r, const TensorView* tv, const std::vector<int>& m, std::string* why) {
  const auto& shape = a.shape.at(tv);
  for (size_t i = 0; i < m.size(); ++i) {
    int64_t want = m[i] < 0 ? 1 : r->extents.at(static_cast<size_t>(m[i]));
    if (shape[i] != want) {
      *why = str(tv->toString(), " axis ", i, " has local extent ", shape[i], " but walks a kernel axis of extent ", want);
      return false;
    }
  }
  auto it = r->axis_map.find(tv);
  if (it != r->axis_map.end() && it->second != m) {
    *why = str(tv->toString(), " would be walked in two different axis orders (", mapText(it->second), " and ",
               mapText(m), ") in one kernel");
    return false;
  }
  r->axis_map[tv] = m;
  return true;
}

}  // namespace

bool buildRegion(const Analysis& a, const std::vector<const Expr*>& exprs, const std::vector<int64_t>& extents,
                 const std::vector<const TensorView*>& anchors, const std::vector<const TensorView*>& stop,
                 const std::vector<const TensorView*>& forbidden, Region* r, std::string* why) {
  r->extents = extents;
  for (const TensorView* tv : anchors) {
    const auto& shape = a.shape.at(tv);
    std::vector<int> m(shape.size(), -1);
    std::vector<int64_t> non1;
    for (size_t i = 0; i < shape.size(); ++i) {
      if (shape[i] == 1) continue;
      m[i] = static_cast<int>(non1.size());
      non1.push_back(shape[i]);
    }
    if (non1 != extents) {
      *why = str(tv->toString(), " does not have the shape of the kernel's iteration domain (outputs of one kernel must "
                                 "have the same local shape, up to extent-1 axes)");
      return false;
    }
    if (!setMap(a, r, tv, m, why)) return false;
  }
  std::unordered_set<const Val*> stop_set(stop.begin(), stop.end());
  std::unordered_set<const Val*> forbidden_set(forbidden.begin(), forbidden.end());
  std::vector<const Expr*> live;
  for (auto it = exprs.rbegin(); it != exprs.rend(); ++it) {
    const Expr* e = *it;
    auto om = r->axis_map.find(e->out());
    if (om == r->axis_map.end()) continue;  // feeds nothing this region writes
    live.push_back(e);
    std::vector<int> out_map = om->second;
    for (const Val* v : e->inputs()) {
      if (!v->isTensor()) continue;
      const auto* in = static_cast<const TensorView*>(v);
      if (forbidden_set.count(in)) {
        *why = str(e->toString(), " reads ", in->toString(),
                   ", which lives on the reduction's input domain; a reduction epilogue can only read the reduction "
                   "result and segment inputs");
        return false;
      }
      if (!setMap(a, r, in, inputMap(a, e, in, out_map), why)) return false;
    }
  }
  std::reverse(live.begin(), live.end());
  r->exprs = live;
  std::unordered_set<const Val*> produced;
  std::unordered_set<const Val*> loaded;
  const auto& outs = a.segment->outputs;
  for (const Expr* e : live) {
    for (const Val* v : e->inputs()) {
      if (!v->isTensor() || produced.count(v) || loaded.count(v) || stop_set.count(v)) continue;
      const auto* in = static_cast<const TensorView*>(v);
      if (!a.arg.count(in)) {
        *why = str(e->toString(), " reads ", in->toString(), ", which is computed outside this part of the kernel");
        return false;
      }
      loaded.insert(v);
      r->loads.push_back(in);
    }
    produced.insert(e->out());
    if (std::find(outs.begin(), outs.end(), e->out()) != outs.end()) {
      if (std::find(anchors.begin(), anchors.end(), e->out()) == anchors.end()) {
        *why = str("output ", e->out()->toString(), " is not on the kernel's iteration domain");
        return false;
      }
      r->stores.push_back(e->out());
    }
  }
  for (const TensorView* tv : anchors) {  // e.g. a reduction whose input is a segment input
    if (a.arg.count(tv) && !loaded.count(tv)) {
      loaded.insert(tv);
      r->loads.push_back(tv);
    }
  }
  return true;
}

IndexPlan planIndexing(const Analysis& a, const Region& r) {
  IndexPlan p;
  size_t n = r.extents.size();
  std::unordered_map<const TensorView*, std::vector<int64_t>> dom;
  for (const TensorView* tv : r.loads) {
    std::vector<int64_t> s(n, 0);
    const auto& m = r.axis_map.at(tv);
    const KernelTensorArg* arg = a.arg.at(tv);
    for (size_t i = 0; i < m.size(); ++i) {
      if (m[i] >= 0) s[static_cast<size_t>(m[i])] = arg->strides[i];
    }
    dom[tv] = s;
  }
  // Groups of adjacent domain axes; a group's stride is its innermost axis's stride.
  std::vector<std::vector<size_t>> groups;
  for (size_t d = 0; d < n; ++d) {
    bool merge = !groups.empty();
    if (merge) {
      size_t prev = groups.back().back();
      for (const TensorView* tv : r.loads) {
        if (dom[tv][prev] != dom[tv][d] * r.extents[d]) merge = false;
      }
    }
    if (merge) groups.back().push_back(d);
    else groups.push_back({d});
  }
  for (const auto& g : groups) {
    int64_t e = 1;
    for (size_t d : g) e *= r.extents[d];
    p.dims.push_back(e);
  }
  for (const TensorView* tv : r.loads) {
    std::vector<int64_t> s;
    for (const auto& g : groups) s.push_back(dom[tv][g.back()]);
    bool linear = true;
    int64_t expect = 1;
    int64_t reach = 0;
    for (size_t c = s.size(); c-- > 0;) {
      if (s[c] != expect) linear = false;
      expect *= p.dims[c];
      reach += (p.dims[c] - 1) * s[c];
    }
    p.max_offset = std::max(p.max_offset, reach);
    p.strides[tv] = s;
    p.linear[tv] = linear;
  }
  return p;
}

}  // namespace codegen
}  // namespace mf
