// Defining and scheduling a fusion: tensors with *global* shapes, ops, and the sharding schedule
// (device mesh, splits, parallel types), as in meshfuser's Python API (README.md, python/meshfuser/fusion_definition.py).
//
//   meshfuser::Fusion f;
//   auto inp = f.defineTensor({-1, -1, d * e});          // -1: symbolic extent
//   auto w = f.defineTensor({e, d * e});
//   auto out = meshfuser::ops::linear(inp, w);
//   f.addOutput(out);
//   for (auto tv : {inp, w, out})
//     tv.setDeviceMesh(mesh).outerSplit(-1, d).parallelize(-2, meshfuser::ParallelType::MeshX);
//   out.outerSplit(1, d).parallelize(1, meshfuser::ParallelType::MeshX);
//
// Axis positions count the loop domain, reduction axes included (linear's output ends with its
// reduction axis: [.., m, n, r{k}]). Negative positions count from the end.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace mf {  // meshfuser's internals, opaque here
class Fusion;
class TensorView;
class Val;
}  // namespace mf

namespace meshfuser {

enum class DataType { Float, Half, BFloat16, Double, Int, Int32, Bool };

// MeshX/Y/Z: an axis spread over the devices of a mesh axis (MeshX is the mesh's last axis).
enum class ParallelType { MeshX, MeshY, MeshZ, Stream, Serial };

// A dense n-D array of unique ranks.
class DeviceMesh {
 public:
  explicit DeviceMesh(std::vector<int64_t> devices);              // 1-D
  DeviceMesh(std::vector<int64_t> devices, std::vector<int64_t> shape);
  static DeviceMesh range(int64_t n);                             // ranks 0..n-1
  int64_t size() const { return static_cast<int64_t>(devices_.size()); }
  const std::vector<int64_t>& devices() const { return devices_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  std::string toString() const;

 private:
  std::vector<int64_t> devices_;
  std::vector<int64_t> shape_;
};

class Fusion;

// A handle on a tensor of a Fusion; valid while that Fusion lives. Scheduling calls return *this.
class TensorView {
 public:
  TensorView& setDeviceMesh(const DeviceMesh& mesh);
  TensorView& split(int64_t axis, int64_t factor, bool inner_split = true);
  TensorView& outerSplit(int64_t axis, int64_t factor) { return split(axis, factor, false); }
  TensorView& innerSplit(int64_t axis, int64_t factor) { return split(axis, factor, true); }
  TensorView& merge(int64_t axis);  // merges axis and axis + 1
  TensorView& parallelize(int64_t axis, ParallelType type);
  // A Stream axis visits its chunks in ring order along mesh axis `type` (send/recv overlap).
  TensorView& swizzle1d(int64_t axis, ParallelType type);
  TensorView& setAllocationAsLoop();
  int64_t ndim() const;  // of the loop domain
  std::string toString() const;  // e.g. "T2_float[i{s0}, iDIDx{2}, ...]"

 private:
  friend class Fusion;
  friend class Value;
  friend struct OpAccess;
  explicit TensorView(mf::TensorView* tv) : tv_(tv) {}
  mf::TensorView* tv_;
};

// A value of a Fusion, tensor or scalar: the operands and results of ops::op.
class Value {
 public:
  Value(const TensorView& tv);  // NOLINT: a tensor is a value
  bool isTensor() const;
  TensorView tensor() const;  // a meshfuser::Error for a scalar
  std::string toString() const;

 private:
  friend class Fusion;
  friend struct OpAccess;
  explicit Value(mf::Val* v) : v_(v) {}
  mf::Val* v_;
};

// An op's attribute value; the op's registry entry declares each attribute's name and type
// (int, bool, float, float or none, dtype, int list, name).
using AttrValue =
    std::variant<int64_t, bool, double, std::optional<double>, DataType, std::vector<int64_t>, std::string>;
using Attrs = std::vector<std::pair<std::string, AttrValue>>;

class Fusion {
 public:
  Fusion();
  ~Fusion();
  Fusion(Fusion&&) noexcept;
  Fusion& operator=(Fusion&&) noexcept;
  Fusion(const Fusion&) = delete;
  Fusion& operator=(const Fusion&) = delete;

  // An input with a global shape (-1: symbolic; 1: broadcast). Inputs are passed to execute in the
  // order they were defined.
  TensorView defineTensor(const std::vector<int64_t>& shape, DataType dtype = DataType::Float);
  // A constant scalar operand (of `dtype`'s category, as a Python number is in fd.ops).
  Value constant(double value, DataType dtype = DataType::Double);
  void addOutput(const TensorView& tv);
  std::string toString() const;  // the IR with meshes and parallel types
  // Overlap of each linear's communication with its GEMM without a Stream schedule: "" (none),
  // "auto", "ring" or "chunked" (README "Overlap").
  void setOverlap(const std::string& mode);

  // Internal: the definition (used by Executor); a meshfuser::Error on a moved-from Fusion.
  const std::shared_ptr<mf::Fusion>& impl() const;

 private:
  std::shared_ptr<mf::Fusion> impl_;
};

namespace ops {
// Every op meshfuser has, by the name Python and the printed IR use (ops::names() lists them):
// operands in the printed IR's order, attributes by their declared names. An attribute left out
// takes its default; unknown ops or attributes, wrong types and invalid values are
// meshfuser::Errors naming the op and the attribute. Returns the op's outputs.
//   auto [values, indices] = ...: ops::op("topk", {x}, {{"k", int64_t{2}}, {"dim", int64_t{-1}}})
std::vector<Value> op(const std::string& name, const std::vector<Value>& operands, const Attrs& attrs = {});
std::vector<std::string> names();

// Typed wrappers of the ops above (each goes through op()).
TensorView linear(const TensorView& x, const TensorView& weight);
TensorView linear(const TensorView& x, const TensorView& weight, const TensorView& bias);
TensorView matmul(const TensorView& a, const TensorView& b);
TensorView add(const TensorView& a, const TensorView& b);
TensorView sub(const TensorView& a, const TensorView& b);
TensorView mul(const TensorView& a, const TensorView& b);
TensorView neg(const TensorView& x);
TensorView relu(const TensorView& x);
TensorView gelu(const TensorView& x);
TensorView tanh(const TensorView& x);
TensorView exp(const TensorView& x);
TensorView cast(const TensorView& x, DataType dtype);
TensorView set(const TensorView& x);  // a copy; resharding between its input's and its own schedule
TensorView sum(const TensorView& x, const std::vector<int64_t>& dims);
TensorView max(const TensorView& x, const std::vector<int64_t>& dims);
TensorView permute(const TensorView& x, const std::vector<int64_t>& dims);
TensorView reshape(const TensorView& x, const std::vector<int64_t>& shape);
// PyTorch semantics (static bounds and widths; Python's fd.ops also takes scalar bounds).
// Returns {var, mean}.
std::pair<TensorView, TensorView> varMean(const TensorView& x, const std::vector<int64_t>& dims,
                                          double correction = 1.0, bool keepdim = false);
TensorView slice(const TensorView& x, const std::vector<int64_t>& starts, const std::vector<int64_t>& ends,
                 const std::vector<int64_t>& strides = {});
TensorView cat(const std::vector<TensorView>& xs, int64_t dim);
TensorView pad(const TensorView& x, const std::vector<int64_t>& pad_widths, double value = 0.0);
TensorView strideOrder(const TensorView& x, const std::vector<int64_t>& stride_order);

// The rest of a transformer layer: division, the normalizations' pointwise ops, a constant
// operand (of the tensor's computation type, as Python's fd.ops.add(x, 1.0)), broadcasting.
TensorView div(const TensorView& a, const TensorView& b);
TensorView add(const TensorView& x, double value);
TensorView mul(const TensorView& x, double value);
TensorView rsqrt(const TensorView& x);
TensorView sigmoid(const TensorView& x);
TensorView silu(const TensorView& x);
// x's axes land on `broadcast_dims` of `shape`; the other axes are broadcast (extent 1 or -1).
TensorView broadcastInDim(const TensorView& x, const std::vector<int64_t>& shape,
                          const std::vector<int64_t>& broadcast_dims);

// PyTorch's fused attention (nvFuser's sdpfa_fwd/bwd). q, k, v: [batch.., heads, seq, head_dim];
// flash attention on CUDA (half, bfloat16), the CPU kernel on CPU (no dropout there). Sharded over
// batch or heads it moves no data. Unset options take PyTorch's defaults.
struct AttentionOptions {
  std::optional<double> dropout_p;
  std::optional<bool> is_causal;
  std::optional<double> scale;
};
struct AttentionForward {
  TensorView attn;       // [batch.., heads, seq_q, head_dim]
  TensorView logsumexp;  // float [batch.., heads, seq_q]
  TensorView seed, offset;  // 0-d int64: the RNG state the backward needs
};
AttentionForward sdpfaFwd(const TensorView& q, const TensorView& k, const TensorView& v,
                          const AttentionOptions& options = {});
struct AttentionGradients {
  TensorView grad_q, grad_k, grad_v;
};
// The forward's options must be given again.
AttentionGradients sdpfaBwd(const TensorView& grad_attn, const TensorView& q, const TensorView& k, const TensorView& v,
                            const AttentionForward& forward, const AttentionOptions& options = {});

// Mixture of experts (PyTorch's semantics). groupedMm is torch._grouped_mm: [m, k] x [g, k, n] with
// int32 offsets [g] (cumulative ends of each group's rows) -> [m, n]; [m, k] x [k, n] with offsets
// splitting k -> [g, m, n]; without offsets [g, m, k] x [g, k, n] -> [g, m, n].
TensorView groupedMm(const TensorView& mat1, const TensorView& mat2, const TensorView& offsets);
TensorView groupedMm(const TensorView& mat1, const TensorView& mat2);
// {values, indices (int64)}.
std::pair<TensorView, TensorView> topk(const TensorView& x, int64_t k, int64_t dim = -1, bool largest = true,
                                       bool sorted = true);
std::pair<TensorView, TensorView> sort(const TensorView& x, int64_t dim = -1, bool descending = false,
                                       bool stable = false);
TensorView argsort(const TensorView& x, int64_t dim = -1, bool descending = false, bool stable = false);
TensorView indexSelect(const TensorView& x, int64_t dim, const TensorView& index);  // 1-D index
TensorView gather(const TensorView& x, int64_t dim, const TensorView& index);       // torch.gather
TensorView scatter(const TensorView& x, int64_t dim, const TensorView& index, const TensorView& src);
// torch.scatter_reduce: reduce is "sum", "prod", "mean", "amax" or "amin".
TensorView scatterReduce(const TensorView& x, int64_t dim, const TensorView& index, const TensorView& src,
                         const std::string& reduce, bool include_self = true);
TensorView indexAdd(const TensorView& x, int64_t dim, const TensorView& index, const TensorView& src);
TensorView cumsum(const TensorView& x, int64_t dim);
// Exactly `minlength` bins; every value must lie in [0, minlength).
TensorView bincount(const TensorView& x, int64_t minlength);
// Expert parallelism: this rank's rows (grouped by expert, `counts` rows per expert) go to the team
// member along `mesh_axis` that holds their expert. Returns {received rows (grouped by local expert,
// then source rank; their count is bound at run time), recv_counts [team_size, local experts]}.
std::pair<TensorView, TensorView> allToAllDispatch(const TensorView& tokens, const TensorView& counts,
                                                   ParallelType mesh_axis, int64_t team_size);
// The reverse: expert_out's rows (in the dispatch's order) back to their senders, in tokens' order.
TensorView allToAllCombine(const TensorView& expert_out, const TensorView& counts, const TensorView& recv_counts);
}  // namespace ops

}  // namespace meshfuser
