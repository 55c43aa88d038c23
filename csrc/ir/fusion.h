// Fusion: an SSA DAG of Exprs over Vals with inputs and outputs. It owns every node it creates;
// nodes are never freed individually (a pass that drops an expr just unlinks it).
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/nodes.h"

namespace mf {

class Fusion {
 public:
  Fusion() = default;
  Fusion(const Fusion&) = delete;
  Fusion& operator=(const Fusion&) = delete;

  // Node creation.
  IterDomain* newIterDomain(Extent extent, IterType type);
  IterDomain* cloneIterDomain(const IterDomain* id);  // same extent, type and parallel type
  IdTransform* newTransform(IdTransform::Kind kind, std::vector<IterDomain*> in, std::vector<IterDomain*> out,
                            int64_t factor, bool inner_split);
  TensorView* newTensor(DataType dtype, std::vector<IterDomain*> logical);
  // `extent`: the scalar stands for this symbolic extent (fd.ops.size).
  Scalar* newScalar(DataType dtype, std::optional<double> value, std::string extent = "");
  // Completes `attrs` from the op's declaration (defaults; unknown, missing or invalid ones are
  // user errors) and runs the op's check (ir/op_checks.h); on failure nothing is wired.
  Expr* newExpr(OpType op, std::vector<Val*> inputs, std::vector<Val*> outputs, const Attributes& attrs = {});
  Extent newSymbol();  // a fresh symbolic extent s0, s1, ...
  // For the IR parser: nodes with the names printed text gives them (later fresh names follow).
  IterDomain* newIterDomainNamed(int64_t name, Extent extent, IterType type);
  TensorView* newTensorNamed(int64_t name, DataType dtype, std::vector<IterDomain*> logical);
  Scalar* newScalarNamed(int64_t name, DataType dtype, std::optional<double> value, std::string extent = "");
  void reserveSymbol(const std::string& symbol);  // "s7": fresh symbols start after s7
  // Unified symbols (symbol -> the one it equals), for the printer.
  const std::unordered_map<std::string, std::string>& symbolEqualities() const { return symbol_parent_; }
  // Records that two symbolic extents are equal (an op joined them); canonicalSymbol picks one.
  void unifySymbols(const std::string& a, const std::string& b);
  std::string canonicalSymbol(const std::string& s) const;

  // Bumped by every change to the definition or schedule (executor caches key on a fingerprint
  // recomputed only when it moved).
  int64_t version() const { return version_; }
  void bump() { ++version_; }

  // Overlap applied to the linears of the program without a stream schedule written by the user:
  // "" (none), "auto", "ring" or "chunked" (host/stream_loops.cpp). Part of the printed program,
  // so it keys the executor caches like the schedule does.
  const std::string& overlap() const { return overlap_; }
  void setOverlap(const std::string& mode);

  // Rewires: `e` no longer defines its outputs or uses its inputs.
  void unlink(Expr* e);
  // Makes `consumer_expr` read `replacement` where it read `original`.
  void replaceInputOf(Expr* consumer_expr, Val* original, Val* replacement);

  void addInput(Val* v);
  void addOutput(Val* v);
  const std::vector<Val*>& inputs() const { return inputs_; }
  const std::vector<Val*>& outputs() const { return outputs_; }
  bool isInput(const Val* v) const;
  bool isOutput(const Val* v) const;

  // Exprs that outputs depend on, producers before consumers, in a deterministic order.
  std::vector<Expr*> exprs() const;
  // TensorViews reachable from outputs (inputs included), in topological order.
  std::vector<TensorView*> allTensors() const;

  // A deep copy. `map` (optional) receives old -> new for Vals.
  std::unique_ptr<Fusion> clone(std::unordered_map<const Val*, Val*>* map = nullptr) const;

 private:
  std::vector<std::unique_ptr<IterDomain>> ids_;
  std::vector<std::unique_ptr<IdTransform>> transforms_;
  std::vector<std::unique_ptr<Val>> vals_;
  std::vector<std::unique_ptr<Expr>> exprs_;
  std::vector<Val*> inputs_;
  std::vector<Val*> outputs_;
  std::unordered_map<std::string, std::string> symbol_parent_;
  int64_t version_ = 0;
  std::string overlap_;
  int64_t next_symbol_ = 0;
  int64_t next_id_name_ = 0;
  int64_t next_tensor_name_ = 0;
  int64_t next_scalar_name_ = 0;
};

}  // namespace mf
