// The reduction kernels (one sum/max/min, or several outer ones over one domain, with a pointwise
// prologue and epilogue).
//
// Requires: an InnerReduction or OuterReduction Schedule. Guarantees: exact and deterministic
// results (a fixed combine order for a given launch, no atomics); accumulation in float; every
// element of the reduction input is visited once, so prologue outputs are written exactly once;
// the epilogue runs once per output element, on one thread, after the full combine. The prologue
// reads groups of `vec` consecutive elements with one vector access per tensor, and the main loops
// load `unroll` groups per thread before accumulating any of them (a one-group loop does the tail).
//   inner  X viewed as [rows, red]: blockDim.y rows per block, blockDim.x threads per row strided
//          over the row's vectors, then __shfl_xor_sync inside the warp and, when a row spans
//          several warps (blockDim.y == 1), a shared-memory combine of the per-warp results.
//   outer  X viewed as [red, rows]: a block owns blockDim.x * vec adjacent columns (each thread
//          `vec` of them, one vector load per reduced row), threadIdx.y splits the reduced rows;
//          the blockDim.y partials combine in a shared-memory tree, then the block's threads run
//          the epilogue one column each. With split_rows, block (x, y) walks only chunk y of the
//          reduced rows, writes its float partials to the workspace ([chunks][columns]) and counts
//          its arrival on the tile's counter; the last block to arrive combines the chunks in chunk
//          order (deterministic) and runs the epilogue.
#include <algorithm>
#include <cmath>

#include "codegen/internal.h"

namespace mf {
namespace codegen {
namespace {

std::string combine(OpType op, const std::string& a, const std::string& b) {
  return fillTemplate(opInfo(op).cuda_combine, {a, b});
}

std::string initValue(OpType op) { return opInfo(op).cuda_init; }

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
    os << indent << tensorParam(tv) << "[" << flat << "] = " << storeOf(tv) << ";\n";
  }
}

}  // namespace

std::string emitReduction(const Analysis& a, const Schedule& s, const std::string& name_token) {
  const std::vector<const Expr*>& reds = s.reductions;
  const Expr* red = reds.front();
  const OpType op = red->op();
  const auto* x = static_cast<const TensorView*>(red->input(0));
  const TensorView* y = red->out();
  const std::string acc = tensorLocal(y);
  const std::string it = indexType(s.index64);
  const int64_t tx = s.launch.block_x, ty = s.launch.block_y, v = s.vec, u = s.unroll;
  const int64_t nred = static_cast<int64_t>(reds.size());
  const bool inner = s.kind == Kind::InnerReduction;
  auto is_output = [&](const TensorView* tv) {
    return std::find(a.segment->outputs.begin(), a.segment->outputs.end(), tv) != a.segment->outputs.end();
  };
  std::ostringstream os;
  const bool split = s.split_rows;
  os << prelude() << "\n" << signature(a, name_token, it, tx * ty, 0, split);
  // The extent-dependent side (rows of an inner reduction, reduced rows of an outer one) is kCount.
  os << "  // " << (inner ? "inner" : "outer") << " reduction";
  for (const Expr* r : reds) os << " " << r->toString() << (r == reds.back() ? ":" : ";");
  os << " " << (inner ? std::string(kCount) : std::to_string(s.rows)) << " rows x "
     << (inner ? std::to_string(s.red) : std::string(kCount)) << " reduced elements, " << tx << " x " << ty << " threads per block, " << v << " per vector, " << u
     << " vectors per step\n";

  auto emitEpilogue = [&](const std::string& indent) {
    emitRegionBody(s.epilogue, s.epilogue_index, "row", "e", it, indent, os);
    for (const Expr* r : reds) {
      if (is_output(r->out())) {
        os << indent << tensorParam(r->out()) << "[row] = " << storeExpr(r->out()->dtype(), tensorLocal(r->out())) << ";\n";
      }
    }
  };
  // The reduction loop over index variable `j` (from `first`, step `stride`, below `count`);
  // `flat(e)` is the flat prologue index of the group at j = e; `accumulate(indent)` folds x in.
  auto emitLoop = [&](const std::string& first, int64_t stride, const std::string& count,
                      const std::function<std::string(const std::string&)>& flat,
                      const std::function<void(const std::string&)>& accumulate, const std::string& indent) {
    const std::string in = indent + "  ";
    if (u > 1) {
      os << indent << it << " j = " << first << ";\n";
      // Loops of u, u / 2, ... groups, then one: an outer reduction's count is the extent-dependent
      // reduced extent, and its unroll must not depend on it (one source for every row count).
      for (int64_t w = u; w > 1; w /= 2) {
        os << indent << "for (; j + " << (w - 1) * stride << " < " << count << "; j += " << w * stride << ") {  // "
           << w << " groups: all loads, then the math\n";
        emitGroupArrays(s.main, s.main_index, v, w, in, os);
        os << "#pragma unroll\n" << in << "for (int u = 0; u < " << w << "; ++u) {\n";
        os << in << "  const " << it << " i = " << flat("j + u * " + std::to_string(stride)) << ";\n";
        emitGroupLoads(s.main, s.main_index, v, "i", it, "[u]", in + "  ", os);
        os << in << "}\n";
        os << "#pragma unroll\n" << in << "for (int u = 0; u < " << w << "; ++u) {\n";
        if (!s.main.stores.empty()) {
          os << in << "  const " << it << " i = " << flat("j + u * " + std::to_string(stride)) << ";\n";
        }
        emitGroupCompute(s.main, s.main_index, v, "i", "[u]", in + "  ", os, accumulate);
        os << in << "}\n";
        os << indent << "}\n";
      }
      os << indent << "for (; j < " << count << "; j += " << stride << ") {\n";
    } else {
      os << indent << "for (" << it << " j = " << first << "; j < " << count << "; j += " << stride << ") {\n";
    }
    os << in << "const " << it << " i = " << flat("j") << ";\n";
    emitGroupLoads(s.main, s.main_index, v, "i", it, "", in, os);
    emitGroupCompute(s.main, s.main_index, v, "i", "", in, os, accumulate);
    os << indent << "}\n";
  };

  if (inner) {
    const bool block_mode = ty == 1 && tx > 32;
    if (block_mode) os << "  __shared__ float mf_partial[" << tx / 32 << "];\n";
    const std::string per_block = ty == 1 ? "" : " * " + std::to_string(ty);
    os << "  for (" << it << " row = (" << it << ")blockIdx.x" << per_block << (ty == 1 ? "" : " + threadIdx.y")
       << "; row < " << kCount << "; row += (" << it << ")gridDim.x" << per_block << ") {\n";
    os << "    float " << acc << " = " << initValue(op) << ";\n";
    emitLoop("threadIdx.x", tx, std::to_string(s.red / v),
             [&](const std::string& j) { return "row * " + std::to_string(s.red) + " + " + timesText(j, v); },
             [&](const std::string& ind) { os << ind << acc << " = " << combine(op, acc, tensorLocal(x)) << ";\n"; },
             "    ");
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
    const std::string wrapped = wrapInt32Result(y->dtype(), acc);
    if (wrapped != acc) os << "      " << acc << " = " << wrapped << ";\n";
    emitEpilogue("      ");
    os << "    }\n";
    os << "  }\n}\n";
    return os.str();
  }

  // Outer: reduction r's partials are mf_acc[r][k] per thread, mf_partial[r][.][.] per block and,
  // split over chunks, mf_parts[(r * chunks + chunk) * columns + column] in the workspace (one
  // reduction: mf_acc[k], mf_partial[.][.], mf_parts[chunk * columns + column]).
  const int64_t tile = tx * v;  // columns per block
  const std::string lane = v > 1 ? "k" : "0";
  const std::string rows = std::to_string(s.rows);
  const bool one = nred == 1;
  auto opOf = [&](int64_t r) { return reds[static_cast<size_t>(r)]->op(); };
  auto accOf = [&](int64_t r) { return one ? std::string("mf_acc") : "mf_acc[" + std::to_string(r) + "]"; };
  auto partialOf = [&](int64_t r) { return one ? std::string("mf_partial") : "mf_partial[" + std::to_string(r) + "]"; };
  const std::string dims = one ? "" : "[" + std::to_string(nred) + "]";
  os << "  __shared__ float mf_partial" << dims << "[" << ty << "][" << tile << "];\n";
  os << "  for (" << it << " col0 = (" << it << ")blockIdx.x * " << tile << "; col0 < " << rows << "; col0 += ("
     << it << ")gridDim.x * " << tile << ") {\n";
  os << "    const " << it << " col = col0 + " << timesText("threadIdx.x", v) << ";  // this thread's first column\n";
  os << "    float mf_acc" << dims << "[" << v << "];\n";
  for (int64_t r = 0; r < nred; ++r) {
    os << "#pragma unroll\n    for (int k = 0; k < " << v << "; ++k) " << accOf(r) << "[k] = " << initValue(opOf(r))
       << ";\n";
  }
  if (split) {
    // This block's chunk of reduced rows: [mf_r0, mf_r1), chunks of a multiple of blockDim.y rows.
    os << "    const " << it << " mf_chunk = (" << kCount << " + gridDim.y * " << ty << " - 1) / (gridDim.y * " << ty
       << ") * " << ty << ";\n";
    os << "    const " << it << " mf_r0 = (" << it << ")blockIdx.y * mf_chunk;\n";
    os << "    const " << it << " mf_r1 = mf_r0 + mf_chunk < " << kCount << " ? mf_r0 + mf_chunk : " << kCount << ";\n";
  }
  os << "    if (col < " << rows << ") {\n";
  emitLoop(split ? "mf_r0 + threadIdx.y" : "threadIdx.y", ty, split ? "mf_r1" : kCount,
           [&](const std::string& j) {
             if (s.inner_kept == s.rows) return timesText(j, s.rows) + " + col";
             const std::string b = std::to_string(s.inner_kept);
             return "(col / " + b + ") * " + timesText(kCount, s.inner_kept) + " + " + timesText(j, s.inner_kept) +
                    " + col % " + b;
           },
           [&](const std::string& ind) {
             for (int64_t r = 0; r < nred; ++r) {
               const std::string slot = accOf(r) + "[" + lane + "]";
               const auto* xr = static_cast<const TensorView*>(reds[static_cast<size_t>(r)]->input(0));
               os << ind << slot << " = " << combine(opOf(r), slot, tensorLocal(xr)) << ";\n";
             }
           },
           "      ");
  os << "    }\n";
  for (int64_t r = 0; r < nred; ++r) {
    os << "#pragma unroll\n    for (int k = 0; k < " << v << "; ++k) " << partialOf(r) << "[threadIdx.y]["
       << timesText("threadIdx.x", v) << " + k] = " << accOf(r) << "[k];\n";
  }
  os << "    __syncthreads();\n";
  os << "    for (int h = " << ty / 2 << "; h > 0; h >>= 1) {\n";
  os << "      if (threadIdx.y < h) {\n";
  os << "#pragma unroll\n        for (int k = 0; k < " << v << "; ++k) {\n";
  const std::string c = timesText("threadIdx.x", v) + " + k";
  for (int64_t r = 0; r < nred; ++r) {
    const std::string p = partialOf(r);
    os << "          " << p << "[threadIdx.y][" << c << "] = "
       << combine(opOf(r), p + "[threadIdx.y][" + c + "]", p + "[threadIdx.y + h][" + c + "]") << ";\n";
  }
  os << "        }\n      }\n";
  os << "      __syncthreads();\n    }\n";
  if (split) {
    const std::string tid = "threadIdx.y * " + std::to_string(tx) + " + threadIdx.x";
    const std::string work = std::string(kWorkspaceParam);
    auto part = [&](int64_t r, const std::string& chunk) {
      const std::string row_of = one ? chunk : "(" + std::to_string(r) + " * gridDim.y + " + chunk + ")";
      return "mf_parts[(" + it + ")" + row_of + " * " + rows + " + col0 + c]";
    };
    os << "    if (gridDim.y > 1) {  // the chunk's partials out; the last block of this tile combines every chunk\n";
    os << "      float* mf_parts = reinterpret_cast<float*>(" << work << ");\n";
    os << "      unsigned* mf_arrived = reinterpret_cast<unsigned*>(" << work << " + (size_t)gridDim.y * " << nred * s.rows
       << " * sizeof(float)) + col0 / " << tile << ";\n";
    os << "      __shared__ bool mf_last;\n";
    const std::string chunk_loop = "      for (int c = " + tid + "; c < " + std::to_string(tile) + " && col0 + c < " + rows +
                                   "; c += " + std::to_string(tx * ty) + ")";
    if (one) {
      os << chunk_loop << " " << part(0, "blockIdx.y") << " = mf_partial[0][c];\n";
    } else {
      os << chunk_loop << " {\n";
      for (int64_t r = 0; r < nred; ++r) os << "        " << part(r, "blockIdx.y") << " = " << partialOf(r) << "[0][c];\n";
      os << "      }\n";
    }
    os << "      __threadfence();\n";
    os << "      __syncthreads();\n";
    os << "      if (" << tid << " == 0) mf_last = atomicAdd(mf_arrived, 1u) == gridDim.y - 1;\n";
    os << "      __syncthreads();\n";
    os << "      if (!mf_last) continue;  // the whole block: another block of this tile finishes it\n";
    os << "      __threadfence();\n";
    os << chunk_loop << " {\n";
    for (int64_t r = 0; r < nred; ++r) {
      const std::string in = one ? "        " : "          ";
      if (!one) os << "        {\n";
      os << in << "float v = " << initValue(opOf(r)) << ";\n";
      os << in << "for (unsigned k = 0; k < gridDim.y; ++k) v = " << combine(opOf(r), "v", "__ldcg(&" + part(r, "k") + ")")
         << ";\n";
      os << in << partialOf(r) << "[0][c] = v;\n";
      if (!one) os << "        }\n";
    }
    os << "      }\n";
    os << "      if (" << tid << " == 0) *mf_arrived = 0u;  // ready for the next launch\n";
    os << "      __syncthreads();\n";
    os << "    }\n";
  }
  os << "    for (int c = threadIdx.y * " << tx << " + threadIdx.x; c < " << tile << "; c += " << tx * ty
     << ") {  // the epilogue, one column per thread\n";
  os << "      const " << it << " row = col0 + c;\n";
  os << "      if (row >= " << rows << ") break;\n";
  for (int64_t r = 0; r < nred; ++r) {
    const TensorView* yr = reds[static_cast<size_t>(r)]->out();
    os << "      const float " << tensorLocal(yr) << " = " << wrapInt32Result(yr->dtype(), partialOf(r) + "[0][c]")
       << ";\n";
  }
  emitEpilogue("      ");
  os << "    }\n";
  os << "    __syncthreads();\n";
  os << "  }\n}\n";
  return os.str();
}

}  // namespace codegen
}  // namespace mf
