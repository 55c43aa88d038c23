// Each scheduler's parameters from the device limits (see heuristics.h for what each one means).
// The tuned constants below were measured on one H200 (scheduler.cpp and normalization.cpp quote
// the measurements); what a device's limits decide is computed from them.
#include "codegen/heuristics.h"

#include <algorithm>

#include "codegen/internal.h"
#include "support/error.h"

namespace mf {
namespace codegen {
namespace {

constexpr int64_t kKiB = 1024;
// Registers per thread the transpose kernel needs (bf16 with 16-byte B vectors used 61-63): the
// blocks per SM are as many as the register file holds at this many, at most four.
constexpr int64_t kTransposeRegistersPerThread = 64;
constexpr int64_t kTransposeBlocksPerSm = 4;
// The transpose tiles leave this much of the static shared memory per block unused (measured
// with 40 KB of the 48 KB).
constexpr int64_t kTransposeStaticHeadroom = 8 * kKiB;
// Staged normalization rows: two resident blocks per SM, each also holding its reductions'
// static scratch (under 1 KiB) beside the system's per-block reservation; at most 96 KiB each.
constexpr int64_t kStagedBlocksPerSm = 2;
constexpr int64_t kMaxStagedBytes = 96 * kKiB;

VectorParams vectorParams(const DeviceLimits& d) {
  VectorParams v;
  v.max_bytes = d.max_vector_bytes;
  return v;
}

}  // namespace

PointwiseParams PointwiseParams::forDevice(const DeviceLimits& d) {
  PointwiseParams p;
  p.vector = vectorParams(d);
  p.warp = d.warp_size;
  p.threads_per_sm = d.max_threads_per_sm;
  p.sm_count = d.sm_count;
  p.max_threads_per_block = d.max_threads_per_block;
  return p;
}

std::string PointwiseParams::toString() const {
  return str("pointwise params: vector <= ", vector.max_bytes, " bytes / ", vector.max_elements, " elements, block ",
             small_block, " (<= ", small_groups_per_sm, " groups per SM) or ", large_block, ", unroll ", unroll,
             ", grid <= ", sm_count, " SMs x ", threads_per_sm, " threads per SM / block, max block ",
             max_threads_per_block);
}

ReductionParams ReductionParams::forDevice(const DeviceLimits& d) {
  ReductionParams p;
  p.vector = vectorParams(d);
  p.warp = d.warp_size;
  p.warps_per_block = std::max<int64_t>(1, std::min(p.warps_per_block, d.max_threads_per_block / d.warp_size));
  p.many_rows_block = std::min(p.many_rows_block, floorPow2(d.max_threads_per_block));
  p.few_rows_max_block = d.max_threads_per_block;
  p.outer_block_few_tiles = d.max_threads_per_block;
  p.outer_block = std::min(p.outer_block, d.max_threads_per_block);
  p.threads_per_sm = d.max_threads_per_sm;
  p.sm_count = d.sm_count;
  p.max_threads_per_block = d.max_threads_per_block;
  return p;
}

std::string ReductionParams::toString() const {
  return str("reduction params: vector <= ", vector.max_bytes, " bytes / ", vector.max_elements,
             " elements; inner: a warp per row up to ", warp_row_max, " elements (", warp_row_max_many_rows,
             " with >= ", rows_per_sm_for_many, " rows per SM), ", warp, " x ", warps_per_block,
             " blocks; else ", many_rows_block, " threads per row (many rows) or up to ", few_rows_max_block,
             "; outer: columns per block ", min_outer_columns, "..", warp, ", ", outer_block, " threads (",
             outer_block_few_tiles, " with fewer tiles than SMs; partials <= ", outer_partial_bytes,
             " bytes), rows split for ", outer_split_waves,
             " waves, >= ", outer_split_min_rows, " rows per chunk; unroll ", unroll, "; grid <= ", sm_count,
             " SMs x ", threads_per_sm,
             " threads per SM / block");
}

NormalizationParams NormalizationParams::forDevice(const DeviceLimits& d) {
  NormalizationParams p;
  p.vector = vectorParams(d);
  p.warp = d.warp_size;
  // Blocks within the device's: every block size below is a power of two at most max_threads_per_block.
  const int64_t max_block = floorPow2(d.max_threads_per_block);
  p.max_row_threads = std::min(p.max_row_threads, max_block);
  p.min_row_threads = std::min(p.min_row_threads, p.max_row_threads);
  p.warp_mode_block = std::min(p.warp_mode_block, max_block);
  p.outer_block_y = std::max<int64_t>(1, std::min(p.outer_block_y, max_block / p.outer_block_x));
  p.registers_per_sm = d.registers_per_sm;
  p.can_stage = d.hasCpAsync();
  const int64_t per_block = d.shared_mem_per_sm / kStagedBlocksPerSm - 2 * d.reserved_shared_mem_per_block;
  p.staged_bytes_per_block =
      std::min({kMaxStagedBytes, per_block / kKiB * kKiB,
                d.shared_mem_per_block_optin - d.reserved_shared_mem_per_block});
  p.threads_per_sm = d.max_threads_per_sm;
  p.sm_count = d.sm_count;
  p.max_threads_per_block = d.max_threads_per_block;
  p.max_grid = d.max_grid_x;
  return p;
}

std::string NormalizationParams::toString() const {
  return str("normalization params: vector <= ", vector.max_bytes, " bytes / ", vector.max_elements,
             " elements; warp mode up to ", warp * groups_per_lane, " vectors per row (", warp_mode_block,
             " threads per block); block mode ", min_row_threads, "..", max_row_threads, " threads, ",
             groups_per_thread, " groups per thread; persistent within ", kept_registers_per_thread,
             " registers and ", max_unrolled_elements, " elements per thread; resident blocks for >= ",
             resident_blocks_min_threads, " threads with <= ",
             small_row_bytes, " row bytes per thread: ", registers_per_sm, " registers / (threads x ",
             registers_for_two_blocks,
             "); staged rows ", can_stage ? str("<= ", staged_bytes_per_block, " bytes") : "off",
             ", grid one wave of ", threads_per_sm, " threads per SM; outer ", outer_block_x, " x ", outer_block_y,
             ", ", outer_blocks_per_sm, " blocks per SM; ", sm_count, " SMs");
}

TransposeParams TransposeParams::forDevice(const DeviceLimits& d) {
  TransposeParams p;
  p.vector = vectorParams(d);
  p.block_x = d.warp_size;
  p.block_y = std::max<int64_t>(1, std::min(p.block_y, floorPow2(d.max_threads_per_block) / p.block_x));
  p.tile_a = 2 * p.block_x;
  p.lanes_b = p.block_x / 2;
  const int64_t threads = p.block_x * p.block_y;
  p.blocks_per_sm = std::max<int64_t>(
      1, std::min({kTransposeBlocksPerSm, d.registers_per_sm / (threads * kTransposeRegistersPerThread),
                   d.max_threads_per_sm / threads, d.max_blocks_per_sm}));
  p.tile_bytes_cap = std::min(d.shared_mem_per_block - kTransposeStaticHeadroom,
                              d.shared_mem_per_sm / p.blocks_per_sm - d.reserved_shared_mem_per_block);
  p.sm_count = d.sm_count;
  return p;
}

std::string TransposeParams::toString() const {
  return str("transpose params: vector <= ", vector.max_bytes, " bytes / ", vector.max_elements, " elements; tiles ",
             tile_a, " x ", lanes_b, " vec, block ", block_x, " x ", block_y, ", float tiles <= ", tile_bytes_cap,
             " bytes, ", blocks_per_sm, " blocks per SM x ", sm_count, " SMs");
}

std::string heuristicsText(const Schedule& s, const DeviceLimits& device) {
  std::string params;
  switch (s.kind) {
    case Kind::Pointwise: params = s.pointwise.toString(); break;
    case Kind::InnerReduction:
    case Kind::OuterReduction: params = s.reduction.toString(); break;
    case Kind::Normalization: params = s.normalization.toString(); break;
    case Kind::Transpose: params = s.transpose.toString(); break;
  }
  const KernelLaunch& l = s.launch;
  std::string chosen = str("chosen: vec ", s.vec, ", unroll ", s.unroll, ", index ", s.index64 ? 64 : 32, ", block ",
                           l.block_x, "x", l.block_y, ", grid ", l.grid_x, ", min blocks per SM ", l.min_blocks,
                           ", dynamic shared ", l.shared_mem_bytes, " bytes");
  if (l.grid_y > 1) {
    chosen += str(", reduced rows split in ", l.grid_y, " chunks (grid_y), workspace ", l.workspace_bytes, " bytes");
  }
  if (s.kind == Kind::Normalization) {
    chosen += str(s.norm.persistent ? ", persistent " : ", multi-pass ", s.norm.iters, " groups, ",
                  s.norm.cached.size(), " cached, ", s.norm.staged.size(), " staged");
  }
  return str("device: ", device.toString(), "\n", params, "\n", chosen);
}

}  // namespace codegen
}  // namespace mf
