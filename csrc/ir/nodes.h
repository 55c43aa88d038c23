// IR nodes. A Fusion owns all of them; everything else holds raw pointers.
//
//   IterDomain   one axis: extent (constant or symbolic), IterType, ParallelType.
//   IdTransform  Split or Merge between IterDomains (how loop is derived from logical).
//   Val          a value: TensorView or Scalar.
//   Expr         an op over Vals (OpType + typed attributes, declared in its registry entry).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ir/device_mesh.h"
#include "ir/op_registry.h"
#include "ir/types.h"

namespace mf {

class Fusion;
class Expr;
class IdTransform;

// Extent of an axis: a constant, or a symbol known only at run time (printed as its name).
struct Extent {
  int64_t value = -1;  // -1: symbolic
  std::string symbol;  // "s0", "s0/2", ...
  bool isConst() const { return value >= 0; }
  std::string toString() const { return isConst() ? std::to_string(value) : symbol; }
  bool operator==(const Extent& o) const { return value == o.value && symbol == o.symbol; }
};

class IterDomain {
 public:
  IterDomain(int64_t name, Extent extent, IterType type) : name_(name), extent_(std::move(extent)), type_(type) {}

  int64_t name() const { return name_; }
  const Extent& extent() const { return extent_; }
  IterType iterType() const { return type_; }
  bool isReduction() const { return type_ == IterType::Reduction; }
  bool isBroadcast() const { return type_ == IterType::Broadcast; }
  ParallelType parallelType() const { return ptype_; }
  bool isDeviceDim() const { return isDeviceParallel(ptype_); }
  IdTransform* definition() const { return definition_; }
  bool isRFactorProduct() const { return rfactor_product_; }
  // A stream axis swizzled on a mesh axis visits its chunks in ring order: rank r starts with the
  // chunk it holds and then takes its neighbour's (tv.swizzle1d). Serial: not swizzled.
  ParallelType swizzle() const { return swizzle_; }
  void setSwizzle(ParallelType pt) { swizzle_ = pt; }

  void parallelize(ParallelType pt) { ptype_ = pt; }
  void setIterType(IterType t) { type_ = t; }
  void setDefinition(IdTransform* t) { definition_ = t; }
  void setRFactorProduct(bool v) { rfactor_product_ = v; }

  std::string toString() const;

 private:
  int64_t name_;
  Extent extent_;
  IterType type_;
  ParallelType ptype_ = ParallelType::Serial;
  IdTransform* definition_ = nullptr;
  bool rfactor_product_ = false;
  ParallelType swizzle_ = ParallelType::Serial;
};

class IdTransform {
 public:
  enum class Kind { Split, Merge };
  IdTransform(Kind kind, std::vector<IterDomain*> in, std::vector<IterDomain*> out, int64_t factor, bool inner_split)
      : kind_(kind), inputs_(std::move(in)), outputs_(std::move(out)), factor_(factor), inner_split_(inner_split) {}
  Kind kind() const { return kind_; }
  const std::vector<IterDomain*>& inputs() const { return inputs_; }
  const std::vector<IterDomain*>& outputs() const { return outputs_; }
  int64_t factor() const { return factor_; }
  bool innerSplit() const { return inner_split_; }
  std::string toString() const;

 private:
  Kind kind_;
  std::vector<IterDomain*> inputs_;
  std::vector<IterDomain*> outputs_;
  int64_t factor_;   // Split only
  bool inner_split_;  // Split only: true => factor is the inner extent
};

enum class ValKind { Tensor, Scalar };

class Val {
 public:
  Val(ValKind kind, int64_t name, DataType dtype) : kind_(kind), name_(name), dtype_(dtype) {}
  virtual ~Val() = default;
  ValKind kind() const { return kind_; }
  bool isTensor() const { return kind_ == ValKind::Tensor; }
  int64_t name() const { return name_; }
  DataType dtype() const { return dtype_; }
  Expr* definition() const { return definition_; }
  const std::vector<Expr*>& uses() const { return uses_; }
  Fusion* fusion() const { return fusion_; }

  void setDefinition(Expr* e) { definition_ = e; }
  void addUse(Expr* e) { uses_.push_back(e); }
  void removeUse(Expr* e);
  void setFusion(Fusion* f) { fusion_ = f; }
  virtual std::string toString() const = 0;

 private:
  ValKind kind_;
  int64_t name_;
  DataType dtype_;
  Expr* definition_ = nullptr;
  std::vector<Expr*> uses_;
  Fusion* fusion_ = nullptr;
};

// A scalar: a constant, a fusion input, or a tensor's symbolic extent (fd.ops.size), whose value
// the runtime takes from the extents the inputs bound.
class Scalar : public Val {
 public:
  // A scalar computed from other scalars by an op (fd.ops.reciprocal(s), fd.ops.mul(s1, s2)): the
  // runtime evaluates it from its operands' values (the op's `on_scalars` in the registry).
  struct Computation {
    OpType op;
    std::vector<Val*> operands;
  };
  Scalar(int64_t name, DataType dtype, std::optional<double> value, std::string extent = "")
      : Val(ValKind::Scalar, name, dtype), value_(value), extent_(std::move(extent)) {}
  const std::optional<Computation>& computation() const { return computation_; }
  void setComputation(Computation c) { computation_ = std::move(c); }
  const std::optional<double>& value() const { return value_; }
  // The symbolic extent this scalar stands for ("s0", "s0+4"), or empty.
  const std::string& extent() const { return extent_; }
  bool isExtent() const { return !extent_.empty(); }
  std::string toString() const override;  // "2.5", "S3", or "S3{s0}" for an extent

 private:
  std::optional<double> value_;
  std::string extent_;
  std::optional<Computation> computation_;
};

class TensorView : public Val {
 public:
  TensorView(int64_t name, DataType dtype, std::vector<IterDomain*> logical);

  // Domains. root is empty unless the defining op changed the shape (rfactor).
  const std::vector<IterDomain*>& root() const { return root_; }
  const std::vector<IterDomain*>& logical() const { return logical_; }
  const std::vector<IterDomain*>& loop() const { return loop_; }
  const std::vector<IterDomain*>& allocation() const { return allocation_.empty() ? logical_ : allocation_; }
  bool hasAllocation() const { return !allocation_.empty(); }
  const std::vector<IterDomain*>& rootOrLogical() const { return root_.empty() ? logical_ : root_; }
  // Logical IDs without reductions: the axes of the runtime tensor.
  std::vector<IterDomain*> logicalNoReductions() const;
  int64_t nDims() const { return static_cast<int64_t>(loop_.size()); }

  const std::vector<bool>& contiguity() const { return contiguity_; }
  const std::vector<int64_t>& strideOrder() const { return stride_order_; }
  const DeviceMesh& mesh() const { return mesh_; }
  bool hasMesh() const { return !mesh_.empty(); }

  // Scheduling (each rewrites the loop domain; axes count the loop domain, negative from the end).
  void split(int64_t axis, int64_t factor, bool inner_split = true);
  void merge(int64_t axis_outer, int64_t axis_inner);
  void reorder(const std::vector<std::pair<int64_t, int64_t>>& old_to_new);
  IterDomain* axis(int64_t i) const;
  void parallelize(int64_t axis, ParallelType pt);
  // Makes loop axis `axis` (a stream axis) visit its chunks in ring order along mesh axis `pt`.
  void swizzle1d(int64_t axis, ParallelType pt);
  void setDeviceMesh(const DeviceMesh& mesh);
  void setAllocationAsLoop();
  // nvFuser's set_allocation_domain: the memory order of the loop axes (`axes`, a permutation of
  // them, outermost first) and whether each is contiguous (one entry, or one per axis). Axes on a
  // mesh hold one piece per device and may go anywhere; the others must keep each logical axis's
  // pieces together, outer first, so that the order is a stride order of the local tensor, which
  // the runtime honours (outputs come back in it); any other order is a user error.
  void setAllocationDomain(const std::vector<int64_t>& axes, const std::vector<bool>& contiguity);
  // Splits this reduction into partial = op(inputs) reducing `axes` and this = sum(partial) over the
  // rest (docs/design.md section 4). Returns partial.
  TensorView* rfactor(std::vector<int64_t> axes);

  // Internal setters used by ops, passes and the cloner.
  void setRoot(std::vector<IterDomain*> r) { root_ = std::move(r); }
  void setLogical(std::vector<IterDomain*> l) { logical_ = std::move(l); }
  void setLoop(std::vector<IterDomain*> l) { loop_ = std::move(l); }
  void setAllocation(std::vector<IterDomain*> a) { allocation_ = std::move(a); }
  void setContiguity(std::vector<bool> c) { contiguity_ = std::move(c); }
  void setStrideOrder(std::vector<int64_t> s) { stride_order_ = std::move(s); }

  // The user's name (define_tensor(name=...)), empty when none: printed by print(fd) (name=...),
  // in the host program's legend and in error messages (label()).
  const std::string& userName() const { return user_name_; }
  void setUserName(std::string name);  // a Python-identifier-like word; user error otherwise
  std::string label() const;           // "T3 (hidden_states)", or "T3"

  int64_t normalizeAxis(int64_t axis, int64_t ndims, const char* what) const;
  std::string toString() const override;  // "T3"
  std::string domainString() const;        // "T3_float[i{s0}, iDIDx{2}, ...]"

 private:
  std::vector<IterDomain*> root_;
  std::vector<IterDomain*> logical_;
  std::vector<IterDomain*> loop_;
  std::vector<IterDomain*> allocation_;
  std::vector<bool> contiguity_;       // per logical non-reduction axis; empty = contiguous
  std::vector<int64_t> stride_order_;  // empty = row major
  DeviceMesh mesh_;
  std::string user_name_;
};

class Expr {
 public:
  Expr(int64_t name, OpType op, std::vector<Val*> inputs, std::vector<Val*> outputs, Attributes attrs)
      : name_(name), op_(op), inputs_(std::move(inputs)), outputs_(std::move(outputs)), attrs_(std::move(attrs)) {}
  int64_t name() const { return name_; }
  OpType op() const { return op_; }
  const std::vector<Val*>& inputs() const { return inputs_; }
  const std::vector<Val*>& outputs() const { return outputs_; }
  Val* input(size_t i) const { return inputs_.at(i); }
  Val* output(size_t i) const { return outputs_.at(i); }
  TensorView* out() const;  // the single TensorView output
  TensorView* outTensor(size_t i) const;  // output i, which must be a TensorView
  // The op's attributes as its registry entry declares them (ir/attributes.h), complete.
  const Attributes& attributes() const { return attrs_; }
  template <typename T>
  const T& attr(const std::string& name) const {
    return attrs_.get<T>(name);
  }
  void replaceInput(size_t i, Val* v) { inputs_.at(i) = v; }
  std::string toString() const;

 private:
  int64_t name_;
  OpType op_;
  std::vector<Val*> inputs_;
  std::vector<Val*> outputs_;
  Attributes attrs_;
};

}  // namespace mf
