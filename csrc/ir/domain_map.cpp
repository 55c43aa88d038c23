#include "ir/domain_map.h"

#include "support/error.h"

namespace mf {
namespace {

std::vector<int64_t> reshapeMap(const std::vector<IterDomain*>& in, const std::vector<IterDomain*>& out) {
  // Walk both shapes, grouping axes whose products agree; the outermost producer axis of a group
  // maps to the outermost consumer axis of the group.
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

}  // namespace

std::vector<int64_t> mapProducerToConsumer(const Expr* e, size_t input_index) {
  MF_CHECK(e->input(input_index)->isTensor(), "input ", input_index, " of ", e->toString(), " is not a tensor");
  auto* producer = static_cast<TensorView*>(e->input(input_index));
  TensorView* consumer = e->out();
  auto p_ids = producer->logicalNoReductions();
  const auto& c_ids = consumer->rootOrLogical();
  int64_t prank = static_cast<int64_t>(p_ids.size());
  int64_t crank = static_cast<int64_t>(c_ids.size());
  std::vector<int64_t> map(prank, -1);
  const ExprAttrs& attrs = e->attrs();
  OpType op = e->op();
  if (isPointwise(op) || isReduction(op)) {
    for (int64_t p = 0; p < prank; ++p) map[p] = p + (crank - prank);
  } else if (op == OpType::BroadcastInDim) {
    for (int64_t p = 0; p < prank; ++p) map[p] = attrs.dims[p];
  } else if (op == OpType::Squeeze) {
    int64_t c = 0;
    for (int64_t p = 0; p < prank; ++p) {
      bool dropped = false;
      for (int64_t d : attrs.dims) dropped |= d == p;
      map[p] = dropped ? -1 : c++;
    }
  } else if (op == OpType::Permute) {
    for (int64_t c = 0; c < crank; ++c) map[attrs.dims[c]] = c;
  } else if (op == OpType::Reshape) {
    map = reshapeMap(p_ids, c_ids);
  } else if (op == OpType::Linear) {
    // out = [batch..., n?, r{k}]
    if (input_index == 0) {
      for (int64_t p = 0; p + 1 < prank; ++p) map[p] = p;
      map[prank - 1] = crank - 1;
    } else if (input_index == 1) {
      if (prank == 2) {
        map[0] = crank - 2;
        map[1] = crank - 1;
      } else {
        map[0] = crank - 1;
      }
    } else if (prank == 1) {
      map[0] = crank - 2;
    }
  } else if (op == OpType::Matmul) {
    auto* a = static_cast<TensorView*>(e->input(0));
    auto* b = static_cast<TensorView*>(e->input(1));
    int64_t arank = static_cast<int64_t>(a->logicalNoReductions().size());
    int64_t brank = static_cast<int64_t>(b->logicalNoReductions().size());
    // Output axes: batch..., m (if arank >= 2), n (if brank >= 2), r{k}.
    int64_t n_pos = brank >= 2 ? crank - 2 : -1;
    int64_t m_pos = arank >= 2 ? (brank >= 2 ? crank - 3 : crank - 2) : -1;
    int64_t batch_end = m_pos >= 0 ? m_pos : (n_pos >= 0 ? n_pos : crank - 1);
    if (input_index == 0) {
      map[prank - 1] = crank - 1;
      if (prank >= 2) {
        map[prank - 2] = m_pos;
        for (int64_t p = 0; p < prank - 2; ++p) map[p] = batch_end - (prank - 2) + p;
      }
    } else {
      if (prank == 1) {
        map[0] = crank - 1;
      } else {
        map[prank - 2] = crank - 1;
        map[prank - 1] = n_pos;
        for (int64_t p = 0; p < prank - 2; ++p) map[p] = batch_end - (prank - 2) + p;
      }
    }
  } else {
    MF_THROW_INTERNAL("no domain map for ", toString(op));
  }
  // Broadcast producer axes carry no data along a non-broadcast consumer axis.
  for (int64_t p = 0; p < prank; ++p) {
    if (map[p] >= 0 && p_ids[p]->isBroadcast() && !c_ids[map[p]]->isBroadcast() && !c_ids[map[p]]->isReduction()) {
      map[p] = -1;
    }
  }
  return map;
}

}  // namespace mf
