#include "runtime/attention_math.h"

#include <ATen/CPUGeneratorImpl.h>

#include <limits>

namespace mf {
namespace {

// Scaled scores in float32 with the causal mask PyTorch's is_causal means (top-left aligned: query
// i sees keys 0..i).
at::Tensor scores(const at::Tensor& q, const at::Tensor& k, const MathAttentionOptions& o) {
  at::Tensor s = at::matmul(q.to(at::kFloat), k.to(at::kFloat).transpose(-2, -1)).mul_(o.scale);
  if (o.is_causal) {
    at::Tensor future = at::ones({q.size(-2), k.size(-2)}, q.options().dtype(at::kBool)).triu_(1);
    s.masked_fill_(future, -std::numeric_limits<float>::infinity());
  }
  return s;
}

// The dropout multiplier (0 or 1 / (1 - p)) for the scores' shape, drawn on the CPU from the seed
// and moved to the scores' device: the same seed gives the same mask on any device.
at::Tensor dropoutScale(const at::Tensor& s, const MathAttentionOptions& o) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(o.seed));
  at::Tensor keep = at::empty(s.sizes(), at::TensorOptions().dtype(at::kFloat)).bernoulli_(1.0 - o.dropout_p, gen);
  return keep.div_(1.0 - o.dropout_p).to(s.device());
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> mathAttentionForward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                        const MathAttentionOptions& o) {
  at::Tensor s = scores(q, k, o);
  at::Tensor lse = at::logsumexp(s, -1);
  at::Tensor p = (s - lse.unsqueeze(-1)).exp_();
  if (o.dropout_p > 0.0) p.mul_(dropoutScale(p, o));
  return {at::matmul(p, v.to(at::kFloat)).to(q.scalar_type()), lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> mathAttentionBackward(const at::Tensor& grad_out, const at::Tensor& q,
                                                                     const at::Tensor& k, const at::Tensor& v,
                                                                     const at::Tensor& logsumexp,
                                                                     const MathAttentionOptions& o) {
  at::Tensor qf = q.to(at::kFloat), kf = k.to(at::kFloat), vf = v.to(at::kFloat), go = grad_out.to(at::kFloat);
  at::Tensor p = (scores(q, k, o) - logsumexp.to(at::kFloat).unsqueeze(-1)).exp_();
  at::Tensor dp = at::matmul(go, vf.transpose(-2, -1));
  at::Tensor p_dropped = p;
  if (o.dropout_p > 0.0) {
    at::Tensor mask = dropoutScale(p, o);
    p_dropped = p * mask;
    dp.mul_(mask);
  }
  at::Tensor grad_v = at::matmul(p_dropped.transpose(-2, -1), go);
  // softmax backward: dS = P * (dP - rowsum(P * dP))
  at::Tensor ds = p * (dp - (p * dp).sum(-1, /*keepdim=*/true));
  at::Tensor grad_q = at::matmul(ds, kf).mul_(o.scale);
  at::Tensor grad_k = at::matmul(ds.transpose(-2, -1), qf).mul_(o.scale);
  const auto dtype = q.scalar_type();
  return {grad_q.to(dtype), grad_k.to(dtype), grad_v.to(dtype)};
}

int64_t drawDropoutSeed() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return static_cast<int64_t>(gen.get<at::CPUGeneratorImpl>()->random64() >> 1);
}

}  // namespace mf
