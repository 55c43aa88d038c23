#include "runtime/segment_kernels.h"

#include <algorithm>
#include <iostream>
#include <unordered_set>

#include "ir/domain_map.h"
#include "ir/op_registry.h"
#include "runtime/aten_evaluator.h"
#include "runtime/buffer_ownership.h"
#include "runtime/cuda_kernel.h"
#include "codegen/piece_recompute.h"
#include "support/error.h"
#include "support/log.h"
#include "support/options.h"
#include "support/text.h"

namespace mf {
namespace {

std::optional<GeneratedKernel> generate(const KernelSegment& segment, const std::vector<KernelTensorArg>& args,
                                        const DeviceLimits& device, std::string* why) {
  CodegenOptions options;
  options.device = device;
  ++compileCounters().kernels;
  std::optional<GeneratedKernel> k = generateKernel(segment, args, options, why);
  if (k && isDumpEnabled(DumpOption::Heuristics)) logText("heuristics", k->name + ":\n" + k->heuristics);
  if (k && isDumpEnabled(DumpOption::CudaKernel)) logText("cuda_kernel", k->source);
  return k;
}

// What a piece stores besides the values read after it: nothing of `recomputed` (the next piece
// computes them again), all of `leaves` (the statistics that computing needs); `done`: the exprs
// of the pieces before it, whose reads do not count (they have run).
struct PieceOutputs {
  const std::unordered_set<const Expr*>* done = nullptr;
  const Recompute* recompute = nullptr;
};

// The piece for `exprs` with its kernel, or with why_not when the generator refuses it.
SegmentKernels::Piece makePiece(const std::vector<Expr*>& exprs, const Fusion& fusion,
                                const SegmentKernels::Values& values, const DeviceLimits& device,
                                const PieceOutputs& stored = {}) {
  SegmentKernels::Piece p;
  p.exprs = exprs;
  std::unordered_set<const Expr*> in_piece(exprs.begin(), exprs.end());
  p.segment = makeKernelSegment(exprs, [&](const Val* v) {
    if (fusion.isOutput(v)) return true;
    if (stored.recompute && stored.recompute->leaves.count(v)) return true;
    if (stored.recompute && stored.recompute->values.count(v)) return false;
    for (const Expr* use : v->uses()) {
      if (!in_piece.count(use) && !(stored.done && stored.done->count(use))) return true;
    }
    return false;
  });
  for (const Val* v : p.segment.inputs) {
    if (v->isTensor()) p.args.push_back(kernelArgOf(values.at(v)));
  }
  p.kernel = generate(p.segment, p.args, device, &p.why_not);
  return p;
}

// How far past an expr that ends a kernel planning looks for one that lets the kernel go on.
constexpr size_t kLookahead = 6;

// The segment's exprs with the views of its inputs first (the broadcasts of RoPE's cos and sin
// tables): met between two pointwise exprs they would end a kernel that could run through them.
std::vector<Expr*> inputViewsFirst(const std::vector<Expr*>& exprs) {
  std::unordered_set<const Val*> produced;
  for (const Expr* e : exprs) {
    for (const Val* v : e->outputs()) produced.insert(v);
  }
  std::vector<Expr*> views, rest;
  for (Expr* e : exprs) {
    bool of_inputs = opInfo(e->op()).aten_view &&
                     std::none_of(e->inputs().begin(), e->inputs().end(), [&](const Val* v) { return produced.count(v); });
    (of_inputs ? views : rest).push_back(e);
  }
  views.insert(views.end(), rest.begin(), rest.end());
  return views;
}

bool sameArgs(const std::vector<KernelTensorArg>& a, const std::vector<KernelTensorArg>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].dtype != b[i].dtype || a[i].sizes != b[i].sizes || a[i].strides != b[i].strides ||
        a[i].alignment_bytes != b[i].alignment_bytes) {
      return false;
    }
  }
  return true;
}

// Whether every tensor the piece produces shares its storage with a tensor it reads (views: an
// ATen reshape of a tensor laid out for it moves no data; one that is not copies).
bool onlyAliases(const KernelSegment& segment, const SegmentKernels::Values& values) {
  if (segment.outputs.empty()) return false;
  for (const TensorView* out : segment.outputs) {
    const at::Tensor& result = values.at(out);
    bool aliases = false;
    for (const Val* in : segment.inputs) {
      aliases = aliases || (in->isTensor() && result.is_alias_of(values.at(in)));
    }
    if (!aliases) return false;
  }
  return true;
}

std::string sizesText(const std::vector<KernelTensorArg>& args) {
  std::string text;
  for (const KernelTensorArg& a : args) text += (text.empty() ? "" : ", ") + listText(a.sizes);
  return text;
}

// `group` without the recomputed exprs that nothing left in it reads (a product only the next
// piece's column sums read): computed there, not here.
std::vector<Expr*> withoutUnread(const std::vector<Expr*>& group, const Recompute& again) {
  std::unordered_set<const Expr*> in_group(group.begin(), group.end()), dropped;
  const std::unordered_set<const Expr*> recomputed(again.exprs.begin(), again.exprs.end());
  for (auto it = group.rbegin(); it != group.rend(); ++it) {
    const Expr* g = *it;
    bool needed = !recomputed.count(g);
    for (const Val* out : g->outputs()) {
      needed = needed || !again.values.count(out);
      for (const Expr* use : out->uses()) needed = needed || (in_group.count(use) && !dropped.count(use));
    }
    if (!needed) dropped.insert(g);
  }
  std::vector<Expr*> kept;
  for (Expr* g : group) {
    if (!dropped.count(g)) kept.push_back(g);
  }
  return kept;
}

// Whether `e` is a view that keeps its input's elements in their flat order (a squeeze, or a
// broadcast that only adds size-1 axes): ATen makes it without moving data, contiguous when its
// input is. A permute or an expanding broadcast does not.
bool keepsFlatOrder(const Expr* e) {
  if (!opInfo(e->op()).aten_view || e->inputs().size() != 1 || e->outputs().size() != 1 || !e->inputs()[0]->isTensor()) {
    return false;
  }
  const auto* in = static_cast<const TensorView*>(e->inputs()[0]);
  const std::vector<IterDomain*> in_axes = in->logicalNoReductions();
  const std::vector<IterDomain*>& out_axes = e->out()->rootOrLogical();
  const std::vector<int64_t> map = mapProducerToConsumer(e, 0);
  std::vector<bool> mapped(out_axes.size(), false);
  int64_t last = -1;
  for (size_t p = 0; p < in_axes.size(); ++p) {
    const int64_t c = map[p];
    if (c < 0) {
      if (!(in_axes[p]->extent().isConst() && in_axes[p]->extent().value == 1)) return false;
      continue;
    }
    if (c <= last || !(out_axes[static_cast<size_t>(c)]->extent() == in_axes[p]->extent())) return false;
    mapped[static_cast<size_t>(c)] = true;
    last = c;
  }
  for (size_t c = 0; c < out_axes.size(); ++c) {
    if (!mapped[c] && !(out_axes[c]->extent().isConst() && out_axes[c]->extent().value == 1)) return false;
  }
  return true;
}

// The flat views of a kernel piece that ATen makes instead of the kernel: `leading`, views of the
// piece's inputs that later work reads (the kernel would store a copy: an autograd graph's
// broadcast of the gate, read by silu here and by its derivative after a GEMM); `trailing`, views
// that nothing in the piece reads (the kernel would store y and squeeze(y), the same data twice),
// reshapes of values the kernel computes among them.
// Never where the view would make a fusion output alias a fusion input or another output.
struct PeeledViews {
  std::vector<Expr*> leading, trailing;
};
PeeledViews viewsATenMakes(const std::vector<Expr*>& exprs, const Fusion& fusion) {
  std::unordered_set<const Expr*> in_piece(exprs.begin(), exprs.end());
  std::unordered_set<const Val*> made, computed;  // computed: by a non-layout op, stored contiguous
  for (const Expr* e : exprs) {
    for (const Val* v : e->outputs()) {
      made.insert(v);
      if (opInfo(e->op()).kind != OpKind::Layout) computed.insert(v);
    }
  }
  PeeledViews views;
  for (Expr* e : exprs) {
    // A reshape of a tensor the kernel computes (and stores contiguous) is a view too: the kernel
    // would store d_gate and its [rows, ffn] flattening, the same data twice (Llama's SwiGLU
    // backward). Not of a permute's output: merging permuted heads is the kernel's copy.
    const bool regroups_kernel_output = opInfo(e->op()).cuda_keeps_flat_order && e->inputs().size() == 1 &&
                                        e->outputs().size() == 1 && computed.count(e->inputs()[0]);
    if (!keepsFlatOrder(e) && !regroups_kernel_output) continue;
    const Val* in = e->inputs()[0];
    const Val* out = e->out();
    if (fusion.isOutput(out) && (fusion.isInput(in) || fusion.isOutput(in))) continue;
    bool read_here = false, read_later = fusion.isOutput(out);
    for (const Expr* use : out->uses()) (in_piece.count(use) ? read_here : read_later) = true;
    if (!made.count(in) && read_later) {
      views.leading.push_back(e);
    } else if (made.count(in) && !read_here) {
      views.trailing.push_back(e);
    }
  }
  return views;
}

}  // namespace

CompileCounters& compileCounters() {
  static CompileCounters counters;
  return counters;
}

const GeneratedKernel* SegmentKernels::kernelFor(Piece& p, const std::vector<KernelTensorArg>& args,
                                                 const std::string& label) {
  if (!p.kernel) return nullptr;
  if (sameArgs(args, p.args)) return &*p.kernel;
  for (auto it = p.variants.begin(); it != p.variants.end(); ++it) {
    if (!sameArgs(args, it->first)) continue;
    p.variants.splice(p.variants.begin(), p.variants, it);  // most recently used first
    return it->second ? &*it->second : nullptr;
  }
  std::string why;
  std::optional<GeneratedKernel> k = generate(p.segment, args, device_, &why);
  bool known = k && k->name == p.kernel->name;
  for (const auto& [other_args, other] : p.variants) known = known || (k && other && other->name == k->name);
  if (k && !known) ++compileCounters().sources;
  if (!known && isDumpEnabled(DumpOption::Recompile)) {
    logText("recompile", "recompile: " + label + ": inputs of sizes [" + sizesText(args) + "] (planned for [" +
                             sizesText(p.args) + "]) " +
                             (k ? "need a new kernel: " + p.kernel->choices + " -> " + k->choices
                                : "run on the ATen evaluator: the generator refuses them (" + why + ")"));
  }
  if (!k && isDumpEnabled(DumpOption::Fallback)) {
    logText("fallback", label + ": runs on the ATen evaluator for inputs of sizes [" + sizesText(args) + "]: " + why);
  }
  p.variants.emplace_front(args, std::move(k));
  if (p.variants.size() > kMaxVariants) p.variants.pop_back();
  return p.variants.front().second ? &*p.variants.front().second : nullptr;
}

std::string SegmentKernels::planText(const std::string& indent) const {
  std::string text;
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const Piece& p = pieces_[i];
    std::string ops;
    for (const Expr* e : p.exprs) ops += (ops.empty() ? "" : ", ") + std::string(opInfo(e->op()).name);
    text += indent + "piece " + std::to_string(i) + " [" + ops + "]: ";
    text += p.kernel ? "generated " + p.kernel->choices : "ATen (" + p.why_not + ")";
    text += "\n";
  }
  return text;
}

// An output may be written into the buffer of an input the segment reads last, as Inductor reuses
// buffers: a GELU backward's d_pre = (dy @ W2) * gelu'(pre) then needs no second [tokens, ffn]
// buffer beside dy @ W2, which was the backward's peak. Safe only where each element of the input is
// read once, by the thread that then writes the same element of the output: pointwise and
// reduction kernels (one pass over their inputs; normalization kernels may read a row twice) with
// no layout op (a permute or slice reads other elements), an input of exactly the output's sizes,
// dtype and contiguous layout, no other reader (not a fusion output, no later piece of the segment, no
// other tensor on its storage, no reference but the runtime's own: a fusion input only when the
// caller released it).
int64_t SegmentKernels::reusableInput(const Piece& p, const GeneratedKernel& k, size_t out,
                                      const std::vector<at::Tensor>& ins, const std::vector<bool>& taken) const {
  if (isDisabled(DisableOption::InplaceOutputs) || fusion_ == nullptr || segment_exprs_ == nullptr) return -1;
  if (k.scheduler != "pointwise" && k.scheduler != "reduction") return -1;
  for (const Expr* e : p.exprs) {
    const OpInfo& info = opInfo(e->op());
    if (info.kind == OpKind::Layout || info.aten_view) return -1;
  }
  const TensorView* tv = p.segment.outputs[out];
  if (fusion_->isInput(tv)) return -1;
  size_t t = 0;
  for (const Val* v : p.segment.inputs) {
    if (!v->isTensor()) continue;
    const size_t index = t++;
    // A fusion input qualifies only when the caller released it (execute(..., release_inputs=True)):
    // otherwise the caller's reference fails the count below.
    if (taken[index] || fusion_->isOutput(v)) continue;
    if (std::find(last_reads_.begin(), last_reads_.end(), v) == last_reads_.end()) continue;
    const at::Tensor& in = ins[index];
    // The runtime's value map and `ins` hold the only references; nothing else views the storage.
    if (!in.is_cuda() || !ownsItsBuffer(in, 2)) continue;
    if (!in.is_contiguous() || in.storage_offset() != 0 || in.sizes() != c10::IntArrayRef(k.output_sizes[out]) ||
        in.scalar_type() != toAten(tv->dtype()) || in.storage().nbytes() != in.nbytes()) {
      continue;
    }
    bool read_elsewhere = false;
    for (const Expr* e : *segment_exprs_) {
      if (std::find(p.exprs.begin(), p.exprs.end(), e) != p.exprs.end()) continue;
      for (const Val* i : e->inputs()) read_elsewhere = read_elsewhere || i == v;
    }
    if (!read_elsewhere) return static_cast<int64_t>(index);
  }
  return -1;
}

bool SegmentKernels::launch(const Piece& p, const GeneratedKernel& k, Values& values, const ScalarFn& scalar) {
  std::vector<at::Tensor> ins;
  std::vector<double> scalar_args;
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
    ins.push_back(values.at(v));
  }
  if (ins.empty()) return false;  // outputs take their device from an input
  std::vector<at::Tensor> outs;
  std::vector<bool> taken(ins.size(), false);
  for (size_t i = 0; i < p.segment.outputs.size(); ++i) {
    const TensorView* tv = p.segment.outputs[i];
    const int64_t reuse = reusableInput(p, k, i, ins, taken);
    if (reuse >= 0) {
      taken[static_cast<size_t>(reuse)] = true;
      outs.push_back(ins[static_cast<size_t>(reuse)]);
      continue;
    }
    outs.push_back(at::empty(k.output_sizes[i], ins.at(0).options().dtype(toAten(tv->dtype()))));
  }
  launchGeneratedKernel(k, ins, outs, scalar_args);
  for (size_t i = 0; i < outs.size(); ++i) values[p.segment.outputs[i]] = outs[i];
  return true;
}

void SegmentKernels::plan(const std::vector<Expr*>& exprs, const Fusion& fusion, Values& values, const EvalFn& eval,
                          const ScalarFn& scalar, bool do_launch, const std::string& label) {
  planned_ = true;
  std::unordered_set<const Expr*> done;  // the exprs of finished pieces
  auto finishOne = [&](Piece p) {  // runs the piece now: the next piece's args are its outputs
    // Views only (the heads of q, k, v permuted for attention): ATen returns views, moving no data,
    // where a generated kernel would copy them (and its text would hold their middle extents).
    if (std::all_of(p.exprs.begin(), p.exprs.end(), [](const Expr* e) { return opInfo(e->op()).aten_view; })) {
      p.kernel.reset();
      p.why_not = "only views (ATen returns them without moving data)";
      p.views_only = true;
    }
    // Layout ops only, some of which ATen may view (a reshape of a contiguous tensor): ATen runs
    // them first, and where every output is a view of its input no kernel copies them.
    bool evaluated = false;
    if (!p.views_only && std::all_of(p.exprs.begin(), p.exprs.end(),
                                     [](const Expr* e) { return opInfo(e->op()).kind == OpKind::Layout; })) {
      eval(p.exprs, values);
      evaluated = true;
      if (onlyAliases(p.segment, values)) {
        p.kernel.reset();
        p.why_not = "only views of its inputs (ATen moved no data)";
        p.views_only = true;
      }
    }
    const bool launched = do_launch && p.kernel && launch(p, *p.kernel, values, scalar);
    if (!launched) {
      if (!evaluated) eval(p.exprs, values);
      // As a kernel would have left them (e.g. on meta tensors): the next piece plans on these.
      if (p.kernel) {
        for (const TensorView* out : p.segment.outputs) values[out] = values.at(out).contiguous();
      }
    }
    // A reshape of a tensor laid out for it is a view too: nothing to generate, nothing moved.
    if (!p.kernel && !p.views_only && onlyAliases(p.segment, values)) {
      p.why_not = "only views of its inputs (ATen moved no data)";
      p.views_only = true;
    }
    if (!p.kernel && !p.views_only && isDumpEnabled(DumpOption::Fallback)) {
      for (const Expr* e : p.exprs) {
        logText("fallback", label + ": " + e->toString() + " runs on the ATen evaluator: " + p.why_not);
      }
    }
    // Without launching (meta tensors), what would run it; else what did.
    last_.push_back(p.kernel && (launched || !do_launch) ? p.kernel->scheduler : "expr_eval");
    if (p.kernel) ++compileCounters().sources;
    pieces_.push_back(std::move(p));
  };
  // A kernel piece with flat views ATen can make: they run on ATen around a kernel of the rest.
  // `peel` false: the piece's outputs were chosen for a recompute; it runs as planned.
  auto finish = [&](Piece p, bool peel = true) {
    const PeeledViews views = peel && p.kernel ? viewsATenMakes(p.exprs, fusion) : PeeledViews{};
    std::unordered_set<const Expr*> peeled(views.leading.begin(), views.leading.end());
    peeled.insert(views.trailing.begin(), views.trailing.end());
    std::vector<Expr*> rest;
    for (Expr* e : p.exprs) {
      if (!peeled.count(e)) rest.push_back(e);
    }
    if (peeled.empty() || rest.empty()) {
      finishOne(std::move(p));
      return;
    }
    std::unordered_set<const Expr*> done_before(done);  // the views read the kernel's outputs after it
    for (const Expr* e : p.exprs) done_before.erase(e);
    auto viewsPiece = [](const std::vector<Expr*>& exprs) {
      Piece v;
      v.exprs = exprs;
      // Inputs and outputs, so finishOne can tell the reshapes among them are views once run.
      v.segment = makeKernelSegment(exprs, [](const Val*) { return true; });
      return v;
    };
    if (!views.leading.empty()) finishOne(viewsPiece(views.leading));
    Piece kernel = makePiece(rest, fusion, values, device_, PieceOutputs{&done_before, nullptr});
    if (!kernel.kernel) {  // the views stay in the kernel, as first planned
      finishOne(std::move(p));
      return;
    }
    finishOne(std::move(kernel));
    if (!views.trailing.empty()) finishOne(viewsPiece(views.trailing));
  };
  Piece whole = makePiece(exprs, fusion, values, device_);
  if (whole.kernel || exprs.size() == 1) {
    finish(std::move(whole));
    return;
  }
  std::vector<Expr*> ordered = inputViewsFirst(exprs);
  std::vector<Expr*> group;
  std::optional<Piece> accepted;  // the kernel for `group`
  std::unordered_set<const Expr*> recomputed;  // exprs queued again by piece_recompute.h
  PieceOutputs after_done{&done, nullptr};
  // Recomputing pays only where the next kernel reads the recomputed values with work of its own:
  // a kernel of the recomputed exprs and views alone would store them again, read x twice and add
  // a launch (RMSNorm, then a reshape and a norm over each head: the normalization stays whole).
  // Planning runs once per input signature, so the leaner piece is evaluated here (ATen) to give
  // the next piece's candidates the tensors they read.
  auto nextPieceTakesIn = [&](const Recompute& again, const Piece& leaner, const std::vector<Expr*>& order,
                              size_t from) {
    Values scratch = values;
    eval(leaner.exprs, scratch);
    std::unordered_set<const Expr*> done_then(done);
    done_then.insert(leaner.exprs.begin(), leaner.exprs.end());
    for (const Expr* r : again.exprs) done_then.erase(r);
    PieceOutputs then{&done_then, nullptr};
    std::vector<Expr*> next(again.exprs.begin(), again.exprs.end());
    bool works = false;  // whether `next` has an expr other than a view or layout change yet
    size_t refused = 0;  // prefixes in a row without a kernel (a cat closes what slices open)
    for (size_t j = from; j < order.size() && refused <= kLookahead; ++j) {
      next.push_back(order[j]);
      works = works || opInfo(order[j]->op()).kind != OpKind::Layout;
      const bool kernel = makePiece(next, fusion, scratch, device_, then).kernel.has_value();
      if (kernel && works) return true;
      refused = kernel ? 0 : refused + 1;
    }
    return false;
  };
  auto finishGroup = [&](Piece p, bool peel = true) {
    done.insert(p.exprs.begin(), p.exprs.end());
    finish(std::move(p), peel);
  };
  for (size_t i = 0; i < ordered.size(); ++i) {
    Expr* e = ordered[i];
    std::vector<Expr*> grown = group;
    grown.push_back(e);
    Piece candidate = makePiece(grown, fusion, values, device_, after_done);
    if (candidate.kernel) {
      group = std::move(grown);
      accepted = std::move(candidate);
      continue;
    }
    // A later prefix may close what this one leaves open (RoPE: x * cos, then the two slices of x
    // and the cat that joins them: outputs of two shapes until the cat). Only the same scheduler:
    // a pointwise run must not become a transpose that writes a second layout.
    size_t joined = 0;
    for (size_t j = i + 1; accepted && j < std::min(ordered.size(), i + 1 + kLookahead); ++j) {
      grown.push_back(ordered[j]);
      Piece later = makePiece(grown, fusion, values, device_, after_done);
      if (later.kernel && later.kernel->scheduler == accepted->kernel->scheduler) {
        group = grown;
        accepted = std::move(later);
        joined = j;
        break;
      }
    }
    if (joined > 0) {
      i = joined;
      continue;
    }
    // The kernel ends here: what the rest reads from it and costs less to compute again than to
    // store and load is computed again at the start of the next piece (piece_recompute.h).
    if (accepted && !std::all_of(group.begin(), group.end(), [&](const Expr* g) { return recomputed.count(g); })) {
      const std::vector<Expr*> rest(ordered.begin() + static_cast<std::ptrdiff_t>(i), ordered.end());
      Recompute again = recomputeInNextPiece(group, rest, fusion);
      if (!again.exprs.empty()) {
        PieceOutputs storing{&done, &again};
        Piece leaner = makePiece(withoutUnread(group, again), fusion, values, device_, storing);
        if (leaner.kernel && nextPieceTakesIn(again, leaner, ordered, i)) {
          finishGroup(std::move(leaner), /*peel=*/false);
          accepted.reset();
          group.clear();
          recomputed.insert(again.exprs.begin(), again.exprs.end());
          for (const Expr* r : again.exprs) done.erase(r);  // they run again: their reads count
          ordered.insert(ordered.begin() + static_cast<std::ptrdiff_t>(i), again.exprs.begin(), again.exprs.end());
          --i;  // plan from the first recomputed expr
          continue;
        }
      }
    }
    if (accepted) finishGroup(std::move(*accepted));
    accepted.reset();
    group.clear();
    Piece alone = makePiece({e}, fusion, values, device_, after_done);
    if (alone.kernel) {
      group = {e};
      accepted = std::move(alone);
    } else {
      finishGroup(std::move(alone));
    }
  }
  if (accepted) finishGroup(std::move(*accepted));
}

void SegmentKernels::run(const std::vector<Expr*>& exprs, const Fusion& fusion, Values& values, const EvalFn& eval,
                         const ScalarFn& scalar, bool do_launch, const std::string& label, const DeviceLimits& device,
                         const std::vector<const Val*>& last_reads) {
  segment_exprs_ = &exprs;
  fusion_ = &fusion;
  last_reads_ = last_reads;
  last_.clear();
  last_kernels_.clear();
  if (planned_ && device != device_) {  // another device (or cuda_kernels for another architecture): plan again
    planned_ = false;
    pieces_.clear();
  }
  if (!planned_) {
    device_ = device;
    plan(exprs, fusion, values, eval, scalar, do_launch, label);
    for (const Piece& p : pieces_) last_kernels_.push_back(p.kernel ? &*p.kernel : nullptr);
    return;
  }
  for (size_t i = 0; i < pieces_.size(); ++i) {
    Piece& p = pieces_[i];
    const GeneratedKernel* k = nullptr;
    if (p.kernel) {
      std::vector<KernelTensorArg> args;
      for (const Val* v : p.segment.inputs) {
        if (v->isTensor()) args.push_back(kernelArgOf(values.at(v)));
      }
      k = kernelFor(p, args, pieces_.size() > 1 ? label + " piece " + std::to_string(i) : label);
    }
    bool launched = do_launch && k != nullptr && launch(p, *k, values, scalar);
    if (!launched) {
      eval(p.exprs, values);
      if (k != nullptr && !do_launch) {  // as the kernel would have left them: contiguous (meta tensors)
        for (const TensorView* out : p.segment.outputs) values[out] = values.at(out).contiguous();
      }
    }
    last_.push_back(k != nullptr && (launched || !do_launch) ? k->scheduler : "expr_eval");
    last_kernels_.push_back(k);
  }
}

}  // namespace mf
