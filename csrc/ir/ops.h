// Op builders: create the output TensorView (fresh logical domain, global shape) and the Expr.
// Shapes follow PyTorch: binary ops broadcast (numpy rules, right-aligned), reductions drop axes
// (keepdim is a broadcast afterwards), linear/matmul outputs end with their reduction axis.
#pragma once

#include <vector>

#include "ir/fusion.h"

namespace mf {

TensorView* defineTensor(Fusion& f, const std::vector<int64_t>& shape, DataType dtype,
                         const std::vector<bool>& contiguity = {}, const std::vector<int64_t>& stride_order = {});
Scalar* defineScalar(Fusion& f, DataType dtype, std::optional<double> value);

TensorView* unaryOp(OpType op, TensorView* x);
TensorView* castOp(TensorView* x, DataType dtype);
// Either operand may be a Scalar; at least one must be a tensor.
TensorView* binaryOp(OpType op, Val* a, Val* b);
TensorView* whereOp(Val* cond, Val* a, Val* b);
TensorView* reductionOp(OpType op, TensorView* x, std::vector<int64_t> dims, std::optional<DataType> dtype = std::nullopt);
TensorView* broadcastInDim(TensorView* x, const std::vector<int64_t>& shape, const std::vector<int64_t>& broadcast_dims);
TensorView* squeeze(TensorView* x, std::vector<int64_t> dims);
TensorView* permute(TensorView* x, const std::vector<int64_t>& dims);
TensorView* reshape(TensorView* x, const std::vector<int64_t>& shape);
TensorView* matmul(TensorView* a, TensorView* b);
TensorView* linear(TensorView* x, TensorView* w, TensorView* bias = nullptr);

// Attention (ops_attention.cpp). q, k, v: [batch.., heads, seq, head_dim], one dtype (float, half,
// bfloat16), k and v of one sequence length, one head_dim, the same leading axes (no
// grouped-query heads).
// Unset options take PyTorch's defaults: no dropout, not causal, scale 1/sqrt(head_dim).
struct AttentionOptions {
  std::optional<double> dropout_p;
  std::optional<bool> is_causal;
  std::optional<double> scale;
};
// {attn [lead.., seq_q, head_dim], logsumexp (float) [lead.., seq_q], seed, offset (0-d Int)}.
std::vector<TensorView*> sdpfaFwd(TensorView* q, TensorView* k, TensorView* v, const AttentionOptions& options);
// {grad_q, grad_k, grad_v}, shaped like q, k, v; the forward's options must be given again.
std::vector<TensorView*> sdpfaBwd(TensorView* grad_attn, TensorView* q, TensorView* k, TensorView* v, TensorView* attn,
                                  TensorView* logsumexp, TensorView* seed, TensorView* offset,
                                  const AttentionOptions& options);

}  // namespace mf
