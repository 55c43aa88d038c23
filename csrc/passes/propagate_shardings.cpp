// propagate_shardings
// Requires: validate_meshes ran (inputs of a multi-device fusion have meshes).
// Guarantees: every tensor has a mesh when any does. Tensors the user gave a mesh are never
//   changed. Others get, forward, each device parallel type from the first input that has it
//   (in the order the op registry prefers: linear's weight, bias, input; matmul's B then A;
//   otherwise the most parallel input first), and
//   then, backward from consumers, the parallel types still missing (fusion inputs never get new
//   ones). No tensor ends up with two axes of one parallel type.
#include <algorithm>
#include <set>

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
      TensorView* out = e->out();
      if (annotated.count(out)) continue;
      for (size_t i : referenceOrder(e)) {
        shardConsumerLikeProducer(e, i, all);
      }
    }
    for (auto it = exprs.rbegin(); it != exprs.rend(); ++it) {
      Expr* e = *it;
      for (size_t i = 0; i < e->inputs().size(); ++i) {
        if (!e->input(i)->isTensor()) continue;
        auto* in = static_cast<TensorView*>(e->input(i));
        if (annotated.count(in)) continue;
        if (fusion.isInput(in)) {
          if (!in->hasMesh()) in->setDeviceMesh(e->out()->mesh());
          continue;
        }
        shardProducerLikeConsumer(e, i, in, all, /*include_reduction_dids=*/false);
      }
    }
  }
};

}  // namespace

std::unique_ptr<Pass> makePropagateShardingsPass() { return std::make_unique<PropagateShardingsPass>(); }

}  // namespace mf
