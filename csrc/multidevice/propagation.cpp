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
  for (ParallelType pt : pts) {
    // The consumer loop axis with pt, reductions included on request.
    IterDomain* loop_id = nullptr;
    for (IterDomain* id : consumer->loop()) {
      if (id->parallelType() == pt && (include_reduction_dids || !id->isReduction())) loop_id = id;
    }
    if (loop_id == nullptr) continue;
    // Trace it to the consumer's root/logical: the axis itself, or the input of an outer split.
    int64_t c_axis = -1;
    bool whole = false;
    auto pos = std::find(c_domain.begin(), c_domain.end(), loop_id);
    if (pos != c_domain.end()) {
      c_axis = pos - c_domain.begin();
      whole = true;
    } else if (IdTransform* t = loop_id->definition();
               t && t->kind() == IdTransform::Kind::Split && !t->innerSplit() && t->outputs()[0] == loop_id) {
      auto in_pos = std::find(c_domain.begin(), c_domain.end(), t->inputs()[0]);
      if (in_pos != c_domain.end()) c_axis = in_pos - c_domain.begin();
    }
    if (c_axis < 0) continue;
    auto it = std::find(p2c.begin(), p2c.end(), c_axis);
    if (it == p2c.end()) continue;
    int64_t p_axis = it - p2c.begin();
    // p_axis counts the producer's non-reduction logical axes; shardAxis wants rootOrLogical.
    IterDomain* p_id = producer->logicalNoReductions()[p_axis];
    const auto& p_domain = producer->rootOrLogical();
    int64_t p_index = std::find(p_domain.begin(), p_domain.end(), p_id) - p_domain.begin();
    if (p_index >= static_cast<int64_t>(p_domain.size())) continue;
    shardAxis(producer, p_index, pt, consumer->mesh().size(pt), whole);
  }
}

}  // namespace

bool shardAxis(TensorView* tv, int64_t axis, ParallelType pt, int64_t num_devices, bool whole_axis,
               bool beside_other_kind) {
  IterDomain* id = tv->rootOrLogical().at(axis);
  for (IterDomain* other : tv->loop()) {
    if (other->parallelType() != pt) continue;
    if (!beside_other_kind || other->isReduction() == id->isReduction()) return false;
  }
  auto it = std::find(tv->loop().begin(), tv->loop().end(), id);
  if (it == tv->loop().end()) return false;
  int64_t pos = it - tv->loop().begin();
  if (whole_axis) {
    MF_USER_CHECK(!id->extent().isConst() || id->extent().value == num_devices, tv->toString(), ": cannot shard axis ",
                  axis, " (", id->toString(), ") as a device axis: its extent is ", id->extent().toString(),
                  " but the mesh has ", num_devices, " devices along ", toString(pt));
    tv->parallelize(pos, pt);
    return true;
  }
  MF_USER_CHECK(!id->extent().isConst() || id->extent().value % num_devices == 0, tv->toString(),
                ": sharding propagates to axis ", axis, " (", id->toString(), ") whose extent ", id->extent().value,
                " is not divisible by the ", num_devices, " devices along ", toString(pt));
  tv->split(pos, num_devices, /*inner_split=*/false);
  tv->parallelize(pos, pt);
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
    for (ParallelType pt : pts) {
      if (shardedLoopId(producer, pt) == nullptr) continue;
      DeviceSplit s = deviceSplit(producer, pt);
      int64_t c = p2c[s.axis];
      if (c < 0) continue;
      shardAxis(consumer, c, pt, s.num_devices, s.whole_axis);
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
