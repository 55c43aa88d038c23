// Scheduler choice and launch heuristics.
//
// Requires: a successful analyzeSegment. Guarantees: on success, Schedule holds the regions (with
// index plans), the kind of kernel, its vector width / unroll and its launch configuration:
//   pointwise   no reduction; every output has the same local shape (up to extent-1 axes).
//   reduction   one sum/max/min, or several over the same axes of same-shaped inputs in the outer
//               layout (a LayerNorm backward's weight and bias gradients: column sums that read the
//               same rows); a pointwise prologue over the inputs (ops feeding them) and a pointwise
//               epilogue over the outputs (ops consuming them, never reading prologue tensors or
//               broadcasting a result back). Inner layout (reduced axes innermost, ignoring
//               extent-1 axes) or outer layout (reduced axes outermost); middle axes are refused.
//               Several inner reductions take the normalization kernel (a row per block already
//               reads the row once for all of them).
// All loops are grid-stride, so any grid is correct; the heuristics only chase bandwidth.
//
// Heuristics (the aim: 16-byte accesses and several of them in flight per thread); the numbers are
// those of PointwiseParams / ReductionParams / TransposeParams (heuristics.h) for the sm_90 limits:
//   vector     the widest of 8/4/2 elements (at most 16 bytes for the widest tensor) that divides
//              the inner extent, every outer stride and the pointer alignment; reductions also need
//              it to divide the reduced extent (inner) or the column count (outer).
//   unroll     4 (else 2) vector groups per thread per loop step when every thread has at least
//              that many: all their loads are issued before any math, so a thread keeps up to 4
//              x 16 bytes per tensor in flight instead of one access and a stall. Pointwise kernels
//              always take 4 and fall through loops of 2 and 1 (their text must not depend on the
//              outer extent).
//   pointwise  block 128 (small) or 256; grid = min(groups / block, sm_count * 2048 / block).
//   inner      warp per row (block 32 x 8) for short rows; else one row per block, 256 threads when
//              rows are plentiful (>= 2 per SM), else up to 1024 with at least 2 vectors per thread.
//   outer      each thread owns `vec` adjacent columns; block (tx, ty) with tx = 32 (fewer for a
//              handful of columns), ty = 512 / tx threads splitting the reduced rows (fewer when
//              several reductions' partials would pass 32 KiB of shared memory); the reduced rows
//              split into chunks over grid_y until the grid is one wave of resident blocks (at
//              least 32 rows a chunk), the last block of a tile combining. Double compute (no
//              split): tx the widest of 32..4 that still gives >= 1 column tile per SM, ty = 512 /
//              tx (1024 / tx with fewer tiles than SMs).
//
// Measured on one H200, bf16 [16384, 16384] (device copy ~4.0-4.1 TB/s read+write). Before:
//   gelu(x * y + bias)  0.596 ms = 2.70 TB/s = 66% of copy (vec 8, 256 x 1056, one group per step)
//   sum(x, -1)          0.165 ms = 81% of copy (1024 threads per row, 2-byte loads; torch 0.169 ms)
//   sum(x, 0)           0.184 ms = 72% of copy (32 columns x 32 rows per block, 2-byte loads;
//                       torch 0.141 ms = 94%)
// After (same H200, kernels built by nvcc -O3 from the generated text, 30-launch average; copy
// measured at 4.15-4.17 TB/s in the same runs):
//   gelu(x * y + bias)  0.455 ms = 3.54 TB/s = 85% (vec 8, unroll 4, 256 x 1056; most of the gain
//                       is mf_float_to_bf16 as one cvt: 0.558 ms with the integer rounding)
//   sum(x, -1)          0.119 ms = 4.5 TB/s read (256 threads per row, vec 8, unroll 4, grid 1056)
//   sum(x, 0)           0.123 ms (block 8 x 64, 64 columns per block, vec 8, unroll 4, grid 256);
//                       tried: 4 x 64 (512 blocks) 0.145, 8 x 32 0.128, 8 x 128 0.125, 16 x 32 0.127
#include <algorithm>
#include <unordered_set>

#include "codegen/internal.h"
#include "support/error.h"

namespace mf {
namespace codegen {

int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t floorPow2(int64_t v) {
  int64_t p = 1;
  while (p * 2 <= v) p *= 2;
  return p;
}

namespace {

constexpr int64_t kInt32Max = 2147483647LL;

std::vector<int64_t> non1(const std::vector<int64_t>& s) {
  std::vector<int64_t> r;
  for (int64_t e : s) {
    if (e != 1) r.push_back(e);
  }
  return r;
}

// The largest power of two up to max_unroll that every thread has as many loop steps of (at least 1).
int64_t unrollFor(int64_t steps_per_thread, int64_t max_unroll) {
  int64_t u = 1;
  while (u * 2 <= max_unroll && u * 2 <= steps_per_thread) u *= 2;
  return u;
}

// One wave of resident blocks (threads_per_sm / threads_per_block per SM) at most.
int64_t gridFor(int64_t work_items, int64_t per_block, int64_t threads_per_block, int64_t sm_count,
                int64_t threads_per_sm) {
  int64_t resident = std::max<int64_t>(1, threads_per_sm / threads_per_block);
  return std::max<int64_t>(1, std::min(ceilDiv(work_items, per_block), sm_count * resident));
}

// `extent`: a further extent the vector must divide (reductions: the reduced or kept extent; 0: none).
int64_t chooseVectorWidth(const Analysis& a, const Region& r, const IndexPlan& p, const VectorParams& vp,
                          int64_t extent = 0) {
  if (p.dims.empty()) return 1;
  int64_t max_size = 1;
  for (const TensorView* tv : r.stores) max_size = std::max(max_size, sizeInBytes(tv->dtype()));
  for (const TensorView* tv : r.loads) {
    if (p.strides.at(tv).back() == 1) max_size = std::max(max_size, sizeInBytes(tv->dtype()));
  }
  for (int64_t v = std::min(vp.max_elements, vp.max_bytes / max_size); v >= 2; v /= 2) {
    bool ok = p.dims.back() % v == 0 && extent % v == 0;
    for (const TensorView* tv : r.loads) {
      const auto& s = p.strides.at(tv);
      if (s.back() == 0) continue;  // one element per group, broadcast over the vector
      if (s.back() != 1) ok = false;
      for (size_t c = 0; c + 1 < s.size(); ++c) {
        if (s[c] % v != 0) ok = false;
      }
      if (a.arg.at(tv)->alignment_bytes < v * sizeInBytes(tv->dtype())) ok = false;
    }
    if (ok && resizeAllowsVector(r, v)) return v;
  }
  return 1;
}

// A load contiguous along another axis than the outputs' innermost one would be read with a
// stride: when all such loads share that axis, tile_a x lanes_b vec tiles (TransposeParams) over (it,
// innermost) go through shared memory so that both the strided loads and the output stores are coalesced.
bool chooseTranspose(const Analysis& a, const CodegenOptions& o, Schedule* s) {
  const IndexPlan& p = s->main_index;
  const int64_t n = static_cast<int64_t>(p.dims.size());
  if (n < 2 || p.dims.back() < 2) return false;
  // The tiles hold float compute values (paired float2 stores, 4 bytes each): a kernel computing in
  // double (double or integer tensors) stays pointwise, with strided loads but exact values.
  if (a.compute_double) return false;
  if (s->main.hasResize()) return false;  // the tiles read every load in the domain's context only
  for (const Expr* e : s->main.exprs) {
    if (opInfo(e->op()).cuda_keeps_flat_order) return false;  // a reshape output: stored by flat index
  }
  int64_t axis = -1;
  for (const TensorView* tv : s->main.loads) {
    const auto& st = p.strides.at(tv);
    if (st.back() == 1 || st.back() == 0) continue;
    int64_t contiguous = -1;
    for (int64_t d = 0; d + 1 < n; ++d) {
      if (st[static_cast<size_t>(d)] == 1 && p.dims[static_cast<size_t>(d)] > 1) contiguous = d;
    }
    if (contiguous < 0 || (axis >= 0 && axis != contiguous)) return false;
    axis = contiguous;
    s->transposed.push_back(tv);
  }
  if (axis < 0) return false;
  s->kind = Kind::Transpose;
  s->transpose_axis = axis;
  const TransposeParams& tp = s->transpose = TransposeParams::forDevice(o.device);
  // Vector width along B for the outputs and the loads contiguous along B: at most 16 bytes and 8
  // elements (the tiles are capped below), dividing B, their other strides and alignment. 16-byte
  // bf16 vectors measured 0.93 of copy against 0.87 for 8-byte ones.
  int64_t max_bytes = 1;
  for (const TensorView* tv : s->main.stores) max_bytes = std::max(max_bytes, sizeInBytes(tv->dtype()));
  s->vec = 1;
  for (int64_t v = std::min(tp.vector.max_elements, tp.vector.max_bytes / max_bytes); v >= 2 && s->vec == 1; v /= 2) {
    bool ok = p.dims.back() % v == 0;
    for (const TensorView* tv : s->main.loads) {
      if (std::find(s->transposed.begin(), s->transposed.end(), tv) != s->transposed.end()) continue;
      const auto& st = p.strides.at(tv);
      if (st.back() != 1) continue;  // broadcast along B: one element per vector
      for (size_t d = 0; d + 1 < st.size(); ++d) ok = ok && st[d] % v == 0;
      ok = ok && a.arg.at(tv)->alignment_bytes >= v * sizeInBytes(tv->dtype()) &&
           sizeInBytes(tv->dtype()) * v <= tp.vector.max_bytes;
    }
    if (ok) s->vec = v;
  }
  // Two A-adjacent elements per lane as one vector (bf16: 4 bytes, 128 bytes per warp row) when A
  // is even and every transposed load's other strides and pointer allow it.
  s->vec_a = p.dims[static_cast<size_t>(axis)] % 2 == 0 ? 2 : 1;
  for (const TensorView* tv : s->transposed) {
    const auto& st = p.strides.at(tv);
    for (int64_t d = 0; d < n; ++d) {
      if (d != axis && st[static_cast<size_t>(d)] % 2 != 0) s->vec_a = 1;
    }
    if (a.arg.at(tv)->alignment_bytes < 2 * sizeInBytes(tv->dtype()) || sizeInBytes(tv->dtype()) > 8) s->vec_a = 1;
  }
  // Static shared memory: the float tiles (lanes_b vec x tile_a) of every transposed load, within the cap.
  auto tile_bytes = [&] {
    const int64_t loads = static_cast<int64_t>(s->transposed.size());
    return loads * tp.lanes_b * s->vec * tp.tile_a * static_cast<int64_t>(sizeof(float));
  };
  while (s->vec > 1 && tile_bytes() > tp.tile_bytes_cap) s->vec /= 2;
  if (tile_bytes() > tp.tile_bytes_cap) {
    s->kind = Kind::Pointwise;
    s->transposed.clear();
    return false;
  }
  s->launch.block_x = tp.block_x;
  s->launch.block_y = tp.block_y;
  int64_t tiles = s->main.numel() / (p.dims[static_cast<size_t>(axis)] * p.dims.back()) *
                  ceilDiv(p.dims[static_cast<size_t>(axis)], tp.tile_a) * ceilDiv(p.dims.back(), tp.lanes_b * s->vec);
  // Four 256-thread blocks per SM on the H200 (<= 64 registers; bf16 with 16-byte B vectors uses
  // 61-63) and a grid of exactly that many: one wave. Eight per SM in the grid with six resident
  // (8-byte vectors, 40 registers) left a third of the time to a tail of two blocks per SM.
  s->launch.min_blocks = tp.blocks_per_sm;
  s->launch.grid_x = std::max<int64_t>(1, std::min(tiles, tp.sm_count * s->launch.min_blocks));
  s->count = tiles;
  s->index64 = s->main.numel() + tp.tile_a * p.dims.back() + tp.lanes_b * s->vec > kInt32Max || p.max_offset > kInt32Max ||
               tiles + s->launch.grid_x > kInt32Max;
  return true;
}

bool schedulePointwise(const Analysis& a, const CodegenOptions& o, Schedule* s, std::string* why) {
  const KernelSegment& seg = *a.segment;
  s->kind = Kind::Pointwise;
  std::vector<const TensorView*> anchors(seg.outputs.begin(), seg.outputs.end());
  const auto& domain_shape = a.shape.at(domainTensor(a, seg.outputs[0]));
  if (!buildRegion(a, seg.exprs, non1(domain_shape), anchors, {}, {}, &s->main, why)) return false;
  s->main_index = planIndexing(a, s->main);
  if (chooseTranspose(a, o, s)) return true;
  const PointwiseParams& pp = s->pointwise = PointwiseParams::forDevice(o.device);
  s->vec = chooseVectorWidth(a, s->main, s->main_index, pp.vector);
  int64_t groups = s->main.numel() / s->vec;
  s->count = groups;
  int64_t block = groups <= pp.small_groups_per_sm * pp.sm_count ? pp.small_block : pp.large_block;
  block = floorPow2(std::max(pp.warp, std::min(block, pp.max_threads_per_block)));
  s->launch.block_x = block;
  s->launch.grid_x = gridFor(groups, block, block, pp.sm_count, pp.threads_per_sm);
  int64_t threads = s->launch.grid_x * block;
  // Always the same (the emitter adds loops of 2 and 1 for what is left): a choice by groups per
  // thread would make the text depend on the outer extent, one compile per size bucket.
  s->unroll = pp.unroll;
  // g + (unroll - 1) * step and (g + u * step) * vec stay below (groups + (unroll + 1) * threads) * vec.
  int64_t bound = (groups + (s->unroll + 1) * threads) * s->vec;
  s->index64 = bound > kInt32Max || s->main_index.max_offset > kInt32Max;
  return true;
}

bool scheduleReduction(const Analysis& a, const CodegenOptions& o, Schedule* s, std::string* why) {
  const KernelSegment& seg = *a.segment;
  const Expr* red = a.reductions.front();
  const auto* x = static_cast<const TensorView*>(red->input(0));
  const TensorView* y = red->out();
  const std::unordered_set<const Expr*> is_reduction(a.reductions.begin(), a.reductions.end());
  s->reductions = a.reductions;
  // Prologue: the exprs the reduction inputs depend on. Epilogue: the exprs that depend on outputs.
  std::unordered_set<const Val*> x_deps;
  for (const Expr* r : a.reductions) {
    x_deps.insert(r->input(0));
    if (a.shape.at(static_cast<const TensorView*>(r->input(0))) != a.shape.at(x) ||
        r->attr<Ints>("dims") != red->attr<Ints>("dims")) {
      *why = str(r->toString(), " and ", red->toString(),
                 " reduce different shapes or axes; a reduction kernel folds several reductions of one domain only");
      return false;
    }
  }
  // Epilogue: the exprs that depend on a reduction's output. Prologue: the rest, computed once per
  // element of the domain (those feeding the reductions, and side outputs of the same domain that
  // read what the prologue reads: the activation a weight gradient's GEMM needs, recomputed beside
  // the activation's backward).
  std::unordered_set<const Val*> y_deps;
  for (const Expr* r : a.reductions) y_deps.insert(r->out());
  std::vector<const Expr*> prologue, epilogue;
  for (const Expr* e : seg.exprs) {
    if (is_reduction.count(e)) continue;
    bool reads_y = false;
    for (const Val* v : e->inputs()) reads_y = reads_y || y_deps.count(v);
    if (reads_y) {
      y_deps.insert(e->out());
      epilogue.push_back(e);
    } else {
      prologue.push_back(e);
    }
  }
  for (const Expr* r : a.reductions) {
    if (y_deps.count(r->input(0))) {
      *why = str("the result of a reduction flows into ", r->toString(), " (normalization-like)");
      return false;
    }
  }
  for (const Expr* e : prologue) {
    for (const Val* v : e->inputs()) x_deps.insert(v);
    x_deps.insert(e->out());
  }
  // The reduction domain: x's axes of extent != 1, each reduced or kept.
  const auto& xs = a.shape.at(x);
  const auto& dims = red->attr<Ints>("dims");
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
  // kept* reduced+ kept+ : an outer reduction of every [reduced, inner kept] slice (middle axes).
  s->inner_kept = s->rows;
  if (sorted(false)) {
    s->kind = Kind::InnerReduction;
    if (a.reductions.size() > 1) {
      *why = "several inner reductions take the normalization kernel (one row per block reads the row once for all)";
      return false;
    }
  } else if (sorted(true)) s->kind = Kind::OuterReduction;
  else {
    size_t first_reduced = 0, i = 0;
    while (!reduced_flags[first_reduced]) ++first_reduced;
    for (i = first_reduced; i < reduced_flags.size() && reduced_flags[i]; ++i) {}
    bool middle = std::none_of(reduced_flags.begin() + static_cast<std::ptrdiff_t>(i), reduced_flags.end(),
                               [](bool f) { return f; });
    if (!middle) {
      *why = str(red->toString(), ": the reduced axes of ", x->toString(),
                 " are not adjacent (kept axes between them); the CUDA generator reduces one run of adjacent axes");
      return false;
    }
    s->kind = Kind::OuterReduction;
    s->inner_kept = 1;
    for (size_t k = 0, d = 0; k < xs.size(); ++k) {
      if (xs[k] == 1) continue;
      if (d++ >= i) s->inner_kept *= xs[k];
    }
  }
  auto is_output = [&](const TensorView* tv) {
    return std::find(seg.outputs.begin(), seg.outputs.end(), tv) != seg.outputs.end();
  };
  std::vector<const TensorView*> main_anchors, ys;
  for (const Expr* r : a.reductions) {
    const auto* xr = static_cast<const TensorView*>(r->input(0));
    if (std::find(main_anchors.begin(), main_anchors.end(), xr) == main_anchors.end()) main_anchors.push_back(xr);
    ys.push_back(r->out());
  }
  for (const Expr* e : prologue) {
    if (is_output(e->out()) && std::find(main_anchors.begin(), main_anchors.end(), e->out()) == main_anchors.end()) {
      main_anchors.push_back(e->out());
    }
  }
  if (!buildRegion(a, prologue, non1(xs), main_anchors, {}, {}, &s->main, why)) return false;
  std::vector<const TensorView*> epi_anchors = ys;
  for (const Expr* e : epilogue) {
    if (is_output(e->out())) epi_anchors.push_back(e->out());
  }
  std::vector<const TensorView*> forbidden;
  for (const Val* v : x_deps) {
    if (v->isTensor() && (a.producer.count(static_cast<const TensorView*>(v)) || v == x)) {
      forbidden.push_back(static_cast<const TensorView*>(v));
    }
  }
  if (!buildRegion(a, epilogue, non1(a.shape.at(y)), epi_anchors, ys, forbidden, &s->epilogue, why)) return false;
  if (s->epilogue.hasResize()) {
    *why = str(red->toString(), ": a slice, pad or cat after the reduction; the reduction kernel's epilogue reads "
                                "the result at its own coordinates only");
    return false;
  }
  s->main_index = planIndexing(a, s->main);
  s->epilogue_index = planIndexing(a, s->epilogue);

  KernelLaunch& l = s->launch;
  const ReductionParams& rp = s->reduction = ReductionParams::forDevice(o.device);
  const bool inner = s->kind == Kind::InnerReduction;
  s->count = inner ? s->rows : s->red;
  s->vec = chooseVectorWidth(a, s->main, s->main_index, rp.vector, inner ? s->red : s->inner_kept);
  int64_t bound = 0;  // an upper bound of every index the kernel computes
  if (inner) {
    const bool many_rows = s->rows >= rp.rows_per_sm_for_many * rp.sm_count;
    bool warp_per_row = s->red <= rp.warp_row_max || (s->red <= rp.warp_row_max_many_rows && many_rows);
    if (warp_per_row) {
      l.block_x = rp.warp;
      l.block_y = floorPow2(rp.warps_per_block);
    } else {
      // Plenty of rows: many_rows_block threads per row; few rows: up to few_rows_max_block, each
      // thread at least 2 vectors.
      int64_t red_vectors = s->red / s->vec;
      l.block_x = many_rows ? rp.many_rows_block
                            : std::min(rp.few_rows_max_block, floorPow2(std::max<int64_t>(1, red_vectors / 2)));
      l.block_x = floorPow2(std::max(rp.warp, std::min(l.block_x, rp.max_threads_per_block)));
    }
    l.grid_x = gridFor(s->rows, l.block_y, l.block_x * l.block_y, rp.sm_count, rp.threads_per_sm);
    s->unroll = unrollFor(s->red / s->vec / l.block_x, rp.unroll);
    bound = (s->rows + l.grid_x * l.block_y) * s->red + (s->unroll + 1) * l.block_x * s->vec;
  } else {
    int64_t colvecs = s->rows / s->vec;
    // Double compute keeps the plain kernel (its partials would be doubles): narrow tiles, one per
    // SM at least. Otherwise a warp across 32 vectors of columns (512 contiguous bytes of bf16 per
    // row) and the rows split into chunks over grid_y: the choice depends on the columns only, so
    // one text serves every reduced extent.
    const bool can_split = !a.compute_double;
    int64_t tx = rp.warp;
    while (!can_split && tx > rp.min_outer_columns && ceilDiv(colvecs, tx) < rp.sm_count) tx /= 2;
    while (tx > 1 && tx / 2 >= colvecs) tx /= 2;  // no idle lanes for a handful of columns
    int64_t tiles = ceilDiv(colvecs, tx);
    int64_t threads = can_split ? rp.outer_block : tiles >= rp.sm_count ? rp.outer_block : rp.outer_block_few_tiles;
    threads = std::min(threads, rp.max_threads_per_block);
    l.block_x = tx;
    l.block_y = floorPow2(std::max<int64_t>(1, threads / tx));
    while (l.block_y > 1 && l.block_y / 2 >= s->red) l.block_y /= 2;  // no idle rows of threads
    // Each reduction's partials of the tile sit in static shared memory: several reductions take
    // fewer rows of threads (and more chunks below).
    const auto partial_bytes = [&] {
      return static_cast<int64_t>(a.reductions.size()) * l.block_y * tx * s->vec * static_cast<int64_t>(sizeof(float));
    };
    while (l.block_y > 1 && partial_bytes() > rp.outer_partial_bytes) l.block_y /= 2;
    l.grid_x = gridFor(tiles, 1, l.block_x * l.block_y, rp.sm_count, rp.threads_per_sm);
    s->unroll = rp.unroll;  // with loops of 2 and 1 after it: the reduced extent is the launch's count
    // Chunks of reduced rows over grid_y until the grid is one wave of resident blocks (no partial
    // last wave): bf16 [8192, 4096] -> bf16 had taken 0.059 ms as 2.4 waves of 4 x 256-thread
    // blocks that read 7 rows per thread, against ATen's 0.032 (H200); this way 0.042 against
    // ATen's 0.039 (H100), and [16384, 16384] into float 0.95 of copy bandwidth.
    const int64_t resident_blocks =
        rp.sm_count * std::max<int64_t>(1, rp.threads_per_sm / (l.block_x * l.block_y));
    const int64_t chunks = std::min({std::max<int64_t>(1, rp.outer_split_waves * resident_blocks / tiles),
                                     s->red / rp.outer_split_min_rows, rp.max_grid_y});
    // The text always has the chunked path (one source for every reduced extent); it runs with
    // grid_y > 1 only.
    s->split_rows = can_split;
    if (chunks >= 2 && s->split_rows) {
      l.grid_x = tiles;
      l.grid_y = chunks;
      // [reductions][chunks][columns] float partials, then one arrival counter per column tile (zeroed).
      l.workspace_zero_offset =
          static_cast<int64_t>(a.reductions.size()) * chunks * s->rows * static_cast<int64_t>(sizeof(float));
      l.workspace_bytes = l.workspace_zero_offset + tiles * static_cast<int64_t>(sizeof(unsigned));
    }
    bound = (s->red + (s->unroll + 1) * l.block_y + 1) * s->rows + l.grid_x * tx * s->vec;
  }
  s->index64 = bound > kInt32Max || s->main_index.max_offset > kInt32Max || s->epilogue_index.max_offset > kInt32Max;
  return true;
}

}  // namespace

bool chooseSchedule(const Analysis& a, const CodegenOptions& options, Schedule* s, std::string* why) {
  if (a.reductions.empty()) return schedulePointwise(a, options, s, why);
  // One reduction (or several outer ones of one domain) with a plain epilogue takes the reduction
  // kernel; a result broadcast back into the row, or several inner reductions, take the
  // normalization kernel.
  std::string reduction_why;
  if (!a.reductions.empty()) {
    Schedule r;
    if (scheduleReduction(a, options, &r, &reduction_why)) {
      *s = std::move(r);
      return true;
    }
  }
  std::string norm_why;
  if (scheduleNormalization(a, options, s, &norm_why)) return true;
  *why = reduction_why.empty() ? norm_why : str("reduction kernel: ", reduction_why, "; normalization kernel: ", norm_why);
  return false;
}

}  // namespace codegen
}  // namespace mf
