#include "ir/domain_map.h"

#include "ir/op_registry.h"
#include "support/error.h"

namespace mf {
namespace {

struct Ranks {
  std::vector<IterDomain*> p_ids;
  const std::vector<IterDomain*>* c_ids;
  int64_t prank;
  int64_t crank;
};

Ranks ranksOf(const Expr* e, size_t input_index) {
  MF_CHECK(e->input(input_index)->isTensor(), "input ", input_index, " of ", e->toString(), " is not a tensor");
  auto* producer = static_cast<TensorView*>(e->input(input_index));
  Ranks r;
  r.p_ids = producer->logicalNoReductions();
  r.c_ids = &e->out()->rootOrLogical();
  r.prank = static_cast<int64_t>(r.p_ids.size());
  r.crank = static_cast<int64_t>(r.c_ids->size());
  return r;
}

int64_t rankOf(const Val* v) { return static_cast<int64_t>(static_cast<const TensorView*>(v)->logicalNoReductions().size()); }

}  // namespace

std::vector<int64_t> mapRightAligned(const Expr* e, size_t input_index) {
  Ranks r = ranksOf(e, input_index);
  std::vector<int64_t> map(r.prank);
  for (int64_t p = 0; p < r.prank; ++p) map[p] = p + (r.crank - r.prank);
  return map;
}

std::vector<int64_t> mapBroadcastInDim(const Expr* e, size_t input_index) {
  Ranks r = ranksOf(e, input_index);
  std::vector<int64_t> map(r.prank);
  for (int64_t p = 0; p < r.prank; ++p) map[p] = e->attrs().dims[p];
  return map;
}

std::vector<int64_t> mapSqueeze(const Expr* e, size_t input_index) {
  Ranks r = ranksOf(e, input_index);
  std::vector<int64_t> map(r.prank);
  int64_t c = 0;
  for (int64_t p = 0; p < r.prank; ++p) {
    bool dropped = false;
    for (int64_t d : e->attrs().dims) dropped |= d == p;
    map[p] = dropped ? -1 : c++;
  }
  return map;
}

std::vector<int64_t> mapPermute(const Expr* e, size_t input_index) {
  Ranks r = ranksOf(e, input_index);
  std::vector<int64_t> map(r.prank, -1);
  for (int64_t c = 0; c < r.crank; ++c) map[e->attrs().dims[c]] = c;
  return map;
}

// Walks both shapes, grouping axes whose products agree; the outermost producer axis of a group
// maps to the outermost consumer axis of the group (a sharded outermost axis stays sharded).
std::vector<int64_t> mapReshape(const Expr* e, size_t input_index) {
  Ranks r = ranksOf(e, input_index);
  const auto& in = r.p_ids;
  const auto& out = *r.c_ids;
  std::vector<int64_t> map(in.size(), -1);
  size_t i = 0, o = 0;
  while (i < in.size() && o < out.size()) {
    size_t gi = i, go = o;
    int64_t pi = in[i]->extent().value, po = out[o]->extent().value;
    if (pi < 0 || po < 0) return map;
    while (pi != po) {
      if (pi < po) {
        if (++i >= in.size()) return map;
        pi *= in[i]->extent().value;
      } else {
        if (++o >= out.size()) return map;
        po *= out[o]->extent().value;
      }
    }
    map[gi] = static_cast<int64_t>(go);
    ++i;
    ++o;
  }
  return map;
}

// out = [a (3-D weight only), batch..., out_features (2-D or 3-D weight), r{k}]; input 0 is x, 1 the
// weight ([out_features, k], or [a, out_features, k]), 2 the bias ([out_features], or [a, out_features]).
std::vector<int64_t> mapLinear(const Expr* e, size_t input_index) {
  Ranks r = ranksOf(e, input_index);
  std::vector<int64_t> map(r.prank, -1);
  int64_t prank = r.prank, crank = r.crank;
  const bool leading_weight_axis = rankOf(e->input(1)) == 3;
  if (input_index == 0) {
    for (int64_t p = 0; p + 1 < prank; ++p) map[p] = p + (leading_weight_axis ? 1 : 0);
    map[prank - 1] = crank - 1;
  } else if (input_index == 1) {
    // k is the output's reduction; out_features is its last iteration axis; a leads.
    map[prank - 1] = crank - 1;
    if (prank >= 2) map[prank - 2] = crank - 2;
    if (prank == 3) map[0] = 0;
  } else {
    // out_features (or an axis of extent 1) just before r{k}; a 2-D bias's first axis is a.
    if (prank >= 1) map[prank - 1] = crank - 2;
    if (prank == 2) map[0] = 0;
  }
  return map;
}

// Output axes: batch..., m (if a has >= 2 axes), n (if b has >= 2 axes), r{k}.
std::vector<int64_t> mapMatmul(const Expr* e, size_t input_index) {
  Ranks r = ranksOf(e, input_index);
  std::vector<int64_t> map(r.prank, -1);
  int64_t prank = r.prank, crank = r.crank;
  int64_t arank = rankOf(e->input(0));
  int64_t brank = rankOf(e->input(1));
  int64_t n_pos = brank >= 2 ? crank - 2 : -1;
  int64_t m_pos = arank >= 2 ? (brank >= 2 ? crank - 3 : crank - 2) : -1;
  int64_t batch_end = m_pos >= 0 ? m_pos : (n_pos >= 0 ? n_pos : crank - 1);
  if (input_index == 0) {
    map[prank - 1] = crank - 1;
    if (prank >= 2) {
      map[prank - 2] = m_pos;
      for (int64_t p = 0; p < prank - 2; ++p) map[p] = batch_end - (prank - 2) + p;
    }
  } else if (prank == 1) {
    map[0] = crank - 1;
  } else {
    map[prank - 2] = crank - 1;
    map[prank - 1] = n_pos;
    for (int64_t p = 0; p < prank - 2; ++p) map[p] = batch_end - (prank - 2) + p;
  }
  return map;
}

std::vector<int64_t> mapProducerToConsumer(const Expr* e, size_t input_index) {
  std::vector<int64_t> map = opInfo(e->op()).axis_map(e, input_index);
  Ranks r = ranksOf(e, input_index);
  const auto& c_ids = *r.c_ids;
  for (int64_t p = 0; p < r.prank; ++p) {
    const IterDomain* pid = r.p_ids[p];
    bool unexpanded = pid->isBroadcast() && pid->extent().isConst() && pid->extent().value == 1;
    if (map[p] >= 0 && unexpanded && !c_ids[map[p]]->isBroadcast() && !c_ids[map[p]]->isReduction()) map[p] = -1;
  }
  return map;
}

}  // namespace mf
