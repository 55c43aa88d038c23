#include "ir/domain_map.h"

#include <algorithm>

#include "ir/extent_expr.h"
#include "ir/fusion.h"
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

Ranks ranksOf(const Expr* e, size_t input_index, size_t output_index = 0) {
  MF_CHECK(e->input(input_index)->isTensor(), "input ", input_index, " of ", e->toString(), " is not a tensor");
  auto* producer = static_cast<TensorView*>(e->input(input_index));
  Ranks r;
  r.p_ids = producer->logicalNoReductions();
  r.c_ids = &e->outTensor(output_index)->rootOrLogical();
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
  for (int64_t p = 0; p < r.prank; ++p) map[p] = e->attr<Ints>("broadcast_dims")[p];
  return map;
}

std::vector<int64_t> mapSqueeze(const Expr* e, size_t input_index) {
  Ranks r = ranksOf(e, input_index);
  std::vector<int64_t> map(r.prank);
  int64_t c = 0;
  for (int64_t p = 0; p < r.prank; ++p) {
    bool dropped = false;
    for (int64_t d : e->attr<Ints>("dims")) dropped |= d == p;
    map[p] = dropped ? -1 : c++;
  }
  return map;
}

std::vector<int64_t> mapPermute(const Expr* e, size_t input_index) {
  Ranks r = ranksOf(e, input_index);
  std::vector<int64_t> map(r.prank, -1);
  for (int64_t c = 0; c < r.crank; ++c) map[e->attr<Ints>("dims")[c]] = c;
  return map;
}

// Walks both shapes, grouping axes whose products agree; the outermost producer axis of a group
// maps to the outermost consumer axis of the group (a sharded outermost axis stays sharded).
// Symbolic extents compare as products of symbols: [s0, 4096] -> [s0, 32, 128] groups s0 with s0,
// [s0, s1, s2] -> [-1, s2] (whose -1 is "(s0*s1)") groups s0, s1 with the rows and s2 with s2. The
// extents are read as written first (an op may have unified "s3*s4" with another product), then
// through their unified representatives.
std::vector<int64_t> mapReshape(const Expr* e, size_t input_index) {
  Ranks r = ranksOf(e, input_index);
  const Fusion& f = *e->out()->fusion();
  const auto& in = r.p_ids;
  const auto& out = *r.c_ids;
  auto times = [](ExtentFactors a, const ExtentFactors& b) {
    a.constant *= b.constant;
    a.atoms.insert(a.atoms.end(), b.atoms.begin(), b.atoms.end());
    std::sort(a.atoms.begin(), a.atoms.end());
    return a;
  };
  // The map found with `factors`; `complete` says whether every axis found its group.
  auto group = [&](ExtentFactors (*factors)(const Fusion&, const Extent&), bool* complete) {
    std::vector<int64_t> map(in.size(), -1);
    *complete = false;
    size_t i = 0, o = 0;
    while (i < in.size() && o < out.size()) {
      size_t gi = i, go = o;
      ExtentFactors pi = factors(f, in[i]->extent()), po = factors(f, out[o]->extent());
      while (!(pi == po)) {
        if (pi.divides(po)) {
          if (++i >= in.size()) return map;
          pi = times(pi, factors(f, in[i]->extent()));
        } else if (po.divides(pi)) {
          if (++o >= out.size()) return map;
          po = times(po, factors(f, out[o]->extent()));
        } else {
          return map;
        }
      }
      map[gi] = static_cast<int64_t>(go);
      ++i;
      ++o;
    }
    *complete = true;
    return map;
  };
  bool complete = false;
  std::vector<int64_t> written = group(&factorsAsWritten, &complete);
  if (complete) return written;
  std::vector<int64_t> unified = group(&factorsOf, &complete);
  auto mapped = [](const std::vector<int64_t>& m) { return std::count_if(m.begin(), m.end(), [](int64_t c) { return c >= 0; }); };
  return complete || mapped(unified) > mapped(written) ? unified : written;
}

std::vector<int64_t> mapResized(const Expr* e, size_t input_index) {
  Ranks r = ranksOf(e, input_index);
  const Fusion& f = *e->out()->fusion();
  std::vector<int64_t> map(r.prank, -1);
  for (int64_t p = 0; p < r.prank; ++p) {
    int64_t c = p + (r.crank - r.prank);
    const IterDomain* cid = (*r.c_ids)[c];
    if (factorsOf(f, r.p_ids[p]->extent()) == factorsOf(f, cid->extent())) map[p] = c;
  }
  return map;
}

// Pad: only axes with no width keep their data in place (widths [1, -1] keep the extent but shift).
std::vector<int64_t> mapPad(const Expr* e, size_t input_index) {
  Ranks r = ranksOf(e, input_index);
  const Ints& widths = e->attr<Ints>("pad_widths");
  std::vector<int64_t> map(r.prank);
  for (int64_t p = 0; p < r.prank; ++p) {
    size_t from_last = static_cast<size_t>(r.prank - 1 - p);
    bool padded = 2 * from_last < widths.size() && (widths[2 * from_last] != 0 || widths[2 * from_last + 1] != 0);
    map[p] = padded ? -1 : p;
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

std::vector<int64_t> mapAttention(const Expr* e, size_t input_index, size_t output_index) {
  Ranks r = ranksOf(e, input_index, output_index);
  // q is input 0 of the forward and input 1 of the backward; its axes are [lead.., seq, head_dim].
  size_t q_index = e->op() == OpType::SdpfaBwd ? 1 : 0;
  int64_t lead = rankOf(e->input(q_index)) - 2;
  std::vector<int64_t> map(r.prank, -1);
  for (int64_t p = 0; p < r.prank && p < lead && p < r.crank; ++p) map[p] = p;
  // Without a causal mask each query row is independent of the others: q's sequence maps onto the
  // forward's outputs (attn, logsumexp), so a query split on it stays local. A causal mask needs
  // global positions, and the backward sums over every query row for grad_k and grad_v.
  bool rows_independent = e->op() == OpType::SdpfaFwd && !e->attr<bool>("is_causal");
  if (rows_independent && input_index == 0 && output_index <= 1 && r.prank > lead) map[lead] = lead;
  return map;
}

// out = [*indices.shape, dim] or, as partial_gathers makes it, [*indices.shape, dim, r{rows}]:
// indices axes in order, then the weight's embedding axis. The weight's vocabulary axis is
// gathered from: it maps to the trailing reduction when there is one, else to no output axis.
std::vector<int64_t> mapEmbedding(const Expr* e, size_t input_index) {
  Ranks r = ranksOf(e, input_index);
  std::vector<int64_t> map(r.prank, -1);
  if (input_index == 0) {
    for (int64_t p = 0; p < r.prank; ++p) map[p] = p;
    return map;
  }
  bool partial = r.crank == rankOf(e->input(0)) + 2;
  map[0] = partial ? r.crank - 1 : -1;
  map[1] = partial ? r.crank - 2 : r.crank - 1;
  return map;
}

std::vector<int64_t> mapAlongDimOutputs(const Expr* e, size_t input_index, size_t output_index) {
  Ranks r = ranksOf(e, input_index, output_index);
  std::vector<int64_t> map(r.prank);
  for (int64_t p = 0; p < r.prank; ++p) map[p] = p == e->attr<int64_t>("dim") ? -1 : p;
  return map;
}

std::vector<int64_t> mapAlongDim(const Expr* e, size_t input_index) { return mapAlongDimOutputs(e, input_index, 0); }

std::vector<int64_t> mapIndexSelect(const Expr* e, size_t input_index) {
  if (input_index == 0) return mapAlongDim(e, 0);
  return {e->attr<int64_t>("dim")};
}

namespace {
// Axes of input `input_index` other than `dim` map onto the same output axis where the extents
// agree (same rank only).
std::vector<int64_t> mapSameExtents(const Expr* e, size_t input_index) {
  Ranks r = ranksOf(e, input_index);
  const Fusion& f = *e->out()->fusion();
  std::vector<int64_t> map(r.prank, -1);
  if (r.prank != r.crank) return map;
  for (int64_t p = 0; p < r.prank; ++p) {
    if (p != e->attr<int64_t>("dim") && factorsOf(f, r.p_ids[p]->extent()) == factorsOf(f, (*r.c_ids)[p]->extent())) map[p] = p;
  }
  return map;
}
}  // namespace

std::vector<int64_t> mapGatherAlong(const Expr* e, size_t input_index) {
  if (input_index == 0) return mapSameExtents(e, 0);
  Ranks r = ranksOf(e, input_index);
  std::vector<int64_t> map(r.prank);
  for (int64_t p = 0; p < r.prank; ++p) map[p] = p;
  return map;
}

std::vector<int64_t> mapScatter(const Expr* e, size_t input_index) {
  if (input_index == 0) return mapAlongDim(e, 0);
  return mapSameExtents(e, input_index);
}

std::vector<int64_t> mapGroupedMm(const Expr* e, size_t input_index) {
  Ranks r = ranksOf(e, input_index);
  std::vector<int64_t> map(r.prank, -1);
  const int64_t rank1 = rankOf(e->input(0)), rank2 = rankOf(e->input(1));
  if (input_index == 2) return map;  // offsets
  // k maps to the output's trailing r{k} (2-D x 3-D and 3-D x 3-D; the root of an rfactored partial).
  const bool has_k = r.crank > 0 && (*r.c_ids)[r.crank - 1]->isReduction();
  if (rank1 == 3 && rank2 == 3) {    // [g, m, k] x [g, k, n] -> [g, m, n, r{k}]
    map[0] = 0;
    if (input_index == 0) map[1] = 1;
    else map[2] = 2;
  } else if (rank1 == 2 && rank2 == 3) {  // [m, k] x [g, k, n] -> [m, n, r{k}]: rows follow the offsets
    if (input_index == 1) map[2] = 1;
  } else if (rank1 == 2 && rank2 == 2) {  // [m, k] x [k, n] -> [g, m, n]: k follows the offsets
    if (input_index == 0) map[0] = 1;
    else map[1] = 2;
  }
  if (has_k && rank2 == 3) map[input_index == 0 ? rank1 - 1 : 1] = r.crank - 1;
  return map;
}

std::vector<int64_t> mapNothing(const Expr* e, size_t input_index) {
  return std::vector<int64_t>(ranksOf(e, input_index).prank, -1);
}

std::vector<int64_t> mapProducerToConsumer(const Expr* e, size_t input_index, size_t output_index) {
  const OpInfo& info = opInfo(e->op());
  MF_CHECK(info.output_axis_map != nullptr || output_index == 0, info.name, " has one output; asked for output ",
           output_index);
  std::vector<int64_t> map = info.output_axis_map != nullptr ? info.output_axis_map(e, input_index, output_index)
                                                              : info.axis_map(e, input_index);
  Ranks r = ranksOf(e, input_index, output_index);
  const auto& c_ids = *r.c_ids;
  for (int64_t p = 0; p < r.prank; ++p) {
    const IterDomain* pid = r.p_ids[p];
    bool unexpanded = pid->isBroadcast() && pid->extent().isConst() && pid->extent().value == 1;
    if (map[p] >= 0 && unexpanded && !c_ids[map[p]]->isBroadcast() && !c_ids[map[p]]->isReduction()) map[p] = -1;
  }
  return map;
}

}  // namespace mf
