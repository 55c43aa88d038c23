#include "ir/op_checks.h"

#include <algorithm>
#include <set>

#include "ir/nodes.h"
#include "support/error.h"
#include "support/text.h"

namespace mf {
namespace {

const TensorView* tensorOperand(const Expr* e, size_t i) {
  MF_USER_ARG_CHECK(i < e->inputs().size() && e->input(i)->isTensor(), e->toString(), ": operand ", i,
                    " must be a tensor");
  return static_cast<const TensorView*>(e->input(i));
}

int64_t rankOf(const TensorView* tv) { return static_cast<int64_t>(tv->logicalNoReductions().size()); }

// Axes of `what` are distinct and within [0, rank).
void requireAxes(const Expr* e, const char* what, const Ints& axes, int64_t rank, const TensorView* of) {
  std::set<int64_t> seen;
  for (int64_t a : axes) {
    MF_USER_ARG_CHECK(a >= 0 && a < rank, e->toString(), ": ", what, " names axis ", a, " but ", of->toString(),
                      " has rank ", rank);
    MF_USER_ARG_CHECK(seen.insert(a).second, e->toString(), ": ", what, " names axis ", a, " twice");
  }
}

void requireOutputRank(const Expr* e, int64_t want, const char* why) {
  const int64_t got = rankOf(e->outTensor(0));
  MF_USER_ARG_CHECK(got == want, e->toString(), ": the output ", e->output(0)->toString(), " has rank ", got,
                    " but ", why, " gives rank ", want);
}

void requireScalarOperands(const Expr* e, size_t from) {
  for (size_t i = from; i < e->inputs().size(); ++i) {
    MF_USER_ARG_CHECK(!e->input(i)->isTensor(), e->toString(), ": operand ", i, " must be a scalar");
  }
}

}  // namespace

void checkCast(const Expr* e) {
  DataType dt = e->attr<DataType>("dtype");
  MF_USER_ARG_CHECK(e->output(0)->dtype() == dt, e->toString(), ": the output is ", toString(e->output(0)->dtype()),
                    " but dtype is ", toString(dt));
}

void checkReduction(const Expr* e) {
  const TensorView* x = tensorOperand(e, 0);
  const Ints& dims = e->attr<Ints>("dims");
  MF_USER_ARG_CHECK(!dims.empty(), e->toString(), ": no axis to reduce (dims is empty)");
  requireAxes(e, "dims", dims, rankOf(x), x);
}

void checkBroadcastInDim(const Expr* e) {
  const TensorView* x = tensorOperand(e, 0);
  const Ints& shape = e->attr<Ints>("shape");
  const Ints& bdims = e->attr<Ints>("broadcast_dims");
  MF_USER_ARG_CHECK(static_cast<int64_t>(bdims.size()) == rankOf(x), e->toString(), ": broadcast_dims has ",
                    bdims.size(), " entries but ", x->toString(), " has ", rankOf(x), " axes");
  requireAxes(e, "broadcast_dims", bdims, static_cast<int64_t>(shape.size()), e->outTensor(0));
  MF_USER_ARG_CHECK(std::is_sorted(bdims.begin(), bdims.end()), e->toString(), ": broadcast_dims ", listText(bdims),
                    " must be increasing");
  requireOutputRank(e, static_cast<int64_t>(shape.size()), "shape");
}

void checkSqueeze(const Expr* e) {
  const TensorView* x = tensorOperand(e, 0);
  const Ints& dims = e->attr<Ints>("dims");
  requireAxes(e, "dims", dims, rankOf(x), x);
  requireOutputRank(e, rankOf(x) - static_cast<int64_t>(dims.size()), "squeezing dims");
}

void checkPermute(const Expr* e) {
  const TensorView* x = tensorOperand(e, 0);
  const Ints& dims = e->attr<Ints>("dims");
  MF_USER_ARG_CHECK(static_cast<int64_t>(dims.size()) == rankOf(x), e->toString(), ": dims ", listText(dims),
                    " must be a permutation of the ", rankOf(x), " axes of ", x->toString());
  requireAxes(e, "dims", dims, rankOf(x), x);
}

void checkReshape(const Expr* e) {
  tensorOperand(e, 0);
  requireOutputRank(e, static_cast<int64_t>(e->attr<Ints>("shape").size()), "shape");
}

void checkSlice(const Expr* e) {
  const TensorView* x = tensorOperand(e, 0);
  const Ints& strides = e->attr<Ints>("strides");
  MF_USER_ARG_CHECK(static_cast<int64_t>(strides.size()) == rankOf(x), e->toString(), ": strides has ",
                    strides.size(), " entries but ", x->toString(), " has ", rankOf(x), " axes");
  MF_USER_ARG_CHECK(static_cast<int64_t>(e->inputs().size()) == 1 + 2 * rankOf(x), e->toString(),
                    ": a slice takes the tensor and a (start, end) pair per axis: ", 1 + 2 * rankOf(x),
                    " operands; got ", e->inputs().size());
  requireScalarOperands(e, 1);
  requireOutputRank(e, rankOf(x), "slicing");
}

void checkPad(const Expr* e) {
  const TensorView* x = tensorOperand(e, 0);
  const Ints& widths = e->attr<Ints>("pad_widths");
  MF_USER_ARG_CHECK(widths.size() % 2 == 0 && static_cast<int64_t>(widths.size()) <= 2 * rankOf(x), e->toString(),
                    ": pad_widths has ", widths.size(), " entries; expected pairs (last axis first) for at most the ",
                    rankOf(x), " axes of ", x->toString());
  MF_USER_ARG_CHECK(e->inputs().size() == 2, e->toString(), ": pad takes the tensor and the fill value");
  requireScalarOperands(e, 1);
  requireOutputRank(e, rankOf(x), "padding");
}

void checkCat(const Expr* e) {
  const TensorView* first = tensorOperand(e, 0);
  const int64_t dim = e->attr<int64_t>("dim");
  MF_USER_ARG_CHECK(dim < rankOf(first), e->toString(), ": dim ", dim, " is out of range for ", first->toString(),
                    " of rank ", rankOf(first));
  for (size_t i = 0; i < e->inputs().size(); ++i) {
    MF_USER_ARG_CHECK(rankOf(tensorOperand(e, i)) == rankOf(first), e->toString(), ": operand ", i,
                      " has rank ", rankOf(tensorOperand(e, i)), " but operand 0 has ", rankOf(first));
  }
  requireOutputRank(e, rankOf(first), "concatenating");
}

void checkStrideOrder(const Expr* e) {
  const TensorView* x = tensorOperand(e, 0);
  const Ints& given = e->attr<Ints>("stride_order");
  Ints order = given;
  MF_USER_ARG_CHECK(static_cast<int64_t>(order.size()) == rankOf(x), e->toString(), ": stride_order has ",
                    order.size(), " entries but ", x->toString(), " has ", rankOf(x), " axes");
  std::sort(order.begin(), order.end());
  for (size_t i = 0; i < order.size(); ++i) {
    MF_USER_ARG_CHECK(order[i] == static_cast<int64_t>(i), e->toString(), ": stride_order ", listText(given),
                      " is not a permutation of the axes of ", x->toString());
  }
  const Ints& out_order = e->outTensor(0)->strideOrder();
  MF_USER_ARG_CHECK(out_order.empty() || out_order == given, e->toString(), ": the output's stride order ",
                    listText(out_order), " differs from the op's ", listText(given));
}

void checkUniform(const Expr* e) {
  requireScalarOperands(e, 0);
  MF_USER_ARG_CHECK(e->output(0)->dtype() == e->attr<DataType>("dtype"), e->toString(), ": the output is ",
                    toString(e->output(0)->dtype()), " but dtype is ", toString(e->attr<DataType>("dtype")));
  requireOutputRank(e, static_cast<int64_t>(e->attr<Ints>("shape").size()), "shape");
}

void checkEmbedding(const Expr* e) {
  tensorOperand(e, 0);
  const TensorView* weight = tensorOperand(e, 1);
  MF_USER_ARG_CHECK(rankOf(weight) == 2, e->toString(), ": the weight ", weight->toString(),
                    " must be 2-D [num_embeddings, embedding_dim]");
  const Ints& padding = e->attr<Ints>("padding_idx");
  const Extent& vocab = weight->logicalNoReductions()[0]->extent();
  MF_USER_ARG_CHECK(padding.empty() || !vocab.isConst() || (padding[0] >= -vocab.value && padding[0] < vocab.value),
                    e->toString(), ": padding_idx ", listText(padding), " is out of range for a weight of ",
                    vocab.toString(), " embeddings");
}

void checkAttention(const Expr* e) {
  for (size_t i = 0; i < e->inputs().size(); ++i) tensorOperand(e, i);
  for (size_t i = 1; i <= 3; ++i) {
    const size_t q = e->inputs().size() == 3 ? i - 1 : i;  // the backward starts with grad_attn
    MF_USER_ARG_CHECK(rankOf(tensorOperand(e, q)) >= 2, e->toString(), ": ", e->input(q)->toString(),
                      " must be [batch.., seq, head_dim]");
  }
}

void checkAlongDim(const Expr* e) {
  const TensorView* x = tensorOperand(e, 0);
  const int64_t dim = e->attr<int64_t>("dim");
  MF_USER_ARG_CHECK(dim < rankOf(x), e->toString(), ": dim ", dim, " is out of range for ", x->toString(), " of rank ",
                    rankOf(x));
  if (e->attributes().has("k")) {
    const int64_t k = e->attr<int64_t>("k");
    const Extent& n = x->logicalNoReductions()[dim]->extent();
    MF_USER_ARG_CHECK(!n.isConst() || k <= n.value, e->toString(), ": k = ", k, " exceeds the extent ", n.value,
                      " of axis ", dim, " of ", x->toString());
  }
  if (e->attributes().has("dtype")) {
    MF_USER_ARG_CHECK(e->output(0)->dtype() == e->attr<DataType>("dtype"), e->toString(), ": the output is ",
                      toString(e->output(0)->dtype()), " but dtype is ", toString(e->attr<DataType>("dtype")));
  }
}

void checkBincount(const Expr* e) {
  const TensorView* x = tensorOperand(e, 0);
  MF_USER_ARG_CHECK(rankOf(x) == 1, e->toString(), ": the input ", x->toString(), " must be 1-D");
  const Extent& bins = e->outTensor(0)->logicalNoReductions().at(0)->extent();
  MF_USER_ARG_CHECK(!bins.isConst() || bins.value == e->attr<int64_t>("minlength"), e->toString(),
                    ": the output has ", bins.value, " bins but minlength is ", e->attr<int64_t>("minlength"));
}

void checkExpr(const Expr* e) {
  const OpInfo& info = opInfo(e->op());
  MF_USER_ARG_CHECK(completeAttributes(info.name, info.attributes, e->attributes()) == e->attributes(),
                    e->toString(), ": its attributes are not complete in declaration order");
  const auto n = static_cast<int>(e->inputs().size());
  MF_USER_ARG_CHECK(n >= info.min_inputs && n <= info.max_inputs, info.name, " takes ", info.min_inputs, "-",
                    info.max_inputs, " operands, got ", n, " (", e->toString(), ")");
  if (info.check != nullptr) info.check(e);
}

}  // namespace mf
