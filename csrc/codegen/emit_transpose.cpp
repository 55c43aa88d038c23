// The transpose kernel: a pointwise segment where some loads are contiguous along axis A of the
// domain while the outputs are contiguous along the innermost axis B. Tiles are 32 (A) x 32 vec (B).
//
// Requires: a Transpose Schedule (chooseTranspose in scheduler.cpp). Guarantees: the domain is
// covered by 32 x 32 tiles over (A, B) for every index of the other axes; a block of 32 x 8 threads
// first reads each transposed load with threadIdx.x walking A (coalesced), into a padded float tile
// in shared memory (33 columns: few bank conflicts on the transposed read), then computes with
// threadIdx.x walking B, `vec` consecutive elements each: the other loads and every store are
// coalesced vector accesses. Every output element is written exactly once; partial tiles at the
// edges are guarded (the scheduler makes B a multiple of vec, so a vector never straddles an edge).
#include <algorithm>

#include "codegen/internal.h"

namespace mf {
namespace codegen {

std::string emitTranspose(const Analysis& a, const Schedule& s, const std::string& name_token) {
  const Region& r = s.main;
  const IndexPlan& p = s.main_index;
  const std::string it = indexType(s.index64);
  const size_t n = p.dims.size();
  const size_t ax = static_cast<size_t>(s.transpose_axis);
  const int64_t dim_a = p.dims[ax], dim_b = p.dims.back();
  const int64_t vb = s.vec;           // consecutive elements along B per thread in the compute phase
  const int64_t tile_b = 32 * vb;     // tile extent along B; 32 along A
  const int64_t by = s.launch.block_y;
  const int64_t tiles_a = ceilDiv(dim_a, 32), tiles_b = ceilDiv(dim_b, tile_b);
  const int64_t outer = r.numel() / (dim_a * dim_b);
  auto is_tiled = [&](const TensorView* tv) {
    return std::find(s.transposed.begin(), s.transposed.end(), tv) != s.transposed.end();
  };
  std::ostringstream os;
  os << prelude() << "\n" << signature(a, name_token, s.launch.block_x * by);
  os << "  // transpose over [";
  for (size_t d = 0; d < n; ++d) os << (d ? ", " : "") << p.dims[d];
  os << "]: 32 x " << tile_b << " tiles over axes " << ax << " and " << n - 1 << " through shared memory, " << vb
     << " per vector along axis " << n - 1 << "\n";
  for (const TensorView* tv : s.transposed) {
    os << "  __shared__ float mf_tile" << tv->name() << "[" << tile_b << "][33];\n";
  }
  os << "  for (" << it << " tile = blockIdx.x; tile < " << outer * tiles_a * tiles_b << "; tile += gridDim.x) {\n";
  os << "    " << it << " rem = tile;\n";
  os << "    const " << it << " b0 = (rem % " << tiles_b << ") * " << tile_b << ";\n";
  os << "    rem /= " << tiles_b << ";\n";
  os << "    const " << it << " a0 = (rem % " << tiles_a << ") * 32;\n";
  // The other axes' coordinates, from the tile's outer index.
  std::vector<std::string> coord(n);
  bool first = true;
  for (size_t d = n - 1; d-- > 0;) {
    if (d == ax) continue;
    if (first) os << "    rem /= " << tiles_a << ";\n";
    first = false;
    coord[d] = "o" + std::to_string(d);
    os << "    const " << it << " " << coord[d] << " = rem % " << p.dims[d] << ";\n";
    os << "    rem /= " << p.dims[d] << ";\n";
  }
  coord[ax] = "ia";
  coord[n - 1] = "ib";
  auto offsetOf = [&](const std::vector<int64_t>& strides) {
    std::string e;
    for (size_t d = 0; d < n; ++d) {
      if (strides[d] == 0) continue;
      e += (e.empty() ? "" : " + ") + coord[d] + (strides[d] == 1 ? "" : " * " + std::to_string(strides[d]));
    }
    return e.empty() ? std::string("0") : e;
  };
  std::vector<int64_t> out_strides(n, 1);
  for (size_t d = n - 1; d-- > 0;) out_strides[d] = out_strides[d + 1] * p.dims[d + 1];
  // Fixed trip counts, unrolled: each thread's loads are all in flight together.
  auto rowsLoop = [&](int64_t rows, const std::string& what) {
    os << "#pragma unroll\n    for (int yy = 0; yy < " << rows / by << "; ++yy) {  // " << what << "\n";
    os << "      const int y = threadIdx.y + yy * " << by << ";\n";
  };
  rowsLoop(tile_b, "read along axis " + std::to_string(ax));
  os << "      const " << it << " ia = a0 + threadIdx.x, ib = b0 + y;\n";
  os << "      if (ia >= " << dim_a << " || ib >= " << dim_b << ") continue;\n";
  for (const TensorView* tv : s.transposed) {
    os << "      mf_tile" << tv->name() << "[y][threadIdx.x] = "
       << loadExpr(tv->dtype(), tensorParam(tv) + "[" + offsetOf(p.strides.at(tv)) + "]") << ";\n";
  }
  os << "    }\n    __syncthreads();\n";
  rowsLoop(32, "compute and write along axis " + std::to_string(n - 1));
  os << "      const " << it << " ia = a0 + y, ib = b0 + " << timesText("threadIdx.x", vb) << ";\n";
  os << "      if (ia >= " << dim_a << " || ib >= " << dim_b << ") continue;\n";
  // Non-tiled loads contiguous along B: one vector each; broadcast ones: one element.
  for (const TensorView* tv : r.loads) {
    if (is_tiled(tv)) continue;
    const std::string arr = "mf_array<" + cudaType(tv->dtype()) + ", " + std::to_string(vb) + ">";
    if (vb > 1 && p.strides.at(tv).back() == 1) {
      os << "      const " << arr << " v" << tv->name() << " = *reinterpret_cast<const " << arr << "*>("
         << tensorParam(tv) << " + " << offsetOf(p.strides.at(tv)) << ");\n";
    } else {
      os << "      const float x" << tv->name() << " = "
         << loadExpr(tv->dtype(), tensorParam(tv) + "[" + offsetOf(p.strides.at(tv)) + "]") << ";\n";
    }
  }
  const std::string flat = offsetOf(out_strides);
  for (const TensorView* tv : r.stores) {
    os << "      mf_array<" << cudaType(tv->dtype()) << ", " << vb << "> o" << tv->name() << ";\n";
  }
  os << "#pragma unroll\n      for (int k = 0; k < " << vb << "; ++k) {\n";
  for (const TensorView* tv : r.loads) {
    std::string src;
    if (is_tiled(tv)) src = "mf_tile" + std::to_string(tv->name()) + "[" + timesText("threadIdx.x", vb) + " + k][y]";
    else if (vb > 1 && p.strides.at(tv).back() == 1) src = loadExpr(tv->dtype(), "v" + std::to_string(tv->name()) + ".v[k]");
    else src = "x" + std::to_string(tv->name());
    os << "        const float " << tensorLocal(tv) << " = " << src << ";\n";
  }
  for (const Expr* e : r.exprs) os << emitExpr(e, "        ");
  for (const TensorView* tv : r.stores) {
    os << "        o" << tv->name() << ".v[k] = " << storeOf(tv) << ";\n";
  }
  os << "      }\n";
  for (const TensorView* tv : r.stores) {
    os << "      *reinterpret_cast<mf_array<" << cudaType(tv->dtype()) << ", " << vb << ">*>(" << tensorParam(tv) << " + "
       << flat << ") = o" << tv->name() << ";\n";
  }
  os << "    }\n    __syncthreads();\n  }\n}\n";
  return os.str();
}

}  // namespace codegen
}  // namespace mf
