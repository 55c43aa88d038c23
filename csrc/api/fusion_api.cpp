// Public C++ API (include/meshfuser/fusion.h) over the IR: thin forwarding, errors are already
// meshfuser::Error.
#include "meshfuser/fusion.h"

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

// Ops ----------------------------------------------------------------------------------------------
struct OpAccess {
  static mf::TensorView* get(const TensorView& t) { return t.tv_; }
  static TensorView make(mf::TensorView* t) { return TensorView(t); }
  static TensorView same(const TensorView& a, const TensorView& b, const char* op) {
    MF_USER_ARG_CHECK(a.tv_->fusion() == b.tv_->fusion(), op, ": ", a.toString(), " and ", b.toString(),
                      " belong to different Fusions");
    return a;
  }
};

namespace ops {
namespace {
TensorView wrap(mf::TensorView* t) { return OpAccess::make(t); }
mf::TensorView* in(const TensorView& t) { return OpAccess::get(t); }
TensorView binary(mf::OpType op, const TensorView& a, const TensorView& b, const char* name) {
  OpAccess::same(a, b, name);
  return wrap(mf::binaryOp(op, in(a), in(b)));
}
}  // namespace

TensorView linear(const TensorView& x, const TensorView& weight) {
  OpAccess::same(x, weight, "linear");
  return wrap(mf::linear(in(x), in(weight)));
}
TensorView linear(const TensorView& x, const TensorView& weight, const TensorView& bias) {
  OpAccess::same(x, weight, "linear");
  OpAccess::same(x, bias, "linear");
  return wrap(mf::linear(in(x), in(weight), in(bias)));
}
TensorView matmul(const TensorView& a, const TensorView& b) {
  OpAccess::same(a, b, "matmul");
  return wrap(mf::matmul(in(a), in(b)));
}
TensorView add(const TensorView& a, const TensorView& b) { return binary(mf::OpType::Add, a, b, "add"); }
TensorView sub(const TensorView& a, const TensorView& b) { return binary(mf::OpType::Sub, a, b, "sub"); }
TensorView mul(const TensorView& a, const TensorView& b) { return binary(mf::OpType::Mul, a, b, "mul"); }
TensorView neg(const TensorView& x) { return wrap(mf::unaryOp(mf::OpType::Neg, in(x))); }
TensorView relu(const TensorView& x) { return wrap(mf::unaryOp(mf::OpType::Relu, in(x))); }
TensorView gelu(const TensorView& x) { return wrap(mf::unaryOp(mf::OpType::Gelu, in(x))); }
TensorView tanh(const TensorView& x) { return wrap(mf::unaryOp(mf::OpType::Tanh, in(x))); }
TensorView exp(const TensorView& x) { return wrap(mf::unaryOp(mf::OpType::Exp, in(x))); }
TensorView cast(const TensorView& x, DataType dtype) { return wrap(mf::castOp(in(x), toInternal(dtype))); }
TensorView set(const TensorView& x) { return wrap(mf::unaryOp(mf::OpType::Set, in(x))); }
TensorView sum(const TensorView& x, const std::vector<int64_t>& dims) {
  return wrap(mf::reductionOp(mf::OpType::Sum, in(x), dims));
}
TensorView max(const TensorView& x, const std::vector<int64_t>& dims) {
  return wrap(mf::reductionOp(mf::OpType::Max, in(x), dims));
}
TensorView permute(const TensorView& x, const std::vector<int64_t>& dims) { return wrap(mf::permute(in(x), dims)); }
TensorView reshape(const TensorView& x, const std::vector<int64_t>& shape) { return wrap(mf::reshape(in(x), shape)); }
std::pair<TensorView, TensorView> varMean(const TensorView& x, const std::vector<int64_t>& dims, double correction,
                                          bool keepdim) {
  auto [var, mean] = mf::varMean(in(x), dims, correction, keepdim);
  return {wrap(var), wrap(mean)};
}
TensorView slice(const TensorView& x, const std::vector<int64_t>& starts, const std::vector<int64_t>& ends,
                 const std::vector<int64_t>& strides) {
  mf::Fusion& f = *in(x)->fusion();
  auto constants = [&](const std::vector<int64_t>& v) {
    std::vector<mf::Val*> r;
    for (int64_t i : v) r.push_back(f.newScalar(mf::DataType::Int, static_cast<double>(i)));
    return r;
  };
  return wrap(mf::slice(in(x), constants(starts), constants(ends), strides));
}
TensorView cat(const std::vector<TensorView>& xs, int64_t dim) {
  std::vector<mf::TensorView*> tvs;
  for (const TensorView& t : xs) {
    OpAccess::same(xs.at(0), t, "cat");
    tvs.push_back(in(t));
  }
  return wrap(mf::cat(tvs, dim));
}
TensorView pad(const TensorView& x, const std::vector<int64_t>& pad_widths, double value) {
  return wrap(mf::pad(in(x), pad_widths, in(x)->fusion()->newScalar(mf::DataType::Double, value)));
}
TensorView strideOrder(const TensorView& x, const std::vector<int64_t>& stride_order) {
  return wrap(mf::strideOrder(in(x), stride_order));
}
TensorView div(const TensorView& a, const TensorView& b) { return binary(mf::OpType::Div, a, b, "div"); }
TensorView add(const TensorView& x, double value) {
  return wrap(mf::binaryOp(mf::OpType::Add, in(x), in(x)->fusion()->newScalar(mf::DataType::Double, value)));
}
TensorView mul(const TensorView& x, double value) {
  return wrap(mf::binaryOp(mf::OpType::Mul, in(x), in(x)->fusion()->newScalar(mf::DataType::Double, value)));
}
TensorView rsqrt(const TensorView& x) { return wrap(mf::unaryOp(mf::OpType::Rsqrt, in(x))); }
TensorView sigmoid(const TensorView& x) { return wrap(mf::unaryOp(mf::OpType::Sigmoid, in(x))); }
TensorView silu(const TensorView& x) { return wrap(mf::unaryOp(mf::OpType::Silu, in(x))); }
TensorView broadcastInDim(const TensorView& x, const std::vector<int64_t>& shape,
                          const std::vector<int64_t>& broadcast_dims) {
  return wrap(mf::broadcastInDim(in(x), shape, broadcast_dims));
}

namespace {
mf::AttentionOptions toInternal(const AttentionOptions& o) { return {o.dropout_p, o.is_causal, o.scale}; }
}  // namespace

AttentionForward sdpfaFwd(const TensorView& q, const TensorView& k, const TensorView& v, const AttentionOptions& options) {
  OpAccess::same(q, k, "sdpfaFwd");
  OpAccess::same(q, v, "sdpfaFwd");
  auto outs = mf::sdpfaFwd(in(q), in(k), in(v), toInternal(options));
  return {wrap(outs.at(0)), wrap(outs.at(1)), wrap(outs.at(2)), wrap(outs.at(3))};
}
AttentionGradients sdpfaBwd(const TensorView& grad_attn, const TensorView& q, const TensorView& k, const TensorView& v,
                            const AttentionForward& forward, const AttentionOptions& options) {
  for (const TensorView* t : {&q, &k, &v, &forward.attn, &forward.logsumexp, &forward.seed, &forward.offset}) {
    OpAccess::same(grad_attn, *t, "sdpfaBwd");
  }
  auto outs = mf::sdpfaBwd(in(grad_attn), in(q), in(k), in(v), in(forward.attn), in(forward.logsumexp),
                           in(forward.seed), in(forward.offset), toInternal(options));
  return {wrap(outs.at(0)), wrap(outs.at(1)), wrap(outs.at(2))};
}

TensorView groupedMm(const TensorView& mat1, const TensorView& mat2, const TensorView& offsets) {
  OpAccess::same(mat1, mat2, "groupedMm");
  OpAccess::same(mat1, offsets, "groupedMm");
  return wrap(mf::groupedMm(in(mat1), in(mat2), in(offsets)));
}
TensorView groupedMm(const TensorView& mat1, const TensorView& mat2) {
  OpAccess::same(mat1, mat2, "groupedMm");
  return wrap(mf::groupedMm(in(mat1), in(mat2), nullptr));
}
std::pair<TensorView, TensorView> topk(const TensorView& x, int64_t k, int64_t dim, bool largest, bool sorted) {
  auto [values, indices] = mf::topk(in(x), k, dim, largest, sorted);
  return {wrap(values), wrap(indices)};
}
std::pair<TensorView, TensorView> sort(const TensorView& x, int64_t dim, bool descending, bool stable) {
  auto [values, indices] = mf::sort(in(x), dim, descending, stable);
  return {wrap(values), wrap(indices)};
}
TensorView argsort(const TensorView& x, int64_t dim, bool descending, bool stable) {
  return wrap(mf::argsort(in(x), dim, descending, stable));
}
TensorView indexSelect(const TensorView& x, int64_t dim, const TensorView& index) {
  OpAccess::same(x, index, "indexSelect");
  return wrap(mf::indexSelect(in(x), dim, in(index)));
}
TensorView gather(const TensorView& x, int64_t dim, const TensorView& index) {
  OpAccess::same(x, index, "gather");
  return wrap(mf::gather(in(x), dim, in(index)));
}
TensorView scatter(const TensorView& x, int64_t dim, const TensorView& index, const TensorView& src) {
  OpAccess::same(x, index, "scatter");
  OpAccess::same(x, src, "scatter");
  return wrap(mf::scatter(in(x), dim, in(index), in(src)));
}
TensorView scatterReduce(const TensorView& x, int64_t dim, const TensorView& index, const TensorView& src,
                         const std::string& reduce, bool include_self) {
  OpAccess::same(x, index, "scatterReduce");
  OpAccess::same(x, src, "scatterReduce");
  return wrap(mf::scatterReduce(in(x), dim, in(index), in(src), reduce, include_self));
}
TensorView indexAdd(const TensorView& x, int64_t dim, const TensorView& index, const TensorView& src) {
  OpAccess::same(x, index, "indexAdd");
  OpAccess::same(x, src, "indexAdd");
  return wrap(mf::indexAdd(in(x), dim, in(index), in(src)));
}
std::pair<TensorView, TensorView> allToAllDispatch(const TensorView& tokens, const TensorView& counts,
                                                   ParallelType mesh_axis, int64_t team_size) {
  OpAccess::same(tokens, counts, "allToAllDispatch");
  auto [received, recv_counts] = mf::allToAllDispatch(in(tokens), in(counts), meshfuser::toInternal(mesh_axis), team_size);
  return {wrap(received), wrap(recv_counts)};
}
TensorView allToAllCombine(const TensorView& expert_out, const TensorView& counts, const TensorView& recv_counts) {
  OpAccess::same(expert_out, counts, "allToAllCombine");
  OpAccess::same(expert_out, recv_counts, "allToAllCombine");
  return wrap(mf::allToAllCombine(in(expert_out), in(counts), in(recv_counts)));
}
TensorView cumsum(const TensorView& x, int64_t dim) { return wrap(mf::cumsum(in(x), dim)); }
TensorView bincount(const TensorView& x, int64_t minlength) { return wrap(mf::bincount(in(x), minlength)); }
}  // namespace ops

}  // namespace meshfuser
