// Public C++ API (include/meshfuser/fusion.h) over the IR: thin forwarding, errors are already
// meshfuser::Error. Every op goes through ops::op, the registry's generic builder (ir/build_op.h),
// so the C++ API has every op the registry has.
#include "meshfuser/fusion.h"

#include <type_traits>

#include "ir/build_op.h"
#include "ir/device_mesh.h"
#include "ir/fusion.h"
#include "ir/ops.h"
#include "ir/printer.h"
#include "support/error.h"
#include "support/version.h"

namespace meshfuser {

const char* version() { return mf::kVersion; }

namespace {
mf::DataType toInternal(DataType dt) { return static_cast<mf::DataType>(static_cast<int>(dt)); }

mf::ParallelType toInternal(ParallelType pt) {
  switch (pt) {
    case ParallelType::MeshX: return mf::ParallelType::DIDx;
    case ParallelType::MeshY: return mf::ParallelType::DIDy;
    case ParallelType::MeshZ: return mf::ParallelType::DIDz;
    case ParallelType::Stream: return mf::ParallelType::Stream;
    case ParallelType::Serial: return mf::ParallelType::Serial;
  }
  MF_THROW_INTERNAL("unknown parallel type");
}
}  // namespace

// Mesh ---------------------------------------------------------------------------------------------
DeviceMesh::DeviceMesh(std::vector<int64_t> devices) : devices_(devices), shape_{static_cast<int64_t>(devices.size())} {
  mf::DeviceMesh check(devices_);  // validates (unique ranks)
}

DeviceMesh::DeviceMesh(std::vector<int64_t> devices, std::vector<int64_t> shape)
    : devices_(std::move(devices)), shape_(std::move(shape)) {
  mf::DeviceMesh check(devices_, shape_);
}

DeviceMesh DeviceMesh::range(int64_t n) {
  MF_USER_ARG_CHECK(n >= 1, "DeviceMesh::range: n must be at least 1, got ", n);
  std::vector<int64_t> d(n);
  for (int64_t i = 0; i < n; ++i) d[i] = i;
  return DeviceMesh(d);
}

std::string DeviceMesh::toString() const { return mf::DeviceMesh(devices_, shape_).toString(); }

// TensorView ---------------------------------------------------------------------------------------
TensorView& TensorView::setDeviceMesh(const DeviceMesh& mesh) {
  tv_->setDeviceMesh(mf::DeviceMesh(mesh.devices(), mesh.shape()));
  tv_->fusion()->bump();
  return *this;
}

TensorView& TensorView::split(int64_t axis, int64_t factor, bool inner_split) {
  tv_->split(axis, factor, inner_split);
  tv_->fusion()->bump();
  return *this;
}

TensorView& TensorView::merge(int64_t axis) {
  tv_->merge(axis, axis + 1);
  tv_->fusion()->bump();
  return *this;
}

TensorView& TensorView::parallelize(int64_t axis, ParallelType type) {
  tv_->parallelize(axis, toInternal(type));
  tv_->fusion()->bump();
  return *this;
}

TensorView& TensorView::swizzle1d(int64_t axis, ParallelType type) {
  tv_->swizzle1d(axis, toInternal(type));
  return *this;
}

TensorView& TensorView::setAllocationAsLoop() {
  tv_->setAllocationAsLoop();
  tv_->fusion()->bump();
  return *this;
}

int64_t TensorView::ndim() const { return tv_->nDims(); }
std::string TensorView::toString() const { return tv_->domainString(); }

// Fusion -------------------------------------------------------------------------------------------
Fusion::Fusion() : impl_(std::make_shared<mf::Fusion>()) {}
Fusion::~Fusion() = default;
Fusion::Fusion(Fusion&&) noexcept = default;
Fusion& Fusion::operator=(Fusion&&) noexcept = default;

const std::shared_ptr<mf::Fusion>& Fusion::impl() const {
  MF_USER_CHECK(impl_ != nullptr, "this meshfuser::Fusion was moved from; use the Fusion it was moved to");
  return impl_;
}

TensorView Fusion::defineTensor(const std::vector<int64_t>& shape, DataType dtype) {
  return TensorView(mf::defineTensor(*impl(), shape, toInternal(dtype)));
}

void Fusion::addOutput(const TensorView& tv) {
  MF_USER_ARG_CHECK(tv.tv_->fusion() == impl().get(), "addOutput: ", tv.toString(), " belongs to another Fusion");
  impl_->addOutput(tv.tv_);
}

std::string Fusion::toString() const { return mf::printFusion(*impl()); }
void Fusion::setOverlap(const std::string& mode) { impl()->setOverlap(mode); }

// Values -------------------------------------------------------------------------------------------
Value::Value(const TensorView& tv) : v_(tv.tv_) {}
bool Value::isTensor() const { return v_->isTensor(); }
TensorView Value::tensor() const {
  MF_USER_ARG_CHECK(v_->isTensor(), "Value::tensor: ", v_->toString(), " is a scalar");
  return TensorView(static_cast<mf::TensorView*>(v_));
}
std::string Value::toString() const { return v_->toString(); }

Value Fusion::constant(double value, DataType dtype) { return Value(impl()->newScalar(toInternal(dtype), value)); }

// Ops ----------------------------------------------------------------------------------------------
struct OpAccess {
  static mf::Val* get(const Value& v) { return v.v_; }
  static Value make(mf::Val* v) { return Value(v); }
};

namespace ops {
namespace {
mf::AttrValue toInternal(const AttrValue& v) {
  return std::visit(
      [](const auto& x) -> mf::AttrValue {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, DataType>) return meshfuser::toInternal(x);
        else return x;
      },
      v);
}

// The single output of op `name`.
TensorView single(const char* name, const std::vector<Value>& operands, const Attrs& attrs = {}) {
  return op(name, operands, attrs).at(0).tensor();
}

Value number(const TensorView& x, double value) {
  return OpAccess::make(OpAccess::get(x)->fusion()->newScalar(mf::DataType::Double, value));
}

std::vector<Value> ints(const TensorView& x, const std::vector<int64_t>& values) {
  std::vector<Value> r;
  for (int64_t i : values) {
    r.push_back(OpAccess::make(OpAccess::get(x)->fusion()->newScalar(mf::DataType::Int, static_cast<double>(i))));
  }
  return r;
}

Attrs attentionAttrs(const AttentionOptions& o) {
  Attrs a;
  if (o.dropout_p) a.emplace_back("dropout_p", *o.dropout_p);
  if (o.is_causal) a.emplace_back("is_causal", *o.is_causal);
  if (o.scale) a.emplace_back("scale", o.scale);
  return a;
}
}  // namespace

std::vector<Value> op(const std::string& name, const std::vector<Value>& operands, const Attrs& attrs) {
  std::vector<mf::Val*> ins;
  for (const Value& v : operands) {
    ins.push_back(OpAccess::get(v));
    MF_USER_ARG_CHECK(ins.back()->fusion() == ins.front()->fusion(), name, ": ", v.toString(), " and ",
                      operands.front().toString(), " belong to different Fusions");
  }
  mf::Attributes given;
  for (const auto& [key, value] : attrs) given.set(key, toInternal(value));
  std::vector<Value> outs;
  for (mf::Val* v : mf::buildOp(name, ins, given)) outs.push_back(OpAccess::make(v));
  return outs;
}

std::vector<std::string> names() {
  std::vector<std::string> r;
  for (const mf::OpInfo& info : mf::allOps()) {
    if (info.build != nullptr) r.push_back(info.name);  // the exchanges: allToAllDispatch/allToAllCombine
  }
  return r;
}

TensorView linear(const TensorView& x, const TensorView& weight) { return single("linear", {x, weight}); }
TensorView linear(const TensorView& x, const TensorView& weight, const TensorView& bias) {
  return single("linear", {x, weight, bias});
}
TensorView matmul(const TensorView& a, const TensorView& b) { return single("matmul", {a, b}); }
TensorView add(const TensorView& a, const TensorView& b) { return single("add", {a, b}); }
TensorView sub(const TensorView& a, const TensorView& b) { return single("sub", {a, b}); }
TensorView mul(const TensorView& a, const TensorView& b) { return single("mul", {a, b}); }
TensorView neg(const TensorView& x) { return single("neg", {x}); }
TensorView relu(const TensorView& x) { return single("relu", {x}); }
TensorView gelu(const TensorView& x) { return single("gelu", {x}); }
TensorView tanh(const TensorView& x) { return single("tanh", {x}); }
TensorView exp(const TensorView& x) { return single("exp", {x}); }
TensorView cast(const TensorView& x, DataType dtype) { return single("cast", {x}, {{"dtype", dtype}}); }
TensorView set(const TensorView& x) { return single("set", {x}); }
TensorView sum(const TensorView& x, const std::vector<int64_t>& dims) { return single("sum", {x}, {{"dims", dims}}); }
TensorView max(const TensorView& x, const std::vector<int64_t>& dims) { return single("max", {x}, {{"dims", dims}}); }
TensorView permute(const TensorView& x, const std::vector<int64_t>& dims) {
  return single("permute", {x}, {{"dims", dims}});
}
TensorView reshape(const TensorView& x, const std::vector<int64_t>& shape) {
  return single("reshape", {x}, {{"shape", shape}});
}
std::pair<TensorView, TensorView> varMean(const TensorView& x, const std::vector<int64_t>& dims, double correction,
                                          bool keepdim) {
  // A composite of registry ops (ir/ops_composite.cpp), not an op of its own.
  auto [var, mean] = mf::varMean(static_cast<mf::TensorView*>(OpAccess::get(x)), dims, correction, keepdim);
  return {OpAccess::make(var).tensor(), OpAccess::make(mean).tensor()};
}
TensorView slice(const TensorView& x, const std::vector<int64_t>& starts, const std::vector<int64_t>& ends,
                 const std::vector<int64_t>& strides) {
  MF_USER_ARG_CHECK(starts.size() == ends.size(), "slice: ", starts.size(), " starts but ", ends.size(), " ends");
  std::vector<Value> operands = {x};
  std::vector<Value> lo = ints(x, starts), hi = ints(x, ends);
  for (size_t i = 0; i < lo.size(); ++i) {
    operands.push_back(lo[i]);
    operands.push_back(hi[i]);
  }
  Attrs attrs;
  if (!strides.empty()) attrs.emplace_back("strides", strides);
  return single("slice", operands, attrs);
}
TensorView cat(const std::vector<TensorView>& xs, int64_t dim) {
  return single("cat", std::vector<Value>(xs.begin(), xs.end()), {{"dim", dim}});
}
TensorView pad(const TensorView& x, const std::vector<int64_t>& pad_widths, double value) {
  return single("pad", {x, number(x, value)}, {{"pad_widths", pad_widths}});
}
TensorView strideOrder(const TensorView& x, const std::vector<int64_t>& stride_order) {
  return single("stride_order", {x}, {{"stride_order", stride_order}});
}
TensorView div(const TensorView& a, const TensorView& b) { return single("div", {a, b}); }
TensorView add(const TensorView& x, double value) { return single("add", {x, number(x, value)}); }
TensorView mul(const TensorView& x, double value) { return single("mul", {x, number(x, value)}); }
TensorView rsqrt(const TensorView& x) { return single("rsqrt", {x}); }
TensorView sigmoid(const TensorView& x) { return single("sigmoid", {x}); }
TensorView silu(const TensorView& x) { return single("silu", {x}); }
TensorView broadcastInDim(const TensorView& x, const std::vector<int64_t>& shape,
                          const std::vector<int64_t>& broadcast_dims) {
  return single("broadcast_in_dim", {x}, {{"shape", shape}, {"broadcast_dims", broadcast_dims}});
}

AttentionForward sdpfaFwd(const TensorView& q, const TensorView& k, const TensorView& v, const AttentionOptions& options) {
  auto outs = op("sdpfa_fwd", {q, k, v}, attentionAttrs(options));
  return {outs.at(0).tensor(), outs.at(1).tensor(), outs.at(2).tensor(), outs.at(3).tensor()};
}
AttentionGradients sdpfaBwd(const TensorView& grad_attn, const TensorView& q, const TensorView& k, const TensorView& v,
                            const AttentionForward& forward, const AttentionOptions& options) {
  auto outs = op("sdpfa_bwd",
                 {grad_attn, q, k, v, forward.attn, forward.logsumexp, forward.seed, forward.offset},
                 attentionAttrs(options));
  return {outs.at(0).tensor(), outs.at(1).tensor(), outs.at(2).tensor()};
}

TensorView groupedMm(const TensorView& mat1, const TensorView& mat2, const TensorView& offsets) {
  return single("grouped_mm", {mat1, mat2, offsets});
}
TensorView groupedMm(const TensorView& mat1, const TensorView& mat2) { return single("grouped_mm", {mat1, mat2}); }
std::pair<TensorView, TensorView> topk(const TensorView& x, int64_t k, int64_t dim, bool largest, bool sorted) {
  auto outs = op("topk", {x}, {{"k", k}, {"dim", dim}, {"largest", largest}, {"sorted", sorted}});
  return {outs.at(0).tensor(), outs.at(1).tensor()};
}
std::pair<TensorView, TensorView> sort(const TensorView& x, int64_t dim, bool descending, bool stable) {
  auto outs = op("sort", {x}, {{"dim", dim}, {"descending", descending}, {"stable", stable}});
  return {outs.at(0).tensor(), outs.at(1).tensor()};
}
TensorView argsort(const TensorView& x, int64_t dim, bool descending, bool stable) {
  return single("argsort", {x}, {{"dim", dim}, {"descending", descending}, {"stable", stable}});
}
TensorView indexSelect(const TensorView& x, int64_t dim, const TensorView& index) {
  return single("index_select", {x, index}, {{"dim", dim}});
}
TensorView gather(const TensorView& x, int64_t dim, const TensorView& index) {
  return single("gather", {x, index}, {{"dim", dim}});
}
TensorView scatter(const TensorView& x, int64_t dim, const TensorView& index, const TensorView& src) {
  return single("scatter", {x, index, src}, {{"dim", dim}});
}
TensorView scatterReduce(const TensorView& x, int64_t dim, const TensorView& index, const TensorView& src,
                         const std::string& reduce, bool include_self) {
  return single("scatter_reduce", {x, index, src},
                {{"dim", dim}, {"reduce", reduce}, {"include_self", include_self}});
}
TensorView indexAdd(const TensorView& x, int64_t dim, const TensorView& index, const TensorView& src) {
  return single("index_add", {x, index, src}, {{"dim", dim}});
}
TensorView cumsum(const TensorView& x, int64_t dim) { return single("cumsum", {x}, {{"dim", dim}}); }
TensorView bincount(const TensorView& x, int64_t minlength) {
  return single("bincount", {x}, {{"minlength", minlength}});
}
// The exchanges are built by their typed builders (the dispatch makes the counts exchange too).
std::pair<TensorView, TensorView> allToAllDispatch(const TensorView& tokens, const TensorView& counts,
                                                   ParallelType mesh_axis, int64_t team_size) {
  auto* t = static_cast<mf::TensorView*>(OpAccess::get(tokens));
  auto* c = static_cast<mf::TensorView*>(OpAccess::get(counts));
  MF_USER_ARG_CHECK(t->fusion() == c->fusion(), "allToAllDispatch: tokens and counts belong to different Fusions");
  auto [received, recv_counts] = mf::allToAllDispatch(t, c, meshfuser::toInternal(mesh_axis), team_size);
  return {OpAccess::make(received).tensor(), OpAccess::make(recv_counts).tensor()};
}
TensorView allToAllCombine(const TensorView& expert_out, const TensorView& counts, const TensorView& recv_counts) {
  std::vector<mf::TensorView*> tvs;
  for (const TensorView* tv : {&expert_out, &counts, &recv_counts}) {
    tvs.push_back(static_cast<mf::TensorView*>(OpAccess::get(*tv)));
    MF_USER_ARG_CHECK(tvs.back()->fusion() == tvs.front()->fusion(),
                      "allToAllCombine: the operands belong to different Fusions");
  }
  return OpAccess::make(mf::allToAllCombine(tvs[0], tvs[1], tvs[2])).tensor();
}
}  // namespace ops

}  // namespace meshfuser
