// Segment analysis for the CUDA generator: what is supported, and the local shape of every tensor.
//
// Requires: a KernelSegment (exprs topologically ordered) and one KernelTensorArg per tensor input
// (or one per input Val, scalar entries ignored). Guarantees on success: every op is pointwise, cast,
// broadcast_in_dim, squeeze, permute or one of at most one sum/max/min; every tensor is float, half,
// bfloat16 or bool; no output has a root domain; Analysis::shape holds the local (per-device) sizes
// of every tensor, propagated from the args with the ATen evaluator's rules.
#include <algorithm>

#include "codegen/internal.h"
#include "multidevice/sharding.h"
#include "support/error.h"

namespace mf {
namespace codegen {
namespace {

bool supportedDtype(DataType dt) {
  return dt == DataType::Float || dt == DataType::Half || dt == DataType::BFloat16 || dt == DataType::Bool;
}

std::string shapeText(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

// Right-aligned numpy broadcasting of the tensor operands' local shapes.
bool broadcastShape(const Analysis& a, const Expr* e, std::vector<int64_t>* out, std::string* why) {
  size_t rank = 0;
  for (const Val* v : e->inputs()) {
    if (v->isTensor()) rank = std::max(rank, a.shape.at(static_cast<const TensorView*>(v)).size());
  }
  out->assign(rank, 1);
  for (const Val* v : e->inputs()) {
    if (!v->isTensor()) continue;
    const auto& s = a.shape.at(static_cast<const TensorView*>(v));
    size_t off = rank - s.size();
    for (size_t i = 0; i < s.size(); ++i) {
      int64_t& o = (*out)[off + i];
      if (s[i] == o || s[i] == 1) continue;
      if (o == 1) {
        o = s[i];
        continue;
      }
      *why = str(e->toString(), ": local operand shapes do not broadcast (", v->toString(), " is ", shapeText(s), ")");
      return false;
    }
  }
  return true;
}

bool outputShape(const Analysis& a, const Expr* e, std::vector<int64_t>* out, std::string* why) {
  OpType op = e->op();
  const TensorView* tv = e->out();
  auto in_shape = [&](size_t i) -> const std::vector<int64_t>& {
    return a.shape.at(static_cast<const TensorView*>(e->input(i)));
  };
  if (isUnary(op)) {
    *out = in_shape(0);
  } else if (isBinary(op) || op == OpType::Where) {
    if (!broadcastShape(a, e, out, why)) return false;
  } else if (op == OpType::BroadcastInDim) {
    const ExprAttrs& at = e->attrs();
    const auto& in = in_shape(0);
    auto ids = tv->logicalNoReductions();
    auto shards = shardsPerAxis(tv);
    out->assign(at.shape.size(), 1);
    for (size_t o = 0; o < ids.size(); ++o) {
      auto it = std::find(at.dims.begin(), at.dims.end(), static_cast<int64_t>(o));
      bool mapped = it != at.dims.end();
      bool expand = !mapped || (ids[o]->isBroadcast() && ids[o]->extent().isConst() && ids[o]->extent().value != 1);
      if (!expand) {
        (*out)[o] = in.at(static_cast<size_t>(it - at.dims.begin()));
      } else if (ids[o]->extent().isConst()) {
        (*out)[o] = ids[o]->extent().value / shards[o];
      } else {
        *why = str(e->toString(), ": output axis ", o, " has a symbolic extent");
        return false;
      }
    }
  } else if (op == OpType::Squeeze) {
    const auto& in = in_shape(0);
    const auto& dims = e->attrs().dims;
    out->clear();
    for (size_t i = 0; i < in.size(); ++i) {
      bool drop = std::find(dims.begin(), dims.end(), static_cast<int64_t>(i)) != dims.end();
      if (drop && in[i] != 1) {
        *why = str(e->toString(), ": squeezed axis ", i, " has local extent ", in[i]);
        return false;
      }
      if (!drop) out->push_back(in[i]);
    }
  } else if (op == OpType::Permute) {
    const auto& in = in_shape(0);
    out->clear();
    for (int64_t d : e->attrs().dims) out->push_back(in.at(static_cast<size_t>(d)));
  } else if (isReduction(op)) {
    const auto& in = in_shape(0);
    const auto& dims = e->attrs().dims;
    out->clear();
    for (size_t i = 0; i < in.size(); ++i) {
      if (std::find(dims.begin(), dims.end(), static_cast<int64_t>(i)) == dims.end()) out->push_back(in[i]);
    }
  } else {
    *why = str(e->toString(), ": op ", toString(op), " has no shape rule in the CUDA generator");
    return false;
  }
  if (out->size() != tv->logicalNoReductions().size()) {
    *why = str(e->toString(), ": computed local rank ", out->size(), " but ", tv->toString(), " has rank ",
               tv->logicalNoReductions().size());
    return false;
  }
  return true;
}

bool checkOp(const Expr* e, std::string* why) {
  OpType op = e->op();
  if (op == OpType::Reshape) {
    *why = str(e->toString(), ": reshape is not supported by the CUDA generator (it needs a view or a copy; ATen runs it)");
    return false;
  }
  if (isContraction(op)) {
    *why = str(e->toString(), ": ", toString(op), " runs on cuBLAS through ATen, not in a generated kernel");
    return false;
  }
  if (!isPointwise(op) && !isReduction(op) && op != OpType::BroadcastInDim && op != OpType::Squeeze &&
      op != OpType::Permute) {
    *why = str(e->toString(), ": op ", toString(op), " is not supported by the CUDA generator");
    return false;
  }
  for (const Val* v : e->outputs()) {
    if (!v->isTensor()) {
      *why = str(e->toString(), ": produces a scalar, which the CUDA generator does not support");
      return false;
    }
    const auto* tv = static_cast<const TensorView*>(v);
    if (!tv->root().empty()) {
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
             "; generated kernels support float, half, bfloat16 and bool tensors (compute is in float, so ",
             (tv->dtype() == DataType::Double ? "double would lose precision" : "integers would not be exact"), ")");
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
    if (!v->isTensor()) {
      if (per_val) ++next;
      continue;
    }
    const auto* tv = static_cast<const TensorView*>(v);
    const KernelTensorArg& arg = args[next++];
    if (!checkDtype(tv, why)) return false;
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
    if (isReduction(e->op())) {
      if (a->reduction != nullptr) {
        *why = str("the segment has more than one reduction (", a->reduction->toString(), " and ", e->toString(),
                   "); a generated kernel holds at most one");
        return false;
      }
      a->reduction = e;
    }
    const TensorView* out = e->out();
    if (!checkDtype(out, why)) return false;
    std::vector<int64_t> shape;
    if (!outputShape(*a, e, &shape, why)) return false;
    a->shape[out] = shape;
    a->producer[out] = e;
  }
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
