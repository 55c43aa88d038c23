// The transpose kernel: a pointwise segment where some loads are contiguous along axis A of the
// domain while the outputs are contiguous along the innermost axis B.
//
// Requires: a Transpose Schedule (chooseTranspose in scheduler.cpp). Guarantees: the domain is
// covered by 32 x 32 tiles over (A, B) for every index of the other axes; a block of 32 x 8 threads
// first reads each transposed load with threadIdx.x walking A (coalesced), into a padded float tile
// in shared memory (33 columns: no bank conflicts on the transposed read), then computes with
// threadIdx.x walking B: the other loads and every store are coalesced. Every output element is
// written exactly once; partial tiles at the edges are guarded.
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
  const int64_t tiles_a = ceilDiv(dim_a, 32), tiles_b = ceilDiv(dim_b, 32);
  const int64_t outer = r.numel() / (dim_a * dim_b);
  std::ostringstream os;
  os << prelude() << "\n" << signature(a, name_token, s.launch.block_x * s.launch.block_y);
  os << "  // transpose over [";
  for (size_t d = 0; d < n; ++d) os << (d ? ", " : "") << p.dims[d];
  os << "]: 32 x 32 tiles over axes " << ax << " and " << n - 1 << " through shared memory\n";
  for (const TensorView* tv : s.transposed) os << "  __shared__ float mf_tile" << tv->name() << "[32][33];\n";
  os << "  for (" << it << " tile = blockIdx.x; tile < " << outer * tiles_a * tiles_b << "; tile += gridDim.x) {\n";
  os << "    " << it << " rem = tile;\n";
  os << "    const " << it << " b0 = (rem % " << tiles_b << ") * 32;\n";
  os << "    rem /= " << tiles_b << ";\n";
  os << "    const " << it << " a0 = (rem % " << tiles_a << ") * 32;\n";
  os << "    rem /= " << tiles_a << ";\n";
  // The other axes' coordinates, from the tile's outer index.
  std::vector<std::string> coord(n);
  for (size_t d = n - 1; d-- > 0;) {
    if (d == ax) continue;
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
  auto bounds = [&](const std::string& ia, const std::string& ib, const std::string& indent) {
    os << indent << "const " << it << " ia = " << ia << ", ib = " << ib << ";\n";
    os << indent << "if (ia >= " << dim_a << " || ib >= " << dim_b << ") continue;\n";
  };
  // Fixed trip counts, unrolled: each thread's loads are all in flight together.
  const std::string rows_loop = "#pragma unroll\n    for (int yy = 0; yy < " + std::to_string(32 / s.launch.block_y) +
                                "; ++yy) {\n      const int y = threadIdx.y + yy * " + std::to_string(s.launch.block_y) +
                                ";";
  os << rows_loop << "  // read along axis " << ax << "\n";
  bounds("a0 + threadIdx.x", "b0 + y", "      ");
  for (const TensorView* tv : s.transposed) {
    os << "      mf_tile" << tv->name() << "[y][threadIdx.x] = "
       << loadExpr(tv->dtype(), tensorParam(tv) + "[" + offsetOf(p.strides.at(tv)) + "]") << ";\n";
  }
  os << "    }\n    __syncthreads();\n";
  os << rows_loop << "  // compute and write along axis " << n - 1 << "\n";
  bounds("a0 + y", "b0 + threadIdx.x", "      ");
  for (const TensorView* tv : r.loads) {
    bool tiled = std::find(s.transposed.begin(), s.transposed.end(), tv) != s.transposed.end();
    std::string src = tiled ? "mf_tile" + std::to_string(tv->name()) + "[threadIdx.x][y]"
                            : loadExpr(tv->dtype(), tensorParam(tv) + "[" + offsetOf(p.strides.at(tv)) + "]");
    os << "      const float " << tensorLocal(tv) << " = " << src << ";\n";
  }
  for (const Expr* e : r.exprs) os << emitExpr(e, "      ");
  const std::string flat = offsetOf(out_strides);
  for (const TensorView* tv : r.stores) {
    os << "      " << tensorParam(tv) << "[" << flat << "] = " << storeExpr(tv->dtype(), tensorLocal(tv)) << ";\n";
  }
  os << "    }\n    __syncthreads();\n  }\n}\n";
  return os.str();
}

}  // namespace codegen
}  // namespace mf
