// Builders of sdpfa_fwd and sdpfa_bwd: shape and dtype checks, output TensorViews, the Expr.
// The ops mean what PyTorch's fused attention means (scaled_dot_product_attention and its
// backward); the runtime evaluates them with PyTorch's kernels (runtime/attention.cpp).
#include <cmath>

#include "ir/ops.h"
#include "support/error.h"
#include "support/text.h"

namespace mf {
namespace {

std::string shapeOf(const TensorView* tv) {
  std::vector<std::string> extents;
  for (const IterDomain* id : tv->logicalNoReductions()) extents.push_back(id->extent().toString());
  return listText(extents);
}

// Extents that must agree: a user error when both are known and differ; unified when both are symbolic.
void requireSameExtent(Fusion& f, const char* op, const TensorView* a, size_t axis_a, const TensorView* b, size_t axis_b,
                       const char* what) {
  const Extent& ea = a->logicalNoReductions().at(axis_a)->extent();
  const Extent& eb = b->logicalNoReductions().at(axis_b)->extent();
  MF_USER_CHECK(!(ea.isConst() && eb.isConst() && ea.value != eb.value), op, ": ", what, " differs: ", a->toString(),
                " has ", ea.value, " at axis ", axis_a, " (shape ", shapeOf(a), ") but ", b->toString(), " has ", eb.value,
                " at axis ", axis_b, " (shape ", shapeOf(b), ")");
  if (!ea.isConst() && !eb.isConst()) f.unifySymbols(ea.symbol, eb.symbol);
}

size_t rankOf(const TensorView* tv) { return tv->logicalNoReductions().size(); }

// q, k, v: same rank >= 3, one floating dtype, matching leading axes, seq(k) == seq(v), one head_dim.
void checkQkv(Fusion& f, const char* op, TensorView* q, TensorView* k, TensorView* v) {
  const char* names[] = {"query", "key", "value"};
  TensorView* tvs[] = {q, k, v};
  for (int i = 0; i < 3; ++i) {
    MF_USER_ARG_CHECK(rankOf(tvs[i]) >= 3, op, ": ", names[i], " ", tvs[i]->toString(), " has shape ",
                      shapeOf(tvs[i]), "; expected [batch.., heads, seq, head_dim] (at least 3 axes)");
    MF_USER_ARG_CHECK(rankOf(tvs[i]) == rankOf(q), op, ": ", names[i], " ", tvs[i]->toString(), " has ", rankOf(tvs[i]),
                      " axes but query ", q->toString(), " has ", rankOf(q));
    MF_USER_ARG_CHECK(tvs[i]->dtype() == q->dtype(), op, ": ", names[i], " ", tvs[i]->toString(), " is ",
                      toString(tvs[i]->dtype()), " but query is ", toString(q->dtype()), "; one dtype for all three");
  }
  DataType dt = q->dtype();
  MF_USER_ARG_CHECK(dt == DataType::Float || dt == DataType::Half || dt == DataType::BFloat16, op, ": query ",
                    q->toString(), " is ", toString(dt), "; expected float, half or bfloat16");
  size_t lead = rankOf(q) - 2;
  const size_t heads = lead - 1;
  for (size_t a = 0; a < heads; ++a) {
    requireSameExtent(f, op, q, a, k, a, "a batch extent");
    requireSameExtent(f, op, q, a, v, a, "a batch extent");
  }
  requireSameExtent(f, op, k, heads, v, heads, "the number of key/value heads");
  // Grouped-query attention (Llama 3, Mistral): k and v may have fewer heads than q when both
  // counts are known and divide; query head h reads key/value head h / (q heads / kv heads).
  const Extent& hq = q->logicalNoReductions().at(heads)->extent();
  const Extent& hk = k->logicalNoReductions().at(heads)->extent();
  if (hq.isConst() && hk.isConst()) {
    MF_USER_ARG_CHECK(hk.value > 0 && hq.value % hk.value == 0, op, ": query ", q->toString(), " has ", hq.value,
                      " heads (axis ", heads, ") and key ", k->toString(), " has ", hk.value,
                      "; grouped-query attention needs the query heads to be a multiple of the key/value heads");
    // One key/value head for several query heads (multi-query attention) would be an extent-1 axis
    // that a head split cannot follow; the caller repeats k and v (expand) to the query heads.
    MF_USER_ARG_CHECK(hk.value > 1 || hq.value == hk.value, op, ": key ", k->toString(),
                      " has 1 head for the ", hq.value, " heads of query ", q->toString(),
                      " (multi-query attention); repeat k and v to the query heads, or give them 2 or more heads");
  } else {
    requireSameExtent(f, op, q, heads, k, heads, "the number of heads (grouped-query heads need constant counts)");
  }
  requireSameExtent(f, op, k, lead, v, lead, "the key/value sequence length");
  requireSameExtent(f, op, q, lead + 1, k, lead + 1, "head_dim of query and key");
  // PyTorch's fused kernels (flash, CPU flash) need one head size for q, k and v.
  requireSameExtent(f, op, q, lead + 1, v, lead + 1, "head_dim of query and value");
}

void checkOptions(const char* op, const AttentionOptions& o) {
  double p = o.dropout_p.value_or(0.0);
  MF_USER_ARG_CHECK(p >= 0.0 && p < 1.0, op, ": dropout_p is ", p, "; expected 0 <= dropout_p < 1");
  MF_USER_ARG_CHECK(!o.scale || std::isfinite(*o.scale), op, ": scale is ", o.scale.value_or(0.0),
                    "; expected a finite number or None");
}

// Unset options are left to the declaration's defaults.
Attributes attrsOf(const AttentionOptions& o) {
  Attributes attrs;
  if (o.dropout_p) attrs.set("dropout_p", *o.dropout_p);
  if (o.is_causal) attrs.set("is_causal", *o.is_causal);
  if (o.scale) attrs.set("scale", o.scale);
  return attrs;
}

IterDomain* like(Fusion& f, const IterDomain* id) { return f.newIterDomain(id->extent(), id->iterType()); }

TensorView* tensorLike(Fusion& f, const TensorView* tv, DataType dtype) {
  std::vector<IterDomain*> ids;
  for (const IterDomain* id : tv->logicalNoReductions()) ids.push_back(like(f, id));
  return f.newTensor(dtype, ids);
}

void requireRngState(const char* op, const TensorView* tv, const char* what) {
  MF_USER_ARG_CHECK(rankOf(tv) == 0 && tv->dtype() == DataType::Int, op, ": ", what, " ", tv->toString(),
                    " must be the 0-d int64 tensor sdpfa_fwd returns; got ", toString(tv->dtype()), " of shape ",
                    shapeOf(tv));
}

}  // namespace

std::vector<TensorView*> sdpfaFwd(TensorView* q, TensorView* k, TensorView* v, const AttentionOptions& options) {
  Fusion& f = *q->fusion();
  checkQkv(f, "sdpfa_fwd", q, k, v);
  checkOptions("sdpfa_fwd", options);
  auto qi = q->logicalNoReductions();
  auto vi = v->logicalNoReductions();
  std::vector<IterDomain*> attn_ids, lse_ids;
  for (size_t a = 0; a + 1 < qi.size(); ++a) {
    attn_ids.push_back(like(f, qi[a]));
    lse_ids.push_back(like(f, qi[a]));
  }
  attn_ids.push_back(like(f, vi.back()));
  TensorView* attn = f.newTensor(q->dtype(), attn_ids);
  TensorView* lse = f.newTensor(DataType::Float, lse_ids);
  TensorView* seed = f.newTensor(DataType::Int, {});
  TensorView* offset = f.newTensor(DataType::Int, {});
  f.newExpr(OpType::SdpfaFwd, {q, k, v}, {attn, lse, seed, offset}, attrsOf(options));
  return {attn, lse, seed, offset};
}

std::vector<TensorView*> sdpfaBwd(TensorView* grad_attn, TensorView* q, TensorView* k, TensorView* v, TensorView* attn,
                                  TensorView* logsumexp, TensorView* seed, TensorView* offset,
                                  const AttentionOptions& options) {
  const char* op = "sdpfa_bwd";
  Fusion& f = *q->fusion();
  checkQkv(f, op, q, k, v);
  checkOptions(op, options);
  size_t rank = rankOf(q);
  for (auto [tv, what] : {std::pair<TensorView*, const char*>{grad_attn, "grad_attn"}, {attn, "attn"}}) {
    MF_USER_ARG_CHECK(rankOf(tv) == rank && tv->dtype() == q->dtype(), op, ": ", what, " ", tv->toString(), " is ",
                      toString(tv->dtype()), " of shape ", shapeOf(tv), "; expected ", toString(q->dtype()),
                      " [batch.., heads, seq_q, head_dim_v] like sdpfa_fwd's output");
    for (size_t a = 0; a + 1 < rank; ++a) requireSameExtent(f, op, tv, a, q, a, "a batch, head or query-sequence extent");
    requireSameExtent(f, op, tv, rank - 1, v, rank - 1, "head_dim of value");
  }
  MF_USER_ARG_CHECK(rankOf(logsumexp) == rank - 1 && logsumexp->dtype() == DataType::Float, op, ": logsumexp ",
                    logsumexp->toString(), " is ", toString(logsumexp->dtype()), " of shape ", shapeOf(logsumexp),
                    "; expected float [batch.., heads, seq_q] like sdpfa_fwd's second output");
  for (size_t a = 0; a + 1 < rank; ++a) requireSameExtent(f, op, logsumexp, a, q, a, "a batch, head or query-sequence extent");
  requireRngState(op, seed, "seed");
  requireRngState(op, offset, "offset");
  TensorView* gq = tensorLike(f, q, q->dtype());
  TensorView* gk = tensorLike(f, k, q->dtype());
  TensorView* gv = tensorLike(f, v, q->dtype());
  f.newExpr(OpType::SdpfaBwd, {grad_attn, q, k, v, attn, logsumexp, seed, offset}, {gq, gk, gv}, attrsOf(options));
  return {gq, gk, gv};
}

}  // namespace mf
