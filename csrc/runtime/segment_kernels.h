// How one compute segment runs on CUDA tensors: as generated kernels, split into the fewest pieces
// the generator accepts, with ATen only for ops it cannot express.
//
// Requires: the segment's exprs in topological order; on the first run, the values of the
// segment's inputs. Guarantees: the first run plans the pieces (the whole segment when one kernel
// holds it; else greedily in program order: a piece grows while the generator still accepts it,
// and an op it refuses on its own runs alone on the ATen evaluator) and runs them. The plan is made
// once per executor, i.e. once per shape class (runtime/shape_class.h); later runs reuse it. A
// piece whose inputs' sizes, strides or alignment changed gets the kernel for its new arguments:
// generated again as text (microseconds), and since the text holds no extent-dependent number (the
// count is a launch argument, codegen/kernel.h), usually the same source, whose compiled module the
// CUDA cache already holds. Up to kMaxVariants kernels per piece are kept (least recently used
// out). A piece runs on ATen when the generator refuses its new arguments or it would receive an
// integer scalar past 2^53 (kernels take scalars as doubles); MESHFUSER_DUMP=fallback says so.
// MESHFUSER_DUMP=recompile names every new kernel source and which scheduler choice changed.
// Every op of the segment runs exactly once per run.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <list>
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
    bool views_only = false;                // ATen returns views: no data moves, not a fallback
    // Kernels for other arguments of the same piece, most recently used first (nullopt: refused).
    std::list<std::pair<std::vector<KernelTensorArg>, std::optional<GeneratedKernel>>> variants;
  };
  static constexpr size_t kMaxVariants = 8;
  using Values = std::unordered_map<const Val*, at::Tensor>;
  // Evaluates exprs with the ATen evaluator into `values`.
  using EvalFn = std::function<void(const std::vector<Expr*>&, Values&)>;
  // The value of a runtime scalar input (kernels receive it as a double).
  using ScalarFn = std::function<c10::Scalar(const Val*)>;

  // Runs the segment (`launch`: generated kernels on CUDA tensors; else every piece on ATen, as on
  // meta tensors, still planning the pieces). `label` names the segment in dumps. Kernels are
  // generated for `device`; a run for other limits than the plan's plans again.
  // `last_reads`: the tensors the segment reads last (a kernel may write into their buffers).
  void run(const std::vector<Expr*>& exprs, const Fusion& fusion, Values& values, const EvalFn& eval,
           const ScalarFn& scalar, bool launch, const std::string& label, const DeviceLimits& device,
           const std::vector<const Val*>& last_reads = {});
  bool planned() const { return planned_; }
  const std::vector<Piece>& pieces() const { return pieces_; }
  // What ran each piece on the last run: a kernel's scheduler or "expr_eval".
  const std::vector<std::string>& lastSchedulers() const { return last_; }
  // The kernel of each piece on the last run (null: ATen), for cuda_kernels and the host program.
  const std::vector<const GeneratedKernel*>& lastKernels() const { return last_kernels_; }
  // The plan as text, one line per piece: its ops, then the kernel or why ATen runs them.
  std::string planText(const std::string& indent) const;

 private:
  // The kernel for the piece at these arguments (null: the generator refuses them).
  const GeneratedKernel* kernelFor(Piece& p, const std::vector<KernelTensorArg>& args, const std::string& label);
  void plan(const std::vector<Expr*>& exprs, const Fusion& fusion, Values& values, const EvalFn& eval,
            const ScalarFn& scalar, bool launch, const std::string& label);
  // Launches the piece's kernel when its args still match; false when ATen must run it.
  bool launch(const Piece& p, const GeneratedKernel& k, Values& values, const ScalarFn& scalar);
  // The input whose buffer output `out` of the piece may take (-1: none); see launch().
  int64_t reusableInput(const Piece& p, const GeneratedKernel& k, size_t out, const std::vector<at::Tensor>& ins,
                        const std::vector<bool>& taken) const;
  bool planned_ = false;
  // Of the current run: the segment's exprs, its fusion and the intermediates it reads last.
  const std::vector<Expr*>* segment_exprs_ = nullptr;
  const Fusion* fusion_ = nullptr;
  std::vector<const Val*> last_reads_;
  DeviceLimits device_;  // what the pieces' kernels were generated for
  std::vector<Piece> pieces_;
  std::vector<std::string> last_;
  std::vector<const GeneratedKernel*> last_kernels_;
};

// Counters of compile work, process-wide (tests assert what a new extent costs).
struct CompileCounters {
  int64_t executors = 0;  // FusionExecutors built (pass pipeline + lowering + segmentation)
  int64_t kernels = 0;    // generateKernel calls (text only)
  int64_t sources = 0;    // distinct kernel sources planned or regenerated (each an NVRTC compile on a GPU)
};
CompileCounters& compileCounters();

}  // namespace mf
