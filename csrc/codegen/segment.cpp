// makeKernelSegment: splits a compute segment's exprs into the kernel's inputs and outputs.
//
// Requires: exprs in topological order. Guarantees: inputs are the Vals read from outside the
// segment (tensors and non-constant scalars), each once, in first-use order; outputs are the tensors
// produced in the segment for which live_after is true, in production order.
#include <unordered_set>

#include "codegen/kernel.h"

namespace mf {

KernelSegment makeKernelSegment(const std::vector<Expr*>& exprs, const std::function<bool(const Val*)>& live_after) {
  KernelSegment seg;
  std::unordered_set<const Val*> produced;
  std::unordered_set<const Val*> seen_inputs;
  for (const Expr* e : exprs) {
    seg.exprs.push_back(e);
    for (const Val* v : e->inputs()) {
      if (produced.count(v) || seen_inputs.count(v)) continue;
      if (!v->isTensor() && static_cast<const Scalar*>(v)->value().has_value()) continue;  // a constant
      seen_inputs.insert(v);
      seg.inputs.push_back(v);
    }
    for (const Val* v : e->outputs()) {
      produced.insert(v);
      if (v->isTensor() && live_after(v)) seg.outputs.push_back(static_cast<const TensorView*>(v));
    }
  }
  return seg;
}

}  // namespace mf
