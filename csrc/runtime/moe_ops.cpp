#include "runtime/moe_ops.h"

#if __has_include(<ATen/ops/_grouped_mm.h>)
#include <ATen/ops/_grouped_mm.h>
#define MF_HAS_GROUPED_MM 1
#else
#define MF_HAS_GROUPED_MM 0
#endif

#include "runtime/row_gather.h"
#include "support/error.h"
#include "support/text.h"

namespace mf {
namespace {

// Group ends as host integers, checked: non-decreasing within [0, extent].
std::vector<int64_t> groupEnds(const Expr* e, const at::Tensor& offsets, int64_t extent, const char* axis) {
  at::Tensor host = offsets.to(at::kCPU, at::kLong).contiguous();
  std::vector<int64_t> ends(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel());
  int64_t start = 0;
  for (size_t g = 0; g < ends.size(); ++g) {
    MF_USER_CHECK(ends[g] >= start && ends[g] <= extent, "grouped_mm: offsets ", e->input(2)->toString(), " hold ",
                  listText(ends), "; they must be non-decreasing group ends within [0, ", extent, "] (", axis,
                  "); entry ", g, " is ", ends[g]);
    start = ends[g];
  }
  return ends;
}

// torch._grouped_mm's meaning, one matmul per group: rows (or the contraction) of group g are
// [ends[g-1], ends[g]); rows past the last end are zero.
at::Tensor groupedMmLoop(const Expr* e, const at::Tensor& mat1, const at::Tensor& mat2, const at::Tensor& offsets) {
  if (mat1.dim() == 3) return at::bmm(mat1, mat2);
  if (mat2.dim() == 3) {
    at::Tensor out = at::zeros({mat1.size(0), mat2.size(2)}, mat1.options());
    if (mat1.is_meta()) return out;
    std::vector<int64_t> ends = groupEnds(e, offsets, mat1.size(0), "mat1's rows");
    int64_t start = 0;
    for (size_t g = 0; g < ends.size(); ++g) {
      if (ends[g] > start) {
        out.narrow(0, start, ends[g] - start).copy_(at::mm(mat1.narrow(0, start, ends[g] - start), mat2[g]));
      }
      start = ends[g];
    }
    return out;
  }
  at::Tensor out = at::zeros({offsets.size(0), mat1.size(0), mat2.size(1)}, mat1.options());
  if (mat1.is_meta()) return out;
  std::vector<int64_t> ends = groupEnds(e, offsets, mat1.size(1), "the contraction");
  int64_t start = 0;
  for (size_t g = 0; g < ends.size(); ++g) {
    if (ends[g] > start) {
      out[g].copy_(at::mm(mat1.narrow(1, start, ends[g] - start), mat2.narrow(0, start, ends[g] - start)));
    }
    start = ends[g];
  }
  return out;
}

at::Tensor groupedMm(const Expr* e, const std::vector<RuntimeValue>& in) {
  const at::Tensor& mat1 = in[0].tensor;
  const at::Tensor& mat2 = in[1].tensor;
  at::Tensor offsets = in.size() > 2 ? in[2].tensor : at::Tensor();
#if MF_HAS_GROUPED_MM
  // PyTorch's grouped GEMM where it has one (CUDA, bfloat16); offsets are used as given there. A
  // rank whose experts received no tokens has nothing to multiply: the loop gives the empty or
  // zero result without calling it.
  const bool empty = mat1.numel() == 0 || mat2.numel() == 0;
  if (mat1.is_cuda() && mat1.scalar_type() == at::kBFloat16 && !empty) {
    return at::_grouped_mm(mat1, mat2, offsets.defined() ? std::optional<at::Tensor>(offsets) : std::nullopt);
  }
#endif
  return groupedMmLoop(e, mat1, mat2, offsets);
}

at::Tensor bincount(const Expr* e, const at::Tensor& x) {
  const int64_t bins = e->attr<int64_t>("minlength");
  if (x.is_meta()) return at::empty({bins}, x.options().dtype(at::kLong));
  if (x.numel() > 0) {
    auto [lo, hi] = hostMinMax(x);
    MF_USER_CHECK(lo >= 0 && hi < bins, "bincount: the values of ", e->input(0)->toString(), " must lie in [0, ", bins,
                  ") (minlength, the number of bins); got values in [", lo, ", ", hi, "]");
  }
  at::Tensor values = x.reshape({-1}).to(at::kLong);
  if (x.is_cuda()) {
    // ATen's CUDA bincount reads the minimum and the maximum back to the host again (two more
    // synchronizations); the values are known to be in range, so add ones into the bins instead.
    return at::zeros({bins}, values.options()).index_add_(0, values, at::ones_like(values));
  }
  return callAten(opInfo(e->op()).aten, {values, c10::IValue(), bins});
}

std::vector<at::Tensor> tensorsOf(const std::vector<c10::IValue>& values, size_t n) {
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < n; ++i) out.push_back(values.at(i).toTensor());
  return out;
}

}  // namespace

std::vector<at::Tensor> evaluateMoeOp(const Expr* e, const std::vector<RuntimeValue>& in) {
  const OpInfo& info = opInfo(e->op());
  const at::Tensor& x = in[0].tensor;
  auto index = [&](size_t i) { return in[i].tensor.to(at::kLong); };
  // The axis the op works along (grouped_mm and bincount have none).
  const int64_t dim = e->attributes().has("dim") ? e->attr<int64_t>("dim") : 0;
  switch (info.aten_args) {
    case AtenArgs::GroupedMm: return {groupedMm(e, in)};
    case AtenArgs::Topk: return tensorsOf(callAtenAll(info.aten, {x, e->attr<int64_t>("k"), dim, e->attr<bool>("largest"), e->attr<bool>("sorted")}), 2);
    case AtenArgs::Sort: {
      std::vector<at::Tensor> both = tensorsOf(callAtenAll(info.aten, {x, e->attr<bool>("stable"), dim, e->attr<bool>("descending")}), 2);
      if (e->outputs().size() == 1) return {both[1]};  // argsort
      return both;
    }
    case AtenArgs::DimIndex:
      if (e->op() == OpType::IndexSelect) {
        if (std::optional<at::Tensor> out = indexSelectRows(x, dim, in[1].tensor)) return {*out};
      }
      return {callAten(info.aten, {x, dim, index(1)})};
    case AtenArgs::DimIndexSrc:
      if (e->op() == OpType::IndexAdd) {
        if (std::optional<at::Tensor> out = indexAddSorted(x, dim, in[1].tensor, in[2].tensor)) return {*out};
      }
      return {callAten(info.aten, {x, dim, index(1), in[2].tensor})};
    case AtenArgs::ScatterReduce:
      return {callAten(info.aten, {x, dim, index(1), in[2].tensor, e->attr<std::string>("reduce"),
                                   e->attr<bool>("include_self")})};
    case AtenArgs::Cumsum: return {callAten(info.aten, {x, dim, toAten(e->attr<DataType>("dtype"))})};
    case AtenArgs::Bincount: return {bincount(e, x)};
    default: MF_THROW_INTERNAL(info.name, " is not a mixture-of-experts op");
  }
}

}  // namespace mf
