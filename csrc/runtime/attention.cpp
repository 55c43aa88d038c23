// sdpfa_fwd / sdpfa_bwd on PyTorch's fused attention.
//
// The kernels take [batch, heads, seq, head_dim]; other leading axes (a logical device split adds
// one) fold into batch for the call and unfold after. The RNG state is two 0-d int64 tensors on
// the tensors' device: on CUDA the seed and offset flash attention drew (it returns them packed
// as a uint64 pair, which the backward takes back); on CPU zeros, since PyTorch's CPU kernel has
// no dropout and dropout_p > 0 is refused there.
#include "runtime/attention.h"

#include <ATen/ATen.h>

#include "support/error.h"

namespace mf {
namespace {

// [batch..., heads, seq, head_dim] -> [batch, heads, seq, head_dim], contiguous: the flash
// kernels assume a unit stride along head_dim (a transposed v gave wrong attention, silently), and
// the folded batch is computed (reshape cannot infer -1 for a tensor with no elements).
at::Tensor to4d(const at::Tensor& t) {
  int64_t batch = 1;
  for (int64_t d = 0; d + 3 < t.dim(); ++d) batch *= t.size(d);
  return t.reshape({batch, t.size(-3), t.size(-2), t.size(-1)}).contiguous();
}

void requireSupported(const Expr* e, const at::Tensor& q) {
  const char* op = opInfo(e->op()).name;
  if (q.is_cuda()) {
    MF_USER_CHECK(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16, op, ": on CUDA tensors ",
                  e->input(e->op() == OpType::SdpfaBwd ? 1 : 0)->toString(), " must be half or bfloat16 (flash ",
                  "attention); got ", q.scalar_type());
    return;
  }
  MF_USER_CHECK(e->attrs().dropout_p == 0.0, op, ": dropout_p = ", e->attrs().dropout_p,
                " on CPU tensors is not supported: PyTorch's CPU flash-attention kernel has no dropout; use dropout_p=0 ",
                "on CPU, or CUDA tensors");
}

std::vector<at::Tensor> forward(const Expr* e, const std::vector<RuntimeValue>& in) {
  const ExprAttrs& a = e->attrs();
  const at::Tensor& q = in[0].tensor;
  requireSupported(e, q);
  auto rng_options = at::TensorOptions().dtype(at::kLong).device(q.device());
  std::vector<int64_t> attn_shape(q.sizes().begin(), q.sizes().end());
  attn_shape.back() = in[2].tensor.size(-1);
  std::vector<int64_t> lse_shape(q.sizes().begin(), q.sizes().end() - 1);
  MF_USER_CHECK(in[1].tensor.size(-2) > 0 || q.numel() == 0, opInfo(e->op()).name, ": ", e->input(1)->toString(),
                " has no keys (sequence length 0) for a non-empty query; attention over nothing is undefined");
  if (q.numel() == 0) {  // no queries: nothing to attend (the flash kernels divide by zero here)
    return {at::empty(attn_shape, q.options()), at::empty(lse_shape, q.options().dtype(at::kFloat)),
            at::zeros({}, rng_options), at::zeros({}, rng_options)};
  }
  at::Tensor q4 = to4d(q), k4 = to4d(in[1].tensor), v4 = to4d(in[2].tensor);
  at::Tensor attn, lse, seed, offset;
  if (q.is_cuda()) {
    auto r = at::_scaled_dot_product_flash_attention(q4, k4, v4, a.dropout_p, a.is_causal, /*return_debug_mask=*/false,
                                                     a.scale);
    attn = std::get<0>(r);
    lse = std::get<1>(r);
    at::Tensor rng = std::get<6>(r);
    if (rng.numel() == 2) {  // {seed, offset} as uint64
      at::Tensor pair = rng.view(at::kLong).to(q.device());
      seed = pair[0].clone();
      offset = pair[1].clone();
    } else if (rng.numel() == 1) {
      seed = rng.to(rng_options).reshape({});
      offset = std::get<7>(r).to(rng_options).reshape({});
    } else {
      seed = at::zeros({}, rng_options);
      offset = at::zeros({}, rng_options);
    }
  } else {
    auto r = at::_scaled_dot_product_flash_attention_for_cpu(q4, k4, v4, a.dropout_p, a.is_causal, c10::nullopt, a.scale);
    attn = std::get<0>(r);
    lse = std::get<1>(r);
    seed = at::zeros({}, rng_options);
    offset = at::zeros({}, rng_options);
  }
  return {attn.reshape(attn_shape), lse.reshape(lse_shape), seed, offset};
}

std::vector<at::Tensor> backward(const Expr* e, const std::vector<RuntimeValue>& in) {
  const ExprAttrs& a = e->attrs();
  const at::Tensor& q = in[1].tensor;
  requireSupported(e, q);
  at::Tensor grad4 = to4d(in[0].tensor), q4 = to4d(q), k4 = to4d(in[2].tensor), v4 = to4d(in[3].tensor);
  at::Tensor out4 = to4d(in[4].tensor);
  const at::Tensor& lse_in = in[5].tensor;
  int64_t lse_batch = 1;
  for (int64_t d = 0; d + 2 < lse_in.dim(); ++d) lse_batch *= lse_in.size(d);
  at::Tensor lse3 = lse_in.reshape({lse_batch, lse_in.size(-2), lse_in.size(-1)}).contiguous();
  at::Tensor gq, gk, gv;
  if (q.is_cuda()) {
    // Flash attention's backward reads the packed uint64 {seed, offset} it returned.
    at::Tensor rng = at::stack({in[6].tensor.reshape({}), in[7].tensor.reshape({})}).to(q.device()).view(at::kUInt64);
    at::Tensor unused = at::empty({0}, rng.options());
    std::tie(gq, gk, gv) = at::_scaled_dot_product_flash_attention_backward(
        grad4, q4, k4, v4, out4, lse3, at::Tensor(), at::Tensor(), q4.size(2), k4.size(2), a.dropout_p, a.is_causal, rng,
        unused, a.scale);
  } else {
    std::tie(gq, gk, gv) = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        grad4, q4, k4, v4, out4, lse3, a.dropout_p, a.is_causal, c10::nullopt, a.scale);
  }
  return {gq.reshape(q.sizes()), gk.reshape(in[2].tensor.sizes()), gv.reshape(in[3].tensor.sizes())};
}

}  // namespace

std::vector<at::Tensor> evaluateAttention(const Expr* e, const std::vector<RuntimeValue>& inputs) {
  MF_CHECK(e->op() == OpType::SdpfaFwd || e->op() == OpType::SdpfaBwd, "not an attention op: ", e->toString());
  return e->op() == OpType::SdpfaFwd ? forward(e, inputs) : backward(e, inputs);
}

}  // namespace mf
