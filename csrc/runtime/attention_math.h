// Attention written with matrix products in float32: the kernel for what no fused kernel takes
// (dropout on CPU, float32 with dropout on CUDA, a forced MESHFUSER_ATTENTION_KERNEL=math). The
// logsumexp it returns is the fused kernels' (of the scaled, masked scores, before dropout), and the
// dropout mask is drawn from a generator seeded by the saved seed, so the backward redraws it.
#pragma once

#include <ATen/ATen.h>

#include <tuple>

namespace mf {

struct MathAttentionOptions {
  double dropout_p = 0.0;
  bool is_causal = false;
  double scale = 1.0;
  int64_t seed = 0;  // of the dropout mask
};

// q, k, v: [batch, heads, seq, head_dim]. Returns (attention in q's dtype, logsumexp float).
std::tuple<at::Tensor, at::Tensor> mathAttentionForward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                        const MathAttentionOptions& o);

// Returns (grad_q, grad_k, grad_v) in q's dtype.
std::tuple<at::Tensor, at::Tensor, at::Tensor> mathAttentionBackward(const at::Tensor& grad_out, const at::Tensor& q,
                                                                     const at::Tensor& k, const at::Tensor& v,
                                                                     const at::Tensor& logsumexp,
                                                                     const MathAttentionOptions& o);

// A fresh seed for a call's dropout mask, from PyTorch's default CPU generator (torch.manual_seed
// makes it repeatable).
int64_t drawDropoutSeed();

}  // namespace mf
