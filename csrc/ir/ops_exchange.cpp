// Builders of the expert-parallel exchanges: all_to_all_dispatch (two exprs: the counts' AllToAll,
// then the tokens' AllToAllV) and all_to_all_combine (the reverse AllToAllV).
//
// Why explicit ops: which rank receives which rows depends on the routing, so the receiving extent
// is known only once the counts arrived. Written as ops of the program, the exchange has one place
// to be planned (one host communication each), printed and costed, while the per-rank work around it
// (routing, permutation, the grouped GEMMs) stays ordinary ops on this rank's rows. Their operands
// and results are rank-local: they hold this rank's own rows, are unsharded on the mesh axis, and no
// pass reshards them (lowering checks it).
//
// Row orders. `tokens` [m, h] are this rank's rows grouped by expert (expert 0's rows first), with
// counts [experts] rows per expert. Team member r holds experts [r*e, (r+1)*e), e = experts / team.
// The dispatch's result [rows, h] holds the rows sent to this rank's experts, grouped by local
// expert and, within one, by source rank; `rows` is a data-dependent extent bound at run time.
// recv_counts [team, e]: rows each source sends each local expert. The combine takes rows in the
// dispatch's order and returns [m, h'] in the order of the dispatch's `tokens`.
#include "ir/fusion.h"
#include "ir/ops.h"
#include "support/error.h"
#include "support/text.h"

namespace mf {
namespace {

std::vector<IterDomain*> axesOf(const TensorView* tv) { return tv->logicalNoReductions(); }

void requireIntegerCounts(const char* op, const char* what, const TensorView* counts) {
  MF_USER_ARG_CHECK(counts->dtype() == DataType::Int || counts->dtype() == DataType::Int32, op, ": ", what, " ",
                    counts->label(), " must be int64 or int32; got ", toString(counts->dtype()));
}

void requireRows(const char* op, const char* what, const TensorView* tv) {
  MF_USER_ARG_CHECK(axesOf(tv).size() >= 1, op, ": ", what, " ", tv->label(),
                    " is 0-D; expected rows (axis 0) to exchange");
}

Attributes meshAxisAttrs(const char* op, ParallelType mesh_axis) {
  MF_USER_ARG_CHECK(isDeviceParallel(mesh_axis), op, ": mesh_axis must be a mesh axis (mesh_x, mesh_y, mesh_z); got ",
                    toString(mesh_axis));
  return {{"mesh_axis", std::string(toString(mesh_axis))}};
}

Fusion& fusionOf(const char* op, const std::vector<TensorView*>& tvs) {
  Fusion* f = tvs.at(0)->fusion();
  for (size_t i = 1; i < tvs.size(); ++i) {
    MF_USER_ARG_CHECK(tvs[i]->fusion() == f, op, ": operand ", i, " (", tvs[i]->label(),
                      ") belongs to another fusion definition than operand 0 (", tvs[0]->label(), ")");
  }
  return *f;
}

// counts and recv_counts must be one dispatch's pair (the combine undoes that dispatch).
Expr* countsExchangeOf(const char* op, const TensorView* counts, const TensorView* recv_counts) {
  Expr* def = recv_counts->definition();
  MF_USER_ARG_CHECK(def != nullptr && def->op() == OpType::AllToAllCounts && def->input(0) == counts, op,
                    ": recv_counts ", recv_counts->label(), " must be the counts that all_to_all_dispatch returned for ",
                    "counts ", counts->label(), " (the combine reverses that dispatch)");
  return def;
}

}  // namespace

std::pair<TensorView*, TensorView*> allToAllDispatch(TensorView* tokens, TensorView* counts, ParallelType mesh_axis,
                                                     int64_t team_size) {
  const char* op = "all_to_all_dispatch";
  Fusion& f = fusionOf(op, {tokens, counts});
  Attributes attrs = meshAxisAttrs(op, mesh_axis);
  requireRows(op, "tokens", tokens);
  requireIntegerCounts(op, "counts", counts);
  MF_USER_ARG_CHECK(axesOf(counts).size() == 1, op, ": counts ", counts->label(), " must be 1-D (rows per expert)");
  const Extent& experts = axesOf(counts)[0]->extent();
  MF_USER_ARG_CHECK(experts.isConst(), op, ": counts ", counts->label(),
                    " needs a constant number of experts (its extent); got ", experts.toString());
  MF_USER_ARG_CHECK(team_size >= 1 && experts.value % team_size == 0, op, ": ", experts.value,
                    " experts (counts ", counts->label(), ") do not split evenly over the ", team_size, " devices of ",
                    toString(mesh_axis), "; expected a multiple of ", team_size);
  const int64_t local = experts.value / team_size;
  auto axis = [&](int64_t n) {
    return f.newIterDomain(Extent{n, ""}, n == 1 ? IterType::Broadcast : IterType::Iteration);
  };
  TensorView* recv_counts = f.newTensor(DataType::Int, {axis(team_size), axis(local)});
  // tokens is an operand for its row count only: the exchange checks that the counts cover the
  // rows, and every rank learns whether every sender's did, before any row moves.
  f.newExpr(OpType::AllToAllCounts, {counts, tokens}, {recv_counts}, attrs);

  // The received rows: an extent no input gives, bound when the counts arrived.
  std::vector<IterDomain*> ids = {f.newIterDomain(f.newSymbol(), IterType::Iteration)};
  for (size_t a = 1; a < axesOf(tokens).size(); ++a) {
    const IterDomain* id = axesOf(tokens)[a];
    ids.push_back(f.newIterDomain(id->extent(), id->iterType()));
  }
  TensorView* received = f.newTensor(tokens->dtype(), ids);
  f.newExpr(OpType::AllToAllDispatch, {tokens, counts, recv_counts}, {received}, attrs);
  return {received, recv_counts};
}

TensorView* allToAllCombine(TensorView* expert_out, TensorView* counts, TensorView* recv_counts) {
  const char* op = "all_to_all_combine";
  Fusion& f = fusionOf(op, {expert_out, counts, recv_counts});
  requireRows(op, "expert_out", expert_out);
  Expr* exchange = countsExchangeOf(op, counts, recv_counts);
  // The rows come back to where the dispatch took them: its tokens' row extent.
  const TensorView* tokens = nullptr;
  const TensorView* dispatched = nullptr;
  for (Expr* use : recv_counts->uses()) {
    if (use->op() != OpType::AllToAllDispatch) continue;
    tokens = static_cast<const TensorView*>(use->input(0));
    dispatched = use->out();
  }
  MF_USER_ARG_CHECK(tokens != nullptr, op, ": recv_counts ", recv_counts->label(), " has no all_to_all_dispatch");
  const Extent& received = axesOf(dispatched)[0]->extent();
  const Extent& rows = axesOf(expert_out)[0]->extent();
  MF_USER_ARG_CHECK(!rows.isConst() && f.canonicalSymbol(rows.symbol) == f.canonicalSymbol(received.symbol), op,
                    ": expert_out ", expert_out->label(), " has ", rows.toString(), " rows; expected the ",
                    received.toString(), " rows that all_to_all_dispatch received (", dispatched->label(),
                    "), in their order");
  std::vector<IterDomain*> ids = {f.newIterDomain(axesOf(tokens)[0]->extent(), IterType::Iteration)};
  for (size_t a = 1; a < axesOf(expert_out).size(); ++a) {
    const IterDomain* id = axesOf(expert_out)[a];
    ids.push_back(f.newIterDomain(id->extent(), id->iterType()));
  }
  TensorView* out = f.newTensor(expert_out->dtype(), ids);
  f.newExpr(OpType::AllToAllCombine, {expert_out, counts, recv_counts}, {out}, exchange->attributes());
  return out;
}

}  // namespace mf
