// The op table. One entry per op; see op_registry.h for what each field means.
#include "ir/op_registry.h"

#include <cmath>
#include <unordered_map>

#include "ir/build_op.h"
#include "ir/domain_map.h"
#include "ir/op_checks.h"
#include "support/error.h"

namespace mf {
namespace {

// Attribute declarations (ir/attributes.h).
AttrDef required(const char* name, AttrType type, bool (*valid)(const AttrValue&) = nullptr,
                 const char* expected = nullptr) {
  return AttrDef{name, type, std::nullopt, valid, expected};
}
AttrDef optional(const char* name, AttrValue default_value, bool (*valid)(const AttrValue&) = nullptr,
                 const char* expected = nullptr) {
  AttrType type = typeOf(default_value);
  return AttrDef{name, type, std::move(default_value), valid, expected};
}
AttrDef dtypeAttr() { return required("dtype", AttrType::Dtype); }
AttrDef axesAttr() { return required("dims", AttrType::Ints, &nonNegative, "axes >= 0"); }
AttrDef dimAttr() { return required("dim", AttrType::Int, &nonNegative, "an axis >= 0"); }
bool scatterReductionName(const AttrValue& v) {
  ScatterReduction r;
  return parseScatterReduction(std::get<std::string>(v), r);
}

OpInfo base(OpType op, const char* name, OpKind kind, int min_in, int max_in, DtypeRule dtype, AxisMapFn map) {
  OpInfo i{};
  i.op = op;
  i.name = name;
  i.kind = kind;
  i.min_inputs = min_in;
  i.max_inputs = max_in;
  i.dtype_rule = dtype;
  i.axis_map = map;
  i.partial_combine = OpType::Sum;
  i.bias_input = -1;
  i.regroups_axes = false;
  i.aten_args = AtenArgs::Operands;
  i.no_cuda = "not supported by the CUDA generator";
  i.cuda_exact_bool = false;
  return i;
}

OpInfo unary(OpType op, const char* name, DtypeRule dtype, const char* aten, const char* cuda) {
  OpInfo i = base(op, name, OpKind::Unary, 1, 1, dtype, &mapRightAligned);
  i.build = &builders::unary;
  i.aten = aten;
  i.cuda = cuda;
  return i;
}

OpInfo binary(OpType op, const char* name, DtypeRule dtype, const char* aten, const char* cuda) {
  OpInfo i = base(op, name, OpKind::Binary, 2, 2, dtype, &mapRightAligned);
  i.build = &builders::binary;
  i.aten = aten;
  i.cuda = cuda;
  i.cuda_exact_bool = dtype == DtypeRule::Bool;
  return i;
}

OpInfo layout(OpType op, const char* name, std::vector<AttrDef> attrs, OpCheckFn check, BuildFn build, AxisMapFn map,
              const char* aten, AtenArgs args) {
  OpInfo i = base(op, name, OpKind::Layout, 1, 1, DtypeRule::SameAsInput, map);
  i.attributes = std::move(attrs);
  i.check = check;
  i.build = build;
  i.aten = aten;
  i.aten_args = args;
  i.cuda = "{0}";  // the index mapping moves the data; the value is unchanged
  i.cuda_exact_bool = true;
  return i;
}

OpInfo reduction(OpType op, const char* name, const char* aten, const char* init, const char* combine) {
  OpInfo i = base(op, name, OpKind::Reduction, 1, 1, DtypeRule::Reduction, &mapRightAligned);
  i.attributes = {axesAttr()};
  i.check = &checkReduction;
  i.build = &builders::reduction;
  i.partial_combine = op;
  i.aten = aten;
  i.aten_args = AtenArgs::ReducedAxes;
  i.cuda_init = init;
  i.cuda_combine = combine;
  return i;
}

std::vector<OpInfo> buildTable() {
  using D = DtypeRule;
  std::vector<OpInfo> t;
  // Unary. set keeps the dtype; neg/abs/relu keep integers; the rest compute in floating point.
  OpInfo set = unary(OpType::Set, "set", D::SameAsInput, nullptr, "{0}");
  set.aten_args = AtenArgs::Identity;
  set.cuda_exact_bool = true;
  set.on_scalars = [](double a, double) { return a; };
  t.push_back(set);
  t.push_back(unary(OpType::Neg, "neg", D::SameAsInput, "aten::neg", "-{0}"));
  t.back().on_scalars = [](double a, double) { return -a; };
  t.push_back(unary(OpType::Abs, "abs", D::SameAsInput, "aten::abs", "fabsf({0})"));
  t.back().on_scalars = [](double a, double) { return std::fabs(a); };
  t.push_back(unary(OpType::Exp, "exp", D::FloatIfIntegral, "aten::exp", "expf({0})"));
  t.back().on_scalars = [](double a, double) { return std::exp(a); };
  t.back().cuda_nonpositive = "__expf({0})";
  t.push_back(unary(OpType::Log, "log", D::FloatIfIntegral, "aten::log", "logf({0})"));
  t.back().on_scalars = [](double a, double) { return std::log(a); };
  t.push_back(unary(OpType::Tanh, "tanh", D::FloatIfIntegral, "aten::tanh", "tanhf({0})"));
  t.back().on_scalars = [](double a, double) { return std::tanh(a); };
  t.push_back(unary(OpType::Relu, "relu", D::SameAsInput, "aten::relu", "mf_relu({0})"));
  t.back().on_scalars = [](double a, double) { return a > 0 ? a : 0.0; };
  t.push_back(unary(OpType::Gelu, "gelu", D::FloatIfIntegral, "aten::gelu", "mf_gelu({0})"));
  t.back().on_scalars = [](double a, double) { return 0.5 * a * (1.0 + std::erf(a / std::sqrt(2.0))); };
  t.push_back(unary(OpType::Sigmoid, "sigmoid", D::FloatIfIntegral, "aten::sigmoid", "mf_sigmoid({0})"));
  t.back().on_scalars = [](double a, double) { return 1.0 / (1.0 + std::exp(-a)); };
  t.push_back(unary(OpType::Sqrt, "sqrt", D::FloatIfIntegral, "aten::sqrt", "sqrtf({0})"));
  t.back().on_scalars = [](double a, double) { return std::sqrt(a); };
  t.push_back(unary(OpType::Reciprocal, "reciprocal", D::FloatIfIntegral, "aten::reciprocal", "1.0f / {0}"));
  t.back().on_scalars = [](double a, double) { return 1.0 / a; };
  t.push_back(unary(OpType::Silu, "silu", D::FloatIfIntegral, "aten::silu", "{0} / (1.0f + expf(-{0}))"));
  t.back().on_scalars = [](double a, double) { return a / (1.0 + std::exp(-a)); };
  t.push_back(unary(OpType::Rsqrt, "rsqrt", D::FloatIfIntegral, "aten::rsqrt", "rsqrtf({0})"));
  t.back().on_scalars = [](double a, double) { return 1.0 / std::sqrt(a); };
  t.push_back(unary(OpType::Erf, "erf", D::FloatIfIntegral, "aten::erf", "erff({0})"));
  t.back().on_scalars = [](double a, double) { return std::erf(a); };
  t.push_back(unary(OpType::Sin, "sin", D::FloatIfIntegral, "aten::sin", "sinf({0})"));
  t.back().on_scalars = [](double a, double) { return std::sin(a); };
  t.push_back(unary(OpType::Cos, "cos", D::FloatIfIntegral, "aten::cos", "cosf({0})"));
  t.back().on_scalars = [](double a, double) { return std::cos(a); };
  OpInfo cast = unary(OpType::Cast, "cast", D::Attribute, "aten::to.dtype", "{0}");
  cast.attributes = {dtypeAttr()};
  cast.check = &checkCast;
  cast.build = &builders::cast;
  cast.aten_args = AtenArgs::Dtype;
  cast.cuda_exact_bool = true;  // codegen rounds to the target dtype
  t.push_back(cast);

  // Binary.
  t.push_back(binary(OpType::Add, "add", D::Promote, "aten::add.Tensor", "{0} + {1}"));
  t.back().is_sum = true;
  t.back().on_scalars = [](double a, double b) { return a + b; };
  t.push_back(binary(OpType::Sub, "sub", D::Promote, "aten::sub.Tensor", "{0} - {1}"));
  t.back().on_scalars = [](double a, double b) { return a - b; };
  t.back().is_difference = true;
  t.push_back(binary(OpType::Mul, "mul", D::Promote, "aten::mul.Tensor", "{0} * {1}"));
  t.back().on_scalars = [](double a, double b) { return a * b; };
  // Unsigned: an int64 product that overflows wraps (defined behaviour), as PyTorch's does.
  t.back().cuda_integer = "(long long)((unsigned long long)(long long)({0}) * (unsigned long long)(long long)({1}))";
  t.back().no_cuda_int64_result = "an int64 product can pass 2^53, where kernels (computing integers in double) round";
  t.push_back(binary(OpType::Div, "div", D::TrueDivide, "aten::div.Tensor", "{0} / {1}"));
  t.back().on_scalars = [](double a, double b) { return a / b; };
  t.push_back(binary(OpType::Maximum, "maximum", D::Promote, "aten::maximum", "mf_max({0}, {1})"));
  t.back().on_scalars = [](double a, double b) { return std::isnan(a) || a > b ? a : b; };
  t.push_back(binary(OpType::Minimum, "minimum", D::Promote, "aten::minimum", "mf_min({0}, {1})"));
  t.back().on_scalars = [](double a, double b) { return std::isnan(a) || a < b ? a : b; };
  t.push_back(binary(OpType::Pow, "pow", D::Promote, "aten::pow.Tensor_Tensor", "powf({0}, {1})"));
  t.back().on_scalars = [](double a, double b) { return std::pow(a, b); };
  t.back().no_cuda_int32_result = "an integer power wraps in integer arithmetic; the kernel's pow is a double one";
  t.back().no_cuda_int64_result = t.back().no_cuda_int32_result;
  t.back().refuses_negative_integer_exponent = true;
  t.push_back(binary(OpType::Eq, "eq", D::Bool, "aten::eq.Tensor", "({0} == {1} ? 1.0f : 0.0f)"));
  t.back().on_scalars = [](double a, double b) { return a == b ? 1.0 : 0.0; };
  t.push_back(binary(OpType::Ne, "ne", D::Bool, "aten::ne.Tensor", "({0} != {1} ? 1.0f : 0.0f)"));
  t.back().on_scalars = [](double a, double b) { return a != b ? 1.0 : 0.0; };
  t.push_back(binary(OpType::Lt, "lt", D::Bool, "aten::lt.Tensor", "({0} < {1} ? 1.0f : 0.0f)"));
  t.back().on_scalars = [](double a, double b) { return a < b ? 1.0 : 0.0; };
  t.push_back(binary(OpType::Le, "le", D::Bool, "aten::le.Tensor", "({0} <= {1} ? 1.0f : 0.0f)"));
  t.back().on_scalars = [](double a, double b) { return a <= b ? 1.0 : 0.0; };
  t.push_back(binary(OpType::Gt, "gt", D::Bool, "aten::gt.Tensor", "({0} > {1} ? 1.0f : 0.0f)"));
  t.back().on_scalars = [](double a, double b) { return a > b ? 1.0 : 0.0; };
  t.push_back(binary(OpType::Ge, "ge", D::Bool, "aten::ge.Tensor", "({0} >= {1} ? 1.0f : 0.0f)"));
  t.back().on_scalars = [](double a, double b) { return a >= b ? 1.0 : 0.0; };

  OpInfo where = base(OpType::Where, "where", OpKind::Ternary, 3, 3, D::PromoteLastTwo, &mapRightAligned);
  where.build = &builders::where;
  where.aten = "aten::where.self";
  where.cuda = "({0} != 0.0f ? {1} : {2})";
  where.cuda_exact_bool = true;
  t.push_back(where);

  // Layout.
  for (OpInfo view : {layout(OpType::BroadcastInDim, "broadcast_in_dim",
                             {required("shape", AttrType::Ints, &extentOrSymbolic, "extents >= 0, or -1 (kept)"),
                              required("broadcast_dims", AttrType::Ints, &nonNegative, "axes >= 0")},
                             &checkBroadcastInDim, &builders::broadcastInDim, &mapBroadcastInDim, "aten::expand", AtenArgs::BroadcastInDim),
                      layout(OpType::Squeeze, "squeeze", {axesAttr()}, &checkSqueeze, &builders::squeeze, &mapSqueeze, "aten::squeeze.dims", AtenArgs::AttrDims),
                      layout(OpType::Permute, "permute", {axesAttr()}, &checkPermute, &builders::permute,
                             &mapPermute, "aten::permute", AtenArgs::AttrDims)}) {
    view.aten_view = true;
    t.push_back(view);
  }
  OpInfo reshape = layout(OpType::Reshape, "reshape",
                          {required("shape", AttrType::Ints, &extentOrSymbolic, "extents >= 0, or -1 (symbolic)")},
                          &checkReshape, &builders::reshape, &mapReshape, "aten::reshape", AtenArgs::LocalShape);
  reshape.regroups_axes = true;
  reshape.cuda_keeps_flat_order = true;  // cuda "{0}": generated only as a kernel output (codegen/region.cpp)
  t.push_back(reshape);
  // Slice, pad and cat resize axes: an axis whose extent changes (or that a pad shifts) maps to
  // nothing, so a device split on it is gathered first; the other axes pass their splits through.
  OpInfo slice = layout(OpType::Slice, "slice", {required("strides", AttrType::Ints, &positive, "strides >= 1")},
                        &checkSlice, &builders::slice, &mapResized, "aten::slice.Tensor", AtenArgs::Slice);
  slice.max_inputs = 1 + 2 * 64;  // x, then (start, end) per axis
  slice.regroups_axes = true;
  slice.cuda = nullptr;
  slice.cuda_resize = &resizeSlice;
  t.push_back(slice);
  OpInfo pad = layout(OpType::Pad, "pad", {required("pad_widths", AttrType::Ints)}, &checkPad, &builders::pad,
                      &mapPad, "aten::constant_pad_nd", AtenArgs::Pad);
  pad.max_inputs = 2;  // x, fill value
  pad.regroups_axes = true;
  pad.cuda = nullptr;
  pad.cuda_resize = &resizePad;
  pad.resize_fill_input = 1;
  t.push_back(pad);
  OpInfo cat = layout(OpType::Cat, "cat", {dimAttr()}, &checkCat, &builders::cat, &mapResized, "aten::cat", AtenArgs::Cat);
  cat.max_inputs = 1 << 16;
  cat.dtype_rule = D::Promote;
  cat.regroups_axes = true;
  cat.cuda = nullptr;
  cat.cuda_resize = &resizeCat;
  t.push_back(cat);
  OpInfo stride_order =
      layout(OpType::StrideOrder, "stride_order",
             {required("stride_order", AttrType::Ints, &nonNegative, "a permutation of the axes")},
             &checkStrideOrder, &builders::strideOrder, &mapRightAligned, nullptr, AtenArgs::StrideOrder);
  stride_order.cuda = nullptr;
  stride_order.no_cuda = "stride_order is a layout copy that ATen makes (generated kernels write row-major outputs)";
  t.push_back(stride_order);

  // Sources and gathers.
  // uniform(low, high, seed, offset): every operand is a scalar; the value of an element is a
  // function of (seed, offset, its global index), so any sharding of the output draws the same.
  OpInfo uniform = base(OpType::Uniform, "uniform", OpKind::Source, 4, 4, D::Attribute, &mapRightAligned);
  uniform.attributes = {required("dtype", AttrType::Dtype, &floatingDtype, "float, half, bfloat16 or double"),
                        required("shape", AttrType::Ints, &nonNegative, "static extents >= 0")};
  uniform.check = &checkUniform;
  uniform.build = &builders::uniform;
  uniform.aten_args = AtenArgs::CounterRng;
  uniform.no_cuda = "uniform is not generated yet (the ATen path computes the counter-based generator)";
  t.push_back(uniform);
  // embedding_fwd(indices, weight): output [*indices.shape, dim]. The vocabulary axis of the weight
  // maps to no output axis, so a weight sharded on it is made whole first (a reshard).
  OpInfo embedding = base(OpType::EmbeddingFwd, "embedding_fwd", OpKind::Gather, 2, 2, D::SecondInput, &mapEmbedding);
  // padding_idx: [] (none) or [the one index], normalized like torch when the vocabulary is static.
  embedding.attributes = {optional("padding_idx", Ints{}, &atMostOneEntry, "[] or [index]")};
  embedding.attributes.back().omitted_when_default = true;
  embedding.check = &checkEmbedding;
  embedding.build = &builders::embedding;
  embedding.aten = "aten::embedding";
  embedding.aten_args = AtenArgs::Embedding;
  embedding.no_cuda = "embedding_fwd runs on ATen (a gather), not in a generated kernel";
  t.push_back(embedding);

  // Reductions (NaN propagates through max/min like PyTorch).
  t.push_back(reduction(OpType::Sum, "sum", "aten::sum.dim_IntList", "0.0f", "{0} + {1}"));
  t.push_back(reduction(OpType::Max, "max", "aten::amax", "__int_as_float(0xff800000)", "mf_max({0}, {1})"));
  t.back().bounds_above = true;
  t.push_back(reduction(OpType::Min, "min", "aten::amin", "__int_as_float(0x7f800000)", "mf_min({0}, {1})"));

  // Contractions: cuBLAS through ATen, in a segment of their own.
  OpInfo matmul = base(OpType::Matmul, "matmul", OpKind::Contraction, 2, 2, D::SameAsInput, &mapMatmul);
  matmul.build = &builders::matmul;
  matmul.propagation_order = {1, 0};
  matmul.aten = "aten::matmul";
  matmul.no_cuda = "runs on cuBLAS through ATen, not in a generated kernel";
  matmul.gemm_accumulates = true;
  t.push_back(matmul);
  OpInfo linear = base(OpType::Linear, "linear", OpKind::Contraction, 2, 3, D::SameAsInput, &mapLinear);
  linear.build = &builders::linear;
  linear.propagation_order = {1, 2, 0};
  linear.bias_input = 2;
  linear.aten = "aten::linear";
  linear.aten_args = AtenArgs::FoldedWeight;
  linear.no_cuda = matmul.no_cuda;
  linear.gemm_accumulates = true;
  linear.second_operand_transposed = true;
  t.push_back(linear);

  // Attention: PyTorch's fused kernels through ATen, in a segment of their own. Batch and head
  // axes pass through, and q's sequence in a forward without causal mask; other sequence and
  // head_dim axes are whole on every device (gathered when sharded): splitting them needs a ring
  // or a partial softmax, which is not built yet.
  OpInfo fwd = base(OpType::SdpfaFwd, "sdpfa_fwd", OpKind::Attention, 3, 3, D::SameAsInput, nullptr);
  fwd.output_axis_map = &mapAttention;
  fwd.sharding_free_outputs = {2, 3};  // seed, offset
  fwd.regroups_axes = true;            // an output split on an axis no input maps to is a reshard
  // Unset options take PyTorch's defaults: no dropout, not causal, scale 1/sqrt(head_dim) (none).
  fwd.attributes = {optional("dropout_p", 0.0, &probability, "0 <= dropout_p < 1"), optional("is_causal", false),
                    optional("scale", OptionalFloat(), &finiteOrNone, "a finite number or none")};
  fwd.check = &checkAttention;
  fwd.build = &builders::sdpfaFwd;
  fwd.aten = "aten::_scaled_dot_product_flash_attention";
  fwd.aten_args = AtenArgs::Attention;
  fwd.no_cuda = "runs on PyTorch's fused attention kernels through ATen, not in a generated kernel";
  t.push_back(fwd);
  OpInfo bwd = fwd;
  bwd.op = OpType::SdpfaBwd;
  bwd.name = "sdpfa_bwd";
  bwd.min_inputs = bwd.max_inputs = 8;  // grad_attn, q, k, v, attn, logsumexp, seed, offset
  bwd.sharding_free_outputs = {};
  bwd.build = &builders::sdpfaBwd;
  bwd.aten = "aten::_scaled_dot_product_flash_attention_backward";
  t.push_back(bwd);

  // Mixture of experts: ATen runs each in a segment of its own. The axis an op reads across (the
  // sorted or counted axis, the axis gathered from or scattered into, grouped_mm's rows and
  // contraction) maps to no output axis, so a device split on it is gathered before the op; the
  // other axes pass their splits through (ir/domain_map.cpp, mapAlongDim and the rest).
  auto moe = [](OpType op, const char* name, int min_in, int max_in, AxisMapFn map, std::vector<AttrDef> attrs,
                const char* aten, AtenArgs args) {
    OpInfo i = base(op, name, OpKind::Routing, min_in, max_in, DtypeRule::SameAsInput, map);
    i.attributes = std::move(attrs);
    i.check = &checkAlongDim;
    i.aten = aten;
    i.aten_args = args;
    i.regroups_axes = true;  // an output split on an axis no input maps to is a reshard
    i.no_cuda = "runs on ATen (data-dependent indexing or grouped GEMM), not in a generated kernel";
    return i;
  };
  // grouped_mm(mat1, mat2[, offsets]): 2-D x 3-D (offsets split mat1's rows), 3-D x 3-D (a batch of
  // matmuls), 2-D x 2-D (offsets split the contraction: the weight gradient, out [groups, m, n]).
  t.push_back(moe(OpType::GroupedMm, "grouped_mm", 2, 3, &mapGroupedMm, {}, "aten::_grouped_mm",
                  AtenArgs::GroupedMm));
  t.back().check = nullptr;  // no attributes; its shape rules stay in the builder (they unify extents)
  t.back().build = &builders::groupedMm;
  // Its output ends with r{k} (2-D x 3-D, 3-D x 3-D): k split on both operands gives partial sums
  // and one reduction across devices (row-parallel experts), as for linear.
  t.back().contracts = true;
  OpInfo topk = moe(OpType::Topk, "topk", 1, 1, nullptr,
                    {required("k", AttrType::Int, &nonNegative, "k >= 0"), dimAttr(), optional("largest", true),
                     optional("sorted", true)},
                    "aten::topk", AtenArgs::Topk);
  topk.output_axis_map = &mapAlongDimOutputs;  // values, indices (int64)
  topk.build = &builders::topk;
  t.push_back(topk);
  const std::vector<AttrDef> sort_attrs = {dimAttr(), optional("descending", false), optional("stable", false)};
  OpInfo sort = moe(OpType::Sort, "sort", 1, 1, nullptr, sort_attrs, "aten::sort.stable", AtenArgs::Sort);
  sort.output_axis_map = &mapAlongDimOutputs;  // values, indices (int64)
  sort.build = &builders::sort;
  t.push_back(sort);
  t.push_back(moe(OpType::Argsort, "argsort", 1, 1, &mapAlongDim, sort_attrs, "aten::sort.stable",
                  AtenArgs::Sort));
  t.back().build = &builders::argsort;
  t.push_back(moe(OpType::IndexSelect, "index_select", 2, 2, &mapIndexSelect, {dimAttr()}, "aten::index_select",
                  AtenArgs::DimIndex));
  t.back().build = &builders::indexSelect;
  t.push_back(
      moe(OpType::GatherAlong, "gather", 2, 2, &mapGatherAlong, {dimAttr()}, "aten::gather", AtenArgs::DimIndex));
  t.back().build = &builders::gather;
  t.push_back(
      moe(OpType::Scatter, "scatter", 3, 3, &mapScatter, {dimAttr()}, "aten::scatter.src", AtenArgs::DimIndexSrc));
  t.back().build = &builders::scatter;
  t.push_back(
      moe(OpType::IndexAdd, "index_add", 3, 3, &mapScatter, {dimAttr()}, "aten::index_add", AtenArgs::DimIndexSrc));
  t.back().build = &builders::indexAdd;
  t.push_back(
      moe(OpType::Cumsum, "cumsum", 1, 1, &mapAlongDim, {dtypeAttr(), dimAttr()}, "aten::cumsum", AtenArgs::Cumsum));
  t.back().dtype_rule = D::Attribute;
  t.back().build = &builders::cumsum;
  t.push_back(moe(OpType::Bincount, "bincount", 1, 1, &mapNothing,
                  {required("minlength", AttrType::Int, &positive, "minlength >= 1")}, "aten::bincount",
                  AtenArgs::Bincount));
  t.back().check = &checkBincount;
  t.back().build = &builders::bincount;
  t.push_back(moe(OpType::ScatterReduce, "scatter_reduce", 3, 3, &mapScatter,
                  {dimAttr(), required("reduce", AttrType::Name, &scatterReductionName, "sum, prod, mean, amax or amin"),
                   optional("include_self", true)},
                  "aten::scatter_reduce.two", AtenArgs::ScatterReduce));
  t.back().build = &builders::scatterReduce;
  // Expert parallelism: the exchanges (ops_exchange.cpp). No axis passes a device split through
  // (their operands and results are rank-local rows); lowering makes each one host communication.
  // fd.ops.all_to_all_dispatch builds them (its team size is no attribute), so they have no
  // generic builder.
  auto exchange = [](OpType op, const char* name, int n_in) {
    OpInfo i = base(op, name, OpKind::Exchange, n_in, n_in, DtypeRule::SameAsInput, &mapNothing);
    i.attributes = {required("mesh_axis", AttrType::Name, &meshAxisName, "DIDx, DIDy or DIDz")};
    i.aten_args = AtenArgs::Communication;
    i.no_cuda = "a communication (lowered to an AllToAll of the host program), not a kernel";
    return i;
  };
  t.push_back(exchange(OpType::AllToAllCounts, "all_to_all_counts", 2));  // counts, tokens (for their rows)
  t.push_back(exchange(OpType::AllToAllDispatch, "all_to_all_dispatch", 3));
  t.push_back(exchange(OpType::AllToAllCombine, "all_to_all_combine", 3));

  // Ops their entry defines alone: no C++ names them (they take the next OpType value), fd.ops and
  // the C++ API's ops::op build them by name, ATen runs them as aten(operands..., attributes...).
  // triu(x, diagonal=0): torch.triu over the last two axes. Its values depend on the positions along
  // them, so a device split there is gathered first (they map to no output axis); leading axes pass
  // their splits through.
  OpInfo triu = base(OpType(t.size()), "triu", OpKind::Routing, 1, 1, D::SameAsInput, [](const Expr* e, size_t i) {
    std::vector<int64_t> map = mapRightAligned(e, i);
    for (size_t k = map.size() < 2 ? 0 : map.size() - 2; k < map.size(); ++k) map[k] = -1;
    return map;
  });
  triu.attributes = {optional("diagonal", int64_t{0})};
  triu.check = [](const Expr* e) {
    const Val* x = e->input(0);
    const size_t rank = x->isTensor() ? static_cast<const TensorView*>(x)->logicalNoReductions().size() : 0;
    MF_USER_ARG_CHECK(rank >= 2, e->toString(), ": ", x->toString(), " has ", rank, rank == 1 ? " axis" : " axes",
                      "; triu needs at least 2");
  };
  triu.build = &builders::shapedLikeInput;
  triu.regroups_axes = true;
  triu.aten = "aten::triu";
  triu.no_cuda = "triu runs on ATen";
  t.push_back(triu);

  for (size_t k = 0; k < t.size(); ++k) {
    MF_CHECK(static_cast<size_t>(t[k].op) == k, "op registry out of order at ", t[k].name);
    MF_CHECK(t[k].build != nullptr || t[k].kind == OpKind::Exchange, "op ", t[k].name, " names no builder");
  }
  return t;
}

}  // namespace

const std::vector<OpInfo>& allOps() {
  static const std::vector<OpInfo> table = buildTable();
  return table;
}

const OpInfo& opInfo(OpType op) { return allOps().at(static_cast<size_t>(op)); }

const OpInfo* findOp(const std::string& name) {
  static const std::unordered_map<std::string, const OpInfo*> by_name = [] {
    std::unordered_map<std::string, const OpInfo*> m;
    for (const OpInfo& i : allOps()) m[i.name] = &i;
    return m;
  }();
  auto it = by_name.find(name);
  return it == by_name.end() ? nullptr : it->second;
}

const char* toString(OpType op) { return opInfo(op).name; }
bool isUnary(OpType op) { return opInfo(op).kind == OpKind::Unary; }
bool isBinary(OpType op) { return opInfo(op).kind == OpKind::Binary; }
bool isComparison(OpType op) { return opInfo(op).dtype_rule == DtypeRule::Bool; }
bool isPointwise(OpType op) {
  OpKind k = opInfo(op).kind;
  return k == OpKind::Unary || k == OpKind::Binary || k == OpKind::Ternary;
}
bool isReduction(OpType op) { return opInfo(op).kind == OpKind::Reduction; }
bool isContraction(OpType op) { return opInfo(op).kind == OpKind::Contraction; }
bool isExchange(OpType op) { return opInfo(op).kind == OpKind::Exchange; }
bool reduces(OpType op) {
  return isReduction(op) || isContraction(op) || opInfo(op).kind == OpKind::Gather || opInfo(op).contracts;
}

namespace {
constexpr const char* kScatterReductions[] = {"sum", "prod", "mean", "amax", "amin"};
}
const char* toString(ScatterReduction r) { return kScatterReductions[static_cast<int64_t>(r)]; }
bool parseScatterReduction(const std::string& name, ScatterReduction& out) {
  for (int64_t i = 0; i < 5; ++i) {
    if (name == kScatterReductions[i]) {
      out = static_cast<ScatterReduction>(i);
      return true;
    }
  }
  return false;
}
bool runsAlone(OpType op) {
  OpKind k = opInfo(op).kind;
  return k == OpKind::Contraction || k == OpKind::Attention || k == OpKind::Source || k == OpKind::Gather ||
         k == OpKind::Routing;
}

}  // namespace mf
