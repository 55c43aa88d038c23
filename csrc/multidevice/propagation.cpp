#include "multidevice/propagation.h"

#include <algorithm>

#include "ir/domain_map.h"
#include "ir/fusion.h"
#include "multidevice/sharding.h"
#include "support/error.h"

namespace mf {

namespace {

// shardProducerLikeConsumer for one output of e: the first output that shards a type wins.
void shardProducerLikeOutput(const Expr* e, size_t input_index, size_t output_index, TensorView* producer,
                             const std::vector<ParallelType>& pts, bool include_reduction_dids) {
  TensorView* consumer = e->outTensor(output_index);
  if (!consumer->hasMesh()) return;
  if (!producer->hasMesh()) producer->setDeviceMesh(consumer->mesh());
  if (consumer->mesh() != producer->mesh()) return;
  auto p2c = mapProducerToConsumer(e, input_index, output_index);
  const auto& c_domain = consumer->rootOrLogical();
  for (ParallelType pt : byDepth(consumer, pts)) {
    // The consumer loop axis with pt, reductions included on request.
    IterDomain* loop_id = nullptr;
    for (IterDomain* id : consumer->loop()) {
      if (id->parallelType() == pt && (include_reduction_dids || !id->isReduction())) loop_id = id;
    }
    if (loop_id == nullptr) continue;
    // Trace it to the consumer's root/logical through splits (any nesting: interleaved too).
    IterDomain* root = loop_id;
    while (root != nullptr && std::find(c_domain.begin(), c_domain.end(), root) == c_domain.end()) {
      IdTransform* t = root->definition();
      root = t != nullptr && t->kind() == IdTransform::Kind::Split ? t->inputs()[0] : nullptr;
    }
    if (root == nullptr) continue;
    DeviceSplit cs = deviceSplitOf(consumer, loop_id, c_domain);
    int64_t c_axis = cs.axis;
    auto it = std::find(p2c.begin(), p2c.end(), c_axis);
    if (it == p2c.end()) continue;
    int64_t p_axis = it - p2c.begin();
    // p_axis counts the producer's non-reduction logical axes; shardAxis wants rootOrLogical.
    IterDomain* p_id = producer->logicalNoReductions()[p_axis];
    const auto& p_domain = producer->rootOrLogical();
    int64_t p_index = std::find(p_domain.begin(), p_domain.end(), p_id) - p_domain.begin();
    if (p_index >= static_cast<int64_t>(p_domain.size())) continue;
    if (layoutCarriesOver(e, cs, p_id, c_domain[static_cast<size_t>(c_axis)])) shardAxis(producer, p_index, cs);
  }
}

}  // namespace

bool layoutCarriesOver(const Expr* e, const DeviceSplit& s, const IterDomain* from, const IterDomain* to) {
  return !opInfo(e->op()).regroups_axes || s.blocked() || s.whole_axis || from->extent() == to->extent();
}

bool shardAxis(TensorView* tv, int64_t axis, ParallelType pt, int64_t num_devices, bool whole_axis,
               bool beside_other_kind) {
  DeviceSplit like;
  like.pt = pt;
  like.num_devices = num_devices;
  like.whole_axis = whole_axis;
  return shardAxis(tv, axis, like, beside_other_kind);
}

bool shardAxis(TensorView* tv, int64_t axis, const DeviceSplit& like, bool beside_other_kind) {
  const ParallelType pt = like.pt;
  const int64_t d = like.num_devices;
  IterDomain* id = tv->rootOrLogical().at(axis);
  for (IterDomain* other : tv->loop()) {
    if (other->parallelType() != pt) continue;
    if (!beside_other_kind || other->isReduction() == id->isReduction()) return false;
  }
  auto in_loop = [&](const IterDomain* x) { return std::find(tv->loop().begin(), tv->loop().end(), x) != tv->loop().end(); };
  // The axis itself, or the part of it that other device splits left: a piece of d elements
  // placed as `like` says (the copy of an outer device split left it), else the one part left.
  IterDomain* target = id;
  if (!in_loop(id)) {
    if (like.whole_axis) return false;
    std::vector<IterDomain*> leaves = splitLeaves(tv, id);
    std::vector<IterDomain*> parts;
    for (IterDomain* leaf : leaves) {
      if (leaf->parallelType() == pt) return false;  // already split on pt (an rfactored partial, say)
      if (!leaf->isDeviceDim()) parts.push_back(leaf);
    }
    auto product = [&](size_t from, size_t to) {
      int64_t p = 1;
      for (size_t i = from; i < to; ++i) {
        if (!parts[i]->extent().isConst()) return DeviceSplit::kRest;
        p *= parts[i]->extent().value;
      }
      return p;
    };
    for (size_t i = 0; i < parts.size(); ++i) {
      const Extent& e = parts[i]->extent();
      bool placed = like.outer != DeviceSplit::kRest ? product(0, i) == like.outer
                                                     : product(i + 1, parts.size()) == like.inner;
      if (e.isConst() && e.value == d && placed && in_loop(parts[i])) {
        tv->parallelize(std::find(tv->loop().begin(), tv->loop().end(), parts[i]) - tv->loop().begin(), pt);
        return true;
      }
    }
    if (parts.size() != 1 || !in_loop(parts[0])) return false;
    target = parts[0];
  }
  int64_t pos = std::find(tv->loop().begin(), tv->loop().end(), target) - tv->loop().begin();
  const Extent& extent = target->extent();
  if (like.whole_axis) {
    MF_USER_CHECK(!extent.isConst() || extent.value == d, tv->toString(), ": cannot shard axis ", axis, " (",
                  id->toString(), ") as a device axis: its extent is ", extent.toString(), " but the mesh has ", d,
                  " devices along ", toString(pt));
    tv->parallelize(pos, pt);
    return true;
  }
  // Nested in another device split, an indivisible part means this layout does not fit here.
  if (target != id && extent.isConst()) {
    int64_t need = like.outer == 1 || like.inner_all == 1 ? d : like.outer != DeviceSplit::kRest ? like.outer * d : like.inner_all * d;
    if (extent.value % need != 0) return false;
  }
  auto check_divides = [&](int64_t n) {
    MF_USER_CHECK(!extent.isConst() || extent.value % n == 0, tv->toString(), ": sharding propagates to axis ", axis,
                  " (", target->toString(), ") whose extent ", extent.value, " is not divisible by ",
                  n == d ? "the " : std::to_string(n) + ", ", d, " devices along ", toString(pt));
  };
  if (like.outer == 1) {  // [d, rest]
    check_divides(d);
    tv->split(pos, d, /*inner_split=*/false);
    tv->parallelize(pos, pt);
  } else if (like.inner_all == 1) {  // [rest, d]
    check_divides(d);
    tv->split(pos, d, /*inner_split=*/true);
    tv->parallelize(pos + 1, pt);
  } else if (like.outer != DeviceSplit::kRest) {  // [outer, d, rest]
    check_divides(like.outer * d);
    tv->split(pos, like.outer, /*inner_split=*/false);
    tv->split(pos + 1, d, /*inner_split=*/false);
    tv->parallelize(pos + 1, pt);
  } else {  // [rest, d, inner] (inner holding the device pieces that come after, for their copy)
    check_divides(like.inner_all * d);
    tv->split(pos, like.inner_all, /*inner_split=*/true);
    tv->split(pos, d, /*inner_split=*/true);
    tv->parallelize(pos + 1, pt);
  }
  return true;
}

void shardConsumerLikeProducer(const Expr* e, size_t input_index, const std::vector<ParallelType>& pts,
                               const std::set<const TensorView*>* keep) {
  auto* producer = static_cast<TensorView*>(e->input(input_index));
  if (!producer->hasMesh()) return;
  auto kept = [&](const TensorView* tv) { return keep != nullptr && keep->count(tv) > 0; };
  for (Val* v : e->outputs()) {  // every output lives on the mesh, the RNG state too
    auto* out = static_cast<TensorView*>(v);
    if (v->isTensor() && !out->hasMesh() && !kept(out)) out->setDeviceMesh(producer->mesh());
  }
  for (size_t o : dataOutputs(e)) {
    TensorView* consumer = e->outTensor(o);
    if (kept(consumer) || consumer->mesh() != producer->mesh()) continue;
    auto p2c = mapProducerToConsumer(e, input_index, o);
    for (ParallelType pt : byDepth(producer, pts)) {
      if (shardedLoopId(producer, pt) == nullptr) continue;
      DeviceSplit s = deviceSplit(producer, pt);
      int64_t c = p2c[s.axis];
      if (c < 0) continue;
      if (layoutCarriesOver(e, s, producer->logicalNoReductions()[static_cast<size_t>(s.axis)],
                            consumer->rootOrLogical()[static_cast<size_t>(c)])) {
        shardAxis(consumer, c, s);
      }
    }
  }
}

void shardProducerLikeConsumer(const Expr* e, size_t input_index, TensorView* producer,
                               const std::vector<ParallelType>& pts, bool include_reduction_dids) {
  for (size_t o : dataOutputs(e)) shardProducerLikeOutput(e, input_index, o, producer, pts, include_reduction_dids);
}

TensorView* newTensorLike(TensorView* tv, bool keep_reductions) {
  Fusion& f = *tv->fusion();
  std::vector<IterDomain*> ids;
  for (IterDomain* id : keep_reductions ? tv->logical() : tv->logicalNoReductions()) {
    ids.push_back(f.newIterDomain(id->extent(), id->iterType()));
  }
  TensorView* t = f.newTensor(tv->dtype(), ids);
  t->setDeviceMesh(tv->mesh());
  return t;
}

}  // namespace mf
