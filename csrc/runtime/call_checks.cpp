#include "runtime/call_checks.h"

#include <set>

#include "ir/extent_expr.h"
#include "runtime/aten_evaluator.h"
#include "ir/fusion.h"
#include "support/error.h"
#include "support/text.h"

namespace mf {

std::string meshWorldError(const HostProgram& program, int64_t world_size) {
  std::set<std::string> seen;
  for (const TensorView* tv : program.fusion().allTensors()) {
    if (!tv->hasMesh()) continue;
    const DeviceMesh& mesh = tv->mesh();
    if (!seen.insert(mesh.toString()).second) continue;
    int64_t highest = -1;
    for (int64_t d : mesh.devices()) highest = std::max(highest, d);
    if (mesh.size() <= world_size && highest < world_size) continue;
    const int64_t needed = std::max(mesh.size(), highest + 1);
    std::string world = world_size == 1
                            ? std::string("this process runs alone (a world of 1 process: no launcher variables, or "
                                          "torch.distributed initialized with world_size=1)")
                            : mf::str("the world has ", world_size, " processes (ranks 0 to ", world_size - 1, ")");
    std::string what = mesh.size() > world_size ? mf::str("has ", mesh.size(), " devices")
                                                : mf::str("names rank ", highest, ", outside the world");
    return mf::str("mesh ", mesh.toString(), " (of ", tv->label(), ") ", what, ", but ", world,
                   "; each device of a mesh is one process. Launch ", needed, " processes, e.g. `torchrun ",
                   "--nproc_per_node=", needed, " your_script.py`, or use a mesh of the ranks that exist");
  }
  return "";
}

std::string embeddingIndexError(const Fusion& f, int64_t rank, const std::vector<RuntimeValue>& inputs,
                                const ExtentBindings& bindings) {
  for (const Expr* e : f.exprs()) {
    if (e->op() != OpType::EmbeddingFwd) continue;
    int64_t input = -1;
    for (size_t i = 0; i < f.inputs().size() && i < inputs.size(); ++i) {
      if (f.inputs()[i] == e->input(0)) input = static_cast<int64_t>(i);
    }
    if (input < 0 || !inputs[input].is_tensor) continue;
    const auto* indices_tv = static_cast<const TensorView*>(e->input(0));
    if (indices_tv->hasMesh() && !indices_tv->mesh().has(rank)) continue;
    const at::Tensor& indices = inputs[input].tensor;
    if (indices.numel() == 0 || indices.is_meta() || !at::isIntegralType(indices.scalar_type(), false)) continue;
    const auto* table = static_cast<const TensorView*>(e->input(1));
    std::optional<int64_t> rows = evaluateExtent(f, table->logicalNoReductions()[0]->extent(), bindings);
    if (!rows) continue;
    auto [low, high] = hostMinMax(indices);
    if (low >= 0 && high < *rows) continue;
    return mf::str("input ", input, " (", indices_tv->toString(), ") of ", e->toString(), ": indices must lie in [0, ",
                   *rows, ") (the table's rows); got values in [", low, ", ", high, "]");
  }
  return "";
}

}  // namespace mf
