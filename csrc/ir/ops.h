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
// The dtype PyTorch computes an op of these operands in (its three tiers: tensors with axes, 0-dim
// tensors, Python scalars).
DataType resultType(const std::vector<const Val*>& operands);
// Integer scalars only (constants, inputs, extents): add/sub/mul give an extent scalar, usable as
// a reshape size or a slice bound (fd.ops.mul(fd.ops.size(x, 0), 2)).
Scalar* extentArithmetic(OpType op, Val* a, Val* b);
TensorView* whereOp(Val* cond, Val* a, Val* b);
TensorView* reductionOp(OpType op, TensorView* x, std::vector<int64_t> dims, std::optional<DataType> dtype = std::nullopt);
TensorView* broadcastInDim(TensorView* x, const std::vector<int64_t>& shape, const std::vector<int64_t>& broadcast_dims);
// broadcast_in_dim to extents given as Vals (ops_shape.cpp): ints (-1 keeps the input's extent),
// integer scalar inputs or tensors' extents (fd.ops.size, fd.ops.shape), known when the program runs.
TensorView* broadcastInDimExtents(TensorView* x, const std::vector<Val*>& shape,
                                  const std::vector<int64_t>& broadcast_dims);
// An op on scalar values (ops_scalar.cpp): fd.ops.reciprocal(s), fd.ops.mul(s1, s2). Constants fold;
// integer add/sub/mul of extents stay extents (extentArithmetic, usable as shapes and bounds);
// anything else is a scalar the runtime computes from its operands' values (the op's `on_scalars`).
// The dtype follows the op's dtype rule (a float result of integers is double, as Python's).
Scalar* scalarOp(OpType op, const std::vector<Val*>& operands);
// What a computed scalar's op gives for its operands' values (the runtime's evaluation).
double evaluateScalarOp(OpType op, const std::vector<double>& operands, DataType dtype);
TensorView* squeeze(TensorView* x, std::vector<int64_t> dims);
TensorView* permute(TensorView* x, const std::vector<int64_t>& dims);
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

// Shapes (ops_shape.cpp). Extents given as Vals may be int constants, integer scalar inputs
// (fd.define_scalar()) or extents of tensors (size); -1 in a reshape is inferred.
Scalar* size(TensorView* x, int64_t dim);
std::vector<Scalar*> shape(TensorView* x);
TensorView* reshape(TensorView* x, const std::vector<int64_t>& shape);
// Sizes as Vals (ints, integer scalar inputs, extents); -1 is inferred.
TensorView* reshapeExtents(TensorView* x, const std::vector<Val*>& shape);
// PyTorch's x[start:end:step] per axis. `normalize`: every bound, constant or runtime scalar, on
// a static or symbolic axis, is normalized as PyTorch does (negative counts from the end, then
// clamped to [0, extent]; an end before the start gives an empty axis). Without it (nvFuser's
// manual_normalization) bounds are used as given and must satisfy 0 <= start <= end <= extent
// (checked at run time). Empty `strides`: all 1.
TensorView* slice(TensorView* x, const std::vector<Val*>& starts, const std::vector<Val*>& ends,
                  const std::vector<int64_t>& strides = {}, bool normalize = true);
// torch.nn.functional.pad(x, pad_widths, value=value): pairs of widths, last axis first.
TensorView* pad(TensorView* x, const std::vector<int64_t>& pad_widths, Val* value = nullptr);
TensorView* cat(const std::vector<TensorView*>& xs, int64_t dim);
// Same values; the output's memory layout follows `stride_order` (stride_order[i] ranks axis i's
// stride, larger = outer; [n-1, ..., 0] is row-major).
TensorView* strideOrder(TensorView* x, const std::vector<int64_t>& stride_order);

// Mixture of experts (ops_moe.cpp); PyTorch's semantics, nvFuser's names.
// torch._grouped_mm: [m, k] x [g, k, n] with int32 `offsets` [g] (cumulative ends of each group's
// rows) -> [m, n]; [g, m, k] x [g, k, n] (no offsets) -> [g, m, n]; [m, k] x [k, n] with offsets
// splitting k -> [g, m, n] (the weight gradient). `offsets` may be null for 3-D x 3-D only.
TensorView* groupedMm(TensorView* mat1, TensorView* mat2, TensorView* offsets);
// torch.topk: {values, indices (int64)} with `k` entries along `dim`.
std::pair<TensorView*, TensorView*> topk(TensorView* x, int64_t k, int64_t dim = -1, bool largest = true,
                                         bool sorted = true);
// torch.sort: {values, indices (int64)}; argsort: the indices alone.
std::pair<TensorView*, TensorView*> sort(TensorView* x, int64_t dim = -1, bool descending = false, bool stable = false);
TensorView* argsort(TensorView* x, int64_t dim = -1, bool descending = false, bool stable = false);
// torch.index_select: the entries of axis `dim` that the 1-D integer `index` names.
TensorView* indexSelect(TensorView* x, int64_t dim, TensorView* index);
// torch.gather: out[..i..] = x[..index[..i..] at dim..]; index has x's rank and, on other axes, at
// most x's extents (`exact_extents`: exactly them, nvFuser's take_along_axis).
TensorView* gather(TensorView* x, int64_t dim, TensorView* index, bool exact_extents = false);
// torch.scatter (src form): a copy of x with src's values written where index points along dim.
TensorView* scatter(TensorView* x, int64_t dim, TensorView* index, TensorView* src);
// torch.scatter_reduce: a copy of x where src's values reduce (sum, prod, mean, amax, amin) into the
// positions index names along dim; include_self: x's own value takes part.
TensorView* scatterReduce(TensorView* x, int64_t dim, TensorView* index, TensorView* src, const std::string& reduce,
                          bool include_self = true);
// torch.index_add: a copy of x with src's slices along dim added at the 1-D index's positions.
TensorView* indexAdd(TensorView* x, int64_t dim, TensorView* index, TensorView* src);
// torch.cumsum; integers and bool accumulate in int64 unless `dtype` is given.
TensorView* cumsum(TensorView* x, int64_t dim, std::optional<DataType> dtype = std::nullopt);
// torch.bincount(x, minlength=minlength) with exactly `minlength` bins (int64): every value of the
// 1-D integer x must lie in [0, minlength) (checked when it runs).
TensorView* bincount(TensorView* x, int64_t minlength);

// Expert parallelism (ops_exchange.cpp): the token exchange along `mesh_axis` (a team of
// `team_size` devices). tokens [m, ..]: this rank's rows grouped by expert; counts [experts]: rows
// per expert. Returns {received [rows, ..] (grouped by local expert, then source rank; rows is bound
// at run time), recv_counts [team_size, experts / team_size] (rows from each source per local
// expert)}. The combine returns expert_out's rows to their senders, in the dispatch's tokens' order.
std::pair<TensorView*, TensorView*> allToAllDispatch(TensorView* tokens, TensorView* counts, ParallelType mesh_axis,
                                                     int64_t team_size);
TensorView* allToAllCombine(TensorView* expert_out, TensorView* counts, TensorView* recv_counts);

// Composites (ops_composite.cpp): built from the ops above, so they shard like them.
// torch.var_mean: two passes (the mean, then the sum of squared deviations), in float for
// half/bfloat16 inputs. Returns {var, mean}.
std::pair<TensorView*, TensorView*> varMean(TensorView* x, std::vector<int64_t> dims, double correction = 1.0,
                                            bool keepdim = false);

}  // namespace mf
