// Which attention kernel runs a call: the choice PyTorch's scaled_dot_product_attention would make
// (cuDNN, then flash, then memory-efficient, then math), made the same way for the forward and the
// backward of one call so the backward reads the saved outputs of the kernel that wrote them.
#pragma once

#include <ATen/ATen.h>

#include <string>

namespace mf {

class Expr;

enum class AttentionKernel { Cudnn, Flash, Efficient, CpuFlash, Math };

const char* attentionKernelName(AttentionKernel k);

// q, k, v: the [batch, heads, seq, head_dim] tensors the kernel will read (contiguous, head_dim
// padded as the fused kernels need). MESHFUSER_ATTENTION_KERNEL=cudnn|flash|efficient|math forces
// a kernel (for debugging; a kernel that cannot take the call then fails with PyTorch's reason).
// Otherwise, on CUDA without dropout PyTorch's own dispatcher decides (as for a call that needs
// gradients, so the forward never picks a kernel without a backward); with dropout flash attention
// (half, bfloat16) or the math kernel; on CPU PyTorch's CPU flash kernel, or math with dropout.
AttentionKernel chooseAttentionKernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout_p,
                                      bool is_causal, double scale);

// The kernel the last call of `e` ran, for fd.host_program(); empty before the first call.
void recordAttentionKernel(const Expr* e, AttentionKernel k);
std::string lastAttentionKernel(const Expr* e);

}  // namespace mf
