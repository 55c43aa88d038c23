// sum_partials
// Requires: decompose_reshardings ran: a contraction over a sharded axis is a local partial op and
//   a device reduction `sum(partial, dims=[k])` over the device axis (an Allreduce once lowered).
// Guarantees: an add of two such device sums -- over the same mesh, parallel type and partial
//   layout, each read only by that add and not a fusion output, both sums and the add's output
//   sharded alike (all whole: Allreduces; or all split the same way: ReduceScatters) -- becomes one
//   device sum of the added partials: add(sum_dev(p), sum_dev(q)) -> sum_dev(add(p, q)), sharded
//   as the add's output was. Sums are linear, so the result is the same; the partials are added
//   locally and reduced once. Repeated to a fixed point, so a chain a + b + c reduces once: the
//   q, k and v input gradients of a tensor-parallel attention backward take one Allreduce, as in
//   Megatron, instead of three Allreduces of the full activation and two adds after them (one
//   ReduceScatter instead of three in the sequence-parallel form).
#include "ir/fusion.h"
#include "ir/op_registry.h"
#include "multidevice/sharding.h"
#include "passes/pass.h"
#include "support/error.h"

namespace mf {
namespace {

// The sum over one device axis that defines tv, when tv is read only by `reader`.
const Expr* soleDeviceSum(const Fusion& f, const Val* v, const Expr* reader) {
  if (!v->isTensor() || f.isOutput(v) || f.isInput(v) || v->uses().size() != 1 || v->uses()[0] != reader) return nullptr;
  const Expr* def = v->definition();
  if (def == nullptr || def->op() != OpType::Sum || def->attr<Ints>("dims").size() != 1 || !def->input(0)->isTensor()) {
    return nullptr;
  }
  const auto* out = static_cast<const TensorView*>(v);
  int64_t device_reductions = 0, other_reductions = 0;
  for (const IterDomain* id : out->loop()) {
    if (id->isReduction()) (id->isDeviceDim() ? device_reductions : other_reductions) += 1;
  }
  return device_reductions == 1 && other_reductions == 0 ? def : nullptr;
}

bool sameLogicalShape(const TensorView* a, const TensorView* b) {
  auto la = a->logicalNoReductions(), lb = b->logicalNoReductions();
  if (la.size() != lb.size()) return false;
  for (size_t i = 0; i < la.size(); ++i) {
    if (la[i]->extent().toString() != lb[i]->extent().toString() || la[i]->parallelType() != lb[i]->parallelType()) return false;
  }
  return true;
}

// How tv's iteration axes are laid out over the devices: each loop axis but the reductions, with
// its extent and parallel type (two tensors of one logical shape with equal texts are split alike).
std::string shardingText(const TensorView* tv) {
  std::string text;
  for (const IterDomain* id : tv->loop()) {
    if (id->isReduction()) continue;
    text += id->extent().toString() + ":" + std::to_string(static_cast<int>(id->parallelType())) + " ";
  }
  return text;
}

bool sumPartialsOnce(Fusion& f, Expr* add) {
  if (add->op() != OpType::Add || add->inputs().size() != 2 || add->input(0) == add->input(1)) return false;
  const Expr* x = soleDeviceSum(f, add->input(0), add);
  const Expr* y = soleDeviceSum(f, add->input(1), add);
  if (x == nullptr || y == nullptr || x->attributes() != y->attributes()) return false;
  auto* p = static_cast<TensorView*>(x->input(0));
  auto* q = static_cast<TensorView*>(y->input(0));
  TensorView* out = add->out();
  const auto* x_out = static_cast<const TensorView*>(add->input(0));
  const auto* y_out = static_cast<const TensorView*>(add->input(1));
  const std::string sharding = shardingText(out);
  if (p->mesh() != q->mesh() || p->mesh() != out->mesh() || p->dtype() != q->dtype() ||
      p->dtype() != out->dtype() || x_out->dtype() != out->dtype() || !sameLogicalShape(p, q) ||
      shardingText(x_out) != sharding || shardingText(y_out) != sharding ||
      out->logicalNoReductions().size() + 1 != p->logicalNoReductions().size()) {
    return false;
  }
  // The partials' sum: p's logical layout, the device axis an iteration axis.
  std::vector<IterDomain*> ids;
  for (const IterDomain* id : p->logicalNoReductions()) ids.push_back(f.cloneIterDomain(id));
  TensorView* partial_sum = f.newTensor(p->dtype(), ids);
  partial_sum->setDeviceMesh(p->mesh());
  // The add's output becomes the device sum's: it gains the reduced device axis and keeps its loop
  // (a split of an axis over the devices makes the sum a ReduceScatter, as before).
  IterDomain* reduced = nullptr;
  for (IterDomain* id : x_out->loop()) {
    if (id->isReduction()) reduced = f.cloneIterDomain(id);
  }
  MF_CHECK(reduced != nullptr, "a device sum without a reduction axis: ", x->toString());
  std::vector<IterDomain*> logical = out->logicalNoReductions();
  logical.push_back(reduced);
  std::vector<IterDomain*> loop = out->loop();
  loop.push_back(reduced);
  out->setRoot({});
  out->setLogical(logical);
  out->setLoop(loop);
  out->setAllocation({});
  Attributes sum_attrs = x->attributes();
  f.unlink(const_cast<Expr*>(x));
  f.unlink(const_cast<Expr*>(y));
  f.unlink(add);
  f.newExpr(OpType::Add, {p, q}, {partial_sum});
  f.newExpr(OpType::Sum, {partial_sum}, {out}, sum_attrs);
  return true;
}

class SumPartialsPass : public Pass {
 public:
  const char* name() const override { return "sum_partials"; }
  void run(Fusion& fusion) override {
    for (bool changed = true; changed;) {
      changed = false;
      for (Expr* e : fusion.exprs()) {
        if (sumPartialsOnce(fusion, e)) {
          changed = true;
          break;
        }
      }
    }
  }
};

}  // namespace

std::unique_ptr<Pass> makeSumPartialsPass() { return std::make_unique<SumPartialsPass>(); }

}  // namespace mf
