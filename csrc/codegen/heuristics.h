// The tunable numbers of each scheduler, derived once from the device's limits. The scheduler
// (scheduler.cpp, normalization.cpp) reads them to choose a kernel's shape; the emitters
// (emit_*.cpp) read the same struct from the Schedule, so no number is written twice.
//
// Guarantees: for the sm_90 limits (DeviceLimits{}) every field equals the constant the H200
// measurements chose (quoted in scheduler.cpp and normalization.cpp); other devices change only
// what their limits force: resident threads and blocks per SM, the SM count, and what fits in
// their shared memory and register file. `toString()` is what MESHFUSER_DUMP=heuristics prints.
#pragma once

#include <cstdint>
#include <string>

#include "codegen/device_limits.h"

namespace mf {
namespace codegen {

// Vector accesses: the widest of max_elements / .. / 2 elements within max_bytes (all schedulers).
struct VectorParams {
  int64_t max_bytes = 16;
  int64_t max_elements = 8;
};

struct PointwiseParams {
  VectorParams vector;
  int64_t small_block = 128;  // threads per block when there are few vector groups per SM
  int64_t large_block = 256;
  int64_t small_groups_per_sm = 128;  // at most this many groups per SM take the small block
  int64_t unroll = 4;                 // vector groups per thread per loop step (loops of 2 and 1 follow)
  int64_t warp = 32;                  // the smallest block
  int64_t threads_per_sm = 2048;      // resident threads per SM: the grid is one wave of them
  int64_t sm_count = 132;
  int64_t max_threads_per_block = 1024;
  static PointwiseParams forDevice(const DeviceLimits& d);
  std::string toString() const;
};

struct ReductionParams {
  VectorParams vector;
  int64_t warp = 32;
  // Inner: a warp per row for rows of at most warp_row_max elements, or of at most
  // warp_row_max_many_rows when there are at least rows_per_sm_for_many rows per SM.
  int64_t warp_row_max = 256;
  int64_t warp_row_max_many_rows = 2048;
  int64_t rows_per_sm_for_many = 2;
  int64_t warps_per_block = 8;        // warp-per-row blocks: 32 x this
  int64_t many_rows_block = 256;      // threads per row with many rows
  int64_t few_rows_max_block = 1024;  // threads per row with few rows (at least 2 vectors each)
  // Outer: threads per block, fewer column tiles than SMs taking the larger block.
  int64_t outer_block = 512;
  int64_t outer_block_few_tiles = 1024;
  int64_t min_outer_columns = 4;  // the narrowest column tile (threadIdx.x extent)
  int64_t outer_partial_bytes = 32 * 1024;  // every reduction's float partials of a block's tile
  // Outer: the rows split into chunks (grid_y) until the grid holds outer_split_waves waves of
  // resident blocks (rounded down), each chunk at least outer_split_min_rows rows.
  int64_t outer_split_waves = 1;
  int64_t outer_split_min_rows = 32;
  int64_t max_grid_y = 65535;
  // Vector groups per thread per loop step: outer always (loops of 2 and 1 follow), inner the
  // largest power of two up to this that every thread has.
  int64_t unroll = 4;
  int64_t threads_per_sm = 2048;
  int64_t sm_count = 132;
  int64_t max_threads_per_block = 1024;
  static ReductionParams forDevice(const DeviceLimits& d);
  std::string toString() const;
};

struct NormalizationParams {
  VectorParams vector;
  int64_t warp = 32;
  int64_t groups_per_lane = 2;           // warp mode: rows of at most warp * this vectors
  int64_t warp_mode_block = 256;         // threads per block in warp mode
  int64_t groups_per_thread = 4;         // block mode: threads = vectors / this ...
  int64_t min_row_threads = 64;          // ... between these two
  int64_t max_row_threads = 512;
  int64_t kept_registers_per_thread = 64;  // persistent: registers holding raw row data or cached values
  int64_t max_unrolled_elements = 32;      // persistent: iters x vec at most this
  // Blocks of resident_blocks_min_threads+ threads holding at most small_row_bytes of row data per
  // thread ask ptxas for as many resident blocks as registers_per_sm / (threads *
  // registers_for_two_blocks) allow.
  int64_t resident_blocks_min_threads = 512;
  int64_t small_row_bytes = 64;
  int64_t registers_for_two_blocks = 64;
  int64_t registers_per_sm = 65536;
  // Staged rows: the next row's loads in dynamic shared memory by cp.async, two blocks per SM.
  bool can_stage = true;
  int64_t staged_bytes_per_block = 96 * 1024;
  int64_t threads_per_sm = 2048;  // the staged grid: one wave of resident blocks
  int64_t outer_block_x = 32, outer_block_y = 16, outer_blocks_per_sm = 4;
  int64_t sm_count = 132;
  int64_t max_threads_per_block = 1024;
  int64_t max_grid = 2147483647;
  static NormalizationParams forDevice(const DeviceLimits& d);
  std::string toString() const;
};

// Tiles of tile_a (along the transposed loads' contiguous axis A) x lanes_b * vec (along the
// outputs' innermost axis B) through shared memory, by blocks of block_x x block_y threads.
struct TransposeParams {
  VectorParams vector;
  int64_t tile_a = 64;  // = 2 * block_x: two elements per lane along A
  int64_t lanes_b = 16;  // = block_x / 2: the compute phase's lanes along B (2 lanes walk A)
  int64_t block_x = 32, block_y = 8;
  int64_t tile_bytes_cap = 40960;  // every transposed load's float tile together
  int64_t blocks_per_sm = 4;       // __launch_bounds__ minimum and the grid: one wave
  int64_t sm_count = 132;
  static TransposeParams forDevice(const DeviceLimits& d);
  std::string toString() const;
};

}  // namespace codegen
}  // namespace mf
