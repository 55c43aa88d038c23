#include "runtime/segment_kernels.h"

#include <iostream>
#include <unordered_set>

#include "runtime/aten_evaluator.h"
#include "runtime/cuda_kernel.h"
#include "support/error.h"
#include "support/options.h"

namespace mf {
namespace {

// The piece for `exprs` with its kernel, or with why_not when the generator refuses it.
SegmentKernels::Piece makePiece(const std::vector<Expr*>& exprs, const Fusion& fusion,
                                const SegmentKernels::Values& values) {
  SegmentKernels::Piece p;
  p.exprs = exprs;
  std::unordered_set<const Expr*> in_piece(exprs.begin(), exprs.end());
  p.segment = makeKernelSegment(exprs, [&](const Val* v) {
    if (fusion.isOutput(v)) return true;
    for (const Expr* use : v->uses()) {
      if (!in_piece.count(use)) return true;
    }
    return false;
  });
  for (const Val* v : p.segment.inputs) {
    if (v->isTensor()) p.args.push_back(kernelArgOf(values.at(v)));
  }
  CodegenOptions options;
  options.sm_count = currentSmCount();
  p.kernel = generateKernel(p.segment, p.args, options, &p.why_not);
  if (p.kernel && isDumpEnabled(DumpOption::CudaKernel)) std::cout << p.kernel->source << std::endl;
  return p;
}

}  // namespace

bool SegmentKernels::launch(const Piece& p, Values& values, const ScalarFn& scalar) {
  if (!p.kernel) return false;
  std::vector<at::Tensor> ins;
  std::vector<double> scalar_args;
  size_t arg = 0;
  for (const Val* v : p.segment.inputs) {
    if (!v->isTensor()) {
      const c10::Scalar value = scalar(v);
      // A kernel takes its scalars as doubles: an integer past 2^53 would arrive as another one.
      constexpr int64_t kExactInDouble = int64_t{1} << 53;
      const bool integer = value.isIntegral(/*includeBool=*/false);
      if (integer && (value.toLong() > kExactInDouble || value.toLong() < -kExactInDouble)) return false;
      scalar_args.push_back(value.toDouble());
      continue;
    }
    const at::Tensor& t = values.at(v);
    KernelTensorArg now = kernelArgOf(t);
    const KernelTensorArg& then = p.args[arg++];
    // The kernel bakes in sizes, strides and alignment; anything else takes the ATen path.
    bool same = now.sizes == then.sizes && now.strides == then.strides && now.alignment_bytes >= then.alignment_bytes;
    if (!same) return false;
    ins.push_back(t);
  }
  if (ins.empty()) return false;  // outputs take their device from an input
  std::vector<at::Tensor> outs;
  for (size_t i = 0; i < p.segment.outputs.size(); ++i) {
    const TensorView* tv = p.segment.outputs[i];
    outs.push_back(at::empty(p.kernel->output_sizes[i], ins.at(0).options().dtype(toAten(tv->dtype()))));
  }
  launchGeneratedKernel(*p.kernel, ins, outs, scalar_args);
  for (size_t i = 0; i < outs.size(); ++i) values[p.segment.outputs[i]] = outs[i];
  return true;
}

void SegmentKernels::plan(const std::vector<Expr*>& exprs, const Fusion& fusion, Values& values, const EvalFn& eval,
                          const ScalarFn& scalar, bool do_launch, const std::string& label) {
  planned_ = true;
  auto finish = [&](Piece p) {  // runs the piece now: the next piece's args are its outputs
    const bool launched = do_launch && launch(p, values, scalar);
    if (!launched) {
      eval(p.exprs, values);
      // As a kernel would have left them (e.g. on meta tensors): the next piece plans on these.
      if (p.kernel) {
        for (const TensorView* out : p.segment.outputs) values[out] = values.at(out).contiguous();
      }
    }
    if (!p.kernel && isDumpEnabled(DumpOption::Fallback)) {
      for (const Expr* e : p.exprs) {
        std::cout << "meshfuser: " << label << ": " << e->toString() << " runs on the ATen evaluator: " << p.why_not
                  << std::endl;
      }
    }
    // Without launching (meta tensors), what would run it; else what did.
    last_.push_back(p.kernel && (launched || !do_launch) ? p.kernel->scheduler : "expr_eval");
    pieces_.push_back(std::move(p));
  };
  Piece whole = makePiece(exprs, fusion, values);
  if (whole.kernel || exprs.size() == 1) {
    finish(std::move(whole));
    return;
  }
  std::vector<Expr*> group;
  std::optional<Piece> accepted;  // the kernel for `group`
  for (Expr* e : exprs) {
    std::vector<Expr*> grown = group;
    grown.push_back(e);
    Piece candidate = makePiece(grown, fusion, values);
    if (candidate.kernel) {
      group = std::move(grown);
      accepted = std::move(candidate);
      continue;
    }
    if (accepted) finish(std::move(*accepted));
    accepted.reset();
    group.clear();
    Piece alone = makePiece({e}, fusion, values);
    if (alone.kernel) {
      group = {e};
      accepted = std::move(alone);
    } else {
      finish(std::move(alone));
    }
  }
  if (accepted) finish(std::move(*accepted));
}

void SegmentKernels::run(const std::vector<Expr*>& exprs, const Fusion& fusion, Values& values, const EvalFn& eval,
                         const ScalarFn& scalar, bool do_launch, const std::string& label) {
  if (!planned_) {
    last_.clear();
    plan(exprs, fusion, values, eval, scalar, do_launch, label);
    return;
  }
  last_.clear();
  for (const Piece& p : pieces_) {
    bool launched = do_launch && launch(p, values, scalar);
    if (!launched) eval(p.exprs, values);
    last_.push_back(launched ? p.kernel->scheduler : "expr_eval");
  }
}

}  // namespace mf
