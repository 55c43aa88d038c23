// partial_gathers
// Requires: propagate_shardings ran (every tensor has a mesh in a multi-device fusion).
// Guarantees: a gather (embedding_fwd) whose table is split on its looked-up axis (the vocabulary,
//   Megatron's vocab-parallel embedding) by a device parallel type that the indices do not carry
//   becomes a local masked lookup plus one reduction across devices, when that moves
//   fewer bytes than making the table whole (always with symbolic extents: the table then stays
//   sharded): the output gains a reduction axis over the table's rows, split like the table and
//   rfactored, so each device looks up the indices its rows hold (zeros elsewhere), and the partial
//   results meet in one Allreduce (a ReduceScatter when the output is sharded on that type
//   elsewhere). Otherwise the gather is left to decompose_reshardings (the table is made whole).
#include "multidevice/sharding.h"
#include "passes/pass.h"

namespace mf {
namespace {

int64_t staticNumel(const TensorView* tv) {
  int64_t n = 1;
  for (const IterDomain* id : tv->logicalNoReductions()) {
    if (!id->extent().isConst()) return -1;
    n *= id->extent().value;
  }
  return n;
}

// The device parallel type that splits the table's looked-up axis and that the masked plan can
// serve, or Serial.
ParallelType partialType(const Expr* e) {
  const auto* indices = static_cast<const TensorView*>(e->input(0));
  const auto* table = static_cast<const TensorView*>(e->input(1));
  const TensorView* out = e->out();
  if (!table->hasMesh() || !out->hasMesh() || table->mesh() != out->mesh() || !out->root().empty()) {
    return ParallelType::Serial;
  }
  for (ParallelType pt : kDeviceParallelTypes) {
    if (shardedLoopId(table, pt) == nullptr || shardedLoopId(indices, pt) != nullptr) continue;
    DeviceSplit s = deviceSplit(table, pt);
    if (s.axis != 0 || s.whole_axis || !s.blocked()) continue;  // the masked lookup needs row blocks
    // Bytes per device, up to the same (d-1)/d: an Allreduce moves about twice the output, a
    // ReduceScatter (the output sharded on pt) once; making the table whole moves the table.
    int64_t out_elements = staticNumel(out), table_elements = staticNumel(table);
    int64_t factor = shardedLoopId(out, pt) != nullptr ? 1 : 2;
    bool cheaper = out_elements < 0 || table_elements < 0 || factor * out_elements <= table_elements;
    if (cheaper) return pt;
  }
  return ParallelType::Serial;
}

class PartialGathersPass : public Pass {
 public:
  const char* name() const override { return "partial_gathers"; }
  void run(Fusion& fusion) override {
    for (Expr* e : fusion.exprs()) {
      if (opInfo(e->op()).kind != OpKind::Gather) continue;
      ParallelType pt = partialType(e);
      if (pt == ParallelType::Serial) continue;
      TensorView* out = e->out();
      const auto* table = static_cast<const TensorView*>(e->input(1));
      // out [..., r{rows}] with r{rows} split like the table: [..., rDID{d}, r{rows/d}].
      IterDomain* rows = fusion.newIterDomain(table->logicalNoReductions()[0]->extent(), IterType::Reduction);
      std::vector<IterDomain*> logical = out->logical(), loop = out->loop();
      logical.push_back(rows);
      loop.push_back(rows);
      out->setLogical(logical);
      out->setLoop(loop);
      out->setAllocation({});
      int64_t pos = out->nDims() - 1;
      out->split(pos, table->mesh().size(pt), /*inner_split=*/false);
      out->parallelize(pos, pt);
      out->rfactor({pos + 1});
    }
  }
};

}  // namespace

std::unique_ptr<Pass> makePartialGathersPass() { return std::make_unique<PartialGathersPass>(); }

}  // namespace mf
