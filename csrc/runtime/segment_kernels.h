// How one compute segment runs on CUDA tensors: as generated kernels, split into the fewest pieces
// the generator accepts, with ATen only for ops it cannot express.
//
// Requires: the segment's exprs in topological order; on the first run, the values of the
// segment's inputs. Guarantees: the first run plans the pieces (the whole segment when one kernel
// holds it; else greedily in program order: a piece grows while the generator still accepts it,
// and an op it refuses on its own runs alone on the ATen evaluator) and runs them; later runs reuse
// the plan, and a piece whose inputs' sizes, strides or alignment changed, or that would receive an
// integer scalar past 2^53 (kernels take scalars as doubles), runs on ATen. Every op of
// the segment runs exactly once per run. MESHFUSER_DUMP=fallback names each op left on ATen and why.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "codegen/kernel.h"
#include "ir/fusion.h"

namespace mf {

class SegmentKernels {
 public:
  struct Piece {
    std::vector<Expr*> exprs;
    KernelSegment segment;
    std::optional<GeneratedKernel> kernel;  // nullopt: the ATen evaluator runs `exprs`
    std::vector<KernelTensorArg> args;      // what the kernel was generated for
    std::string why_not;                    // why the ATen evaluator runs it
  };
  using Values = std::unordered_map<const Val*, at::Tensor>;
  // Evaluates exprs with the ATen evaluator into `values`.
  using EvalFn = std::function<void(const std::vector<Expr*>&, Values&)>;
  // The value of a runtime scalar input (kernels receive it as a double).
  using ScalarFn = std::function<c10::Scalar(const Val*)>;

  // Runs the segment (`launch`: generated kernels on CUDA tensors; else every piece on ATen, as on
  // meta tensors, still planning the pieces). `label` names the segment in dumps.
  void run(const std::vector<Expr*>& exprs, const Fusion& fusion, Values& values, const EvalFn& eval,
           const ScalarFn& scalar, bool launch, const std::string& label);
  bool planned() const { return planned_; }
  const std::vector<Piece>& pieces() const { return pieces_; }
  // What ran each piece on the last run: a kernel's scheduler or "expr_eval".
  const std::vector<std::string>& lastSchedulers() const { return last_; }

 private:
  void plan(const std::vector<Expr*>& exprs, const Fusion& fusion, Values& values, const EvalFn& eval,
            const ScalarFn& scalar, bool launch, const std::string& label);
  // Launches the piece's kernel when its args still match; false when ATen must run it.
  bool launch(const Piece& p, Values& values, const ScalarFn& scalar);
  bool planned_ = false;
  std::vector<Piece> pieces_;
  std::vector<std::string> last_;
};

}  // namespace mf
