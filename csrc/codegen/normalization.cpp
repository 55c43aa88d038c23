// The persistent normalization plan: reductions over the innermost axes whose results flow back
// into the row (softmax, log-softmax, RMSNorm, LayerNorm, their backward), in one kernel; and the
// outer variant (reductions over the outermost axes, batch-norm-like), multi-pass.
//
// Requires: a successful analyzeSegment with at least one reduction. Guarantees on success: a
// NormPlan where every reduction reduces the same innermost (or outermost) axes of an input that has the
// whole domain; every tensor of the segment maps onto the domain (axis_map); every output either
// has the whole domain (stored per element) or the kept axes only (stored once per row); `stage`,
// `varies` and `home` say in which loop over the row each value is available or computed.
//
// Launch heuristics (aim: each row read from memory once, 16-byte accesses); the numbers are those
// of NormalizationParams (heuristics.h) for the sm_90 limits, measured on one H200:
//   vector   the widest of 8/4/2 elements (16 bytes for the widest full tensor) dividing the
//            reduced extent, the varying loads' outer strides and their pointer alignment.
//   warp     rows of at most 64 vectors: ceilPow2(vectors / 2) <= 32 lanes per row (two groups
//            per lane; 32 when the row count is not a multiple of the rows per warp), 256 threads
//            per block, shuffles only.
//   block    else one row per block of T = ceilPow2(vectors / 4) threads (64..512), `iters`
//            vector groups per thread (4 for the benchmark widths); 512-thread blocks holding <= 64
//            bytes of row data per thread ask for two blocks per SM (__launch_bounds__(512, 2)).
//   grid     a block per row (per block_y rows in warp mode): the block scheduler hands rows to
//            whichever SM frees a slot first. A grid of one wave striding over the rows measured
//            6-12% slower (0.84-0.89 of copy against 0.94-0.97 at 4096 and 256 columns): SMs do
//            not all get the same bandwidth, and a fixed share of rows per block makes every SM
//            wait for the slowest.
//   staged   512-thread rows that keep exp-like values (softmax at 16384 columns): a wave of
//            blocks strides over the rows and each copies its next row into shared memory by
//            cp.async while this one computes (all row loads or none, <= 96 KiB). With at most
//            two such blocks per SM, memory idles through a row's exp without it (0.72 -> 0.87);
//            with more resident blocks the block-per-row grid is faster (softmax at 4096: 0.96
//            against 0.87 staged).
//   outer    a column (kept index) per thread, 32 x 16 threads: threadIdx.y strides the reduced
//            rows (coalesced across threadIdx.x); partials combine through shared memory.
//   persistent  when the raw vectors of the loads that later loops read again fit in 64 registers
//            per thread (and iters x vec <= 32): they stay in registers and later loops recompute
//            from them, except transcendental values (exp, log, ...) later loops need again, which
//            are kept as floats while they fit in the same 64 registers (softmax: one exp per
//            element; recomputing made it compute-bound at ~60% of copy); else each loop re-reads
//            the row from global memory (multi-pass), still one kernel.
#include <algorithm>
#include <unordered_set>

#include "codegen/internal.h"
#include "support/error.h"
#include "support/text.h"

namespace mf {
namespace codegen {
namespace {

constexpr int64_t kInt32Max = 2147483647LL;
// The tunables (NormalizationParams, heuristics.h): groups_per_thread 4 keeps 64 bytes of each
// input in flight per thread (two left the 1024-thread blocks of a 16384-wide row at one block per
// SM and half the bytes in flight); staged rows take dynamic shared memory sized so that two blocks
// of 512 threads per SM still fit.

bool isTranscendental(OpType op) {
  switch (op) {
    case OpType::Exp:
    case OpType::Log:
    case OpType::Tanh:
    case OpType::Gelu:
    case OpType::Sigmoid:
    case OpType::Silu:
    case OpType::Erf:
    case OpType::Sin:
    case OpType::Cos:
    case OpType::Pow: return true;
    default: return false;
  }
}

int64_t ceilPow2(int64_t v) {
  int64_t p = 1;
  while (p < v) p *= 2;
  return p;
}

bool isOutput(const Analysis& a, const TensorView* tv) {
  const auto& outs = a.segment->outputs;
  return std::find(outs.begin(), outs.end(), tv) != outs.end();
}

// Map a tensor whose non-1 axes walk `domain_axes` in order; false when the extents disagree.
bool identityMap(const Analysis& a, const TensorView* tv, const std::vector<int>& domain_axes,
                 const std::vector<int64_t>& extents, std::vector<int>* m) {
  const auto& shape = a.shape.at(tv);
  m->assign(shape.size(), -1);
  size_t next = 0;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 1) continue;
    if (next >= domain_axes.size() || shape[i] != extents[static_cast<size_t>(domain_axes[next])]) return false;
    (*m)[i] = domain_axes[next++];
  }
  return next == domain_axes.size();
}

bool setAxisMap(const Analysis& a, NormPlan* p, const TensorView* tv, const std::vector<int>& m,
                const std::vector<int64_t>& extents, std::string* why) {
  const auto& shape = a.shape.at(tv);
  for (size_t i = 0; i < m.size(); ++i) {
    int64_t want = m[i] < 0 ? 1 : extents.at(static_cast<size_t>(m[i]));
    if (shape[i] != want) {
      *why = str(tv->toString(), " axis ", i, " has local extent ", shape[i], " but walks a row axis of extent ", want);
      return false;
    }
  }
  auto it = p->axis_map.find(tv);
  if (it != p->axis_map.end() && it->second != m) {
    *why = str(tv->toString(), " would be walked in two different axis orders in one normalization kernel");
    return false;
  }
  p->axis_map[tv] = m;
  return true;
}

// A Region over the kept (or reduced) half of the domain with every load's map restricted to it.
void halfRegion(const Analysis& a, const NormPlan& p, bool reduced_half, Region* r) {
  const size_t nk = p.kept.size();
  r->extents = reduced_half ? p.reduced : p.kept;
  for (const TensorView* tv : p.loads) {
    std::vector<int> m = p.axis_map.at(tv);
    for (int& d : m) {
      if (d < 0) continue;
      bool in_reduced = static_cast<size_t>(d) >= nk;
      if (in_reduced != reduced_half) d = -1;
      else if (reduced_half) d -= static_cast<int>(nk);
    }
    r->axis_map[tv] = m;
    r->loads.push_back(tv);
  }
  (void)a;
}

}  // namespace

bool scheduleNormalization(const Analysis& a, const CodegenOptions& o, Schedule* s, std::string* why) {
  const KernelSegment& seg = *a.segment;
  NormPlan& p = s->norm;
  s->kind = Kind::Normalization;
  for (const Expr* e : seg.exprs) {
    if (opInfo(e->op()).cuda_resize != nullptr || opInfo(e->op()).cuda_keeps_flat_order) {
      *why = str(e->toString(), ": the normalization kernel does not resize or reshape axes yet (slice, pad, cat "
                                "and reshape are generated in pointwise kernels)");
      return false;
    }
  }
  const NormalizationParams& np = s->normalization = NormalizationParams::forDevice(o.device);
  // The domain: the first reduction's input; domain axes number the kept axes first, then the
  // reduced ones. Inner: x is [kept..., reduced...]; outer: [reduced..., kept...].
  const Expr* first = a.reductions.at(0);
  const auto* x0 = static_cast<const TensorView*>(first->input(0));
  const auto& xs = a.shape.at(x0);
  std::vector<bool> flags;  // reduced, per non-1 axis of x0
  for (size_t i = 0; i < xs.size(); ++i) {
    if (xs[i] == 1) continue;
    const auto& dims = first->attr<Ints>("dims");
    bool r = std::find(dims.begin(), dims.end(), static_cast<int64_t>(i)) != dims.end();
    flags.push_back(r);
    (r ? p.reduced : p.kept).push_back(xs[i]);
  }
  auto runs = [&](bool first_flag) {  // all `first_flag` axes before all others
    size_t i = 0;
    while (i < flags.size() && flags[i] == first_flag) ++i;
    return std::none_of(flags.begin() + static_cast<std::ptrdiff_t>(i), flags.end(),
                        [&](bool f) { return f == first_flag; });
  };
  if (!runs(false)) {
    if (!runs(true)) {
      *why = str(first->toString(), ": the reduced axes of ", x0->toString(),
                 " are neither all innermost nor all outermost; the normalization kernel reduces one end");
      return false;
    }
    p.outer = true;
  }
  std::vector<int64_t> extents = p.kept;
  extents.insert(extents.end(), p.reduced.begin(), p.reduced.end());
  const int nk = static_cast<int>(p.kept.size());
  std::vector<int> all_axes, kept_axes;  // all_axes: x0's order
  for (int d = 0; d < nk; ++d) kept_axes.push_back(d);
  for (size_t d = 0; d < p.reduced.size(); ++d) {
    if (p.outer) all_axes.push_back(nk + static_cast<int>(d));
  }
  all_axes.insert(all_axes.end(), kept_axes.begin(), kept_axes.end());
  for (size_t d = 0; d < p.reduced.size(); ++d) {
    if (!p.outer) all_axes.push_back(nk + static_cast<int>(d));
  }
  // Anchors: every reduction input walks the whole domain; outputs the whole domain or the kept axes.
  std::unordered_set<const Expr*> reductions(a.reductions.begin(), a.reductions.end());
  for (const Expr* r : a.reductions) {
    const auto* x = static_cast<const TensorView*>(r->input(0));
    std::vector<int> m;
    if (!identityMap(a, x, all_axes, extents, &m)) {
      *why = str(r->toString(), ": its input ", x->toString(), " does not have the shape of ", x0->toString(),
                 " (every reduction of a normalization kernel reads the whole row domain)");
      return false;
    }
    // Its reduced axes must be exactly the domain's reduced axes.
    const auto& dims = r->attr<Ints>("dims");
    for (size_t i = 0; i < m.size(); ++i) {
      if (m[i] < 0) continue;
      bool reduced = std::find(dims.begin(), dims.end(), static_cast<int64_t>(i)) != dims.end();
      if (reduced != (m[i] >= nk)) {
        *why = str(r->toString(), " and ", first->toString(), " reduce different axes; one normalization kernel holds "
                   "reductions over the same axes");
        return false;
      }
    }
    if (!setAxisMap(a, &p, x, m, extents, why)) return false;
    std::vector<int> ym;
    if (!identityMap(a, r->out(), kept_axes, extents, &ym) || !setAxisMap(a, &p, r->out(), ym, extents, why)) {
      if (why->empty()) *why = str(r->out()->toString(), " does not have the kept axes of the row domain");
      return false;
    }
  }
  for (const TensorView* out : seg.outputs) {
    std::vector<int> m;
    if (identityMap(a, out, all_axes, extents, &m)) {
      if (!setAxisMap(a, &p, out, m, extents, why)) return false;
    } else if (identityMap(a, out, kept_axes, extents, &m)) {
      if (!setAxisMap(a, &p, out, m, extents, why)) return false;
      p.row_outputs.push_back(out);
    } else {
      *why = str("output ", out->toString(), " has local shape ", listText(a.shape.at(out)),
                 ", neither the row domain ", listText(extents), " nor its kept axes ", listText(p.kept));
      return false;
    }
  }
  // Walk back from the anchors through every non-reduction expr.
  for (auto it = seg.exprs.rbegin(); it != seg.exprs.rend(); ++it) {
    const Expr* e = *it;
    if (reductions.count(e)) continue;
    auto om = p.axis_map.find(e->out());
    if (om == p.axis_map.end()) {
      *why = str(e->toString(), " feeds neither an output nor a reduction of the normalization kernel");
      return false;
    }
    std::vector<int> out_map = om->second;
    for (const Val* v : e->inputs()) {
      if (!v->isTensor()) continue;
      const auto* in = static_cast<const TensorView*>(v);
      if (!setAxisMap(a, &p, in, inputMap(a, e, in, out_map), extents, why)) return false;
    }
  }
  // Loads (segment input order), varying, stage.
  for (const TensorView* tv : a.tensor_inputs) {
    auto it = p.axis_map.find(tv);
    if (it == p.axis_map.end()) continue;  // read only by nothing mapped (cannot happen in a live segment)
    p.loads.push_back(tv);
    // With an empty reduced domain (extent-1 reduced axes) each row is one element: every load
    // is read per element, so the reductions see it.
    bool varies = p.reduced.empty();
    for (int d : it->second) varies = varies || d >= nk;
    p.varies[tv] = varies;
    p.stage[tv] = 0;
  }
  for (const Expr* e : seg.exprs) {
    int stage = 0;
    bool varies = false;
    for (const Val* v : e->inputs()) {
      if (!v->isTensor()) continue;
      const auto* in = static_cast<const TensorView*>(v);
      stage = std::max(stage, p.stage.at(in));
      varies = varies || p.varies.at(in);
    }
    if (reductions.count(e)) {
      if (!varies) {
        *why = str(e->toString(), " reduces a value that is constant along the reduced axes");
        return false;
      }
      p.stage[e->out()] = stage + 1;
      p.varies[e->out()] = false;
      p.last_loop = std::max(p.last_loop, stage);
      continue;
    }
    p.stage[e->out()] = stage;
    p.varies[e->out()] = varies;
  }
  for (const TensorView* out : seg.outputs) {
    bool row = std::find(p.row_outputs.begin(), p.row_outputs.end(), out) != p.row_outputs.end();
    if (!row) p.last_loop = std::max(p.last_loop, p.stage.at(out));
    if (row && p.varies.at(out)) {
      *why = str("output ", out->toString(), " has the kept axes only but its value changes along the row");
      return false;
    }
  }
  // A varying value lives in the first loop that needs it (an output: the loop of its stage), so a
  // weight read only by the last loop is loaded there, not kept in registers from the first.
  std::unordered_map<const TensorView*, std::vector<const Expr*>> uses;
  for (const Expr* e : seg.exprs) {
    for (const Val* v : e->inputs()) {
      if (v->isTensor()) uses[static_cast<const TensorView*>(v)].push_back(e);
    }
  }
  auto settleHome = [&](const TensorView* tv) {
    int home = isOutput(a, tv) ? p.stage.at(tv) : p.last_loop;
    for (const Expr* e : uses[tv]) home = std::min(home, reductions.count(e) ? p.stage.at(tv) : p.home.at(e->out()));
    p.home[tv] = home;
  };
  for (auto e = seg.exprs.rbegin(); e != seg.exprs.rend(); ++e) {
    if (!reductions.count(*e) && p.varies.at((*e)->out())) settleHome((*e)->out());
  }
  for (const TensorView* tv : p.loads) {
    if (p.varies.at(tv)) settleHome(tv);
  }
  halfRegion(a, p, false, &p.row_region);
  halfRegion(a, p, true, &p.col_region);
  p.row_index = planIndexing(a, p.row_region);
  p.col_index = planIndexing(a, p.col_region);

  // What each loop computes: the values homed there, and whatever varying values they need (a
  // cached value outside its home loop is read from its registers, not recomputed).
  auto planLoops = [&]() {
    p.loop_values.assign(static_cast<size_t>(p.last_loop + 1), {});
    for (const auto& [tv, home] : p.home) p.loop_values[static_cast<size_t>(home)].insert(tv);
    for (size_t l = 0; l < p.loop_values.size(); ++l) {
      auto& m = p.loop_values[l];
      for (auto e = seg.exprs.rbegin(); e != seg.exprs.rend(); ++e) {
        if (reductions.count(*e) || !m.count((*e)->out())) continue;
        if (p.cached.count((*e)->out()) && p.home.at((*e)->out()) != static_cast<int>(l)) continue;
        for (const Val* in : (*e)->inputs()) {
          if (!in->isTensor()) continue;
          const auto* tv = static_cast<const TensorView*>(in);
          if (p.varies.at(tv)) m.insert(tv);
        }
      }
    }
  };
  planLoops();

  // Vector width.
  int64_t rows = 1, red = 1;
  for (int64_t e : p.kept) rows *= e;
  for (int64_t e : p.reduced) red *= e;
  s->rows = rows;
  s->red = red;
  s->count = p.outer ? red : rows;
  int64_t max_bytes = 1;
  for (const TensorView* tv : seg.outputs) {
    if (p.varies.at(tv) || std::find(p.row_outputs.begin(), p.row_outputs.end(), tv) == p.row_outputs.end()) {
      max_bytes = std::max(max_bytes, sizeInBytes(tv->dtype()));
    }
  }
  for (const TensorView* tv : p.loads) {
    if (p.varies.at(tv)) max_bytes = std::max(max_bytes, sizeInBytes(tv->dtype()));
  }
  s->vec = 1;
  KernelLaunch& l = s->launch;
  if (p.outer) {
    // A thread per kept element (column) and row of threads: threadIdx.y strides the reduced
    // rows, so each warp reads 32 adjacent columns of one row; every loop reads from memory.
    l.block_x = np.outer_block_x;
    l.block_y = np.outer_block_y;
    l.grid_x = std::max<int64_t>(1, std::min(ceilDiv(rows, l.block_x), np.sm_count * np.outer_blocks_per_sm));
    p.persistent = false;
    int64_t bound = rows * red + l.grid_x * l.block_x + l.block_y * rows;
    s->index64 = bound > kInt32Max || p.row_index.max_offset + p.col_index.max_offset > kInt32Max;
    return true;
  }
  for (int64_t v = std::min(np.vector.max_elements, np.vector.max_bytes / max_bytes); v >= 2 && !p.col_index.dims.empty();
       v /= 2) {
    bool ok = red % v == 0 && p.col_index.dims.back() % v == 0;
    for (const TensorView* tv : p.loads) {
      if (!p.varies.at(tv)) continue;
      const auto& cs = p.col_index.strides.at(tv);
      if (cs.back() != 1) ok = false;
      for (size_t c = 0; c + 1 < cs.size(); ++c) ok = ok && cs[c] % v == 0;
      for (int64_t rs : p.row_index.strides.at(tv)) ok = ok && rs % v == 0;
      if (a.arg.at(tv)->alignment_bytes < v * sizeInBytes(tv->dtype())) ok = false;
    }
    if (ok) {
      s->vec = v;
      break;
    }
  }
  // Threads, persistence.
  const int64_t vectors = ceilDiv(red, s->vec);
  if (vectors <= np.warp * np.groups_per_lane) {
    // Two vector groups per lane (twice the bytes in flight of one, half the shuffle steps per
    // element): a row takes ceilPow2(vectors / 2) <= 32 lanes. Rows sharing a warp must leave the
    // row loop together (the shuffles name every lane), so a sub-warp row needs rows to be a
    // multiple of the rows per warp.
    int64_t lanes = std::min(np.warp, ceilPow2(ceilDiv(vectors, np.groups_per_lane)));
    if (rows % (np.warp / lanes) != 0) lanes = np.warp;
    l.block_x = lanes;
    l.block_y = np.warp_mode_block / lanes;
    l.grid_x = std::max<int64_t>(1, std::min(ceilDiv(rows, l.block_y), np.max_grid));
  } else {
    l.block_x = std::min(std::max(np.min_row_threads, ceilPow2(ceilDiv(vectors, np.groups_per_thread))), np.max_row_threads);
    l.block_x = floorPow2(std::min(l.block_x, np.max_threads_per_block));
    l.grid_x = std::max<int64_t>(1, std::min(rows, np.max_grid));
  }
  p.iters = ceilDiv(vectors, l.block_x);
  // The loads later loops read again (p.reread); returns their bytes per vector group, kept in
  // registers by a persistent plan.
  auto planRereads = [&]() {
    p.reread.clear();
    int64_t bytes = 0;
    for (const TensorView* tv : p.loads) {
      if (!p.varies.at(tv)) continue;
      // The same for every row (a weight): read again from cache rather than held in registers.
      const auto& rs = p.row_index.strides.at(tv);
      if (std::all_of(rs.begin(), rs.end(), [](int64_t st) { return st == 0; }) && !p.kept.empty()) continue;
      for (int loop = p.home.at(tv) + 1; loop <= p.last_loop; ++loop) {
        if (p.loop_values[static_cast<size_t>(loop)].count(tv)) p.reread.insert(tv);
      }
      if (p.reread.count(tv)) bytes += s->vec * sizeInBytes(tv->dtype());
    }
    return bytes;
  };
  int64_t kept_bytes = planRereads();
  p.persistent = p.iters * s->vec <= np.max_unrolled_elements && p.iters * kept_bytes <= 4 * np.kept_registers_per_thread;
  // A transcendental value (exp, log, ...) that a later loop needs again is kept as floats from its
  // home loop when they fit beside the raw vectors: softmax's exp(x - max) is then computed once
  // per element (each recomputation costs a quarter-rate MUFU op and ~8 FMA-pipe instructions,
  // which made the kernel compute-bound at ~60% of copy bandwidth).
  if (p.persistent) {
    int64_t cached_bytes = 0;
    for (const Expr* e : seg.exprs) {
      const TensorView* tv = e->out();
      if (reductions.count(e) || !p.varies.at(tv) || !isTranscendental(e->op())) continue;
      bool later = false;
      for (int loop = p.home.at(tv) + 1; loop <= p.last_loop; ++loop) later = later || p.loop_values[static_cast<size_t>(loop)].count(tv);
      if (!later) continue;
      if (p.iters * (kept_bytes + cached_bytes + s->vec * 4) > 4 * np.kept_registers_per_thread) continue;
      cached_bytes += s->vec * 4;
      p.cached.insert(tv);
    }
    if (!p.cached.empty()) {
      planLoops();
      kept_bytes = planRereads() + cached_bytes;  // the loads later loops still read, with the cached values cut off
    }
  }
  // Blocks of 512+ threads: ask ptxas for two resident blocks per SM (<= 64 registers; as many as
  // the register file holds at 64 per thread on other devices) when the
  // row data held per thread is small, so that one block loads while the other sits in its
  // reductions' barriers (one 512-thread block per SM left LayerNorm at 16384 columns at 55% of
  // copy: 66 registers).
  const int64_t threads = l.block_x * l.block_y;
  if (p.persistent && threads >= np.resident_blocks_min_threads && p.iters * kept_bytes <= np.small_row_bytes) {
    l.min_blocks = std::max<int64_t>(
        1, std::min(np.registers_per_sm / (threads * np.registers_for_two_blocks), np.threads_per_sm / threads));
  }
  // 512-thread rows that cache transcendental values (softmax's exp): the block's next row is
  // copied into shared memory (dynamic, <= staged_bytes_per_block) by cp.async (sm_80+) while this
  // one computes (no registers), started once loop 0 has consumed the row's data and combined its
  // reductions; each thread copies and reads back only its own vectors, so a cp.async.wait_group
  // is the only synchronisation. The grid is then one wave striding over the rows. Measured no gain
  // or a loss on rows without cached values (RMSNorm at 16384: 0.90 -> 0.84), and keeping weights
  // in shared memory likewise (RMSNorm backward at 16384: 0.92 -> 0.85): neither is done.
  const bool loop0_reduces = std::any_of(a.reductions.begin(), a.reductions.end(), [&](const Expr* r) {
    return p.stage.at(static_cast<const TensorView*>(r->input(0))) == 0;
  });
  if (np.can_stage && p.persistent && l.block_x >= np.max_row_threads && !p.cached.empty() && loop0_reduces) {
    int64_t bytes = 0;
    bool copyable = true;  // every vector a cp.async size (4, 8 or 16 bytes)
    for (const TensorView* tv : p.loads) {
      const auto& rs = p.row_index.strides.at(tv);
      bool per_row = std::any_of(rs.begin(), rs.end(), [](int64_t st) { return st != 0; });
      if (!p.varies.at(tv) || p.home.at(tv) != 0 || !per_row) continue;
      const int64_t vector_bytes = s->vec * sizeInBytes(tv->dtype());
      copyable = copyable && (vector_bytes == 4 || vector_bytes == 8 || vector_bytes == 16);
      bytes += p.iters * l.block_x * vector_bytes;
      p.staged.insert(tv);
    }
    // All or none: a row half staged waits on its other loads anyway.
    if (!copyable || bytes > np.staged_bytes_per_block) p.staged.clear();
    l.shared_mem_bytes = p.staged.empty() ? 0 : bytes;
    if (!p.staged.empty()) {  // one wave striding over the rows
      l.grid_x = std::max<int64_t>(1, std::min(rows, np.sm_count * std::max<int64_t>(1, np.threads_per_sm / l.block_x)));
    }
  }
  // Offsets are computed for rows below `rows` only (the staged copy of the next row checks it);
  // the row counter itself reaches rows + gridDim.x * block_y.
  int64_t bound = std::max(rows * red + l.block_x * s->vec * (p.iters + 1), rows + 2 * l.grid_x * l.block_y);
  s->index64 = bound > kInt32Max || p.row_index.max_offset + p.col_index.max_offset > kInt32Max;
  return true;
}

}  // namespace codegen
}  // namespace mf
