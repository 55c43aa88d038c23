// Resize ops (slice, pad, cat) in generated kernels: index arithmetic on the consumer side.
//
// A resize op is never materialized. Where its output is read at domain coordinate c, each of its
// inputs is read at the coordinate the op's rule gives (ir/resize_map.h) under a guard (the output
// range that input covers); the output value is a select among those branches (or pad's fill
// value). Everything upstream of the resize is computed again at the input's coordinates: a
// *context* (internal.h) says, per domain axis, which coordinate and extent that is. rotate_half
// (cat(-x[h:], x[:h])) thus reads x three times per element (as is, shifted up, shifted down),
// two of them guarded so that only one touches memory.
//
// Requires: a Region under construction (buildRegion) whose output maps are known. Guarantees:
// every branch's input context walks the same axes as the output's; guards that always or never
// hold over the domain are resolved here (a branch that never holds is dropped, its inputs not
// read); loads are guarded so that no context reads outside its tensor; a read at a fixed
// coordinate of a longer axis (a slice or crop down to extent 1) is refused with the reason.
#include <algorithm>
#include <limits>

#include "codegen/internal.h"
#include "support/error.h"

namespace mf {
namespace codegen {
namespace {

constexpr int64_t kNoLow = std::numeric_limits<int64_t>::min();
constexpr int64_t kNoHigh = std::numeric_limits<int64_t>::max();

// Resolves `g` over c in [0, extent): false when it never holds; bounds that always hold dropped.
bool resolve(Guard* g, int64_t extent) {
  const int64_t first = g->offset, last = g->step * (extent - 1) + g->offset;  // step > 0
  if (last < g->lo || first >= g->hi) return false;
  if (g->lo != kNoLow && first >= g->lo) g->lo = kNoLow;
  if (g->hi != kNoHigh && last < g->hi) g->hi = kNoHigh;
  return true;
}

int contextIndex(Region* r, const Context& c) {
  for (size_t k = 0; k < r->contexts.size(); ++k) {
    if (r->contexts[k] == c) return static_cast<int>(k);
  }
  r->contexts.push_back(c);
  return static_cast<int>(r->contexts.size()) - 1;
}

std::string affine(int64_t step, int64_t offset, const std::string& c) {
  std::string t = step == 1 ? c : c + " * " + std::to_string(step);
  if (offset > 0) t += " + " + std::to_string(offset);
  if (offset < 0) t += " - " + std::to_string(-offset);
  return t;
}

}  // namespace

std::string valueName(const TensorView* tv, int context) {
  return context == 0 ? tensorLocal(tv) : tensorLocal(tv) + "_c" + std::to_string(context);
}

bool resizeInputMap(const Analysis& a, const Expr* e, const TensorView* in, const std::vector<int>& out_map,
                    std::vector<int>* m, std::string* why) {
  const auto& in_shape = a.shape.at(in);
  MF_CHECK(in_shape.size() == out_map.size(), "codegen: resize ", e->toString(), " changes the rank");
  m->assign(in_shape.size(), -1);
  for (size_t p = 0; p < in_shape.size(); ++p) {
    if (in_shape[p] == 1) continue;
    if (out_map[p] < 0) {
      *why = str(e->toString(), ": axis ", p, " of ", in->toString(), " (extent ", in_shape[p],
                 ") is read at one fixed coordinate (the result has extent 1 there); generated kernels resize "
                 "axes the kernel walks");
      return false;
    }
    (*m)[p] = out_map[p];
  }
  return true;
}

bool addResizeBranches(const Analysis& a, const Expr* e, const std::vector<int>& out_map, int context, Region* r,
                       std::vector<std::pair<const TensorView*, int>>* needs, std::string* why) {
  const OpInfo& info = opInfo(e->op());
  std::vector<std::vector<int64_t>> shapes;
  for (const Val* v : e->inputs()) {
    shapes.push_back(v->isTensor() ? a.shape.at(static_cast<const TensorView*>(v)) : std::vector<int64_t>{});
  }
  std::vector<ResizeBranch>& branches = r->branches[{e, context}];
  branches.clear();
  for (size_t k = 0; k < e->inputs().size(); ++k) {
    if (!e->input(k)->isTensor()) continue;
    const auto* in = static_cast<const TensorView*>(e->input(k));
    std::vector<AxisResize> axes;
    if (!info.cuda_resize(e, k, shapes, &axes, why)) return false;
    std::vector<int> in_map;
    if (!resizeInputMap(a, e, in, out_map, &in_map, why)) return false;
    const Context& out_context = r->contexts.at(static_cast<size_t>(context));
    Context c = out_context;
    ResizeBranch b;
    b.input = in;
    bool live = true;
    for (size_t p = 0; p < axes.size() && live; ++p) {
      const AxisResize& x = axes[p];
      const int d = out_map[p];
      if (d < 0) {  // the output coordinate is 0 here; so must the input's be (resizeInputMap)
        live = x.lo <= 0 && 0 < x.hi;
        continue;
      }
      const AxisWalk& w = out_context[static_cast<size_t>(d)];
      if (x.lo != kNoLow || x.hi != kNoHigh) {
        Guard g{d, w.step, w.offset, x.lo, x.hi};
        live = resolve(&g, r->extents[static_cast<size_t>(d)]);
        if (live && (g.lo != kNoLow || g.hi != kNoHigh)) b.guards.push_back(g);
      }
      AxisWalk& iw = c[static_cast<size_t>(d)];
      if (in_map[p] < 0) iw = AxisWalk{1, 0, 1};  // not walked: extent 1 upstream
      else iw = AxisWalk{x.step * w.step, x.step * w.offset + x.offset, shapes[k][p]};
    }
    if (!live) continue;  // no output coordinate of this context reads this input
    b.context = contextIndex(r, c);
    needs->emplace_back(in, b.context);
    branches.push_back(std::move(b));
    // Past a branch that always holds, no other input is read (cat: the rest of the axis).
    if (branches.back().guards.empty()) break;
  }
  return true;
}

std::vector<Guard> loadGuards(const Region& r, const TensorView* tv, int context) {
  std::vector<Guard> guards;
  if (context == 0) return guards;
  const auto& m = r.axis_map.at(tv);
  for (int d : m) {
    if (d < 0) continue;
    const AxisWalk& w = r.contexts[static_cast<size_t>(context)][static_cast<size_t>(d)];
    Guard g{d, w.step, w.offset, 0, w.extent};
    if (!resolve(&g, r.extents[static_cast<size_t>(d)])) {
      // Never in bounds: a branch reaching it is guarded off everywhere; read nothing (the guard
      // 0 <= x < 0 never holds).
      g.lo = 0;
      g.hi = 0;
    }
    if (g.lo != kNoLow || g.hi != kNoHigh) guards.push_back(g);
  }
  return guards;
}

std::vector<bool> resizedAxes(const Region& r) {
  std::vector<bool> resized(r.extents.size(), false);
  for (size_t k = 1; k < r.contexts.size(); ++k) {
    for (size_t d = 0; d < resized.size(); ++d) {
      if (!(r.contexts[k][d] == r.contexts[0][d])) resized[d] = true;
    }
  }
  for (const auto& [key, branches] : r.branches) {
    for (const ResizeBranch& b : branches) {
      for (const Guard& g : b.guards) resized[static_cast<size_t>(g.axis)] = true;
    }
  }
  return resized;
}

bool resizeAllowsVector(const Region& r, int64_t vec) {
  if (r.extents.empty() || vec == 1) return true;
  const size_t inner = r.extents.size() - 1;
  auto aligned = [&](int64_t step, int64_t v) { return step == 1 && v % vec == 0; };
  for (size_t k = 1; k < r.contexts.size(); ++k) {
    const AxisWalk& w = r.contexts[k][inner];
    if (w == r.contexts[0][inner]) continue;  // the domain's own walk (vectors may span merged axes)
    if (w.extent == 1 && w.step == 1 && w.offset == 0) continue;  // not walked: one value per vector
    if (!aligned(w.step, w.offset) || w.extent % vec != 0) return false;
  }
  for (const auto& [key, branches] : r.branches) {
    for (const ResizeBranch& b : branches) {
      for (const Guard& g : b.guards) {
        if (static_cast<size_t>(g.axis) != inner) continue;
        if (!aligned(g.step, g.offset) || (g.lo != kNoLow && g.lo % vec != 0) ||
            (g.hi != kNoHigh && g.hi % vec != 0)) {
          return false;
        }
      }
    }
  }
  return true;
}

std::string walkedCoord(const AxisWalk& w, const std::string& c) {
  std::string t = affine(w.step, w.offset, c);
  return t == c ? c : "(" + t + ")";
}

std::string guardText(const std::vector<Guard>& guards, const std::vector<std::string>& axis_coord) {
  std::string text;
  for (const Guard& g : guards) {
    const std::string& c = axis_coord.at(static_cast<size_t>(g.axis));
    MF_CHECK(!c.empty(), "codegen: no coordinate for the guarded axis ", g.axis);
    if (g.lo == 0 && g.hi == 0) return "false";
    // Unit steps compare the coordinate itself: lo <= c + o < hi is lo - o <= c < hi - o.
    const std::string x = g.step == 1 ? c : affine(g.step, g.offset, c);
    const int64_t shift = g.step == 1 ? g.offset : 0;
    if (g.lo != kNoLow) text += (text.empty() ? "" : " && ") + std::to_string(g.lo - shift) + " <= " + x;
    if (g.hi != kNoHigh) text += (text.empty() ? "" : " && ") + x + " < " + std::to_string(g.hi - shift);
  }
  return text;
}

std::string emitResize(const Region& r, const Expr* e, int context, const std::vector<std::string>& axis_coord,
                       const std::string& indent) {
  const OpInfo& info = opInfo(e->op());
  const std::vector<ResizeBranch>& branches = r.branches.at({e, context});
  std::string value = info.resize_fill_input >= 0 ? operandText(e->input(static_cast<size_t>(info.resize_fill_input)))
                                                  : std::string();
  // From the last branch back: "g0 ? v0 : (g1 ? v1 : fill)"; without a fill value the last branch
  // is what is left of the axis (its guard need not be tested).
  for (size_t i = branches.size(); i-- > 0;) {
    const ResizeBranch& b = branches[i];
    const std::string v = valueName(b.input, b.context);
    const std::string g = guardText(b.guards, axis_coord);
    if (value.empty() || g.empty()) value = v;
    else value = "(" + g + ") ? " + v + " : " + (value.find(' ') == std::string::npos ? value : "(" + value + ")");
  }
  MF_CHECK(!value.empty(), "codegen: resize ", e->toString(), " has no branch and no fill value");
  return indent + "const float " + valueName(e->out(), context) + " = " + value + ";  // " + e->toString() + "\n";
}

}  // namespace codegen
}  // namespace mf
