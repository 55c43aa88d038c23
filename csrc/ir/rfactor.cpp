// TensorView::rfactor: out = R(in) becomes partial = R_axes(in) and out = R_rest(partial).
//
// Requires: `this` is defined by a reduction, linear or matmul; `axes` name reduction loop axes.
//   The reductions left out of `axes` are either whole logical reductions (sum/max/min only) or a
//   device piece of splits of one (the multi-device case: the outer part of an outer split, the
//   inner part of an inner split, or any piece already on a mesh axis; it is parallelized on a mesh
//   axis before or after rfactor, and validate_meshes checks that it was).
// Guarantees: partial's root is a copy of out's logical; its logical replaces each split reduction
//   by the split's outputs (rfactored ones stay reductions, the rest become iteration axes, marked
//   rf); partial's loop mirrors out's loop, with iteration axes that used a parallel type now taken
//   by a former reduction axis unparallelized. out is then the reduction of partial over the former
//   reduction axes, keeping their parallel types (rDIDx: reduced across devices).
#include <algorithm>
#include <functional>
#include <set>
#include <unordered_map>

#include "ir/fusion.h"
#include "ir/nodes.h"
#include "support/error.h"

namespace mf {

TensorView* TensorView::rfactor(std::vector<int64_t> axes) {
  Expr* def = definition();
  MF_USER_ARG_CHECK(def != nullptr && reduces(def->op()), "rfactor: ", toString(),
                    " must be the output of sum/max/min/linear/matmul; it is ",
                    def ? mf::toString(def->op()) : std::string("a fusion input"));
  const int bias_input = opInfo(def->op()).bias_input;
  MF_USER_ARG_CHECK(bias_input < 0 || static_cast<int>(def->inputs().size()) <= bias_input, "rfactor: ", toString(),
                    " is a ", mf::toString(def->op()), " with bias; rfactor applies to the bias-free product (add the bias after the reduction)");
  MF_USER_ARG_CHECK(root().empty(), "rfactor: ", toString(), " was already rfactored");
  Fusion& f = *fusion();
  std::set<IterDomain*> rfactored;
  for (int64_t a : axes) {
    IterDomain* id = loop_[normalizeAxis(a, nDims(), "rfactor")];
    MF_USER_ARG_CHECK(id->isReduction(), "rfactor: axis ", a, " of ", toString(), " is ", id->toString(),
                      ", not a reduction axis");
    rfactored.insert(id);
  }
  MF_USER_ARG_CHECK(!rfactored.empty(), "rfactor: no axes given for ", toString());

  // Transforms between logical and loop, producers first.
  std::vector<IdTransform*> transforms;
  std::set<IdTransform*> seen;
  std::set<IterDomain*> logical_set(logical_.begin(), logical_.end());
  std::function<void(IterDomain*)> visit = [&](IterDomain* id) {
    if (logical_set.count(id)) return;
    IdTransform* t = id->definition();
    MF_CHECK(t != nullptr, "loop axis ", id->toString(), " of ", toString(), " is not derived from its logical domain");
    if (seen.count(t)) return;
    for (IterDomain* in : t->inputs()) visit(in);
    seen.insert(t);
    transforms.push_back(t);
  };
  for (IterDomain* id : loop_) visit(id);

  // The reductions left for `out` and the parallel types they carry.
  std::vector<IterDomain*> rest;
  std::set<ParallelType> reduced_pts;
  for (IterDomain* id : loop_) {
    if (!id->isReduction() || rfactored.count(id)) continue;
    bool whole_logical = logical_set.count(id) > 0;
    // A device piece of a split logical reduction: parallelized on a mesh axis, or the outer part of
    // an outer split or the inner part of an inner split, which may still be serial here (nvFuser's
    // order is split, rfactor, then parallelize both sides; validate_meshes checks the partial's
    // side was). Nested splits are fine: the partial's device axis indexes the devices' pieces.
    bool from_splits = id->definition() != nullptr;
    for (IterDomain* cur = id; from_splits && !logical_set.count(cur); cur = cur->definition()->inputs()[0]) {
      from_splits = cur->definition() != nullptr && cur->definition()->kind() == IdTransform::Kind::Split;
    }
    IdTransform* split = id->definition();
    bool device_outer = from_splits && (id->isDeviceDim() || (!split->innerSplit() && split->outputs()[0] == id) ||
                                        (split->innerSplit() && split->outputs()[1] == id));
    bool contraction = isContraction(def->op());
    MF_USER_CHECK(device_outer || (whole_logical && !contraction), "rfactor: reduction axis ", id->toString(), " of ",
                  toString(), " would stay in the final reduction, but only whole logical reductions (sum/max/min) or ",
                  "the device-parallel outer part of an outer split can; rfactor it too or parallelize it on a mesh axis");
    rest.push_back(id);
    if (id->isDeviceDim()) reduced_pts.insert(id->parallelType());
  }
  for (IdTransform* t : transforms) {
    MF_USER_CHECK(t->kind() == IdTransform::Kind::Split || !t->inputs()[0]->isReduction(), "rfactor: ", toString(),
                  " merges reduction axes; rfactor supports split reductions only");
  }

  // Replay out's logical and transforms onto fresh IDs.
  std::unordered_map<IterDomain*, IterDomain*> clone;
  std::vector<IterDomain*> p_root;
  for (IterDomain* id : logical_) {
    IterDomain* c = f.cloneIterDomain(id);
    c->parallelize(ParallelType::Serial);
    clone[id] = c;
    p_root.push_back(c);
  }
  bool any_reduction_transform = false;
  for (IdTransform* t : transforms) {
    std::vector<IterDomain*> ins, outs;
    for (IterDomain* in : t->inputs()) ins.push_back(clone.at(in));
    for (IterDomain* out : t->outputs()) {
      IterDomain* c = f.cloneIterDomain(out);
      c->parallelize(ParallelType::Serial);
      clone[out] = c;
      outs.push_back(c);
    }
    f.newTransform(t->kind(), ins, outs, t->factor(), t->innerSplit());
    any_reduction_transform |= t->inputs()[0]->isReduction();
  }
  std::set<IterDomain*> rest_set(rest.begin(), rest.end());
  // Loop axes: rfactored reductions stay reductions; the rest become iteration axes.
  std::vector<IterDomain*> p_loop;
  for (IterDomain* id : loop_) {
    IterDomain* c = clone.at(id);
    if (id->isReduction()) {
      c->setRFactorProduct(any_reduction_transform && !logical_set.count(id));
      if (rest_set.count(id)) c->setIterType(IterType::Iteration);
      c->parallelize(id->parallelType());
    } else if (!reduced_pts.count(id->parallelType())) {
      c->parallelize(id->parallelType());
    }
    p_loop.push_back(c);
  }
  // Logical: root with every transformed reduction replaced by its loop descendants.
  std::vector<IterDomain*> p_logical;
  for (IterDomain* id : logical_) {
    IterDomain* c = clone.at(id);
    bool transformed = id->isReduction() && std::find(loop_.begin(), loop_.end(), id) == loop_.end();
    if (!transformed) {
      if (id->isReduction() && rest_set.count(id)) c->setIterType(IterType::Iteration);
      p_logical.push_back(c);
      continue;
    }
    for (IterDomain* l : loop_) {
      // A loop reduction descends from `id` when walking its definitions reaches `id`.
      IterDomain* cur = l;
      while (cur != id && cur->definition() != nullptr && !logical_set.count(cur)) cur = cur->definition()->inputs()[0];
      if (cur == id) p_logical.push_back(clone.at(l));
    }
  }

  TensorView* partial = f.newTensor(dtype(), p_logical);
  if (any_reduction_transform) partial->setRoot(p_root);
  partial->setLoop(p_loop);
  partial->setDeviceMesh(mesh());

  // Rewire: the original op now defines partial; out = reduce(partial) over the rest.
  std::vector<Val*> inputs = def->inputs();
  Attributes attrs = def->attributes();
  OpType op = def->op();
  f.unlink(def);
  f.newExpr(op, inputs, {partial}, attrs);

  std::vector<IterDomain*> out_logical;
  std::vector<IterDomain*> new_reductions;
  Ints sum_dims;
  int64_t pos = 0;
  std::unordered_map<IterDomain*, IterDomain*> orig_of_clone;
  for (auto& [o, c] : clone) orig_of_clone[c] = o;
  for (IterDomain* c : p_logical) {
    if (c->isReduction()) continue;
    IterDomain* orig = orig_of_clone.at(c);
    if (rest_set.count(orig)) {
      IterDomain* r = f.newIterDomain(c->extent(), IterType::Reduction);
      r->parallelize(orig->parallelType());
      out_logical.push_back(r);
      new_reductions.push_back(r);
      sum_dims.push_back(pos);
    } else {
      out_logical.push_back(orig);
    }
    ++pos;
  }
  std::vector<IterDomain*> out_loop;
  bool placed = false;
  for (IterDomain* id : loop_) {
    if (!id->isReduction()) {
      out_loop.push_back(id);
    } else if (!placed) {
      out_loop.insert(out_loop.end(), new_reductions.begin(), new_reductions.end());
      placed = true;
    }
  }
  setLogical(out_logical);
  setLoop(out_loop);
  allocation_.clear();
  OpType final_op = opInfo(op).partial_combine;
  f.newExpr(final_op, {partial}, {this}, {{"dims", sum_dims}});
  return partial;
}

}  // namespace mf
