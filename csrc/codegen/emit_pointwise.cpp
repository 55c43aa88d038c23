// The pointwise kernel: grid-stride loop over groups of `vec` consecutive output elements (flat
// index of the contiguous outputs).
//
// Requires: a Pointwise Schedule. Guarantees: every output element is written exactly once; inputs
// are read through their own strides (broadcast axes have stride 0); inputs contiguous over the
// whole domain use the flat index directly; with vec > 1 every tensor whose inner stride is 1 is
// read/written with one aligned vector access per group (the scheduler checked divisibility and
// alignment), and inputs broadcast along the inner axis are read once per group. With unroll U > 1
// the main loop takes U groups per thread (strided by the grid, so every warp access stays
// coalesced) and issues all their loads before any math or store; loops of U/2, ... groups and a
// one-group loop do the rest.
#include "codegen/internal.h"

namespace mf {
namespace codegen {

std::string emitPointwise(const Analysis& a, const Schedule& s, const std::string& name_token) {
  const Region& r = s.main;
  const IndexPlan& p = s.main_index;
  const std::string it = indexType(s.index64);
  const int64_t v = s.vec, u = s.unroll;
  const std::string groups = kCount;  // r.numel() / v for these extents
  std::ostringstream os;
  os << prelude() << "\n" << signature(a, name_token, it, s.launch.block_x);
  // Inner extents only: the text must not change with the outermost one (a kCount bound).
  os << "  // pointwise over [*";
  for (size_t d = 1; d < r.extents.size(); ++d) os << ", " << r.extents[d];
  os << "] (" << kCount << " groups of " << v << " elements";
  if (u > 1) os << ", " << u << " steps unrolled";
  os << ")\n";
  if (u == 1) {
    const std::string g = v == 1 ? "i" : "g";
    os << "  for (" << it << " " << g << " = (" << it << ")blockIdx.x * blockDim.x + threadIdx.x; " << g << " < "
       << groups << "; " << g << " += (" << it << ")gridDim.x * blockDim.x) {\n";
    if (v > 1) os << "    const " << it << " i = g * " << v << ";\n";
    emitGroupLoads(r, p, v, "i", it, "", "    ", os);
    emitGroupCompute(r, p, v, "i", "", "    ", os);
    os << "  }\n}\n";
    return os.str();
  }
  os << "  const " << it << " step = (" << it << ")gridDim.x * blockDim.x;\n";
  os << "  " << it << " g = (" << it << ")blockIdx.x * blockDim.x + threadIdx.x;\n";
  // Loops of u, then u / 2, ... groups: the scheduler's unroll does not depend on the extents (one
  // source for every row count), and a thread with few groups still batches their loads.
  for (int64_t w = u; w > 1; w /= 2) {
    os << "  for (; g + " << w - 1 << " * step < " << groups << "; g += " << w << " * step) {  // " << w
       << " groups: all loads, then the math\n";
    emitGroupArrays(r, p, v, w, "    ", os);
    os << "#pragma unroll\n    for (int u = 0; u < " << w << "; ++u) {\n";
    os << "      const " << it << " i = " << timesText("g + u * step", v) << ";\n";
    emitGroupLoads(r, p, v, "i", it, "[u]", "      ", os);
    os << "    }\n";
    os << "#pragma unroll\n    for (int u = 0; u < " << w << "; ++u) {\n";
    os << "      const " << it << " i = " << timesText("g + u * step", v) << ";\n";
    emitGroupCompute(r, p, v, "i", "[u]", "      ", os);
    os << "    }\n  }\n";
  }
  os << "  for (; g < " << groups << "; g += step) {  // tail: one group per step\n";
  os << "    const " << it << " i = " << timesText("g", v) << ";\n";
  emitGroupLoads(r, p, v, "i", it, "", "    ", os);
  emitGroupCompute(r, p, v, "i", "", "    ", os);
  os << "  }\n}\n";
  return os.str();
}

}  // namespace codegen
}  // namespace mf
