// decompose_reshardings
// Requires: propagate_shardings ran (every tensor has a mesh in a multi-device fusion).
// Guarantees: every resharding expr is either a `set` with one input that changes exactly one
//   device parallel type, or a single-axis reduction over a device axis (sum/max/min whose only
//   reduction loop axis is a whole logical DID axis). To get there it
//   1. moves the bias of a linear whose contraction is sharded after the reduction (so it is added
//      once, not once per device). The bias-free product keeps every device split of the result,
//      the reduction's and the output's alike: with the output scattered on the sequence that is
//      one ReduceScatter, and the bias is added to the scattered result (a 2-D bias of a 3-D weight
//      whose output has batch axes cannot be added right-aligned: a user error);
//   2. rfactors reductions with a device-parallel reduction split into a local partial op plus a
//      reduction over the device axis (seed 001);
//   3. inserts sets: after an op with one tensor input (the op runs on the input's sharding), after
//      an op whose output is sharded on an axis no input maps to (cat's axis: a local slice),
//      before each input of an n-ary op whose sharding differs from what the op needs;
//   4. splits a set that changes several mesh axes into a chain of sets changing one each, and a
//      set that changes how one mesh axis splits the same axis (blocks <-> interleaved) into a
//      gather and a slice.
//   An op of several outputs (attention) first gets, for each output sharded otherwise than its
//   inputs make it, a fresh output sharded as the inputs make it plus a set into the original;
//   then its inputs are resharded before it as in 3.
#include <algorithm>

#include "ir/domain_map.h"
#include "ir/fusion.h"
#include "multidevice/propagation.h"
#include "multidevice/sharding.h"
#include "passes/pass.h"
#include "support/error.h"

namespace mf {
namespace {

const std::vector<ParallelType> kAllDids(std::begin(kDeviceParallelTypes), std::end(kDeviceParallelTypes));

bool hasDeviceReduction(const TensorView* tv) {
  for (IterDomain* id : tv->loop()) {
    if (id->isReduction() && id->isDeviceDim()) return true;
  }
  return false;
}

// sum/max/min whose only reduction loop axis is a device-parallel logical axis.
bool isDeviceReduction(const Expr* e) {
  if (!isReduction(e->op())) return false;
  const TensorView* out = e->out();
  int64_t n = 0;
  bool ok = true;
  for (IterDomain* id : out->loop()) {
    if (!id->isReduction()) continue;
    ++n;
    ok &= id->isDeviceDim() && std::find(out->logical().begin(), out->logical().end(), id) != out->logical().end();
  }
  return n == 1 && ok;
}

// Drops reduction axes from a tensor whose defining op is about to become pointwise.
void dropReductions(TensorView* tv) {
  std::vector<IterDomain*> loop;
  for (IterDomain* id : tv->loop()) {
    if (!id->isReduction()) loop.push_back(id);
  }
  tv->setLogical(tv->logicalNoReductions());
  tv->setRoot({});
  tv->setLoop(loop);
  tv->setAllocation({});
}

// Copies src's device shardings (reduction DIDs too, beside iteration DIDs of the same type) onto
// dst, which has src's logical layout.
void copyShardings(const TensorView* src, TensorView* dst) {
  std::vector<DeviceSplit> splits;
  for (IterDomain* id : src->loop()) {
    if (id->isDeviceDim()) splits.push_back(deviceSplitOf(src, id, src->logical()));
  }
  std::stable_sort(splits.begin(), splits.end(), [](const DeviceSplit& a, const DeviceSplit& b) { return a.depth < b.depth; });
  for (const DeviceSplit& s : splits) shardAxis(dst, s.axis, s, /*beside_other_kind=*/true);
}

// Whether a and b (same logical layout) are split across devices alike.
bool sameSharding(const TensorView* a, const TensorView* b) {
  if (a->mesh() != b->mesh()) return false;
  for (ParallelType pt : kDeviceParallelTypes) {
    bool sa = shardedLoopId(a, pt) != nullptr, sb = shardedLoopId(b, pt) != nullptr;
    if (sa != sb || (sa && !(deviceSplit(a, pt) == deviceSplit(b, pt)))) return false;
  }
  return true;
}

// 1. out = linear(x, w, b) with a sharded contraction -> t = linear(x, w); out = add(t, b).
bool pullBiasAfterReduction(Fusion& f, Expr* e) {
  const int bias_input = opInfo(e->op()).bias_input;
  if (bias_input < 0 || static_cast<int>(e->inputs().size()) <= bias_input || !hasDeviceReduction(e->out())) return false;
  TensorView* out = e->out();
  TensorView* t = newTensorLike(out, /*keep_reductions=*/true);
  copyShardings(out, t);
  std::vector<Val*> operands = e->inputs();
  Val* bias = operands[bias_input];
  // The add broadcasts right-aligned; a 2-D bias [a, b] of a 3-D weight is not right-aligned with
  // an output [a, batch.., b] that has batch axes.
  const auto* bias_tv = dynamic_cast<const TensorView*>(bias);
  MF_USER_CHECK(bias_tv == nullptr || bias_tv->logicalNoReductions().size() < 2 ||
                    out->logicalNoReductions().size() == bias_tv->logicalNoReductions().size(),
                e->toString(), ": the 2-D bias ", bias->toString(),
                " cannot be added after the reduction across devices, because the output has batch axes between its "
                "two axes; add the bias in a separate op after the linear, broadcast to the output's shape");
  operands.erase(operands.begin() + bias_input);
  OpType op = e->op();
  Attributes attrs = e->attributes();
  f.unlink(e);
  f.newExpr(op, operands, {t}, attrs);
  dropReductions(out);
  f.newExpr(OpType::Add, {t, bias}, {out});
  return true;
}

// 2. rfactor the local part of a reduction that is also reduced across devices.
bool rfactorDeviceReduction(Expr* e) {
  if (!reduces(e->op()) || isDeviceReduction(e)) return false;
  TensorView* out = e->out();
  if (!hasDeviceReduction(out)) return false;
  std::vector<int64_t> local_axes;
  for (int64_t i = 0; i < out->nDims(); ++i) {
    IterDomain* id = out->loop()[i];
    if (id->isReduction() && !id->isDeviceDim()) local_axes.push_back(i);
  }
  MF_USER_CHECK(!local_axes.empty(), out->toString(), " reduces across devices along several axes ",
                out->domainString(), "; one device axis per reduction is supported");
  out->rfactor(local_axes);
  return true;
}

// 3a. out = op(in) resharding -> t = op(in) sharded like in; out = set(t). On failure `e` is
// replaced by an equivalent fresh expr (returned through the reference).
bool reshardAfter(Fusion& f, Expr*& e) {
  TensorView* out = e->out();
  // An rfactored partial (root != logical) keeps its root-to-logical splits only where it is:
  // a copy would turn its device piece into a plain axis the op does not produce. Its input is
  // resharded before it instead (the partial of a sum whose output is split on another mesh axis).
  if (!out->root().empty()) return false;
  auto* in = static_cast<TensorView*>(e->input(0));
  TensorView* t = newTensorLike(out, /*keep_reductions=*/true);
  t->setDeviceMesh(in->mesh());
  std::vector<Val*> inputs = e->inputs();
  Attributes attrs = e->attributes();
  OpType op = e->op();
  f.unlink(e);
  Expr* local = f.newExpr(op, inputs, {t}, attrs);
  shardConsumerLikeProducer(local, 0, kAllDids);
  // A reduction over a sharded axis is fine here: step 2 rfactors it into a local partial and a
  // reduction across devices.
  bool reduces_across_devices = reduces(op) && hasDeviceReduction(t);
  if (isResharding(local) && !reduces_across_devices) {
    // The op cannot run on the input's sharding (e.g. a reshape that splits the sharded axis):
    // undo and reshard before instead.
    f.unlink(local);
    e = f.newExpr(op, inputs, {out}, attrs);
    return false;
  }
  dropReductions(out);
  f.newExpr(OpType::Set, {t}, {out});
  return true;
}

// 3b. Reshard each input whose sharding differs from what `e` needs.
bool reshardBefore(Fusion& f, Expr* e) {
  bool changed = false;
  for (size_t i = 0; i < e->inputs().size(); ++i) {
    if (!e->input(i)->isTensor() || reshardedTypes(e, i).empty()) continue;
    auto* in = static_cast<TensorView*>(e->input(i));
    TensorView* resharded = newTensorLike(in);
    resharded->setDeviceMesh(e->outTensor(0)->mesh());
    shardProducerLikeConsumer(e, i, resharded, kAllDids, /*include_reduction_dids=*/true);
    // Another consumer may already reshard `in` this way (attention's backward reads the
    // forward's operands again): share that communication.
    for (Expr* use : in->uses()) {
      if (use != e && use->op() == OpType::Set && sameSharding(use->out(), resharded)) resharded = use->out();
    }
    if (resharded->definition() == nullptr) f.newExpr(OpType::Set, {in}, {resharded});
    f.replaceInputOf(e, in, resharded);
    changed = true;
  }
  return changed;
}

// Shards `dst` (same logical shape as `src`) on pt exactly as `src` is. Returns false when
// dst cannot take it (the axis already carries another device split).
bool copyShardingOf(const TensorView* src, TensorView* dst, ParallelType pt) {
  if (shardedLoopId(src, pt) == nullptr) return true;
  return shardAxis(dst, deviceSplit(src, pt).axis, deviceSplit(src, pt));
}

// 3c. An op that cannot run on its input's sharding and whose output is sharded on an axis no input
// axis maps to (cat's concatenated axis, a sliced or padded one): t = op(inputs) unsharded there,
// then out = set(t) (a local slice). No producer sharding could make such an op local.
bool reshardFreshAxesAfter(Fusion& f, Expr* e) {
  if (!opInfo(e->op()).regroups_axes) return false;
  TensorView* out = e->out();
  std::vector<ParallelType> fresh;
  for (ParallelType pt : kDeviceParallelTypes) {
    if (shardedLoopId(out, pt) == nullptr) continue;
    int64_t axis = deviceSplit(out, pt, /*to_root=*/true).axis;
    bool mapped = false;
    for (size_t i = 0; i < e->inputs().size(); ++i) {
      if (!e->input(i)->isTensor()) continue;
      auto p2c = mapProducerToConsumer(e, i);
      mapped |= std::find(p2c.begin(), p2c.end(), axis) != p2c.end();
    }
    if (!mapped) fresh.push_back(pt);
  }
  if (fresh.empty()) return false;
  TensorView* t = newTensorLike(out);
  for (ParallelType pt : byDepth(out, kAllDids)) {
    if (std::find(fresh.begin(), fresh.end(), pt) == fresh.end()) copyShardingOf(out, t, pt);
  }
  std::vector<Val*> inputs = e->inputs();
  Attributes attrs = e->attributes();
  OpType op = e->op();
  f.unlink(e);
  f.newExpr(op, inputs, {t}, attrs);
  f.newExpr(OpType::Set, {t}, {out});
  return true;
}

// out = set(in) changing several device parallel types -> a chain of sets, each changing one.
// Plans tried: every order of moving one type straight to the consumer's sharding (AllToAll,
// Allgather or LocalSlice per link); else first gather every type the producer shards, then slice
// every type the consumer shards (always possible, more traffic). Returns false if none fits.
bool chainSets(Fusion& f, Expr* e, std::vector<ParallelType> changed) {
  auto* in = static_cast<TensorView*>(e->input(0));
  TensorView* out = e->out();
  if (in->mesh() != out->mesh()) return false;
  // A plan is a list of states; a state says, per changed type, where it is taken from.
  enum class From { Producer, Consumer, Nowhere };
  using State = std::vector<From>;
  auto build = [&](const std::vector<State>& states) -> bool {
    std::vector<Expr*> links;
    TensorView* prev = in;
    bool ok = true;
    for (size_t k = 0; k < states.size() && ok; ++k) {
      TensorView* t = newTensorLike(in);
      // Each type from its source, outer device splits first (so nested splits keep their order).
      std::vector<std::pair<int64_t, ParallelType>> order;
      for (ParallelType pt : kDeviceParallelTypes) {
        auto it = std::find(changed.begin(), changed.end(), pt);
        From from = it == changed.end() ? From::Producer : states[k][it - changed.begin()];
        if (from == From::Nowhere) continue;
        const TensorView* src = from == From::Producer ? in : out;
        int64_t depth = shardedLoopId(src, pt) != nullptr ? deviceSplit(src, pt).depth : 0;
        order.emplace_back(depth, pt);
      }
      std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      for (auto [depth, pt] : order) {
        auto it = std::find(changed.begin(), changed.end(), pt);
        From from = it == changed.end() ? From::Producer : states[k][it - changed.begin()];
        const TensorView* src = from == From::Producer ? in : out;
        ok &= copyShardingOf(src, t, pt) && (shardedLoopId(src, pt) == nullptr) == (shardedLoopId(t, pt) == nullptr);
      }
      links.push_back(f.newExpr(OpType::Set, {prev}, {t}));
      ok &= reshardedTypes(links.back(), 0).size() <= 1;
      prev = t;
    }
    if (ok) {
      // The last link feeds `out` itself (a plan tried before may have restored its definition).
      f.unlink(out->definition());
      Expr* last = f.newExpr(OpType::Set, {prev}, {out});
      ok = reshardedTypes(last, 0).size() <= 1;
      if (ok) return true;
      f.unlink(last);
      f.newExpr(OpType::Set, {in}, {out});  // restore the original definition
    }
    for (Expr* link : links) f.unlink(link);
    return false;
  };
  const size_t n = changed.size();
  std::sort(changed.begin(), changed.end());
  do {
    std::vector<State> states;
    State state(n, From::Producer);
    for (size_t k = 0; k + 1 < n; ++k) {
      state[k] = From::Consumer;
      states.push_back(state);
    }
    if (build(states)) return true;
  } while (std::next_permutation(changed.begin(), changed.end()));
  // Gather the innermost device pieces first and slice the outermost first: a piece nested in
  // another one's split is described relative to it, so the outer one must be there.
  auto by_depth = [&](const TensorView* tv, bool deepest_first) {
    std::vector<size_t> order;
    for (size_t k = 0; k < n; ++k) {
      if (shardedLoopId(tv, changed[k]) != nullptr) order.push_back(k);
    }
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      int64_t da = deviceSplit(tv, changed[a]).depth, db = deviceSplit(tv, changed[b]).depth;
      return deepest_first ? da > db : da < db;
    });
    return order;
  };
  std::vector<State> states;
  State state(n, From::Producer);
  for (size_t k : by_depth(in, /*deepest_first=*/true)) {
    state[k] = From::Nowhere;
    states.push_back(state);
  }
  for (size_t k : by_depth(out, /*deepest_first=*/false)) {
    state[k] = From::Consumer;
    states.push_back(state);
  }
  if (!states.empty()) states.pop_back();  // the final state is `out` itself
  return build(states);
}

// Output `o` of e as its inputs shard it: each parallel type from the first input that has it on
// an axis mapping onto the output. A fresh tensor, not yet part of the fusion's graph.
TensorView* outputAsInputsShardIt(const Expr* e, size_t o) {
  TensorView* out = e->outTensor(o);
  TensorView* t = newTensorLike(out);
  for (size_t i = 0; i < e->inputs().size(); ++i) {
    if (!e->input(i)->isTensor()) continue;
    auto* in = static_cast<TensorView*>(e->input(i));
    if (!in->hasMesh() || in->mesh() != t->mesh()) continue;
    auto p2c = mapProducerToConsumer(e, i, o);
    for (ParallelType pt : byDepth(in, kAllDids)) {
      if (shardedLoopId(in, pt) == nullptr) continue;
      DeviceSplit s = deviceSplit(in, pt);
      if (p2c[s.axis] >= 0 && layoutCarriesOver(e, s, in->logicalNoReductions()[static_cast<size_t>(s.axis)],
                                                t->rootOrLogical()[static_cast<size_t>(p2c[s.axis])])) {
        shardAxis(t, p2c[s.axis], s);
      }
    }
  }
  return t;
}

// 3c. An op of several outputs computes each output sharded as its inputs make it; an output
// sharded otherwise is set from that result (reshard after, one set per output).
bool reshardOutputsAfter(Fusion& f, Expr* e) {
  std::vector<Val*> outs = e->outputs();
  std::vector<std::pair<TensorView*, TensorView*>> sets;  // (computed, wanted)
  for (size_t o : dataOutputs(e)) {
    TensorView* natural = outputAsInputsShardIt(e, o);
    if (sameSharding(natural, e->outTensor(o))) continue;
    sets.emplace_back(natural, e->outTensor(o));
    outs[o] = natural;
  }
  if (sets.empty()) return false;
  OpType op = e->op();
  std::vector<Val*> inputs = e->inputs();
  Attributes attrs = e->attributes();
  f.unlink(e);
  f.newExpr(op, inputs, outs, attrs);
  for (auto [computed, wanted] : sets) f.newExpr(OpType::Set, {computed}, {wanted});
  return true;
}

// 4b. A set that changes only how pt splits one axis (one block per device into interleaved, say):
// no collective maps one onto the other, so gather along pt, then slice (a view).
bool gatherThenSlice(Fusion& f, Expr* e, ParallelType pt) {
  auto* in = static_cast<TensorView*>(e->input(0));
  TensorView* out = e->out();
  if (e->op() != OpType::Set || in->mesh() != out->mesh()) return false;
  if (shardedLoopId(in, pt) == nullptr || shardedLoopId(out, pt) == nullptr) return false;
  DeviceSplit ps = deviceSplit(in, pt), qs = deviceSplit(out, pt);
  if (mapProducerToConsumer(e, 0)[ps.axis] != qs.axis) return false;
  TensorView* gathered = newTensorLike(in);
  for (ParallelType other : byDepth(in, kAllDids)) {
    if (other != pt) copyShardingOf(in, gathered, other);
  }
  f.unlink(e);
  f.newExpr(OpType::Set, {in}, {gathered});
  f.newExpr(OpType::Set, {gathered}, {out});
  return true;
}

bool decomposeOne(Fusion& f, Expr* e) {
  if (pullBiasAfterReduction(f, e)) return true;
  if (rfactorDeviceReduction(e)) return true;
  if (!isResharding(e)) return false;
  if (e->op() == OpType::Set || isDeviceReduction(e)) {
    auto changed = reshardedTypes(e, 0);
    if (changed.size() == 1 && gatherThenSlice(f, e, changed[0])) return true;
    if (changed.size() <= 1) return false;
    MF_USER_CHECK(e->op() == OpType::Set && chainSets(f, e, changed), e->toString(), ": ", e->out()->toString(),
                  " changes ", changed.size(), " device parallel types at once and cannot be split into one ",
                  "communication per mesh axis (different meshes, or a reduction); reshard one mesh axis at a time");
    return true;
  }
  int64_t tensor_inputs = 0;
  for (Val* v : e->inputs()) tensor_inputs += v->isTensor();
  if (tensor_inputs == 1 && e->outputs().size() == 1 && reshardAfter(f, e)) return true;
  if (e->outputs().size() > 1 && reshardOutputsAfter(f, e)) return true;
  if (e->outputs().size() == 1 && reshardFreshAxesAfter(f, e)) return true;
  bool changed = reshardBefore(f, e);
  // Every rank plans the same program, so every rank raises this, before anything is posted.
  MF_USER_CHECK(changed && !isResharding(e), e->toString(), ": ", e->output(0)->toString(),
                " is sharded in a way no communication connects to its input's layout (for example a reshape "
                "that splits or merges an interleaved, inner-split sharded axis into another sharded layout); "
                "reshard the input first (a set to a layout the op keeps) or annotate the output like the input");
  return true;
}

class DecomposeReshardingsPass : public Pass {
 public:
  const char* name() const override { return "decompose_reshardings"; }
  void run(Fusion& fusion) override {
    for (int iteration = 0;; ++iteration) {
      MF_CHECK(iteration < 10000, "decompose_reshardings does not converge");
      bool changed = false;
      for (Expr* e : fusion.exprs()) {
        if (decomposeOne(fusion, e)) {
          changed = true;
          break;
        }
      }
      if (!changed) return;
    }
  }
};

}  // namespace

std::unique_ptr<Pass> makeDecomposeReshardingsPass() { return std::make_unique<DecomposeReshardingsPass>(); }

}  // namespace mf
