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
// Values in [low, high) of a floating `dtype`, drawn by the counter-based generator of
// support/counter_rng.h from (seed, offset, global element index). All four are scalars; seed and
// offset integers in [0, 2^53). `shape` is global and static.
TensorView* uniform(Val* low, Val* high, const std::vector<int64_t>& shape, DataType dtype, Val* seed, Val* offset);
// aten::embedding: rows of weight [num_embeddings, dim] picked by integer `indices`; the output is
// [*indices.shape, dim] of the weight's dtype. padding_idx (forward-neutral, as in PyTorch) is
// recorded and checked against num_embeddings.
TensorView* embeddingFwd(TensorView* indices, TensorView* weight, std::optional<int64_t> padding_idx = std::nullopt);

}  // namespace mf
