#include "runtime/gemm_accumulate.h"

#include "ir/op_registry.h"
#include "runtime/buffer_ownership.h"
#include "support/error.h"

namespace mf {

bool accumulateIntoPartial(const std::vector<Expr*>& exprs, std::unordered_map<const Val*, at::Tensor>& values) {
  MF_CHECK(exprs.size() == 2, "a gemm_accumulate segment holds a GEMM and its sum, not ", exprs.size(), " exprs");
  const Expr* gemm = exprs[0];
  const Expr* sum = exprs[1];
  const Val* partial_val = sum->input(0) == gemm->output(0) ? sum->input(1) : sum->input(0);
  auto it = values.find(partial_val);
  MF_CHECK(it != values.end(), "no value for ", partial_val->toString(), " when running ", sum->toString());
  at::Tensor& partial = it->second;
  const at::Tensor& a = values.at(gemm->input(0));
  at::Tensor b = values.at(gemm->input(1));
  if (opInfo(gemm->op()).second_operand_transposed) b = b.t();
  if (a.dim() < 2 || b.dim() != 2 || a.size(-1) != b.size(0)) return false;
  // The partial may carry size-1 axes the product lacks (the device axis of a partial sum).
  std::vector<int64_t> product_sizes(a.sizes().begin(), a.sizes().end() - 1);
  product_sizes.push_back(b.size(1));
  auto without_ones = [](c10::IntArrayRef sizes) {
    std::vector<int64_t> kept;
    for (int64_t n : sizes) {
      if (n != 1) kept.push_back(n);
    }
    return kept;
  };
  if (without_ones(partial.sizes()) != without_ones(product_sizes) || !partial.is_contiguous() ||
      partial.scalar_type() != a.scalar_type() || b.scalar_type() != a.scalar_type()) {
    return false;
  }
  // Only the runtime's value map references the partial: writing into it changes no value anyone
  // else can see (the fold made sure no later expr reads it).
  if (!ownsItsBuffer(partial, 1)) return false;
  at::Tensor rows = partial.view({-1, b.size(1)});
  rows.addmm_(a.reshape({-1, a.size(-1)}), b);
  values[sum->output(0)] = partial;
  return true;
}

}  // namespace mf
