// Folding the sum of GEMM outputs into the GEMMs (cuBLAS beta = 1).
// Requires: segments and RunSegment instructions built by lowering, before deallocations.
// Guarantees: a segment marked gemm_accumulate holds exactly {g = gemm(a, b), s = add(partial, g)}
//   (either operand order) with g and partial read by that add only, neither a fusion input or
//   output, partial made by an earlier segment of this rank, all three of one dtype; no segment is
//   empty; instruction indices follow the segments removed.
// Why: a backward sums the input-gradient partials of several projections (q, k and v; gate and
// up) before one Allreduce. Summed by a separate kernel, each partial is written, read back and
// the sum written again; accumulated by the next GEMM, the partial is read once inside the GEMM.
#include "host/gemm_accumulate.h"

#include <algorithm>

#include "ir/op_registry.h"
#include "support/options.h"

namespace mf {
namespace {

// The segment holding `e`, or -1.
int64_t segmentOf(const HostProgram& hp, const Expr* e) {
  const auto& segments = hp.segments();
  for (size_t s = 0; s < segments.size(); ++s) {
    const auto& exprs = segments[s].exprs;
    if (std::find(exprs.begin(), exprs.end(), e) != exprs.end()) return static_cast<int64_t>(s);
  }
  return -1;
}

// Where segment `s` runs among the instructions.
int64_t positionOf(const HostProgram& hp, int64_t s) {
  const auto& insts = hp.instructions();
  for (size_t i = 0; i < insts.size(); ++i) {
    if (insts[i].kind == HostInstruction::Kind::RunSegment && insts[i].index == s) return static_cast<int64_t>(i);
  }
  return -1;
}

bool onlyReadBy(const Fusion& f, const Val* v, const Expr* reader) {
  return !f.isInput(v) && !f.isOutput(v) && v->uses().size() == 1 && v->uses()[0] == reader;
}

// The add that segment `s` (a lone GEMM) can accumulate into its partial, or nullptr.
Expr* foldableSum(const HostProgram& hp, int64_t s) {
  const Fusion& f = hp.fusion();
  const Segment& seg = hp.segments()[static_cast<size_t>(s)];
  if (seg.gemm_accumulate || seg.exprs.size() != 1) return nullptr;
  const Expr* gemm = seg.exprs[0];
  const OpInfo& info = opInfo(gemm->op());
  if (!info.gemm_accumulates || gemm->inputs().size() != 2) return nullptr;  // a bias is its own epilogue
  const Val* product = gemm->output(0);
  if (product->uses().size() != 1) return nullptr;
  Expr* sum = product->uses()[0];
  if (!opInfo(sum->op()).is_sum || sum->inputs().size() != 2 || !onlyReadBy(f, product, sum)) return nullptr;
  const Val* partial = sum->input(0) == product ? sum->input(1) : sum->input(0);
  if (partial == product || !partial->isTensor() || !onlyReadBy(f, partial, sum)) return nullptr;
  if (partial->dtype() != product->dtype() || sum->output(0)->dtype() != product->dtype()) return nullptr;
  // The partial must be ready when the GEMM runs: made by a segment before it (a communication's
  // output would need its wait moved).
  if (partial->definition() == nullptr) return nullptr;
  const int64_t maker = segmentOf(hp, partial->definition());
  if (maker < 0 || positionOf(hp, maker) >= positionOf(hp, s) || segmentOf(hp, sum) < 0) return nullptr;
  return sum;
}

void removeSegment(HostProgram& hp, int64_t s) {
  auto& insts = hp.instructions();
  insts.erase(std::remove_if(insts.begin(), insts.end(),
                             [&](const HostInstruction& i) {
                               return i.kind == HostInstruction::Kind::RunSegment && i.index == s;
                             }),
              insts.end());
  for (HostInstruction& i : insts) {
    if (i.kind == HostInstruction::Kind::RunSegment && i.index > s) --i.index;
  }
  hp.segments().erase(hp.segments().begin() + s);
}

}  // namespace

void foldSumsIntoGemms(HostProgram& hp) {
  if (isDisabled(DisableOption::GemmAccumulate)) return;
  // In instruction order, so that a chain of sums (q + k + v) folds link by link.
  for (size_t i = 0; i < hp.instructions().size(); ++i) {
    const HostInstruction inst = hp.instructions()[i];
    if (inst.kind != HostInstruction::Kind::RunSegment) continue;
    Expr* sum = foldableSum(hp, inst.index);
    if (sum == nullptr) continue;
    const int64_t from = segmentOf(hp, sum);
    auto& exprs = hp.segments()[static_cast<size_t>(from)].exprs;
    exprs.erase(std::find(exprs.begin(), exprs.end(), sum));
    Segment& gemm = hp.segments()[static_cast<size_t>(inst.index)];
    gemm.exprs.push_back(sum);
    gemm.gemm_accumulate = true;
    if (exprs.empty()) removeSegment(hp, from);  // `from` runs after `inst`: i stays valid
  }
}

}  // namespace mf
