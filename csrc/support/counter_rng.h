// The counter-based random number function behind fd.ops.uniform (plain C++, no torch).
//
// A value depends on (seed, offset, global element index) only, never on which device or which
// shard computes it: a sharded program draws bit for bit what the unsharded one draws. Every
// multiplication is a 32x16-bit product, so the ATen path computes the same function with int64
// tensor ops on CPU and CUDA without overflow, and generated kernels with 32-bit integer ops.
//
//   keys    = mixKeys(seed, offset)                      (4 words, computed once per call)
//   word(j) = fmix32(fmix32(lo32(index) ^ keys[2j]) ^ hi32(index) ^ keys[2j+1])   for j = 0, 1
//   float, half, bfloat16: u = (word(0) >> (32 - m)) * 2^-m with m = 24, 11, 8 mantissa bits
//   double:                u = ((word(0) >> 5) * 2^26 + (word(1) >> 6)) * 2^-53
//   value   = low + (high - low) * u in float (double for double), rounded to the dtype; a value
//             that rounds up to `high` becomes `low`, so values lie in [low, high).
// fmix32 is MurmurHash3's finalizer (a bijection of 32-bit words with full avalanche).
#pragma once

#include <array>
#include <cstdint>

namespace mf {

// Seeds and offsets are integers in [0, 2^53): they travel as doubles to generated kernels.
constexpr int64_t kMaxRngSeed = int64_t{1} << 53;

constexpr uint32_t kFmixMul1 = 0x85ebca6bu;
constexpr uint32_t kFmixMul2 = 0xc2b2ae35u;

constexpr uint32_t fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= kFmixMul1;
  h ^= h >> 13;
  h *= kFmixMul2;
  h ^= h >> 16;
  return h;
}

// The four key words of (seed, offset). Each chain step is a bijection of the running word, so
// different offsets under one seed give different keys.
inline std::array<uint32_t, 4> mixKeys(int64_t seed, int64_t offset) {
  auto lo = [](int64_t v) { return static_cast<uint32_t>(static_cast<uint64_t>(v) & 0xffffffffu); };
  auto hi = [](int64_t v) { return static_cast<uint32_t>(static_cast<uint64_t>(v) >> 32); };
  uint32_t h = fmix32(lo(seed) ^ 0x9e3779b9u);
  h = fmix32(h ^ hi(seed));
  h = fmix32(h ^ lo(offset) ^ 0x7f4a7c15u);
  h = fmix32(h ^ hi(offset));
  std::array<uint32_t, 4> keys{};
  for (uint32_t& k : keys) {
    h = fmix32(h + 0x6a09e667u);
    k = h;
  }
  return keys;
}

// One 32-bit random word (j = 0 or 1) of a global element index: the reference the ATen and CUDA
// paths must agree with (tests compare against it).
inline uint32_t randomWord(const std::array<uint32_t, 4>& keys, int64_t index, int j) {
  uint32_t lo = static_cast<uint32_t>(static_cast<uint64_t>(index) & 0xffffffffu);
  uint32_t hi = static_cast<uint32_t>(static_cast<uint64_t>(index) >> 32);
  return fmix32(fmix32(lo ^ keys[2 * j]) ^ hi ^ keys[2 * j + 1]);
}

}  // namespace mf
