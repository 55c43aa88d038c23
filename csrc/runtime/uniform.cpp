#include "runtime/uniform.h"

#include <cmath>

#include "multidevice/sharding.h"
#include "support/counter_rng.h"
#include "support/error.h"

namespace mf {
namespace {

constexpr int64_t kLow32 = 0xffffffffLL;

// (x * c) mod 2^32 for x in [0, 2^32): two products of at most 48 bits, so int64 never overflows.
at::Tensor mulMod32(const at::Tensor& x, uint32_t c) {
  int64_t c_lo = c & 0xffffu, c_hi = c >> 16;
  at::Tensor high_part = x.mul(c_hi).bitwise_and_(0xffff).bitwise_left_shift_(16);
  return x.mul(c_lo).add_(high_part).bitwise_and_(kLow32);
}

at::Tensor fmix32(at::Tensor h) {
  h = h.bitwise_xor(h.bitwise_right_shift(16));
  h = mulMod32(h, kFmixMul1);
  h = h.bitwise_xor_(h.bitwise_right_shift(13));
  h = mulMod32(h, kFmixMul2);
  return h.bitwise_xor_(h.bitwise_right_shift(16));
}

// randomWord of counter_rng.h on a tensor of indices.
at::Tensor randomWord(const at::Tensor& index_lo, const at::Tensor& index_hi, const std::array<uint32_t, 4>& keys, int j) {
  at::Tensor h = fmix32(index_lo.bitwise_xor(static_cast<int64_t>(keys[2 * j])));
  return fmix32(h.bitwise_xor_(index_hi).bitwise_xor_(static_cast<int64_t>(keys[2 * j + 1])));
}

int mantissaBits(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return 24;
    case at::kHalf: return 11;
    case at::kBFloat16: return 8;
    default: MF_THROW_INTERNAL("uniform: no float path for ", dtype);
  }
}

// A bound as the dtype holds it, then widened to float (double for double).
float roundedBound(double v, at::ScalarType dtype) {
  switch (dtype) {
    case at::kHalf: return static_cast<float>(c10::Half(static_cast<float>(v)));
    case at::kBFloat16: return static_cast<float>(c10::BFloat16(static_cast<float>(v)));
    default: return static_cast<float>(v);
  }
}

}  // namespace

at::Tensor shardGlobalIndices(const TensorView* tv, int64_t rank, const std::vector<int64_t>& global_shape,
                              const at::TensorOptions& options) {
  at::TensorOptions opts = options.dtype(at::kLong);
  const bool on_mesh = tv->hasMesh() && tv->mesh().has(rank);
  std::vector<int64_t> coords = on_mesh ? tv->mesh().coordinatesOf(rank) : std::vector<int64_t>{};
  std::vector<int64_t> shards = shardsPerAxis(tv);
  const size_t dims = global_shape.size();
  std::vector<at::Tensor> positions(dims);
  std::vector<int64_t> local(dims);
  for (size_t a = 0; a < dims; ++a) {
    if (shards[a] == 1 || !on_mesh) {
      positions[a] = at::arange(global_shape[a] / (on_mesh ? 1 : shards[a]), opts);
    } else {
      std::vector<int64_t> p = axisPositions(tv, static_cast<int64_t>(a), global_shape[a], [&](ParallelType pt) {
        return coords.at(static_cast<size_t>(tv->mesh().axisOf(pt)));
      });
      positions[a] = at::tensor(p, at::TensorOptions().dtype(at::kLong)).to(opts.device());
    }
    local[a] = positions[a].numel();
  }
  at::Tensor index = at::zeros(local, opts);
  int64_t stride = 1;
  for (size_t a = dims; a-- > 0;) {
    std::vector<int64_t> view(dims, 1);
    view[a] = local[a];
    index.add_(positions[a].mul(stride).view(view));
    stride *= global_shape[a];
  }
  return index;
}

std::vector<int64_t> shardStart(const TensorView* tv, int64_t rank, const std::vector<int64_t>& local_shape) {
  std::vector<int64_t> start(local_shape.size(), 0);
  if (!tv->hasMesh() || !tv->mesh().has(rank)) return start;
  std::vector<int64_t> coords = tv->mesh().coordinatesOf(rank);
  for (ParallelType pt : kDeviceParallelTypes) {
    if (shardedLoopId(tv, pt) == nullptr) continue;
    DeviceSplit s = deviceSplit(tv, pt);
    start[s.axis] += coords[tv->mesh().axisOf(pt)] * local_shape[s.axis];
  }
  return start;
}

at::Tensor counterUniform(const at::Tensor& indices, double low, double high, int64_t seed, int64_t offset,
                          at::ScalarType dtype) {
  std::array<uint32_t, 4> keys = mixKeys(seed, offset);
  at::Tensor lo = indices.bitwise_and(kLow32);
  at::Tensor hi = indices.bitwise_right_shift(32);
  at::Tensor word0 = randomWord(lo, hi, keys, 0);
  if (dtype == at::kDouble) {
    at::Tensor word1 = randomWord(lo, hi, keys, 1);
    at::Tensor bits = word0.bitwise_right_shift_(5).mul_(int64_t{1} << 26).add_(word1.bitwise_right_shift_(6));
    at::Tensor v = bits.to(at::kDouble).mul_(std::ldexp(1.0, -53)).mul_(high - low).add_(low);
    return v.masked_fill_(v >= high, low);
  }
  int m = mantissaBits(dtype);
  float low_f = roundedBound(low, dtype), high_f = roundedBound(high, dtype);
  float range = high_f - low_f;  // in float, as a generated kernel computes it
  at::Tensor u = word0.bitwise_right_shift_(32 - m).to(at::kFloat).mul_(std::ldexp(1.0f, -m));
  at::Tensor v = u.mul_(range).add_(low_f).to(dtype);
  return v.masked_fill_(v >= high_f, low_f);
}

}  // namespace mf
