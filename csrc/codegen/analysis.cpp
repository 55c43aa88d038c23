// Segment analysis for the CUDA generator: what is supported, and the local shape of every tensor.
//
// Requires: a KernelSegment (exprs topologically ordered) and one KernelTensorArg per tensor input
// (or one per input Val, scalar entries ignored). Guarantees on success: every op is pointwise, cast,
// broadcast_in_dim, squeeze, permute, slice, pad, cat or a sum/max/min; every tensor is float, half, bfloat16,
// bool, double, int32 or int64 (the last three make the kernel compute in double); no output has a
// root domain; Analysis::shape holds the local (per-device) sizes of every tensor, propagated from
// the args with the ATen evaluator's rules.
#include <algorithm>

#include "codegen/internal.h"
#include "multidevice/sharding.h"
#include "support/text.h"
#include "support/error.h"

namespace mf {
namespace codegen {
namespace {

bool supportedDtype(DataType dt) {
  return dt == DataType::Float || dt == DataType::Half || dt == DataType::BFloat16 || dt == DataType::Bool ||
         dt == DataType::Double || dt == DataType::Int || dt == DataType::Int32;
}

bool needsDouble(DataType dt) { return dt == DataType::Double || dt == DataType::Int || dt == DataType::Int32; }

}  // namespace

std::vector<int64_t> nonReductionPositions(const TensorView* tv) {
  std::vector<int64_t> pos;
  int64_t next = 0;
  for (const IterDomain* id : tv->rootOrLogical()) pos.push_back(id->isReduction() ? -1 : next++);
  return pos;
}

namespace {

// The local output shape, from the op's axis map: an output axis takes the local extent of the
// input axes mapped onto it (which must agree, up to 1s); an axis no input fills (a new or
// expanded broadcast) takes its global extent divided by its shards.
bool outputShape(const Analysis& a, const Expr* e, std::vector<int64_t>* out, std::string* why) {
  const TensorView* tv = e->out();
  const OpInfo& info = opInfo(e->op());
  auto ids = tv->logicalNoReductions();
  std::vector<int64_t> no_reduction = nonReductionPositions(tv);
  out->assign(ids.size(), -1);
  if (info.cuda_keeps_flat_order) {  // a reshape: its local extents are its own, not its input's
    int64_t in_numel = 1, out_numel = 1;
    for (int64_t n : a.shape.at(static_cast<const TensorView*>(e->input(0)))) in_numel *= n;
    for (size_t o = 0; o < ids.size(); ++o) {
      if (!ids[o]->extent().isConst()) {
        *why = str(e->toString(), ": output axis ", o, " has a symbolic extent");
        return false;
      }
      (*out)[o] = ids[o]->extent().value / shardsPerAxis(tv)[o];
      out_numel *= (*out)[o];
    }
    if (in_numel != out_numel) {
      *why = str(e->toString(), ": the local shapes of its input and output hold different numbers of elements");
      return false;
    }
    return true;
  }
  for (size_t i = 0; i < e->inputs().size(); ++i) {
    if (!e->input(i)->isTensor()) continue;
    const auto* in = static_cast<const TensorView*>(e->input(i));
    const auto& s = a.shape.at(in);
    std::vector<int64_t> p2c = info.axis_map(e, i);
    for (size_t p = 0; p < s.size(); ++p) {
      int64_t c = p2c[p] < 0 ? -1 : no_reduction[p2c[p]];
      bool reduced = p2c[p] >= 0 && c < 0;
      if (c < 0) {
        // A resize (slice, pad, cat) maps its resized axes nowhere: their extent is the output's own.
        if (s[p] != 1 && !reduced && info.cuda_resize == nullptr && !info.cuda_keeps_flat_order) {
          *why = str(e->toString(), ": drops axis ", p, " of ", in->toString(), ", which has local extent ", s[p]);
          return false;
        }
        continue;
      }
      int64_t& o = (*out)[c];
      if (o == -1 || o == 1) {
        o = s[p];
      } else if (s[p] != 1 && s[p] != o) {
        *why = str(e->toString(), ": local operand shapes do not broadcast (", in->toString(), " is ", listText(s), ")");
        return false;
      }
    }
  }
  auto shards = shardsPerAxis(tv);
  for (size_t o = 0; o < ids.size(); ++o) {
    bool expanded = ids[o]->isBroadcast() && ids[o]->extent().isConst() && ids[o]->extent().value != 1;
    if ((*out)[o] != -1 && !((*out)[o] == 1 && expanded)) continue;
    if (!ids[o]->extent().isConst()) {
      *why = str(e->toString(), ": output axis ", o, " has a symbolic extent");
      return false;
    }
    (*out)[o] = ids[o]->extent().value / shards[o];
  }
  return true;
}

bool checkOp(const Expr* e, std::string* why) {
  const OpInfo& info = opInfo(e->op());
  if (info.cuda == nullptr && info.cuda_combine == nullptr && info.cuda_resize == nullptr) {
    *why = str(e->toString(), ": ", info.no_cuda);
    return false;
  }
  for (const Val* v : e->outputs()) {
    if (!v->isTensor()) {
      *why = str(e->toString(), ": produces a scalar, which the CUDA generator does not support");
      return false;
    }
    const auto* tv = static_cast<const TensorView*>(v);
    const char* integer_why = tv->dtype() == DataType::Int32 ? info.no_cuda_int32_result
                              : tv->dtype() == DataType::Int ? info.no_cuda_int64_result
                                                             : nullptr;
    if (integer_why != nullptr) {
      *why = str(e->toString(), ": ", integer_why);
      return false;
    }
    if (!tv->root().empty() && !info.cuda_keeps_flat_order) {
      *why = str(e->toString(), ": output ", tv->toString(),
                 " has a root domain (an rfactor partial or a reshape), which the CUDA generator does not support");
      return false;
    }
  }
  return true;
}

bool checkDtype(const TensorView* tv, std::string* why) {
  if (supportedDtype(tv->dtype())) return true;
  *why = str(tv->toString(), " has dtype ", toString(tv->dtype()),
             "; generated kernels support float, half, bfloat16, bool, double, int32 and int64 tensors");
  return false;
}

}  // namespace

bool analyzeSegment(const KernelSegment& segment, const std::vector<KernelTensorArg>& args, Analysis* a,
                    std::string* why) {
  a->segment = &segment;
  if (segment.exprs.empty()) {
    *why = "the segment has no exprs";
    return false;
  }
  if (segment.outputs.empty()) {
    *why = "the segment has no outputs";
    return false;
  }
  for (const Val* v : segment.inputs) {
    if (v->isTensor()) a->tensor_inputs.push_back(static_cast<const TensorView*>(v));
    else a->scalar_inputs.push_back(static_cast<const Scalar*>(v));
  }
  bool per_val = args.size() == segment.inputs.size() && !a->scalar_inputs.empty();
  if (!per_val && args.size() != a->tensor_inputs.size()) {
    *why = str("got ", args.size(), " tensor args for ", a->tensor_inputs.size(), " tensor inputs of the segment");
    return false;
  }
  size_t next = 0;
  for (size_t i = 0; i < segment.inputs.size(); ++i) {
    const Val* v = segment.inputs[i];
    // Kernels compute integers in double: exact below 2^53 only. An int64 tensor may hold larger
    // values (ids, hashes, timestamps), and PyTorch's int64 arithmetic is exact, so such segments
    // stay on ATen; int32 and bool tensors, and int64 values the kernel computes itself (sums of
    // int32 or bool), stay generated. Runtime int64 scalars are passed as doubles;
    // a call whose integer scalar is past 2^53 runs on ATen (SegmentKernels::launch).
    if (!v->isTensor()) {
      if (per_val) ++next;
      continue;
    }
    const auto* tv = static_cast<const TensorView*>(v);
    const KernelTensorArg& arg = args[next++];
    if (!checkDtype(tv, why)) return false;
    if (tv->dtype() == DataType::Int) {
      *why = str("input ", tv->toString(), " is int64: kernels compute integers in double, exact below 2^53 only");
      return false;
    }
    a->compute_double = a->compute_double || needsDouble(tv->dtype());
    if (arg.dtype != tv->dtype()) {
      *why = str("input ", tv->toString(), " is declared ", toString(tv->dtype()), " but the arg is ", toString(arg.dtype));
      return false;
    }
    if (arg.sizes.size() != tv->logicalNoReductions().size() || arg.strides.size() != arg.sizes.size()) {
      *why = str("input ", tv->toString(), " has rank ", tv->logicalNoReductions().size(), " but the arg has ",
                 arg.sizes.size(), " sizes and ", arg.strides.size(), " strides");
      return false;
    }
    for (size_t d = 0; d < arg.sizes.size(); ++d) {
      if (arg.sizes[d] < 0 || arg.strides[d] < 0) {
        *why = str("input ", tv->toString(), " axis ", d, " has size ", arg.sizes[d], " and stride ", arg.strides[d],
                   "; negative sizes or strides are not supported");
        return false;
      }
    }
    a->arg[tv] = &arg;
    a->shape[tv] = arg.sizes;
  }
  for (const Expr* e : segment.exprs) {
    if (!checkOp(e, why)) return false;
    for (const Val* v : e->inputs()) {
      if (v->isTensor() && !a->shape.count(static_cast<const TensorView*>(v))) {
        *why = str(e->toString(), ": reads ", v->toString(), ", which is neither a segment input nor produced earlier");
        return false;
      }
    }
    if (isReduction(e->op())) a->reductions.push_back(e);
    const TensorView* out = e->out();
    if (!checkDtype(out, why)) return false;
    a->compute_double = a->compute_double || needsDouble(out->dtype());
    std::vector<int64_t> shape;
    if (!outputShape(*a, e, &shape, why)) return false;
    a->shape[out] = shape;
    a->producer[out] = e;
  }
  if (a->reductions.size() == 1) a->reduction = a->reductions[0];
  for (const TensorView* tv : segment.outputs) {
    if (!a->producer.count(tv)) {
      *why = str("output ", tv->toString(), " is not produced by the segment");
      return false;
    }
  }
  return true;
}

}  // namespace codegen
}  // namespace mf
