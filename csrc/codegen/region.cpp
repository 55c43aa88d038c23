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

// `context`: which extents tv's walked axes must have (resize.cpp; 0: the domain's).
bool setMap(const Analysis& a, Region* r, const TensorView* tv, const std::vector<int>& m, std::string* why,
            int context = 0) {
  const auto& shape = a.shape.at(tv);
  const Context& c = r->contexts.at(static_cast<size_t>(context));
  for (size_t i = 0; i < m.size(); ++i) {
    int64_t want = m[i] < 0 ? 1 : c.at(static_cast<size_t>(m[i])).extent;
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

const TensorView* domainTensor(const Analysis& a, const TensorView* tv) {
  auto it = a.producer.find(tv);
  if (it == a.producer.end() || !opInfo(it->second->op()).cuda_keeps_flat_order) return tv;
  return static_cast<const TensorView*>(it->second->input(0));
}

bool buildRegion(const Analysis& a, const std::vector<const Expr*>& exprs, const std::vector<int64_t>& extents,
                 const std::vector<const TensorView*>& anchors, const std::vector<const TensorView*>& stop,
                 const std::vector<const TensorView*>& forbidden, Region* r, std::string* why) {
  r->extents = extents;
  r->contexts.assign(1, Context{});
  for (int64_t e : extents) r->contexts[0].push_back(AxisWalk{1, 0, e});
  // The contexts each tensor is needed in (resize.cpp); anchors and everything without a resize
  // upstream of it: {0}.
  std::unordered_map<const TensorView*, std::vector<int>> needed;
  auto need = [&](const TensorView* tv, int context) {
    auto& list = needed[tv];
    if (std::find(list.begin(), list.end(), context) == list.end()) list.push_back(context);
  };
  // A reshape keeps the row-major order: its output, an anchor, is stored at the domain's flat
  // index, and its input walks the domain in its place.
  std::unordered_set<const TensorView*> flat_anchors;
  for (const TensorView* anchor : anchors) {
    const TensorView* tv = domainTensor(a, anchor);
    if (tv != anchor) flat_anchors.insert(anchor);
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
    need(tv, 0);
  }
  std::unordered_set<const Val*> stop_set(stop.begin(), stop.end());
  std::unordered_set<const Val*> forbidden_set(forbidden.begin(), forbidden.end());
  std::vector<const Expr*> live;
  for (auto it = exprs.rbegin(); it != exprs.rend(); ++it) {
    const Expr* e = *it;
    auto om = r->axis_map.find(e->out());
    if (flat_anchors.count(e->out())) {  // its input was mapped as an anchor
      if (om != r->axis_map.end()) {
        *why = str(e->toString(), ": a reshape is generated only as a kernel output (here another op of the kernel "
                                  "reads it too)");
        return false;
      }
      live.push_back(e);
      continue;
    }
    if (om == r->axis_map.end()) continue;  // feeds nothing this region writes
    if (opInfo(e->op()).cuda_keeps_flat_order) {
      *why = str(e->toString(), ": a reshape is generated only as a kernel output whose input walks the kernel's "
                                "domain (here another op of the kernel reads it)");
      return false;
    }
    live.push_back(e);
    std::vector<int> out_map = om->second;
    const std::vector<int> out_contexts = needed.at(e->out());
    for (const Val* v : e->inputs()) {
      if (!v->isTensor()) continue;
      const auto* in = static_cast<const TensorView*>(v);
      if (forbidden_set.count(in)) {
        *why = str(e->toString(), " reads ", in->toString(),
                   ", which lives on the reduction's input domain; a reduction epilogue can only read the reduction "
                   "result and segment inputs");
        return false;
      }
    }
    std::vector<std::pair<const TensorView*, int>> needs;
    if (opInfo(e->op()).cuda_resize != nullptr) {
      for (int c : out_contexts) {
        if (!addResizeBranches(a, e, out_map, c, r, &needs, why)) return false;
      }
    } else {
      for (const Val* v : e->inputs()) {
        if (!v->isTensor()) continue;
        for (int c : out_contexts) needs.emplace_back(static_cast<const TensorView*>(v), c);
      }
    }
    for (const auto& [in, c] : needs) {
      std::vector<int> m;
      if (opInfo(e->op()).cuda_resize != nullptr) {
        if (!resizeInputMap(a, e, in, out_map, &m, why)) return false;
      } else {
        m = inputMap(a, e, in, out_map);
      }
      if (!setMap(a, r, in, m, why, c)) return false;
      need(in, c);
    }
  }
  for (auto& [tv, list] : needed) {
    std::sort(list.begin(), list.end());
    if (list != std::vector<int>{0}) r->value_contexts[tv] = list;
    if (stop_set.count(tv) && list != std::vector<int>{0}) {
      *why = str(tv->toString(), " is read at other coordinates (through a slice, pad or cat) where the kernel "
                                 "only has it at its own");
      return false;
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
      if (!r->axis_map.count(in)) continue;  // a resize branch no output coordinate takes
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
  // Groups of adjacent domain axes; a group's stride is its innermost axis's stride. An axis a
  // resize shifts keeps a coordinate of its own (its guards and shifted offsets need it).
  const std::vector<bool> resized = resizedAxes(r);
  std::vector<std::vector<size_t>> groups;
  for (size_t d = 0; d < n; ++d) {
    bool merge = !groups.empty() && !resized[d] && !resized[groups.back().back()];
    if (merge) {
      size_t prev = groups.back().back();
      for (const TensorView* tv : r.loads) {
        if (dom[tv][prev] != dom[tv][d] * r.extents[d]) merge = false;
      }
    }
    if (merge) groups.back().push_back(d);
    else groups.push_back({d});
  }
  p.group.assign(n, 0);
  for (size_t k = 0; k < groups.size(); ++k) {
    int64_t e = 1;
    for (size_t d : groups[k]) {
      e *= r.extents[d];
      p.group[d] = static_cast<int>(k);
    }
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
    // Read in another context too: its own extents bound the offsets, and the flat index is not one.
    if (r.value_contexts.count(tv)) {
      linear = false;
      const KernelTensorArg* arg = a.arg.at(tv);
      int64_t own = 0;
      for (size_t i = 0; i < arg->sizes.size(); ++i) own += std::max<int64_t>(arg->sizes[i] - 1, 0) * arg->strides[i];
      reach = std::max(reach, own);
    }
    p.max_offset = std::max(p.max_offset, reach);
    p.strides[tv] = s;
    p.linear[tv] = linear;
  }
  return p;
}

}  // namespace codegen
}  // namespace mf
