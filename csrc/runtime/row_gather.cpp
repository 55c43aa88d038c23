#include "runtime/row_gather.h"

#include <unordered_map>

#include "codegen/gather_sum.h"
#include "runtime/aten_evaluator.h"
#include "runtime/cuda_kernel.h"
#include "support/error.h"
#include "support/options.h"
#include "support/text.h"

namespace mf {
namespace {

// Rows narrower than this stay on ATen's index_add: the sort and offsets (two small kernels) cost
// more than the atomics they remove.
constexpr int64_t kMinSortedRowElements = 64;

enum class IndexAddPath { Auto, Aten, Sorted };

IndexAddPath requestedIndexAddPath() {
  const std::string v = envString("MESHFUSER_INDEX_ADD");
  if (v.empty() || v == "auto") return IndexAddPath::Auto;
  if (v == "aten") return IndexAddPath::Aten;
  if (v == "sorted") return IndexAddPath::Sorted;
  MF_THROW_USER("MESHFUSER_INDEX_ADD: unknown value '", v, "'; valid values are auto, aten, sorted");
}

// Why a generated row gather cannot take a call on `x` along `dim` with `index`, or empty.
std::string whyNotGenerated(const at::Tensor& x, int64_t dim, const at::Tensor& index) {
  if (!x.is_cuda()) return "x is not a CUDA tensor";
  // ATen's own call then says what is wrong with the devices.
  if (index.device() != x.device()) return "the index is not on x's device";
  if (isDisabled(DisableOption::Codegen)) return "generated kernels are disabled (MESHFUSER_DISABLE=codegen)";
  if (!cudaKernelsAvailable()) return "generated kernels are unavailable (no CUDA device or NVRTC)";
  if (x.dim() == 0 || (dim != 0 && dim != -x.dim())) return "it works along an axis other than the first";
  const auto t = x.scalar_type();
  if (t != at::kFloat && t != at::kHalf && t != at::kBFloat16) return "its dtype is not float, half or bfloat16";
  return "";
}

// The kernel for `shape` with its rows set, its text generated once per (mode, dtype, width,
// alignment, device) in this thread: execute() runs this per call.
const GeneratedKernel& kernelFor(const GatherSumShape& shape) {
  const DeviceLimits& device = currentDeviceLimits();
  thread_local std::unordered_map<std::string, GeneratedKernel> kernels;
  const std::string key = str(static_cast<int>(shape.mode), ":", toString(shape.dtype), ":", shape.width, ":",
                              shape.alignment_bytes, ":", device.arch, ":", device.device_name);
  auto it = kernels.find(key);
  if (it == kernels.end()) it = kernels.emplace(key, generateGatherSum(shape, device)).first;
  setGatherSumRows(it->second, shape, device);
  return it->second;
}

int64_t alignmentOf(const std::vector<at::Tensor>& tensors) {
  int64_t align = 16;
  for (const at::Tensor& t : tensors) align = std::min(align, kernelArgOf(t).alignment_bytes);
  return align;
}

}  // namespace

std::optional<at::Tensor> indexAddSorted(const at::Tensor& x, int64_t dim, const at::Tensor& index,
                                         const at::Tensor& src) {
  const IndexAddPath path = requestedIndexAddPath();
  if (path == IndexAddPath::Aten) return std::nullopt;
  std::string why = whyNotGenerated(x, dim, index);
  if (why.empty() && src.scalar_type() != x.scalar_type()) why = "x and src differ in dtype";
  if (why.empty() && src.device() != x.device()) why = "src is not on x's device";
  if (why.empty() && (x.size(0) == 0 || x.numel() / x.size(0) < kMinSortedRowElements)) {
    why = "its rows are narrower than 64 elements";
  }
  if (!why.empty()) {
    MF_USER_CHECK(path != IndexAddPath::Sorted, "MESHFUSER_INDEX_ADD=sorted: index_add of x ", x.sizes(),
                  " cannot take the sorted path: ", why);
    return std::nullopt;
  }
  const int64_t rows = x.size(0);
  at::Tensor xc = x.contiguous();
  at::Tensor sc = src.contiguous();
  at::Tensor idx = index.reshape({-1}).to(at::kLong);
  // order: src rows by destination row (stable: ascending src row within a row, so the sums are
  // deterministic); offsets[r] .. offsets[r + 1]: the positions of row r's src rows in order.
  auto [sorted, order] = at::sort(idx, /*stable=*/true, /*dim=*/0, /*descending=*/false);
  at::Tensor offsets = at::searchsorted(sorted, at::arange(rows + 1, idx.options()));
  at::Tensor out = at::empty_like(xc, at::MemoryFormat::Contiguous);
  GatherSumShape shape;
  shape.dtype = fromAten(x.scalar_type());
  shape.out_rows = rows;
  shape.width = x.numel() / rows;
  shape.alignment_bytes = alignmentOf({xc, sc, out});
  launchGeneratedKernel(kernelFor(shape), {xc, sc, order, offsets}, {out}, {static_cast<double>(idx.numel())});
  return out;
}

std::optional<at::Tensor> indexSelectRows(const at::Tensor& x, int64_t dim, const at::Tensor& index) {
  // A strided x stays on ATen, which reads it in place (a copy first would move all of x).
  if (!whyNotGenerated(x, dim, index).empty() || x.size(0) == 0 || !x.is_contiguous()) return std::nullopt;
  const at::Tensor& xc = x;
  at::Tensor idx = index.reshape({-1}).to(at::kLong);
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes[0] = idx.numel();
  at::Tensor out = at::empty(sizes, xc.options());
  if (out.numel() == 0) return out;
  GatherSumShape shape;
  shape.mode = GatherSumShape::Mode::Select;
  shape.dtype = fromAten(x.scalar_type());
  shape.out_rows = idx.numel();
  shape.width = x.numel() / x.size(0);
  shape.alignment_bytes = alignmentOf({xc, out});
  launchGeneratedKernel(kernelFor(shape), {xc, idx}, {out}, {static_cast<double>(x.size(0))});
  return out;
}

}  // namespace mf
