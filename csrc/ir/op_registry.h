// The op registry: everything meshfuser knows about an op, in one entry.
//
// Passes, the evaluator, codegen, the printer/parser and the bindings ask the registry; none of
// them switches on OpType. Adding an elementwise op is one enum value here plus one entry in
// op_registry.cpp (name, kind, dtype rule, ATen name, CUDA expression), and tests. An op with
// attributes declares them in its entry (AttrDef) with a check (ir/op_checks.cpp); see
// docs/adding_an_op.md.
//
// The model is a per-op factor rule: each input axis maps to an output axis (kept, broadcast,
// reduced, contracted, reshaped); a device split on a kept axis passes through; one on a reduced or
// contracted axis makes the output a partial result that a reduction across devices completes
// (`partial_combine`); anything else needs the operand resharded.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/attributes.h"
#include "ir/resize_map.h"
#include "ir/types.h"

namespace mf {

class Expr;
class Val;

enum class OpType {
  // unary
  Set, Neg, Abs, Exp, Log, Tanh, Relu, Gelu, Sigmoid, Sqrt, Reciprocal, Silu, Rsqrt, Erf, Sin, Cos, Cast,
  // binary
  Add, Sub, Mul, Div, Maximum, Minimum, Pow, Eq, Ne, Lt, Le, Gt, Ge,
  // ternary
  Where,
  // layout
  BroadcastInDim, Squeeze, Permute, Reshape, Slice, Pad, Cat, StrideOrder,
  // sources/gathers
  Uniform, EmbeddingFwd,
  // reductions
  Sum, Max, Min,
  // contractions
  Matmul, Linear,
  // attention (several outputs each)
  SdpfaFwd, SdpfaBwd,
  // mixture of experts: grouped GEMM and routing (ops_moe.cpp)
  GroupedMm, Topk, Sort, Argsort, IndexSelect, GatherAlong, Scatter, IndexAdd, Cumsum, Bincount, ScatterReduce,
  // expert parallelism: the token exchange the program states (ops_exchange.cpp)
  AllToAllCounts, AllToAllDispatch, AllToAllCombine,
};

enum class OpKind {
  Unary,        // one tensor in, same shape out
  Binary,       // two operands (tensor or scalar), broadcast right-aligned
  Ternary,      // where
  Layout,       // moves or views data: broadcast_in_dim, squeeze, permute, reshape, slice, pad, cat,
                // stride_order
  Source,       // no tensor operands; the output's values depend on its global element index (uniform)
  Gather,       // rows (axis 0) of a table (input 1) picked by an index tensor (input 0): embedding_fwd.
                // Its output may gain a trailing reduction axis over the rows (partial_gathers)
  Reduction,    // sum/max/min over axes; reduced axes stay in the output's logical domain as r{}
  Contraction,  // matmul/linear: output ends with the contracted r{k}
  Attention,    // sdpfa_fwd/bwd: PyTorch's fused attention, several outputs, no reduction axes
  Routing,      // mixture-of-experts ops whose result depends on the data along an axis (sort, topk,
                // gather/scatter by index, cumsum, bincount) or on group offsets (grouped_mm): ATen
                // runs them in a segment of their own; the axis they read across is whole on every
                // device (its axis map sends it nowhere, so a split on it is gathered first)
  Exchange,     // expert-parallel token exchange written in the program (all_to_all_dispatch/_combine):
                // each becomes one host communication along its mesh axis; its operands and results
                // are this rank's own rows (rank-local values that no pass reshards)
};

// How the output dtype follows from the operands.
enum class DtypeRule {
  SameAsInput,      // dtype of the first tensor operand
  FloatIfIntegral,  // like the input; integral and bool inputs give float (exp(int) is float)
  Promote,          // PyTorch promotion of the operands (scalars by category only)
  TrueDivide,       // Promote, then float if integral
  Bool,             // comparisons
  Attribute,        // the `dtype` attribute (cast)
  PromoteLastTwo,   // where: promotion of the two branches
  Reduction,        // the `dtype` attribute; sum of bool/int32 accumulates in int64
  SecondInput,      // dtype of the second operand (embedding_fwd: the weight's)
};

// How the ATen evaluator calls the op (the op itself is found by `aten` name through the
// dispatcher, so no per-op C++ is needed for plain operand-only ops).
enum class AtenArgs {
  Operands,        // aten(operands...); scalars become wrapped numbers (Python-scalar promotion)
  Identity,        // no call: the input itself
  Dtype,           // aten(x, dtype)
  ReducedAxes,     // aten(x, reduced axes [, keepdim=false, dtype])
  AttrDims,        // aten(x, dims)
  LocalShape,      // aten(x, this rank's shape of the output)
  BroadcastInDim,  // view with the output's rank, then expand to the local output shape
  FoldedWeight,    // Operands, with a weight of several output axes (and its bias) folded to one
                   // for the call and the output unfolded again (linear with a 3-D weight)
  Attention,       // PyTorch's fused attention forward or backward for the tensors' device
                   // (runtime/attention.cpp); attributes dropout_p, is_causal, scale
  Slice,           // aten(x, axis, start, end, step) per sliced axis, bounds from the scalar operands
  Pad,             // aten(x, pad widths, fill value operand)
  Cat,             // aten([tensor operands], axis)
  StrideOrder,     // no call: the input copied into the output's stride order
  CounterRng,      // no ATen op: the counter-based generator of support/counter_rng.h over the
                   // global indices of this rank's shard (runtime/uniform.cpp)
  Embedding,       // aten(weight, indices, padding_idx): operands swapped to ATen's order
  // Mixture-of-experts ops (runtime/moe_ops.cpp), each a function of its operands and attributes:
  GroupedMm,       // torch._grouped_mm on CUDA bfloat16, else one matmul per group
  Topk,            // aten::topk(x, k, dim, largest, sorted) -> values, indices
  Sort,            // aten::sort.stable(x, stable, dim, descending) -> values, indices (argsort: indices)
  DimIndex,        // aten(x, dim, index): index_select, gather
  DimIndexSrc,     // aten(x, dim, index, src): scatter, index_add
  ScatterReduce,   // aten::scatter_reduce.two(x, dim, index, src, reduce, include_self)
  Communication,   // not evaluated: lowered to a host communication (the exchanges)
  Cumsum,          // aten::cumsum(x, dim, dtype)
  Bincount,        // aten::bincount(x, minlength=minlength); a value past minlength is an error
};

// For expr `e` and its tensor input at `input_index`: result[p] is the index into the consumer's
// rootOrLogical() of the axis that the producer's p-th non-reduction logical axis maps to, or -1.
using AxisMapFn = std::vector<int64_t> (*)(const Expr* e, size_t input_index);
// The same for an op of several outputs: indices into output `output_index`'s rootOrLogical().
using OutputAxisMapFn = std::vector<int64_t> (*)(const Expr* e, size_t input_index, size_t output_index);
using OpCheckFn = void (*)(const Expr* e);
// The op's builder in generic form (ir/build_op.h): operands in the printed IR's order, attributes
// by name as a user gives them; returns the outputs.
using BuildFn = std::vector<Val*> (*)(OpType op, const std::vector<Val*>& operands, const Attributes& attrs);
// The op on scalar values (unary ops ignore b), computed in double: what a scalar of
// fd.ops.mul(s1, s2) or fd.ops.reciprocal(s) evaluates to when the program runs.
using ScalarFn = double (*)(double a, double b);

struct OpInfo {
  OpType op;
  const char* name;  // printed name and Python name (fd.ops.<name>)
  OpKind kind;
  int min_inputs;
  int max_inputs;
  DtypeRule dtype_rule;
  // Typed attributes (ir/attributes.h): printed and parsed as `name=value` in this order,
  // completed with their defaults and validated by Fusion::newExpr.
  std::vector<AttrDef> attributes;
  // What the op requires of its operands, outputs and attributes together (ranks, axes in range),
  // as user errors; null: nothing beyond the attribute declarations. Fusion::newExpr runs it (so
  // every builder does) and the verifier runs it again after parsing and after every pass.
  OpCheckFn check = nullptr;
  // How a user builds it (fd.op in the C++ API; the registry walk in the tests).
  BuildFn build = nullptr;
  // On scalars (a scalar result usable as an operand); null: the op takes tensors only.
  ScalarFn on_scalars = nullptr;
  AxisMapFn axis_map;  // ops of one output
  // Ops of several outputs (axis_map is then null); mapProducerToConsumer picks the right one.
  OutputAxisMapFn output_axis_map;
  // Outputs that hold none of the inputs' data (the RNG state attention returns): replicated
  // whatever the inputs' shardings, so they never make the op a resharding. Several outputs only.
  std::vector<int> sharding_free_outputs;

  // Sharding rule.
  // Inputs whose shardings the output takes first during propagation; empty: the most parallel
  // tensor input first.
  std::vector<int> propagation_order;
  // For reductions and contractions: the op that combines partial results of a device-sharded
  // reduction (sum for linear/matmul/sum, max for max, min for min).
  OpType partial_combine;
  // An input added after the reduction (linear's bias): pulled out when the reduction is sharded,
  // so it is added once rather than once per device. -1: none.
  int bias_input;
  // Every output axis is made of this op's input data, regrouped (reshape) or resized (slice, pad,
  // cat): a device split on an output axis that no input axis maps to onto is then a reshard, not
  // a fresh axis. (A resized axis maps to nothing: its shards would hold different ranges.)
  bool regroups_axes;
  // Its output ends with the contracted axis r{k} as linear's does (grouped_mm, 2-D x 3-D and 3-D x
  // 3-D): a device split of k on both operands gives partial sums, combined by `partial_combine`.
  bool contracts = false;
  // ATen evaluates it as a view of its input (no data moves): a piece of only such ops runs on ATen
  // rather than as a generated copy kernel (its consumers read the strided view directly).
  bool aten_view = false;

  // ATen evaluation: a dispatcher name ("aten::exp", "aten::sum.dim_IntList") and its arguments.
  const char* aten;
  AtenArgs aten_args;

  // Code generation: a float expression over {0}, {1}, {2} (the operands, already in float), or
  // nullptr with the reason in `no_cuda`. `cuda_exact_bool`: the expression already yields 0/1 for
  // a bool result (others are normalized).
  const char* cuda;
  const char* no_cuda;
  bool cuda_exact_bool;
  // Resize ops (slice, pad, cat; `cuda` is then nullptr): generated as index arithmetic where
  // their result is read, each output element taken from the input coordinate this rule gives
  // (ir/resize_map.h) or the fill value. nullptr: not a resize op.
  ResizeFn cuda_resize = nullptr;
  // reshape: the row-major order of the elements is unchanged, so a generated kernel computes it
  // as an output stored at the flat index of its input's domain (its input walks the domain).
  bool cuda_keeps_flat_order = false;
  // The operand a resize op yields where no tensor input covers the output coordinate (pad's fill
  // value), or -1 (the inputs cover the whole output: slice, cat).
  int resize_fill_input = -1;
  // int32 results (computed in double): a long long expression over the operands where the float
  // one can lose bits (a product past 2^53), so that the result wraps as PyTorch's int32
  // arithmetic does. nullptr: the float expression is exact for int32 operands.
  const char* cuda_integer = nullptr;
  // Why an int32 / int64 result of this op stays on ATen (double compute cannot give PyTorch's
  // exact integer result), or nullptr.
  const char* no_cuda_int32_result = nullptr;
  const char* no_cuda_int64_result = nullptr;
  // pow: an integer or bool base to a negative integer power is an error, as in PyTorch (checked
  // for a constant exponent when the op is built, for a runtime one when it runs).
  bool refuses_negative_integer_exponent = false;
  // A cheaper float expression for an operand known to be <= 0 or NaN (ir/value_bounds.h), or
  // nullptr. exp: __expf, the hardware exp2 of x * log2(e), within 2 + 1.17|x| ulp (CUDA's
  // figure). For x <= 0: at most 15 ulp (about 2e-6 relative) for results above 1e-5, within 1e-10
  // absolute below (results are <= 1). Softmax's exp(x - max(x)) is then a few instructions
  // instead of about ten, which matters where the kernel is otherwise near the issue limit
  // (softmax rows of 16384: 0.89 -> 0.92 of copy).
  const char* cuda_nonpositive = nullptr;
  // Sub: the result is {0} - {1} (<= 0 where {1} bounds {0} above).
  bool is_difference = false;
  // Add: the result is {0} + {1}, so a contraction's output added to a partial sum can be
  // accumulated into it by the GEMM (host/gemm_accumulate.cpp).
  bool is_sum = false;
  // Contractions cuBLAS can add into an existing tensor (beta = 1) without a bias operand:
  // partial += a @ b replaces a GEMM and a separate add kernel (host/gemm_accumulate.cpp).
  bool gemm_accumulates = false;
  // The contraction multiplies by its second operand transposed (linear: x @ w^T).
  bool second_operand_transposed = false;
  // Max: a reduction whose result is at least every element it reduces.
  bool bounds_above = false;
  // Reductions: the accumulator's initial value and how two partial values combine.
  const char* cuda_init;
  const char* cuda_combine;
};

// scatter_reduce's reductions (PyTorch's names), its `reduce` attribute.
enum class ScatterReduction : int64_t { Sum, Prod, Mean, Amax, Amin };
const char* toString(ScatterReduction r);
// The reduction named `name`, or false.
bool parseScatterReduction(const std::string& name, ScatterReduction& out);

const OpInfo& opInfo(OpType op);
// The entry whose name is `name`, or nullptr.
const OpInfo* findOp(const std::string& name);
const std::vector<OpInfo>& allOps();

const char* toString(OpType op);
bool isUnary(OpType op);
bool isBinary(OpType op);
bool isComparison(OpType op);
bool isPointwise(OpType op);  // unary, binary, ternary and cast
bool isReduction(OpType op);
bool isContraction(OpType op);
// The exchanges: lowered to a host communication of their own (host/lower.cpp).
bool isExchange(OpType op);
// Ops that run in a compute segment of their own on ATen (contractions on cuBLAS, attention on
// PyTorch's fused kernels), so that the pointwise work around them can be a generated kernel.
bool runsAlone(OpType op);
// Reductions, contractions and gathers: ops whose output may have reduction axes (a gather's, over
// the table's rows, when the table is sharded on them: passes/partial_gathers.cpp).
bool reduces(OpType op);
// Ops that a compute segment holds alone (contractions, sources, gathers: ATen runs them), so that
// the pointwise work around them can still be a generated kernel.
bool runsAlone(OpType op);

}  // namespace mf
