// propagate_shardings
// Requires: validate_meshes ran (inputs of a multi-device fusion have meshes).
// Guarantees: every tensor has a mesh when any does. The data layout of tensors the user gave a
//   mesh is never changed. Others get, forward, each device parallel type from the first input that
//   has it (in the order the op registry prefers: linear's weight, bias, input; matmul's B then A;
//   otherwise the most parallel input first), and then, backward from consumers, the parallel types
//   still missing (fusion inputs never get new ones). No tensor ends up with two iteration axes of
//   one parallel type. An annotated reduction whose operands are sharded along the reduced axis
//   gets that device split on its reduction axis (a partial result reduced across devices) when
//   that moves fewer bytes than resharding the operands (addReductionSplitIfCheaper). A partial
//   result nobody annotated whose every reader works on it split along one axis is scattered
//   there (one ReduceScatter instead of an Allreduce and a slice: scatterReductionForReaders).
#include <algorithm>
#include <set>

#include "ir/domain_map.h"
#include "multidevice/propagation.h"
#include "multidevice/sharding.h"
#include "passes/pass.h"

namespace mf {
namespace {

int64_t numDeviceDims(const TensorView* tv) {
  int64_t n = 0;
  for (ParallelType pt : kDeviceParallelTypes) n += shardedLoopId(tv, pt) != nullptr;
  return n;
}

// Input indices in the order their shardings are preferred.
std::vector<size_t> referenceOrder(const Expr* e) {
  std::vector<size_t> order;
  for (size_t i = 0; i < e->inputs().size(); ++i) {
    if (e->input(i)->isTensor()) order.push_back(i);
  }
  const std::vector<int>& preferred = opInfo(e->op()).propagation_order;
  if (!preferred.empty()) {
    std::vector<size_t> result;
    for (int p : preferred) {
      if (static_cast<size_t>(p) < e->inputs().size() && e->input(p)->isTensor()) result.push_back(p);
    }
    return result;
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return numDeviceDims(static_cast<TensorView*>(e->input(a))) > numDeviceDims(static_cast<TensorView*>(e->input(b)));
  });
  return order;
}

// Elements of tv's global shape, or -1 when an extent is symbolic.
int64_t staticNumel(const TensorView* tv) {
  int64_t n = 1;
  for (const IterDomain* id : tv->logicalNoReductions()) {
    if (!id->extent().isConst()) return -1;
    n *= id->extent().value;
  }
  return n;
}

// A reduction (linear, matmul, sum) whose operands are sharded on pt along an axis it reduces can run
// as a local partial result plus one reduction across devices (a ReduceScatter when the output is
// also sharded on pt, else an Allreduce). The output's reduction axes are not part of its data, so
// giving an annotated output that device split changes no layout the user asked for. It is given
// when it moves fewer bytes than making the operands whole along that axis (each sharded operand
// moves at least (d-1)/d of itself): (d-1)/d |out| for a ReduceScatter, twice that for an Allreduce.
// With symbolic extents the partial result is assumed cheaper (the operands hold the contraction).
void addReductionSplitIfCheaper(Expr* e, ParallelType pt) {
  if (!reduces(e->op())) return;
  TensorView* out = e->out();
  if (!out->hasMesh() || !out->mesh().hasParallelType(pt)) return;
  for (IterDomain* id : out->loop()) {
    if (id->parallelType() == pt && id->isReduction()) return;
  }
  int64_t k_axis = -1;
  DeviceSplit like;
  int64_t operand_elements = 0;
  bool symbolic = false;
  for (size_t i = 0; i < e->inputs().size(); ++i) {
    if (!e->input(i)->isTensor()) continue;
    auto* in = static_cast<TensorView*>(e->input(i));
    if (!in->hasMesh() || in->mesh() != out->mesh() || shardedLoopId(in, pt) == nullptr) continue;
    DeviceSplit s = deviceSplit(in, pt);
    int64_t c = mapProducerToConsumer(e, i)[s.axis];
    if (c < 0 || !out->rootOrLogical()[c]->isReduction()) continue;
    if (k_axis >= 0 && k_axis != c) return;
    k_axis = c;
    like = s;
    int64_t n = staticNumel(in);
    symbolic |= n < 0;
    operand_elements += std::max<int64_t>(n, 0);
  }
  if (k_axis < 0) return;
  int64_t out_elements = staticNumel(out);
  bool scattered = shardedLoopId(out, pt) != nullptr;
  bool cheaper = symbolic || out_elements < 0 || (scattered ? 1 : 2) * out_elements <= operand_elements;
  if (cheaper) shardAxis(out, k_axis, like, /*beside_other_kind=*/true);
}

// A reduction across devices on pt (a partial result) that nobody annotated, whose every reader
// computes on its data split on pt along one axis (a sequence-parallel residual add after a
// row-parallel linear) or reduces that axis away: it is scattered there at once. One
// ReduceScatter moves half the bytes of an Allreduce followed by a local slice; a reducing reader
// then sums its rows locally and reduces its smaller result across devices.
void scatterReductionForReaders(Fusion& fusion, Expr* e, ParallelType pt, const std::set<const TensorView*>& annotated) {
  if (!reduces(e->op()) || e->outputs().size() != 1) return;
  TensorView* out = e->out();
  if (annotated.count(out) || fusion.isOutput(out) || out->uses().empty() || !out->hasMesh()) return;
  bool partial = false;
  for (IterDomain* id : out->loop()) partial |= id->isReduction() && id->parallelType() == pt;
  if (!partial || shardedLoopId(out, pt) != nullptr) return;
  int64_t axis = -1;
  DeviceSplit wanted;
  // Readers that reduce over an axis (a bias gradient's sum over the rows): fine if it is the
  // scattered one, they become a partial sum plus an Allreduce of their (smaller) result.
  std::vector<std::pair<const Expr*, size_t>> reducing;
  for (Expr* use : out->uses()) {
    for (size_t i = 0; i < use->inputs().size(); ++i) {
      if (use->input(i) != out) continue;
      for (size_t o : dataOutputs(use)) {
        const TensorView* reader = use->outTensor(o);
        if (!reader->hasMesh() || reader->mesh() != out->mesh()) return;
        if (shardedLoopId(reader, pt) == nullptr) {
          if (!reduces(use->op()) || use->outputs().size() != 1) return;
          reducing.emplace_back(use, i);
          continue;
        }
        DeviceSplit cs = deviceSplit(reader, pt, /*to_root=*/true);
        auto p2c = mapProducerToConsumer(use, i, o);
        auto at = std::find(p2c.begin(), p2c.end(), cs.axis);
        if (at == p2c.end() || cs.whole_axis) return;
        int64_t a = at - p2c.begin();
        if (axis >= 0 && (a != axis || !(cs.signature == wanted.signature))) return;
        axis = a;
        wanted = cs;
      }
    }
  }
  if (axis < 0) return;
  for (auto [use, i] : reducing) {
    int64_t c = mapProducerToConsumer(use, i)[static_cast<size_t>(axis)];
    if (c < 0 || !use->out()->rootOrLogical()[static_cast<size_t>(c)]->isReduction()) return;
  }
  // `axis` counts out's non-reduction logical axes; shardAxis wants rootOrLogical.
  IterDomain* id = out->logicalNoReductions()[static_cast<size_t>(axis)];
  const auto& domain = out->rootOrLogical();
  int64_t index = std::find(domain.begin(), domain.end(), id) - domain.begin();
  if (index < static_cast<int64_t>(domain.size())) shardAxis(out, index, wanted, /*beside_other_kind=*/true);
}

class PropagateShardingsPass : public Pass {
 public:
  const char* name() const override { return "propagate_shardings"; }
  void run(Fusion& fusion) override {
    std::set<const TensorView*> annotated;
    bool any = false;
    for (const TensorView* tv : fusion.allTensors()) {
      if (tv->hasMesh()) annotated.insert(tv);
      any |= tv->hasMesh();
    }
    if (!any) return;
    std::vector<ParallelType> all(std::begin(kDeviceParallelTypes), std::end(kDeviceParallelTypes));
    auto exprs = fusion.exprs();
    for (Expr* e : exprs) {
      bool all_annotated = true;
      for (Val* out : e->outputs()) all_annotated &= annotated.count(static_cast<TensorView*>(out)) > 0;
      if (all_annotated) continue;
      for (size_t i : referenceOrder(e)) {
        shardConsumerLikeProducer(e, i, all, &annotated);
      }
    }
    for (Expr* e : exprs) {
      if (e->outputs().size() != 1 || !annotated.count(e->out())) continue;
      for (ParallelType pt : all) addReductionSplitIfCheaper(e, pt);
    }
    for (auto it = exprs.rbegin(); it != exprs.rend(); ++it) {
      Expr* e = *it;
      for (size_t i = 0; i < e->inputs().size(); ++i) {
        if (!e->input(i)->isTensor()) continue;
        auto* in = static_cast<TensorView*>(e->input(i));
        if (annotated.count(in)) continue;
        if (fusion.isInput(in)) {
          if (!in->hasMesh()) in->setDeviceMesh(e->outTensor(0)->mesh());
          continue;
        }
        shardProducerLikeConsumer(e, i, in, all, /*include_reduction_dids=*/false);
      }
    }
    for (Expr* e : exprs) {
      for (ParallelType pt : all) scatterReductionForReaders(fusion, e, pt, annotated);
    }
  }
};

}  // namespace

std::unique_ptr<Pass> makePropagateShardingsPass() { return std::make_unique<PropagateShardingsPass>(); }

}  // namespace mf
