// The transpose kernel: a pointwise segment where some loads are contiguous along axis A of the
// domain while the outputs are contiguous along the innermost axis B. Tiles are tile_a (A) x
// lanes_b vec (B) of TransposeParams (heuristics.h); for the sm_90 limits 64 x 16 vec, blocks 32 x 8,
// the numbers quoted below.
//
// Requires: a Transpose Schedule (chooseTranspose in scheduler.cpp). Guarantees: the domain is
// covered by 64 x 16vec tiles over (A, B) for every index of the other axes; a block of 32 x 8
// threads first issues the compute phase's other loads (into registers), then reads each
// transposed load with threadIdx.x walking A, two elements per lane (one vector where the scheduler
// found A even and aligned, else lanes x and x + 32: 128 bytes of bf16 per warp row either way),
// into a float tile in shared memory, then computes with 16 lanes walking B (`vec` consecutive
// elements each) and 2 lanes walking A: the other loads and every store are coalesced vector
// accesses. The tile has no padding; row r's columns are XOR-swizzled by 2 * (r / vec) mod 32, which
// keeps a lane pair adjacent (the read phase stores float2) and makes both the row-wise writes and
// the column-wise reads of a warp hit 32 distinct banks. Every output element is written exactly
// once; partial tiles at the edges are guarded (the scheduler makes B a multiple of vec, and A even
// for vector reads, so a vector never straddles an edge).
#include <algorithm>

#include "codegen/internal.h"
#include "support/error.h"

namespace mf {
namespace codegen {

std::string emitTranspose(const Analysis& a, const Schedule& s, const std::string& name_token) {
  const Region& r = s.main;
  const IndexPlan& p = s.main_index;
  const std::string it = indexType(s.index64);
  const size_t n = p.dims.size();
  const size_t ax = static_cast<size_t>(s.transpose_axis);
  const int64_t dim_a = p.dims[ax], dim_b = p.dims.back();
  const TransposeParams& tp = s.transpose;
  // The lanes: threadIdx.x walks A two elements per lane in the read phase; in the compute phase
  // lanes_b lanes walk B and the other two walk A.
  MF_CHECK(tp.tile_a == 2 * s.launch.block_x && tp.lanes_b * 2 == s.launch.block_x && s.launch.block_x == 32,
           "transpose tiles need 32-lane blocks with tile_a = 64 and lanes_b = 16");
  const int64_t vb = s.vec;              // consecutive elements along B per thread in the compute phase
  const int64_t va = s.vec_a;            // 2: one vector of two elements along A per lane; 1: two scalars
  const int64_t tile_a = tp.tile_a;      // tile extent along A
  const int64_t tile_b = tp.lanes_b * vb;  // tile extent along B
  const int64_t by = s.launch.block_y;
  const int64_t tiles_a = ceilDiv(dim_a, tile_a), tiles_b = ceilDiv(dim_b, tile_b);
  const int64_t compute_rows = tile_a / 2 / by;  // a-row pairs per thread in the compute phase
  const std::string lane_b = "(threadIdx.x & " + std::to_string(tp.lanes_b - 1) + ")";  // the lane's place along B
  auto is_tiled = [&](const TensorView* tv) {
    return std::find(s.transposed.begin(), s.transposed.end(), tv) != s.transposed.end();
  };
  std::ostringstream os;
  os << prelude() << "\n" << signature(a, name_token, it, s.launch.block_x * by, s.launch.min_blocks);
  // The outermost extent only through kCount (the tile count) unless it is axis A.
  os << "  // transpose over [";
  for (size_t d = 0; d < n; ++d) os << (d ? ", " : "") << (d == 0 && ax != 0 ? std::string("*") : std::to_string(p.dims[d]));
  os << "]: " << tile_a << " x " << tile_b << " tiles over axes " << ax << " and " << n - 1 << " through shared memory (swizzled), "
     << va << " per vector along axis " << ax << ", " << vb << " along axis " << n - 1 << "\n";
  for (const TensorView* tv : s.transposed) {
    os << "  __shared__ float mf_tile" << tv->name() << "[" << tile_b << "][" << tile_a << "];\n";
  }
  os << "  for (" << it << " tile = blockIdx.x; tile < " << kCount << "; tile += gridDim.x) {\n";
  os << "    " << it << " rem = tile;\n";
  os << "    const " << it << " b0 = (rem % " << tiles_b << ") * " << tile_b << ";\n";
  os << "    rem /= " << tiles_b << ";\n";
  os << "    const " << it << " a0 = (rem % " << tiles_a << ") * " << tile_a << ";\n";
  // The other axes' coordinates, from the tile's outer index.
  std::vector<std::string> coord(n);
  bool first = true;
  for (size_t d = n - 1; d-- > 0;) {
    if (d == ax) continue;
    if (first) os << "    rem /= " << tiles_a << ";\n";
    first = false;
    coord[d] = "mf_o" + std::to_string(d);  // not o<N>: output vectors are named o<tensor>
    const bool outermost = d == 0 || (d == 1 && ax == 0);  // rem is below its extent: no % needed
    if (outermost) {
      os << "    const " << it << " " << coord[d] << " = rem;\n";
      continue;
    }
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
  auto vectorAlongB = [&](const TensorView* tv) { return vb > 1 && p.strides.at(tv).back() == 1; };
  // The compute phase's coordinates: lane & 15 walks B (vb each), lane >> 4 and threadIdx.y walk A.
  auto computeCoords = [&](const std::string& indent) {
    os << indent << "const int al = 2 * (threadIdx.y + yy * " << by << ") + (threadIdx.x >> 4), bl = "
       << timesText(lane_b, vb) << ";\n";
    os << indent << "const " << it << " ia = a0 + al, ib = b0 + bl;\n";
  };
  // 1. The other loads of the compute phase, in flight together with the tile's reads.
  bool other_loads = false;
  for (const TensorView* tv : r.loads) {
    if (is_tiled(tv)) continue;
    other_loads = true;
    if (vectorAlongB(tv)) {
      os << "    mf_array<" << cudaType(tv->dtype()) << ", " << vb << "> v" << tv->name() << "[" << compute_rows << "];\n";
    } else {
      os << "    float x" << tv->name() << "[" << compute_rows << "];\n";
    }
  }
  if (other_loads) {
    os << "#pragma unroll\n    for (int yy = 0; yy < " << compute_rows << "; ++yy) {  // other loads, along axis " << n - 1
       << "\n";
    computeCoords("      ");
    os << "      if (ia >= " << dim_a << " || ib >= " << dim_b << ") continue;\n";
    for (const TensorView* tv : r.loads) {
      if (is_tiled(tv)) continue;
      if (vectorAlongB(tv)) {
        const std::string arr = "mf_array<" + cudaType(tv->dtype()) + ", " + std::to_string(vb) + ">";
        os << "      v" << tv->name() << "[yy] = *reinterpret_cast<const " << arr << "*>(" << tensorParam(tv) << " + "
           << offsetOf(p.strides.at(tv)) << ");\n";
      } else {
        os << "      x" << tv->name() << "[yy] = "
           << loadExpr(tv->dtype(), tensorParam(tv) + "[" + offsetOf(p.strides.at(tv)) + "]") << ";\n";
      }
    }
    os << "    }\n";
  }
  // 2. The transposed loads into the tiles.
  os << "#pragma unroll\n    for (int yy = 0; yy < " << tile_b / by << "; ++yy) {  // read along axis " << ax << "\n";
  os << "      const int y = threadIdx.y + yy * " << by << ", sw = (" << (vb == 1 ? "y" : "(y / " + std::to_string(vb) + ")")
     << " << 1) & 31;\n";
  os << "      const " << it << " ib = b0 + y;\n";
  os << "      if (ib >= " << dim_b << ") continue;\n";
  if (va == 2) {
    os << "      const " << it << " ia = a0 + 2 * threadIdx.x;\n";
    os << "      if (ia >= " << dim_a << ") continue;\n";
    for (const TensorView* tv : s.transposed) {
      const std::string arr = "mf_array<" + cudaType(tv->dtype()) + ", 2>";
      os << "      {\n        const " << arr << " w = *reinterpret_cast<const " << arr << "*>(" << tensorParam(tv) << " + "
         << offsetOf(p.strides.at(tv)) << ");\n";
      os << "        *reinterpret_cast<float2*>(&mf_tile" << tv->name() << "[y][(2 * threadIdx.x) ^ sw]) = make_float2("
         << loadExpr(tv->dtype(), "w.v[0]") << ", " << loadExpr(tv->dtype(), "w.v[1]") << ");\n      }\n";
    }
  } else {
    os << "#pragma unroll\n      for (int q = 0; q < " << tile_a << "; q += " << s.launch.block_x << ") {\n";
    os << "        const " << it << " ia = a0 + threadIdx.x + q;\n";
    os << "        if (ia >= " << dim_a << ") continue;\n";
    for (const TensorView* tv : s.transposed) {
      os << "        mf_tile" << tv->name() << "[y][(threadIdx.x + q) ^ sw] = "
         << loadExpr(tv->dtype(), tensorParam(tv) + "[" + offsetOf(p.strides.at(tv)) + "]") << ";\n";
    }
    os << "      }\n";
  }
  os << "    }\n    __syncthreads();\n";
  // 3. Compute and write along B.
  os << "#pragma unroll\n    for (int yy = 0; yy < " << compute_rows << "; ++yy) {  // compute and write along axis "
     << n - 1 << "\n";
  computeCoords("      ");
  os << "      if (ia >= " << dim_a << " || ib >= " << dim_b << ") continue;\n";
  os << "      const int sw = " << timesText(lane_b, 2) << " & 31;\n";
  const std::string flat = offsetOf(out_strides);
  emitStoreArrays(r.stores, vb, "      ", os);
  os << "#pragma unroll\n      for (int k = 0; k < " << vb << "; ++k) {\n";
  for (const TensorView* tv : r.loads) {
    std::string src;
    if (is_tiled(tv)) src = "mf_tile" + std::to_string(tv->name()) + "[bl + k][al ^ sw]";
    else if (vectorAlongB(tv)) src = loadExpr(tv->dtype(), "v" + std::to_string(tv->name()) + "[yy].v[k]");
    else src = "x" + std::to_string(tv->name()) + "[yy]";
    os << "        const float " << tensorLocal(tv) << " = " << src << ";\n";
  }
  for (const Expr* e : r.exprs) os << emitExpr(e, "        ");
  for (const TensorView* tv : r.stores) os << "        " << storeLane(tv, vb) << "\n";
  os << "      }\n";
  for (const TensorView* tv : r.stores) emitVectorStore(tv, vb, tensorParam(tv) + " + " + flat, "      ", os);
  os << "    }\n    __syncthreads();\n  }\n}\n";
  return os.str();
}

}  // namespace codegen
}  // namespace mf
