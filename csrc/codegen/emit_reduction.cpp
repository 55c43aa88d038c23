// The reduction kernels (one sum/max/min with a pointwise prologue and epilogue).
//
// Requires: an InnerReduction or OuterReduction Schedule. Guarantees: exact and deterministic
// results (a fixed combine order for a given launch, no atomics); accumulation in float; every
// element of the reduction input is visited once, so prologue outputs are written exactly once;
// the epilogue runs once per output element, on one thread, after the full combine.
//   inner  X viewed as [rows, red]: blockDim.y rows per block, blockDim.x threads per row strided
//          over red, then __shfl_xor_sync inside the warp and, when a row spans several warps
//          (blockDim.y == 1), a shared-memory combine of the per-warp results.
//   outer  X viewed as [red, rows]: a block owns 32 adjacent columns (threadIdx.x, coalesced), and
//          threadIdx.y splits the reduced rows; the blockDim.y partials combine in a shared-memory tree.
#include <algorithm>
#include <cmath>

#include "codegen/internal.h"

namespace mf {
namespace codegen {
namespace {

std::string combine(OpType op, const std::string& a, const std::string& b) {
  if (op == OpType::Sum) return a + " + " + b;
  return std::string(op == OpType::Max ? "mf_max(" : "mf_min(") + a + ", " + b + ")";
}

std::string initValue(OpType op) {
  if (op == OpType::Sum) return "0.0f";
  return op == OpType::Max ? floatLiteral(-INFINITY) : floatLiteral(INFINITY);
}

// Loads, exprs and stores of a region at flat index `flat` (one element per thread).
void emitRegionBody(const Region& r, const IndexPlan& p, const std::string& flat, const std::string& prefix,
                    const std::string& it, const std::string& indent, std::ostringstream& os) {
  auto off = emitOffsets(r, p, flat, prefix, it, indent, os);
  for (const TensorView* tv : r.loads) {
    os << indent << "const float " << tensorLocal(tv) << " = "
       << loadExpr(tv->dtype(), tensorParam(tv) + "[" + off.at(tv) + "]") << ";\n";
  }
  for (const Expr* e : r.exprs) os << emitExpr(e, indent);
  for (const TensorView* tv : r.stores) {
    os << indent << tensorParam(tv) << "[" << flat << "] = " << storeExpr(tv->dtype(), tensorLocal(tv)) << ";\n";
  }
}

}  // namespace

std::string emitReduction(const Analysis& a, const Schedule& s, const std::string& name_token) {
  const Expr* red = a.reduction;
  const OpType op = red->op();
  const auto* x = static_cast<const TensorView*>(red->input(0));
  const TensorView* y = red->out();
  const std::string acc = tensorLocal(y);
  const std::string it = indexType(s.index64);
  const int64_t tx = s.launch.block_x, ty = s.launch.block_y;
  const bool inner = s.kind == Kind::InnerReduction;
  const bool y_is_output =
      std::find(a.segment->outputs.begin(), a.segment->outputs.end(), y) != a.segment->outputs.end();
  std::ostringstream os;
  os << prelude() << "\n" << signature(a, name_token, tx * ty);
  os << "  // " << (inner ? "inner" : "outer") << " reduction " << red->toString() << ": " << s.rows << " rows x "
     << s.red << " reduced elements, " << tx << " x " << ty << " threads per block\n";

  auto emitEpilogue = [&](const std::string& indent) {
    emitRegionBody(s.epilogue, s.epilogue_index, "row", "e", it, indent, os);
    if (y_is_output) os << indent << tensorParam(y) << "[row] = " << storeExpr(y->dtype(), acc) << ";\n";
  };
  auto emitPrologue = [&](const std::string& indent) {
    emitRegionBody(s.main, s.main_index, "i", "c", it, indent, os);
    os << indent << acc << " = " << combine(op, acc, tensorLocal(x)) << ";\n";
  };

  if (inner) {
    const bool block_mode = ty == 1 && tx > 32;
    if (block_mode) os << "  __shared__ float mf_partial[" << tx / 32 << "];\n";
    const std::string per_block = ty == 1 ? "" : " * " + std::to_string(ty);
    os << "  for (" << it << " row = (" << it << ")blockIdx.x" << per_block << (ty == 1 ? "" : " + threadIdx.y")
       << "; row < " << s.rows << "; row += (" << it << ")gridDim.x" << per_block << ") {\n";
    os << "    float " << acc << " = " << initValue(op) << ";\n";
    os << "    for (" << it << " k = threadIdx.x; k < " << s.red << "; k += " << tx << ") {\n";
    os << "      const " << it << " i = row * " << s.red << " + k;\n";
    emitPrologue("      ");
    os << "    }\n";
    os << "    for (int o = 16; o > 0; o >>= 1) " << acc << " = "
       << combine(op, acc, "__shfl_xor_sync(0xffffffffu, " + acc + ", o)") << ";\n";
    if (block_mode) {
      os << "    if ((threadIdx.x & 31) == 0) mf_partial[threadIdx.x >> 5] = " << acc << ";\n";
      os << "    __syncthreads();\n";
      os << "    if (threadIdx.x < 32) {\n";
      os << "      " << acc << " = threadIdx.x < " << tx / 32 << " ? mf_partial[threadIdx.x] : " << initValue(op) << ";\n";
      os << "      for (int o = 16; o > 0; o >>= 1) " << acc << " = "
         << combine(op, acc, "__shfl_xor_sync(0xffffffffu, " + acc + ", o)") << ";\n";
      os << "    }\n";
      os << "    __syncthreads();\n";
    }
    os << "    if (threadIdx.x == 0) {\n";
    emitEpilogue("      ");
    os << "    }\n";
    os << "  }\n}\n";
    return os.str();
  }

  os << "  __shared__ float mf_partial[" << ty << "][32];\n";
  os << "  for (" << it << " col0 = (" << it << ")blockIdx.x * 32; col0 < " << s.rows << "; col0 += (" << it
     << ")gridDim.x * 32) {\n";
  os << "    const " << it << " row = col0 + threadIdx.x;\n";
  os << "    float " << acc << " = " << initValue(op) << ";\n";
  os << "    if (row < " << s.rows << ") {\n";
  os << "      for (" << it << " k = threadIdx.y; k < " << s.red << "; k += " << ty << ") {\n";
  os << "        const " << it << " i = k * " << s.rows << " + row;\n";
  emitPrologue("        ");
  os << "      }\n    }\n";
  os << "    mf_partial[threadIdx.y][threadIdx.x] = " << acc << ";\n";
  os << "    __syncthreads();\n";
  os << "    for (int h = " << ty / 2 << "; h > 0; h >>= 1) {\n";
  os << "      if (threadIdx.y < h) mf_partial[threadIdx.y][threadIdx.x] = "
     << combine(op, "mf_partial[threadIdx.y][threadIdx.x]", "mf_partial[threadIdx.y + h][threadIdx.x]") << ";\n";
  os << "      __syncthreads();\n    }\n";
  os << "    if (threadIdx.y == 0 && row < " << s.rows << ") {\n";
  os << "      " << acc << " = mf_partial[0][threadIdx.x];\n";
  emitEpilogue("      ");
  os << "    }\n";
  os << "    __syncthreads();\n";
  os << "  }\n}\n";
  return os.str();
}

}  // namespace codegen
}  // namespace mf
