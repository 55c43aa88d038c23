#include "multidevice/sharding.h"

#include <algorithm>

#include "ir/domain_map.h"
#include "support/error.h"

namespace mf {

IterDomain* shardedLoopId(const TensorView* tv, ParallelType pt) {
  for (IterDomain* id : tv->loop()) {
    if (!id->isReduction() && id->parallelType() == pt) return id;
  }
  return nullptr;
}

bool isSharded(const TensorView* tv) {
  for (ParallelType pt : kDeviceParallelTypes) {
    if (shardedLoopId(tv, pt) != nullptr) return true;
  }
  return false;
}

DeviceSplit deviceSplit(const TensorView* tv, ParallelType pt, bool to_root) {
  DeviceSplit s;
  s.pt = pt;
  s.loop_id = shardedLoopId(tv, pt);
  MF_CHECK(s.loop_id != nullptr, tv->toString(), " is not sharded on ", toString(pt));
  s.num_devices = tv->mesh().size(pt);
  const std::vector<IterDomain*> domain = to_root ? tv->rootOrLogical() : tv->logicalNoReductions();
  auto index_in = [&](const IterDomain* id) {
    auto it = std::find(domain.begin(), domain.end(), id);
    return it == domain.end() ? -1 : static_cast<int64_t>(it - domain.begin());
  };
  IterDomain* id = s.loop_id;
  if (index_in(id) >= 0) {
    s.axis = index_in(id);
    s.whole_axis = true;
    return s;
  }
  IdTransform* t = id->definition();
  MF_USER_CHECK(t != nullptr && t->kind() == IdTransform::Kind::Split && !t->innerSplit() && t->outputs()[0] == id,
                tv->toString(), ": ", toString(pt), " is on ", id->toString(),
                ", which is not the outer output of an outer split; shard an axis with "
                "split(axis, num_devices, inner_split=False) and parallelize the outer part");
  s.axis = index_in(t->inputs()[0]);
  MF_USER_CHECK(s.axis >= 0, tv->toString(), ": ", toString(pt), " is on ", id->toString(),
                ", which splits an axis that is itself a split or merge; only one outer split of a logical axis ",
                "can be sharded in this version");
  return s;
}

int64_t shardedAxis(const TensorView* tv, ParallelType pt) {
  if (!tv->hasMesh() || shardedLoopId(tv, pt) == nullptr) return -1;
  return deviceSplit(tv, pt).axis;
}

std::vector<int64_t> shardsPerAxis(const TensorView* tv) {
  std::vector<int64_t> shards(tv->logicalNoReductions().size(), 1);
  if (!tv->hasMesh()) return shards;
  if (tv->hasAllocation()) {
    // The allocation domain finalize_allocation wrote: each device axis in it divides the logical
    // axis it came from (or is that axis, for a logical split).
    auto logical = tv->logicalNoReductions();
    for (const IterDomain* id : tv->allocation()) {
      if (!id->isDeviceDim() || id->isReduction()) continue;
      const IterDomain* source = id;
      if (std::find(logical.begin(), logical.end(), id) == logical.end()) {
        MF_CHECK(id->definition() != nullptr && id->definition()->kind() == IdTransform::Kind::Split, tv->toString(),
                 ": allocation axis ", id->toString(), " is not a split of a logical axis");
        source = id->definition()->inputs()[0];
      }
      auto it = std::find(logical.begin(), logical.end(), source);
      MF_CHECK(it != logical.end(), tv->toString(), ": allocation axis ", id->toString(), " does not come from a logical axis");
      shards[it - logical.begin()] *= tv->mesh().size(id->parallelType());
    }
    return shards;
  }
  for (ParallelType pt : kDeviceParallelTypes) {
    if (shardedLoopId(tv, pt) == nullptr) continue;
    DeviceSplit s = deviceSplit(tv, pt);
    shards[s.axis] *= s.num_devices;
  }
  return shards;
}

std::vector<int64_t> localShape(const TensorView* tv, const std::vector<int64_t>& global_shape) {
  std::vector<int64_t> local = global_shape;
  auto shards = shardsPerAxis(tv);
  MF_CHECK(shards.size() == local.size(), "rank mismatch for ", tv->toString());
  for (size_t a = 0; a < local.size(); ++a) {
    if (shards[a] == 1) continue;
    auto ids = tv->logicalNoReductions();
    if (ids[a]->isDeviceDim()) {
      local[a] = 1;  // logical split: the axis is the device axis
    } else {
      MF_USER_CHECK(local[a] % shards[a] == 0, tv->toString(), ": axis ", a, " has global extent ", local[a],
                    ", which does not divide evenly into ", shards[a], " shards; uneven sharding is not supported yet");
      local[a] /= shards[a];
    }
  }
  return local;
}

std::vector<size_t> dataOutputs(const Expr* e) {
  const auto& free = opInfo(e->op()).sharding_free_outputs;
  std::vector<size_t> outs;
  for (size_t o = 0; o < e->outputs().size(); ++o) {
    if (!e->output(o)->isTensor()) continue;
    if (std::find(free.begin(), free.end(), static_cast<int>(o)) != free.end()) continue;
    outs.push_back(o);
  }
  return outs;
}

namespace {

// Whether a tensor input of e other than `input_index` maps one of its axes onto `axis` of output
// `output_index`.
bool otherInputMapsOnto(const Expr* e, size_t input_index, size_t output_index, int64_t axis) {
  for (size_t i = 0; i < e->inputs().size(); ++i) {
    if (i == input_index || !e->input(i)->isTensor()) continue;
    auto map = mapProducerToConsumer(e, i, output_index);
    if (std::find(map.begin(), map.end(), axis) != map.end()) return true;
  }
  return false;
}

std::vector<ParallelType> reshardedTypesTo(const Expr* e, size_t input_index, size_t output_index) {
  std::vector<ParallelType> changed;
  auto* producer = static_cast<const TensorView*>(e->input(input_index));
  const TensorView* consumer = e->outTensor(output_index);
  if (!producer->hasMesh() && !consumer->hasMesh()) return changed;
  bool meshes_differ = producer->mesh() != consumer->mesh();
  std::vector<int64_t> p2c;
  for (ParallelType pt : kDeviceParallelTypes) {
    bool p_has = producer->hasMesh() && shardedLoopId(producer, pt) != nullptr;
    bool c_has = consumer->hasMesh() && shardedLoopId(consumer, pt) != nullptr;
    bool in_mesh = producer->mesh().hasParallelType(pt) || consumer->mesh().hasParallelType(pt);
    if (meshes_differ && in_mesh) {
      changed.push_back(pt);
      continue;
    }
    if (!p_has && !c_has) continue;
    if (p2c.empty()) p2c = mapProducerToConsumer(e, input_index, output_index);
    if (!p_has) {
      // The consumer shards an axis this producer does not have (e.g. the weight's out_features
      // seen from a replicated input): every device already holds what it needs.
      // Not so for an op that regroups the producer's axes (reshape, attention): there an output
      // axis split across devices must be the split of an input axis that maps onto it, from
      // this producer or another one (attention's query sequence, not seen from k or v).
      DeviceSplit cs = deviceSplit(consumer, pt, /*to_root=*/true);
      bool fresh_axis = std::find(p2c.begin(), p2c.end(), cs.axis) == p2c.end();
      // A producer without axes holds one value, which every device has.
      if (fresh_axis && (!opInfo(e->op()).regroups_axes || p2c.empty() ||
                         otherInputMapsOnto(e, input_index, output_index, cs.axis))) {
        continue;
      }
    }
    if (p_has != c_has) {
      changed.push_back(pt);
      continue;
    }
    DeviceSplit ps = deviceSplit(producer, pt);
    DeviceSplit cs = deviceSplit(consumer, pt, /*to_root=*/true);
    ps.axis = p2c[ps.axis];
    if (!(ps == cs) || ps.axis < 0) changed.push_back(pt);
  }
  return changed;
}

}  // namespace

std::vector<ParallelType> reshardedTypes(const Expr* e, size_t input_index) {
  std::vector<ParallelType> changed;
  for (size_t o : dataOutputs(e)) {
    for (ParallelType pt : reshardedTypesTo(e, input_index, o)) {
      if (std::find(changed.begin(), changed.end(), pt) == changed.end()) changed.push_back(pt);
    }
  }
  std::sort(changed.begin(), changed.end());
  return changed;
}

bool isResharding(const Expr* e) {
  for (size_t i = 0; i < e->inputs().size(); ++i) {
    if (e->input(i)->isTensor() && !reshardedTypes(e, i).empty()) return true;
  }
  return false;
}

}  // namespace mf
