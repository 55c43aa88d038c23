#include "runtime/index_add_sorted.h"

#include "codegen/gather_sum.h"
#include "runtime/aten_evaluator.h"
#include "runtime/cuda_kernel.h"
#include "support/error.h"
#include "support/options.h"

namespace mf {
namespace {

// Rows narrower than this stay on ATen: the sort and offsets (two small kernels) cost more than
// the atomics they remove.
constexpr int64_t kMinRowElements = 64;

enum class IndexAddPath { Auto, Aten, Sorted };

IndexAddPath requestedPath() {
  const std::string v = envString("MESHFUSER_INDEX_ADD");
  if (v.empty() || v == "auto") return IndexAddPath::Auto;
  if (v == "aten") return IndexAddPath::Aten;
  if (v == "sorted") return IndexAddPath::Sorted;
  MF_THROW_USER("MESHFUSER_INDEX_ADD: unknown value '", v, "'; valid values are auto, aten, sorted");
}

// Why the sorted path cannot take this call, or empty.
std::string whyNotSorted(const at::Tensor& x, int64_t dim, const at::Tensor& src) {
  if (!x.is_cuda()) return "x is not a CUDA tensor";
  if (!cudaKernelsAvailable()) return "generated kernels are unavailable (no CUDA device or NVRTC)";
  if (x.dim() == 0 || (dim != 0 && dim != -x.dim())) return "it adds along an axis other than the first";
  const auto t = x.scalar_type();
  if (t != at::kFloat && t != at::kHalf && t != at::kBFloat16) return "its dtype is not float, half or bfloat16";
  if (src.scalar_type() != t) return "x and src differ in dtype";
  if (x.size(0) == 0 || x.numel() / x.size(0) < kMinRowElements) return "its rows are narrower than 64 elements";
  return "";
}

}  // namespace

std::optional<at::Tensor> indexAddSorted(const at::Tensor& x, int64_t dim, const at::Tensor& index,
                                         const at::Tensor& src) {
  const IndexAddPath path = requestedPath();
  if (path == IndexAddPath::Aten) return std::nullopt;
  const std::string why = whyNotSorted(x, dim, src);
  if (!why.empty()) {
    MF_USER_CHECK(path != IndexAddPath::Sorted, "MESHFUSER_INDEX_ADD=sorted: index_add of x ", x.sizes(),
                  " cannot take the sorted path: ", why);
    return std::nullopt;
  }
  const int64_t rows = x.size(0);
  const int64_t width = x.numel() / rows;
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
  shape.width = width;
  shape.alignment_bytes = std::min({kernelArgOf(xc).alignment_bytes, kernelArgOf(sc).alignment_bytes,
                                    kernelArgOf(out).alignment_bytes});
  // One kernel text per (dtype, width, vector width): cached by its name in launchGeneratedKernel;
  // only the launch bound changes with the row count.
  GeneratedKernel kernel = generateGatherSum(shape, currentDeviceLimits());
  launchGeneratedKernel(kernel, {xc, sc, order, offsets}, {out}, {static_cast<double>(idx.numel())});
  return out;
}

}  // namespace mf
