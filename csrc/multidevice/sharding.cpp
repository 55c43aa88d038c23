#include "multidevice/sharding.h"

#include <algorithm>
#include <map>
#include <set>

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

namespace {

// Every split between tv's loop (and allocation) domain and its roots, keyed by the axis it splits.
std::map<const IterDomain*, const IdTransform*> splitsByInput(const TensorView* tv) {
  std::map<const IterDomain*, const IdTransform*> splits;
  std::vector<const IterDomain*> todo(tv->loop().begin(), tv->loop().end());
  if (tv->hasAllocation()) todo.insert(todo.end(), tv->allocation().begin(), tv->allocation().end());
  std::set<const IdTransform*> seen;
  while (!todo.empty()) {
    const IterDomain* id = todo.back();
    todo.pop_back();
    const IdTransform* t = id->definition();
    if (t == nullptr || !seen.insert(t).second) continue;
    if (t->kind() == IdTransform::Kind::Split) splits[t->inputs()[0]] = t;
    todo.insert(todo.end(), t->inputs().begin(), t->inputs().end());
  }
  return splits;
}

void expandLeaves(const std::map<const IterDomain*, const IdTransform*>& splits, IterDomain* id,
                  std::vector<IterDomain*>& leaves) {
  auto it = splits.find(id);
  if (it == splits.end()) {
    leaves.push_back(id);
    return;
  }
  for (IterDomain* o : it->second->outputs()) expandLeaves(splits, o, leaves);
}

// Runtime extents of the split tree below a root of extent `extent`, leaves in row-major order.
// Returns what does not fit (a split that does not divide, a device piece not as long as the
// mesh), or "".
std::string leafExtents(const TensorView* tv, const std::map<const IterDomain*, const IdTransform*>& splits,
                        IterDomain* id, int64_t extent, std::vector<std::pair<IterDomain*, int64_t>>& leaves) {
  auto it = splits.find(id);
  if (it == splits.end()) {
    if (id->isDeviceDim() && !id->isReduction() && extent != tv->mesh().size(id->parallelType())) {
      ParallelType pt = id->parallelType();
      return str(tv->toString(), ": ", toString(pt), " is on ", id->toString(), ", whose extent is ", extent,
                 " here, but the mesh has ", tv->mesh().size(pt), " devices along ", toString(pt));
    }
    leaves.emplace_back(id, extent);
    return "";
  }
  const IdTransform* t = it->second;
  int64_t f = t->factor();
  if (f <= 0 || extent % f != 0) {
    return str(tv->toString(), ": ", id->toString(), " has extent ", extent, ", which the split ", t->toString(),
               " does not divide evenly; uneven sharding is not supported");
  }
  int64_t rest = extent / f;
  std::string error = leafExtents(tv, splits, t->outputs()[0], t->innerSplit() ? rest : f, leaves);
  return error.empty() ? leafExtents(tv, splits, t->outputs()[1], t->innerSplit() ? f : rest, leaves) : error;
}

int64_t indexIn(const std::vector<IterDomain*>& domain, const IterDomain* id) {
  auto it = std::find(domain.begin(), domain.end(), id);
  return it == domain.end() ? -1 : static_cast<int64_t>(it - domain.begin());
}

// The axis of `domain` that `id` comes from through splits only; a user error through a merge.
IterDomain* splitRoot(const TensorView* tv, IterDomain* id, const std::vector<IterDomain*>& domain) {
  IterDomain* root = id;
  while (indexIn(domain, root) < 0) {
    IdTransform* t = root->definition();
    MF_USER_CHECK(t != nullptr && t->kind() == IdTransform::Kind::Split, tv->toString(), ": ",
                  toString(id->parallelType()), " is on ", id->toString(),
                  ", which comes from a merge of axes; a device axis must come from splits of one logical axis");
    root = t->inputs()[0];
  }
  return root;
}

}  // namespace

std::vector<IterDomain*> splitLeaves(const TensorView* tv, IterDomain* root) {
  std::vector<IterDomain*> leaves;
  expandLeaves(splitsByInput(tv), root, leaves);
  return leaves;
}

DeviceSplit deviceSplitOf(const TensorView* tv, IterDomain* loop_id, const std::vector<IterDomain*>& domain) {
  DeviceSplit s;
  s.pt = loop_id->parallelType();
  s.loop_id = loop_id;
  s.num_devices = tv->mesh().size(s.pt);
  MF_USER_CHECK(!loop_id->extent().isConst() || loop_id->extent().value == s.num_devices, tv->toString(), ": ",
                toString(s.pt), " is on ", loop_id->toString(), " of extent ", loop_id->extent().value,
                ", but the mesh has ", s.num_devices, " devices along ", toString(s.pt));
  IterDomain* root = splitRoot(tv, loop_id, domain);
  s.axis = indexIn(domain, root);
  s.whole_axis = root == loop_id;
  if (s.whole_axis) return s;
  std::vector<IterDomain*> leaves = splitLeaves(tv, root);
  int64_t at = indexIn(leaves, loop_id);
  MF_CHECK(at >= 0, tv->toString(), ": ", loop_id->toString(), " is not a leaf of the splits of ", root->toString());
  // Products of the other non-device leaves before and after the device leaf (kRest if symbolic).
  auto product = [&](int64_t from, int64_t to, bool with_devices) {
    int64_t p = 1;
    for (int64_t i = from; i < to; ++i) {
      const IterDomain* leaf = leaves[static_cast<size_t>(i)];
      if (leaf->isDeviceDim() && !with_devices) continue;
      if (leaf->isDeviceDim()) {
        p *= tv->mesh().size(leaf->parallelType());
        continue;
      }
      if (!leaf->extent().isConst()) return DeviceSplit::kRest;
      p *= leaf->extent().value;
    }
    return p;
  };
  const int64_t n_leaves = static_cast<int64_t>(leaves.size());
  s.outer = product(0, at, false);
  s.inner = product(at + 1, n_leaves, false);
  s.inner_all = product(at + 1, n_leaves, true);
  // The signature: runs of non-device leaves multiplied out, extents of 1 dropped.
  std::string run;
  int64_t run_product = 1;
  bool run_symbolic = false;
  auto flush = [&]() {
    if (run_symbolic) {
      run += "?";
    } else if (run_product != 1) {
      run += std::to_string(run_product);
    }
    if (run_symbolic || run_product != 1) run += ",";
    s.signature += run;
    run.clear();
    run_product = 1;
    run_symbolic = false;
  };
  for (int64_t i = 0; i <= at; ++i) {
    const IterDomain* leaf = leaves[static_cast<size_t>(i)];
    if (leaf->isDeviceDim()) {
      flush();
      s.signature += std::string(toString(leaf->parallelType())) + ",";
      s.depth += i < at;
    } else if (leaf->extent().isConst()) {
      run_product *= leaf->extent().value;
    } else {
      run_symbolic = true;
    }
  }
  // After the device leaf: the rest of the axis, which the product of everything after it (other
  // device pieces included: taken whole, they still space this one's elements) pins down when the
  // outer part is symbolic.
  if (s.outer == DeviceSplit::kRest) s.signature += "|" + std::to_string(s.inner_all);
  MF_USER_CHECK(s.outer != DeviceSplit::kRest || s.inner != DeviceSplit::kRest, tv->toString(), ": ", toString(s.pt),
                " on ", loop_id->toString(), " has symbolic extents on both sides; split by constant factors");
  return s;
}

DeviceSplit deviceSplit(const TensorView* tv, ParallelType pt, bool to_root) {
  IterDomain* loop_id = shardedLoopId(tv, pt);
  MF_CHECK(loop_id != nullptr, tv->toString(), " is not sharded on ", toString(pt));
  return deviceSplitOf(tv, loop_id, to_root ? tv->rootOrLogical() : tv->logicalNoReductions());
}

std::vector<int64_t> axisPositions(const TensorView* tv, int64_t axis, int64_t global_extent,
                                   const std::function<int64_t(ParallelType)>& index_of) {
  IterDomain* root = tv->logicalNoReductions().at(static_cast<size_t>(axis));
  std::vector<std::pair<IterDomain*, int64_t>> leaves;
  std::string error = leafExtents(tv, splitsByInput(tv), root, global_extent, leaves);
  MF_USER_CHECK(error.empty(), error);
  std::vector<int64_t> positions = {0};
  for (auto [leaf, extent] : leaves) {
    int64_t fixed = -1;
    if (leaf->isDeviceDim() && !leaf->isReduction()) {
      fixed = index_of(leaf->parallelType());
    }
    std::vector<int64_t> next;
    next.reserve(positions.size() * static_cast<size_t>(fixed >= 0 ? 1 : extent));
    for (int64_t p : positions) {
      if (fixed >= 0) {
        next.push_back(p * extent + fixed);
      } else {
        for (int64_t c = 0; c < extent; ++c) next.push_back(p * extent + c);
      }
    }
    positions = std::move(next);
  }
  return positions;
}

std::vector<ParallelType> byDepth(const TensorView* tv, std::vector<ParallelType> pts) {
  auto depth = [&](ParallelType pt) {
    return tv->hasMesh() && shardedLoopId(tv, pt) != nullptr ? deviceSplit(tv, pt).depth : int64_t{1} << 20;
  };
  std::stable_sort(pts.begin(), pts.end(), [&](ParallelType a, ParallelType b) { return depth(a) < depth(b); });
  return pts;
}

std::string unevenSplit(const TensorView* tv, int64_t axis, int64_t global_extent) {
  std::vector<std::pair<IterDomain*, int64_t>> leaves;
  return leafExtents(tv, splitsByInput(tv), tv->logicalNoReductions().at(static_cast<size_t>(axis)), global_extent,
                     leaves);
}

bool allSplitsBlocked(const TensorView* tv) {
  if (!tv->hasMesh()) return true;
  for (ParallelType pt : kDeviceParallelTypes) {
    if (shardedLoopId(tv, pt) != nullptr && !deviceSplit(tv, pt).blocked()) return false;
  }
  return true;
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
    for (IterDomain* id : tv->allocation()) {
      if (!id->isDeviceDim() || id->isReduction()) continue;
      const IterDomain* source = splitRoot(tv, id, logical);
      shards[static_cast<size_t>(indexIn(logical, source))] *= tv->mesh().size(id->parallelType());
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
