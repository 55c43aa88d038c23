// sdpfa_fwd / sdpfa_bwd on the attention kernel PyTorch's dispatcher would pick (attention_choice.h).
//
// The kernels take [batch, heads, seq, head_dim]; other leading axes (a logical device split adds
// one) fold into batch for the call and unfold after. On CUDA the fused kernels get head_dim padded
// with zeros to a multiple of 8, as PyTorch's scaled_dot_product_attention does (zero columns add
// nothing to q.k, and v's zero columns give output columns that are cut off), with the scale of the
// unpadded head_dim. The RNG state is two 0-d int64 tensors on the tensors' device: flash
// attention's seed and offset (it returns them packed as a uint64 pair, which its backward takes
// back), the math kernel's mask seed, or zeros without dropout.
#include "runtime/attention.h"

#include <ATen/ATen.h>

#include <atomic>
#include <cmath>

#include "runtime/attention_choice.h"
#include "runtime/attention_math.h"
#include "support/error.h"

namespace mf {
namespace {

constexpr int64_t kHeadDimMultiple = 8;          // the fused CUDA kernels' head_dim alignment
constexpr int64_t kEfficientLseRowMultiple = 32;  // memory-efficient attention pads logsumexp rows

// [batch..., heads, seq, head_dim] -> [batch, heads, seq, head_dim] (the folded batch is computed:
// reshape cannot infer -1 for a tensor with no elements).
at::Tensor fold4d(const at::Tensor& t) {
  int64_t batch = 1;
  for (int64_t d = 0; d + 3 < t.dim(); ++d) batch *= t.size(d);
  return t.reshape({batch, t.size(-3), t.size(-2), t.size(-1)});
}


at::Tensor padLastDim(const at::Tensor& t, int64_t size) {
  return t.size(-1) == size ? t : at::constant_pad_nd(t, {0, size - t.size(-1)}, 0);
}

at::Tensor rngScalar(int64_t value, const at::Tensor& like) {
  return at::scalar_tensor(value, at::TensorOptions().dtype(at::kLong).device(like.device()));
}

// One call's tensors as its kernel reads them, and the kernel.
struct KernelCall {
  at::Tensor q, k, v;
  at::Tensor k_grouped, v_grouped;  // grouped-query attention: the fewer heads, as given (4-D)
  int64_t head_dim = 0;  // unpadded
  int64_t kv_groups = 1;  // query heads per key/value head
  bool native_groups = false;  // the kernel reads the fewer key/value heads itself (no repeated copies)
  double scale = 1.0;
  AttentionKernel kernel = AttentionKernel::Math;
  bool fused() const { return kernel != AttentionKernel::Math && kernel != AttentionKernel::CpuFlash; }
  // k and v with their heads repeated, for a kernel that does not read fewer key/value heads.
  void repeatGroups();
  at::Tensor pad(const at::Tensor& t) const { return fused() ? padLastDim(t, q.size(-1)) : t; }
  at::Tensor unpad(const at::Tensor& t) const { return t.size(-1) == head_dim ? t : t.narrow(-1, 0, head_dim); }
  // A key/value gradient of the repeated heads, summed back onto the heads the caller has, in the
  // [batch, seq, heads, head_dim] layout (so that merging its heads after is a view).
  at::Tensor ungroup(const at::Tensor& t) const {
    if (kv_groups == 1 || native_groups) return t;
    at::Tensor bshd = t.transpose(1, 2);
    return bshd.reshape({t.size(0), t.size(2), t.size(1) / kv_groups, kv_groups, t.size(3)})
        .sum(3, /*keepdim=*/false, at::kFloat)
        .to(t.scalar_type())
        .transpose(1, 2);
  }
};

// Whether `kernel` has taken key/value heads fewer than the query heads in this process (cuDNN's
// and flash attention's kernels do, on recent PyTorch): it then runs without the repeated copies
// (two [batch, heads, seq, head_dim] copies forward, their sums backward); a refusal turns it off.
std::atomic<bool>& nativeGroupsAllowed(AttentionKernel kernel) {
  static std::atomic<bool> cudnn{true}, flash{true};
  return kernel == AttentionKernel::Cudnn ? cudnn : flash;
}

// Key/value heads repeated for grouped-query attention, [batch, heads, seq, head_dim] laid out as
// [batch, seq, heads, head_dim]: the kernels write the gradients in their input's layout.
// Key/value heads repeated for grouped-query attention, [batch, heads, seq, head_dim] laid out as
// [batch, seq, heads, head_dim]: the kernels write the gradients in their input's layout.
at::Tensor repeatHeads(const at::Tensor& t, int64_t groups) {
  at::Tensor bshd = t.transpose(1, 2);
  return bshd.unsqueeze(3)
      .expand({t.size(0), t.size(2), t.size(1), groups, t.size(3)})
      .reshape({t.size(0), t.size(2), t.size(1) * groups, t.size(3)})
      .transpose(1, 2);
}

// What the dispatcher is asked with for the repeated heads, without repeating them (the repeat
// copied k and v even where the kernel then read the fewer heads): `q` where it has the repeated
// tensor's sizes, strides and dtype (self-attention from one projection layout), else an
// allocation of that layout ([batch, seq, heads, head_dim] viewed as heads first), never written.
at::Tensor repeatedHeadsStandIn(const at::Tensor& q, const at::Tensor& t, int64_t groups) {
  const std::vector<int64_t> sizes = {t.size(0), t.size(1) * groups, t.size(2), t.size(3)};
  const std::vector<int64_t> strides = {sizes[2] * sizes[1] * sizes[3], sizes[3], sizes[1] * sizes[3], 1};
  if (q.sizes().vec() == sizes && q.strides().vec() == strides && q.scalar_type() == t.scalar_type()) return q;
  return at::empty_strided(sizes, strides, t.options());
}

void KernelCall::repeatGroups() {
  k = pad(repeatHeads(k_grouped, kv_groups));
  v = pad(repeatHeads(v_grouped, kv_groups));
}

// The kernels (fused CUDA ones and PyTorch's CPU flash attention) read any layout with a unit
// stride along head_dim: q, k and v permuted out of [batch, seq, heads, head_dim] are read in
// place, and the output and the gradients come back in that layout, so merging the heads after is
// a view. A strided head_dim (a transposed v gave wrong attention on CPU, silently) or a broadcast
// axis (stride 0) is copied first.
at::Tensor to4dStrided(const at::Tensor& t) {
  at::Tensor folded = fold4d(t);
  bool in_place = folded.stride(-1) == 1;
  for (int64_t d = 0; d < folded.dim(); ++d) in_place = in_place && (folded.stride(d) != 0 || folded.size(d) <= 1);
  return in_place ? folded : folded.contiguous();
}

// The attention op's attributes (its registry entry declares them).
struct AttentionAttrs {
  double dropout_p;
  bool is_causal;
  OptionalFloat scale;
};
AttentionAttrs attentionAttrs(const Expr* e) {
  return {e->attr<double>("dropout_p"), e->attr<bool>("is_causal"), e->attr<OptionalFloat>("scale")};
}

KernelCall prepare(const Expr* e, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const AttentionAttrs a = attentionAttrs(e);
  KernelCall c;
  c.q = to4dStrided(q);
  c.k = to4dStrided(k);
  c.v = to4dStrided(v);
  c.head_dim = q.size(-1);
  // Grouped-query attention: each key/value head serves kv_groups consecutive query heads. cuDNN
  // and flash read the fewer heads themselves; the other kernels get them repeated (as PyTorch's
  // math path does) and the backward sums the groups. The kernel is chosen as for the repeated call.
  c.kv_groups = c.q.size(1) / c.k.size(1);
  c.scale = a.scale.value_or(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  int64_t padded = (c.head_dim + kHeadDimMultiple - 1) / kHeadDimMultiple * kHeadDimMultiple;
  auto pad = [&](const at::Tensor& t) { return q.is_cuda() ? padLastDim(t, padded) : t; };
  at::Tensor k_asked = c.k, v_asked = c.v;
  if (c.kv_groups > 1) {
    const bool unpadded = padded == c.head_dim && v.size(-1) % kHeadDimMultiple == 0;
    k_asked = unpadded ? repeatedHeadsStandIn(c.q, c.k, c.kv_groups) : repeatHeads(c.k, c.kv_groups);
    v_asked = unpadded ? repeatedHeadsStandIn(c.q, c.v, c.kv_groups) : repeatHeads(c.v, c.kv_groups);
  }
  at::Tensor qp = pad(c.q);
  c.kernel = chooseAttentionKernel(qp, pad(k_asked), pad(v_asked), a.dropout_p, a.is_causal, c.scale);
  MF_USER_CHECK(!(c.kernel == AttentionKernel::Cudnn && a.dropout_p > 0.0), opInfo(e->op()).name,
                ": MESHFUSER_ATTENTION_KERNEL=cudnn with dropout_p = ", a.dropout_p,
                " is not supported (the backward could not redraw cuDNN's mask); force flash or math");
  if (c.fused()) c.q = qp;
  if (c.kv_groups > 1) {
    c.k_grouped = c.k;
    c.v_grouped = c.v;
    c.native_groups = (c.kernel == AttentionKernel::Cudnn || c.kernel == AttentionKernel::Flash) &&
                      nativeGroupsAllowed(c.kernel).load();
    if (!c.native_groups) c.repeatGroups();
  }
  c.k = c.pad(c.k);
  c.v = c.pad(c.v);
  recordAttentionKernel(e, c.kernel);
  return c;
}

// Runs `call` on the fewer key/value heads where the kernel takes them; if it refuses, never again
// in this process, and on the repeated heads now.
template <typename Fn>
void runGrouped(const Expr* e, KernelCall& c, Fn&& call) {
  if (c.native_groups) {
    try {
      call();
      return;
    } catch (const c10::Error&) {
      nativeGroupsAllowed(c.kernel).store(false);
      c.native_groups = false;
      c.repeatGroups();
    }
  }
  runKernel(e, c, call);
}

// Runs `fn`; a PyTorch error from a forced kernel names the kernel and the variable.
template <typename Fn>
auto runKernel(const Expr* e, const KernelCall& c, Fn&& fn) {
  try {
    return fn();
  } catch (const c10::Error& err) {
    MF_THROW_USER(opInfo(e->op()).name, ": the ", attentionKernelName(c.kernel),
                  " attention kernel refused the call (MESHFUSER_ATTENTION_KERNEL selects kernels): ",
                  err.what_without_backtrace());
  }
}

std::vector<at::Tensor> forward(const Expr* e, const std::vector<RuntimeValue>& in) {
  const AttentionAttrs a = attentionAttrs(e);
  const at::Tensor& q = in[0].tensor;
  std::vector<int64_t> attn_shape(q.sizes().begin(), q.sizes().end());
  attn_shape.back() = in[2].tensor.size(-1);
  std::vector<int64_t> lse_shape(q.sizes().begin(), q.sizes().end() - 1);
  MF_USER_CHECK(in[1].tensor.size(-2) > 0 || q.numel() == 0, opInfo(e->op()).name, ": ", e->input(1)->toString(),
                " has no keys (sequence length 0) for a non-empty query; attention over nothing is undefined");
  if (q.numel() == 0) {  // no queries: nothing to attend (the fused kernels divide by zero here)
    return {at::empty(attn_shape, q.options()), at::empty(lse_shape, q.options().dtype(at::kFloat)), rngScalar(0, q),
            rngScalar(0, q)};
  }
  KernelCall c = prepare(e, q, in[1].tensor, in[2].tensor);
  at::Tensor attn, lse, seed = rngScalar(0, q), offset = rngScalar(0, q);
  runGrouped(e, c, [&] {
    switch (c.kernel) {
      case AttentionKernel::Cudnn: {
        auto r = at::_scaled_dot_product_cudnn_attention(c.q, c.k, c.v, std::nullopt, /*compute_log_sumexp=*/true,
                                                         0.0, a.is_causal, /*return_debug_mask=*/false, c.scale);
        attn = std::get<0>(r);
        lse = std::get<1>(r);
        break;
      }
      case AttentionKernel::Flash: {
        auto r = at::_scaled_dot_product_flash_attention(c.q, c.k, c.v, a.dropout_p, a.is_causal,
                                                         /*return_debug_mask=*/false, c.scale);
        attn = std::get<0>(r);
        lse = std::get<1>(r);
        at::Tensor rng = std::get<6>(r);
        if (rng.numel() == 2) {  // {seed, offset} as uint64
          at::Tensor pair = rng.view(at::kLong).to(q.device());
          seed = pair[0].clone();
          offset = pair[1].clone();
        } else if (rng.numel() == 1) {
          seed = rng.to(seed.options()).reshape({});
          offset = std::get<7>(r).to(seed.options()).reshape({});
        }
        break;
      }
      case AttentionKernel::Efficient: {
        auto r = at::_scaled_dot_product_efficient_attention(c.q, c.k, c.v, std::nullopt, /*compute_log_sumexp=*/true,
                                                             a.dropout_p, a.is_causal, c.scale);
        attn = std::get<0>(r);
        lse = std::get<1>(r).narrow(-1, 0, c.q.size(2));  // rows padded to a multiple of 32
        seed = std::get<2>(r).to(seed.options()).reshape({});
        offset = std::get<3>(r).to(seed.options()).reshape({});
        break;
      }
      case AttentionKernel::CpuFlash: {
        auto r = at::_scaled_dot_product_flash_attention_for_cpu(c.q, c.k, c.v, 0.0, a.is_causal, std::nullopt,
                                                                 c.scale);
        attn = std::get<0>(r);
        lse = std::get<1>(r);
        break;
      }
      case AttentionKernel::Math: {
        MathAttentionOptions o{a.dropout_p, a.is_causal, c.scale, a.dropout_p > 0.0 ? drawDropoutSeed() : 0};
        std::tie(attn, lse) = mathAttentionForward(c.q, c.k, c.v, o);
        seed = rngScalar(o.seed, q);
        break;
      }
    }
    return 0;
  });
  return {c.unpad(attn).reshape(attn_shape), lse.reshape(lse_shape), seed, offset};
}

std::vector<at::Tensor> backward(const Expr* e, const std::vector<RuntimeValue>& in) {
  const AttentionAttrs a = attentionAttrs(e);
  const at::Tensor& q = in[1].tensor;
  KernelCall c = prepare(e, q, in[2].tensor, in[3].tensor);
  at::Tensor grad4 = c.pad(to4dStrided(in[0].tensor)), out4 = c.pad(to4dStrided(in[4].tensor));
  const at::Tensor& lse_in = in[5].tensor;
  int64_t lse_batch = 1;
  for (int64_t d = 0; d + 2 < lse_in.dim(); ++d) lse_batch *= lse_in.size(d);
  at::Tensor lse3 = lse_in.reshape({lse_batch, lse_in.size(-2), lse_in.size(-1)}).contiguous();
  const at::Tensor& seed = in[6].tensor;
  const at::Tensor& offset = in[7].tensor;
  const int64_t seq_q = c.q.size(2), seq_k = c.k.size(2);
  at::Tensor gq, gk, gv;
  runGrouped(e, c, [&] {
    switch (c.kernel) {
      case AttentionKernel::Cudnn: {
        at::Tensor none;
        std::tie(gq, gk, gv) = at::_scaled_dot_product_cudnn_attention_backward(
            grad4, c.q, c.k, c.v, out4, lse3.unsqueeze(-1), seed, offset, none, none, none, seq_q, seq_k, 0.0,
            a.is_causal, c.scale);
        break;
      }
      case AttentionKernel::Flash: {
        // Flash attention's backward reads the packed uint64 {seed, offset} it returned.
        at::Tensor rng = at::stack({seed.reshape({}), offset.reshape({})}).to(q.device()).view(at::kUInt64);
        at::Tensor unused = at::empty({0}, rng.options());
        std::tie(gq, gk, gv) = at::_scaled_dot_product_flash_attention_backward(
            grad4, c.q, c.k, c.v, out4, lse3, at::Tensor(), at::Tensor(), seq_q, seq_k, a.dropout_p, a.is_causal, rng,
            unused, c.scale);
        break;
      }
      case AttentionKernel::Efficient: {
        // The memory-efficient backward reads grad_out and out in the [batch, seq, heads, head_dim]
        // layout its forward writes (a contiguous out gave NaN gradients for padded head sizes).
        auto bshd = [](const at::Tensor& t) { return t.transpose(1, 2).contiguous().transpose(1, 2); };
        grad4 = bshd(grad4);
        out4 = bshd(out4);
        int64_t rows = (seq_q + kEfficientLseRowMultiple - 1) / kEfficientLseRowMultiple * kEfficientLseRowMultiple;
        at::Tensor lse_padded = at::constant_pad_nd(lse3, {0, rows - seq_q}, 0);
        auto r = at::_scaled_dot_product_efficient_attention_backward(
            grad4, c.q, c.k, c.v, at::Tensor(), out4, lse_padded, seed.cpu(), offset.cpu(), a.dropout_p,
            {true, true, true, false}, a.is_causal, c.scale);
        std::tie(gq, gk, gv) = std::make_tuple(std::get<0>(r), std::get<1>(r), std::get<2>(r));
        break;
      }
      case AttentionKernel::CpuFlash:
        std::tie(gq, gk, gv) = at::_scaled_dot_product_flash_attention_for_cpu_backward(
            grad4, c.q, c.k, c.v, out4, lse3, 0.0, a.is_causal, std::nullopt, c.scale);
        break;
      case AttentionKernel::Math: {
        MathAttentionOptions o{a.dropout_p, a.is_causal, c.scale, seed.item<int64_t>()};
        std::tie(gq, gk, gv) = mathAttentionBackward(grad4, c.q, c.k, c.v, lse3, o);
        break;
      }
    }
    return 0;
  });
  return {c.unpad(gq).reshape(q.sizes()), c.ungroup(c.unpad(gk)).reshape(in[2].tensor.sizes()),
          c.ungroup(c.unpad(gv)).reshape(in[3].tensor.sizes())};
}

}  // namespace

std::vector<at::Tensor> evaluateAttention(const Expr* e, const std::vector<RuntimeValue>& inputs) {
  MF_CHECK(e->op() == OpType::SdpfaFwd || e->op() == OpType::SdpfaBwd, "not an attention op: ", e->toString());
  return e->op() == OpType::SdpfaFwd ? forward(e, inputs) : backward(e, inputs);
}

}  // namespace mf
