// Scheduler choice and launch heuristics.
//
// Requires: a successful analyzeSegment. Guarantees: on success, Schedule holds the regions (with
// index plans), the kind of kernel and its launch configuration:
//   pointwise   no reduction; every output has the same local shape (up to extent-1 axes).
//   reduction   exactly one sum/max/min; a pointwise prologue over its input (ops feeding it) and a
//               pointwise epilogue over its output (ops consuming it, never reading prologue tensors
//               or broadcasting the result back). Inner layout (reduced axes innermost, ignoring
//               extent-1 axes) or outer layout (reduced axes outermost); middle axes are refused.
// Launch: block 128 (small) or 256 threads; grid = min(ceil(work / block), sm_count * blocks per SM
// at 2048 threads per SM), at least 1; all loops are grid-stride so any grid is correct.
#include <algorithm>
#include <unordered_set>

#include "codegen/internal.h"
#include "support/error.h"

namespace mf {
namespace codegen {
namespace {

constexpr int64_t kInt32Max = 2147483647LL;
constexpr int64_t kThreadsPerSm = 2048;

int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t floorPow2(int64_t v) {
  int64_t p = 1;
  while (p * 2 <= v) p *= 2;
  return p;
}

std::vector<int64_t> non1(const std::vector<int64_t>& s) {
  std::vector<int64_t> r;
  for (int64_t e : s) {
    if (e != 1) r.push_back(e);
  }
  return r;
}

int64_t gridFor(int64_t work_items, int64_t per_block, int64_t threads_per_block, const CodegenOptions& o) {
  int64_t resident = std::max<int64_t>(1, kThreadsPerSm / threads_per_block);
  return std::max<int64_t>(1, std::min(ceilDiv(work_items, per_block), o.sm_count * resident));
}

int64_t chooseVectorWidth(const Analysis& a, const Region& r, const IndexPlan& p) {
  if (p.dims.empty()) return 1;
  int64_t max_size = 1;
  for (const TensorView* tv : r.stores) max_size = std::max(max_size, sizeInBytes(tv->dtype()));
  for (const TensorView* tv : r.loads) {
    if (p.strides.at(tv).back() == 1) max_size = std::max(max_size, sizeInBytes(tv->dtype()));
  }
  for (int64_t v = std::min<int64_t>(8, 16 / max_size); v >= 2; v /= 2) {
    bool ok = p.dims.back() % v == 0;
    for (const TensorView* tv : r.loads) {
      const auto& s = p.strides.at(tv);
      if (s.back() == 0) continue;  // one element per group, broadcast over the vector
      if (s.back() != 1) ok = false;
      for (size_t c = 0; c + 1 < s.size(); ++c) {
        if (s[c] % v != 0) ok = false;
      }
      if (a.arg.at(tv)->alignment_bytes < v * sizeInBytes(tv->dtype())) ok = false;
    }
    if (ok) return v;
  }
  return 1;
}

bool schedulePointwise(const Analysis& a, const CodegenOptions& o, Schedule* s, std::string* why) {
  const KernelSegment& seg = *a.segment;
  s->kind = Kind::Pointwise;
  std::vector<const TensorView*> anchors(seg.outputs.begin(), seg.outputs.end());
  if (!buildRegion(a, seg.exprs, non1(a.shape.at(seg.outputs[0])), anchors, {}, {}, &s->main, why)) return false;
  s->main_index = planIndexing(a, s->main);
  s->vec = chooseVectorWidth(a, s->main, s->main_index);
  int64_t groups = s->main.numel() / s->vec;
  int64_t block = groups <= 128 * o.sm_count ? 128 : 256;
  block = floorPow2(std::max<int64_t>(32, std::min(block, o.max_threads_per_block)));
  s->launch.block_x = block;
  s->launch.grid_x = gridFor(groups, block, block, o);
  int64_t slack = s->launch.grid_x * block * s->vec;
  s->index64 = s->main.numel() + slack > kInt32Max || s->main_index.max_offset > kInt32Max;
  return true;
}

bool scheduleReduction(const Analysis& a, const CodegenOptions& o, Schedule* s, std::string* why) {
  const KernelSegment& seg = *a.segment;
  const Expr* red = a.reduction;
  const auto* x = static_cast<const TensorView*>(red->input(0));
  const TensorView* y = red->out();
  // Prologue: the exprs x depends on. Epilogue: the exprs that depend on y.
  std::unordered_set<const Val*> x_deps{x};
  std::vector<const Expr*> prologue, epilogue;
  for (auto it = seg.exprs.rbegin(); it != seg.exprs.rend(); ++it) {
    const Expr* e = *it;
    if (e == red || !x_deps.count(e->out())) continue;
    prologue.push_back(e);
    for (const Val* v : e->inputs()) x_deps.insert(v);
  }
  std::reverse(prologue.begin(), prologue.end());
  std::unordered_set<const Val*> y_deps{y};
  bool after = false;
  for (const Expr* e : seg.exprs) {
    if (e == red) {
      after = true;
      continue;
    }
    if (x_deps.count(e->out())) continue;
    bool reads_y = false;
    for (const Val* v : e->inputs()) reads_y = reads_y || y_deps.count(v);
    if (!after || !reads_y) {
      *why = str(e->toString(), " neither feeds nor consumes the reduction ", red->toString(),
                 "; a reduction kernel holds one reduction with its prologue and epilogue");
      return false;
    }
    y_deps.insert(e->out());
    epilogue.push_back(e);
  }
  // The reduction domain: x's axes of extent != 1, each reduced or kept.
  const auto& xs = a.shape.at(x);
  const auto& dims = red->attrs().dims;
  std::vector<bool> reduced_flags;
  s->rows = 1;
  s->red = 1;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (xs[i] == 1) continue;
    bool r = std::find(dims.begin(), dims.end(), static_cast<int64_t>(i)) != dims.end();
    reduced_flags.push_back(r);
    (r ? s->red : s->rows) *= xs[i];
  }
  auto sorted = [&](bool reduced_first) {
    bool seen_second = false;
    for (bool f : reduced_flags) {
      bool first = f == reduced_first;
      if (first && seen_second) return false;
      if (!first) seen_second = true;
    }
    return true;
  };
  if (sorted(false)) s->kind = Kind::InnerReduction;
  else if (sorted(true)) s->kind = Kind::OuterReduction;
  else {
    *why = str(red->toString(), ": the reduced axes of ", x->toString(),
               " are neither all innermost nor all outermost (a middle-axis reduction); not supported by the CUDA "
               "generator");
    return false;
  }
  auto is_output = [&](const TensorView* tv) {
    return std::find(seg.outputs.begin(), seg.outputs.end(), tv) != seg.outputs.end();
  };
  std::vector<const TensorView*> main_anchors{x};
  for (const Expr* e : prologue) {
    if (is_output(e->out()) && e->out() != x) main_anchors.push_back(e->out());
  }
  if (!buildRegion(a, prologue, non1(xs), main_anchors, {}, {}, &s->main, why)) return false;
  std::vector<const TensorView*> epi_anchors{y};
  for (const Expr* e : epilogue) {
    if (is_output(e->out())) epi_anchors.push_back(e->out());
  }
  std::vector<const TensorView*> forbidden;
  for (const Val* v : x_deps) {
    if (v->isTensor() && (a.producer.count(static_cast<const TensorView*>(v)) || v == x)) {
      forbidden.push_back(static_cast<const TensorView*>(v));
    }
  }
  if (!buildRegion(a, epilogue, non1(a.shape.at(y)), epi_anchors, {y}, forbidden, &s->epilogue, why)) return false;
  s->main_index = planIndexing(a, s->main);
  s->epilogue_index = planIndexing(a, s->epilogue);

  KernelLaunch& l = s->launch;
  if (s->kind == Kind::InnerReduction) {
    bool warp_per_row = s->red <= 256 || (s->red <= 2048 && s->rows >= 2 * o.sm_count);
    if (warp_per_row) {
      l.block_x = 32;
      l.block_y = floorPow2(std::max<int64_t>(1, std::min<int64_t>(8, o.max_threads_per_block / 32)));
    } else {
      l.block_x = s->red >= 16384 ? 1024 : (s->red >= 4096 ? 512 : 256);
      l.block_x = floorPow2(std::max<int64_t>(32, std::min(l.block_x, o.max_threads_per_block)));
    }
    l.grid_x = gridFor(s->rows, l.block_y, l.block_x * l.block_y, o);
  } else {
    l.block_x = 32;
    l.block_y = ceilDiv(s->rows, 32) >= 2 * o.sm_count ? 8 : 32;
    l.block_y = floorPow2(std::max<int64_t>(1, std::min(l.block_y, o.max_threads_per_block / 32)));
    l.grid_x = gridFor(s->rows, 32, l.block_x * l.block_y, o);
  }
  int64_t slack = l.grid_x * l.block_x * l.block_y * 2;
  s->index64 = s->rows * s->red + slack > kInt32Max || s->main_index.max_offset > kInt32Max ||
               s->epilogue_index.max_offset > kInt32Max;
  return true;
}

}  // namespace

bool chooseSchedule(const Analysis& a, const CodegenOptions& options, Schedule* s, std::string* why) {
  if (a.reduction == nullptr) return schedulePointwise(a, options, s, why);
  return scheduleReduction(a, options, s, why);
}

}  // namespace codegen
}  // namespace mf
