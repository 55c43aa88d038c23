// The pointwise kernel: one thread per group of `vec` consecutive output elements, grid-stride loop
// over the flat index of the (contiguous) outputs.
//
// Requires: a Pointwise Schedule. Guarantees: every output element is written exactly once; inputs
// are read through their own strides (broadcast axes have stride 0); inputs contiguous over the
// whole domain use the flat index directly; with vec > 1 every tensor whose inner stride is 1 is
// read/written with one aligned vector access per group (the scheduler checked divisibility and
// alignment), and inputs broadcast along the inner axis are read once per group.
#include "codegen/internal.h"

namespace mf {
namespace codegen {

std::string emitPointwise(const Analysis& a, const Schedule& s, const std::string& name_token) {
  const Region& r = s.main;
  const IndexPlan& p = s.main_index;
  const std::string it = indexType(s.index64);
  const int64_t v = s.vec;
  std::ostringstream os;
  os << prelude() << "\n" << signature(a, name_token, s.launch.block_x);
  os << "  // pointwise over [";
  for (size_t d = 0; d < r.extents.size(); ++d) os << (d ? ", " : "") << r.extents[d];
  os << "] (" << r.numel() << " elements, " << v << " per thread step)\n";
  const std::string g = v == 1 ? "i" : "g";
  os << "  for (" << it << " " << g << " = (" << it << ")blockIdx.x * blockDim.x + threadIdx.x; " << g << " < "
     << r.numel() / v << "; " << g << " += (" << it << ")gridDim.x * blockDim.x) {\n";
  if (v > 1) os << "    const " << it << " i = " << g << " * " << v << ";\n";
  auto off = emitOffsets(r, p, "i", "c", it, "    ", os);
  std::string body_indent = "    ";
  if (v == 1) {
    for (const TensorView* tv : r.loads) {
      os << "    const float " << tensorLocal(tv) << " = "
         << loadExpr(tv->dtype(), tensorParam(tv) + "[" + off.at(tv) + "]") << ";\n";
    }
  } else {
    for (const TensorView* tv : r.loads) {
      if (p.strides.at(tv).back() == 0) {
        os << "    const float " << tensorLocal(tv) << " = "
           << loadExpr(tv->dtype(), tensorParam(tv) + "[" + off.at(tv) + "]") << ";  // broadcast over the vector\n";
      } else {
        std::string arr = "mf_array<" + cudaType(tv->dtype()) + ", " + std::to_string(v) + ">";
        os << "    const " << arr << " v" << tv->name() << " = *reinterpret_cast<const " << arr << "*>(" << tensorParam(tv)
           << " + " << off.at(tv) << ");\n";
      }
    }
    for (const TensorView* tv : r.stores) {
      os << "    mf_array<" << cudaType(tv->dtype()) << ", " << v << "> o" << tv->name() << ";\n";
    }
    os << "#pragma unroll\n    for (int k = 0; k < " << v << "; ++k) {\n";
    body_indent = "      ";
    for (const TensorView* tv : r.loads) {
      if (p.strides.at(tv).back() == 0) continue;
      os << body_indent << "const float " << tensorLocal(tv) << " = "
         << loadExpr(tv->dtype(), "v" + std::to_string(tv->name()) + ".v[k]") << ";\n";
    }
  }
  for (const Expr* e : r.exprs) os << emitExpr(e, body_indent);
  for (const TensorView* tv : r.stores) {
    std::string dst = v == 1 ? tensorParam(tv) + "[i]" : "o" + std::to_string(tv->name()) + ".v[k]";
    os << body_indent << dst << " = " << storeExpr(tv->dtype(), tensorLocal(tv)) << ";\n";
  }
  if (v > 1) {
    os << "    }\n";
    for (const TensorView* tv : r.stores) {
      std::string arr = "mf_array<" + cudaType(tv->dtype()) + ", " + std::to_string(v) + ">";
      os << "    *reinterpret_cast<" << arr << "*>(" << tensorParam(tv) << " + i) = o" << tv->name() << ";\n";
    }
  }
  os << "  }\n}\n";
  return os.str();
}

}  // namespace codegen
}  // namespace mf
