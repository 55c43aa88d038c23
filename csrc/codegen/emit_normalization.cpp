// The normalization kernel: one row (one kept index) per block, or per warp for short rows; the
// outer variant (reduced axes outermost) gives each thread one kept index (a column), threadIdx.y
// striding the reduced rows, and combines the rows of threads' partials in shared memory.
//
// Requires: a Normalization Schedule (normalization.cpp). Guarantees: each row is processed by one
// block (blockDim.y == 1) or by blockDim.x <= 32 lanes of one warp (all rows of a warp leave the
// row loop together: the scheduler keeps the row count a multiple of the rows per warp); loop s
// over the row's elements (thread t owns vector groups t, t + blockDim.x, ...) computes the varying
// values homed at s and folds the reductions of stage s into per-thread accumulators, which then
// combine across the lanes (__shfl_xor_sync, identical on every lane) and the block (shared memory,
// a fixed warp order; two slots used in turn, one barrier per reduction), so every thread holds
// the row's result for the next loop; deterministic, no atomics. Per-row values are computed once
// per row by every thread; per-row outputs are stored by lane 0. A loop recomputes the varying
// values it needs from the loads, except the plan's cached (transcendental) values, which stay as
// floats from their home loop (mf_e); persistent plans keep the raw vectors of the loads that
// later loops read again in registers (fully unrolled `iters` groups, so each input is read from
// memory once), multi-pass plans read them again; plans with `staged` loads have cp.async copy the block's next row
// into dynamic shared memory (mf_s) after loop 0's reductions, and read it back at the next row's
// loop 0 (each thread only its own vectors: a wait_group, no barrier). A division by a per-row
// value is a per-row reciprocal and a multiply (<= 1.5 ulp instead of 0.5; not in double compute).
// Varying loads and full outputs use one `vec`-wide access per group; half/bfloat16 outputs
// convert two lanes per cvt.
#include <algorithm>
#include <unordered_set>

#include "codegen/internal.h"
#include "support/error.h"

namespace mf {
namespace codegen {
namespace {

std::string arrayOf(const TensorView* tv, int64_t vec) {
  return "mf_array<" + cudaType(tv->dtype()) + ", " + std::to_string(vec) + ">";
}

struct LoopSets {
  std::vector<const TensorView*> loads;   // varying loads read in this loop
  std::vector<const Expr*> exprs;         // varying exprs computed in this loop (program order)
  std::vector<const TensorView*> cache_reads;  // cached values read from their mf_e registers
  std::vector<const Expr*> reductions;    // accumulated in this loop
  std::vector<const TensorView*> stores;  // full outputs written in this loop
};

}  // namespace

std::string emitNormalization(const Analysis& a, const Schedule& s, const std::string& name_token) {
  const NormPlan& p = s.norm;
  const KernelSegment& seg = *a.segment;
  const std::string it = indexType(s.index64);
  const int64_t bx = s.launch.block_x, by = s.launch.block_y, v = s.vec;
  const bool block_mode = bx > 32;
  const int loops = p.last_loop + 1;
  std::unordered_set<const Expr*> reductions(a.reductions.begin(), a.reductions.end());
  auto is_row_output = [&](const TensorView* tv) {
    return std::find(p.row_outputs.begin(), p.row_outputs.end(), tv) != p.row_outputs.end();
  };

  // What each loop computes (NormPlan::loop_values), in program order.
  std::vector<LoopSets> sets(static_cast<size_t>(loops));
  for (int l = 0; l < loops; ++l) {
    LoopSets& ls = sets[static_cast<size_t>(l)];
    const auto& m = p.loop_values[static_cast<size_t>(l)];
    for (const TensorView* tv : p.loads) {
      if (m.count(tv)) ls.loads.push_back(tv);
    }
    for (const Expr* e : seg.exprs) {
      if (reductions.count(e)) {
        if (p.stage.at(static_cast<const TensorView*>(e->input(0))) == l) ls.reductions.push_back(e);
      } else if (m.count(e->out())) {
        if (p.cached.count(e->out()) && p.home.at(e->out()) != l) ls.cache_reads.push_back(e->out());
        else ls.exprs.push_back(e);
      }
    }
    for (const TensorView* out : seg.outputs) {
      if (is_row_output(out)) continue;
      bool here = p.varies.at(out) ? p.home.at(out) == l : l == p.last_loop;
      if (here) ls.stores.push_back(out);
    }
  }
  int block_reductions = 0;  // per row
  for (const LoopSets& ls : sets) block_reductions += ls.reductions.empty() ? 0 : 1;
  int next_slot = 0;
  size_t max_reductions = 1;
  for (const LoopSets& ls : sets) max_reductions = std::max(max_reductions, ls.reductions.size());

  std::ostringstream os;
  const bool guarded = p.iters * bx * v > s.red;
  // Copies the loop-0 vectors of row `row_expr` into the mf_s shared arrays by cp.async (`staged`).
  auto emitNextRow = [&](const std::string& row_expr, const std::string& ind) {
    os << ind << "{  // the vectors of the block's next row, copied to shared memory while this row computes\n";
    os << ind << "  const " << it << " mf_row = " << row_expr << ";\n";
    os << ind << "  if (mf_row < " << kCount << ") {\n";
    const std::string i2 = ind + "    ";
    auto roff = emitOffsets(p.row_region, p.row_index, "mf_row", "rn", it, i2, os);
    os << "#pragma unroll\n" << i2 << "for (int it = 0; it < " << p.iters << "; ++it) {\n";
    os << i2 << "  const " << it << " j = " << timesText("(" + it + ")it * " + std::to_string(bx) + " + threadIdx.x", v)
       << ";\n";
    std::string i3 = i2 + "  ";
    if (guarded) {
      os << i3 << "if (j < " << s.red << ") {\n";
      i3 += "  ";
    }
    auto coff = emitOffsets(p.col_region, p.col_index, "j", "jn", it, i3, os);
    for (const TensorView* tv : p.loads) {
      const std::string src = tensorParam(tv) + " + (" + roff.at(tv) + ") + " + coff.at(tv);
      if (p.staged.count(tv)) {
        os << i3 << "mf_cp_async<" << v * sizeInBytes(tv->dtype()) << ">(&mf_s" << tv->name() << "[it][threadIdx.x], "
           << src << ");\n";
      }
    }
    if (guarded) os << i2 << "  }\n";
    os << i2 << "}\n" << ind << "  }\n";
    os << ind << "  mf_cp_async_commit();\n";
    os << ind << "}\n";
  };
  os << prelude() << "\n";
  if (!p.staged.empty()) os << cpAsyncHelpers();
  os << signature(a, name_token, it, bx * by, s.launch.min_blocks);
  // The extent-dependent side (rows; reduced rows of an outer plan) is kCount.
  os << "  // " << (p.outer ? "outer " : "") << "normalization: "
     << (p.outer ? std::to_string(s.rows) : std::string(kCount)) << " rows x "
     << (p.outer ? std::string(kCount) : std::to_string(s.red))
     << " reduced elements, " << bx << " x " << by
     << " threads per block, " << v << " per vector, " << loops << " loop(s) over the row, "
     << (p.persistent ? "persistent (" + std::to_string(p.iters) + " groups per thread in registers)"
                      : std::string("multi-pass (re-reads the row in each loop)"))
     << "\n";
  if (p.outer) {
    os << "  __shared__ float mf_part[" << max_reductions << "][" << by << "][" << bx << "];\n";
    os << "  for (" << it << " row0 = (" << it << ")blockIdx.x * " << bx << "; row0 < " << s.rows << "; row0 += (" << it
       << ")gridDim.x * " << bx << ") {\n";
    os << "    const " << it << " row = row0 + threadIdx.x;  // this thread's kept element\n";
    os << "    const bool mf_active = row < " << s.rows << ";\n";
  } else {
    if (block_mode) {
      // Two slots used in turn: a slot is written again only after the next block reduction's
      // barrier, which every reader of its last values has passed, so one barrier per reduction.
      os << "  __shared__ float mf_red[2][" << max_reductions << "][32];\n";
      if (block_reductions % 2 == 1) os << "  int mf_par = 0;  // the slot of the next block reduction\n";
    }
    const std::string per_block = by == 1 ? "" : " * " + std::to_string(by);
    if (s.launch.shared_mem_bytes > 0) {  // dynamic: more than the 48 KiB static shared memory allows
      os << "  extern __shared__ __align__(16) unsigned char mf_dyn[];  // the staged row\n";
      int64_t offset = 0;
      for (const TensorView* tv : p.loads) {
        if (!p.staged.count(tv)) continue;
        const std::string row_of_vectors = arrayOf(tv, v) + " (*)[" + std::to_string(bx) + "]";
        os << "  " << arrayOf(tv, v) << " (*const mf_s" << tv->name() << ")["
           << bx << "] = reinterpret_cast<" << row_of_vectors << ">(mf_dyn + " << offset << ");\n";
        offset += p.iters * bx * v * sizeInBytes(tv->dtype());
      }
      MF_CHECK(offset == s.launch.shared_mem_bytes, "normalization: shared memory plan of ", offset,
               " bytes, launch asks ", s.launch.shared_mem_bytes);
    }
    if (!p.staged.empty()) emitNextRow("(" + it + ")blockIdx.x", "  ");
    os << "  for (" << it << " row = (" << it << ")blockIdx.x" << per_block << (by == 1 ? "" : " + threadIdx.y")
       << "; row < " << kCount << "; row += (" << it << ")gridDim.x" << per_block << ") {\n";
  }
  // Row offsets of every load; per-row loads.
  auto row_off = emitOffsets(p.row_region, p.row_index, "row", "rc", it, "    ", os);
  for (const TensorView* tv : p.loads) {
    os << "    const " << it << " ro" << tv->name() << " = " << row_off.at(tv) << ";\n";
    if (!p.varies.at(tv)) {
      std::string value = loadExpr(tv->dtype(), tensorParam(tv) + "[ro" + std::to_string(tv->name()) + "]");
      os << "    const float " << tensorLocal(tv) << " = " << (p.outer ? "mf_active ? " + value + " : 0.0f" : value)
         << ";\n";
    }
  }
  if (p.persistent) {  // raw vectors of the loads later loops read again
    for (const TensorView* tv : p.loads) {
      if (p.reread.count(tv)) os << "    " << arrayOf(tv, v) << " mf_c" << tv->name() << "[" << p.iters << "];\n";
    }
    for (const Expr* e : seg.exprs) {  // in seg order: deterministic text
      if (p.cached.count(e->out())) os << "    float mf_e" << e->out()->name() << "[" << p.iters * v << "];\n";
    }
  }
  // x / r with r the same along the row (softmax's sum): one reciprocal per row, then a multiply
  // per element (an IEEE division per element is a MUFU op plus ~8 instructions). Not in double
  // compute, which keeps divisions exact for integer tensors.
  std::unordered_set<const TensorView*> reciprocals;
  auto rowDivisor = [&](const Expr* e) -> const TensorView* {
    if (a.compute_double || e->op() != OpType::Div || !e->input(1)->isTensor() || !e->input(0)->isTensor()) return nullptr;
    const auto* d = static_cast<const TensorView*>(e->input(1));
    return p.varies.at(d) ? nullptr : d;
  };
  auto emitVarying = [&](const Expr* e, const std::string& indent) {
    const TensorView* d = rowDivisor(e);
    if (d == nullptr) {
      os << emitExpr(e, indent);
      return;
    }
    os << indent << "const float " << tensorLocal(e->out()) << " = " << operandText(e->input(0)) << " * mf_rcp"
       << d->name() << ";  // " << e->toString() << "\n";
  };
  auto emitRowStage = [&](int stage) {
    for (const Expr* e : seg.exprs) {
      if (reductions.count(e) || p.varies.at(e->out()) || p.stage.at(e->out()) != stage) continue;
      os << emitExpr(e, "    ");
    }
    for (const TensorView* out : p.row_outputs) {
      if (p.stage.at(out) != stage) continue;
      os << (p.outer ? "    if (threadIdx.y == 0 && mf_active) " : "    if (threadIdx.x == 0) ") << tensorParam(out)
         << "[row] = " << storeExpr(out->dtype(), tensorLocal(out))
         << ";\n";
    }
  };
  const std::string red_text = std::to_string(s.red);
  // Combined int32 results wrap before anything reads them (PyTorch's int32 sum wraps past 2^31).
  auto emitWraps = [&](const std::vector<const Expr*>& done) {
    for (const Expr* r : done) {
      const std::string acc = tensorLocal(r->out());
      if (wrapInt32Result(r->out()->dtype(), acc) != acc) {
        os << "    " << acc << " = " << wrapInt32Result(r->out()->dtype(), acc) << ";\n";
      }
    }
  };
  for (int l = 0; l < loops; ++l) {
    const LoopSets& ls = sets[static_cast<size_t>(l)];
    emitRowStage(l);
    for (const Expr* e : ls.exprs) {
      const TensorView* d = rowDivisor(e);
      if (d == nullptr || !reciprocals.insert(d).second) continue;
      os << "    const float mf_rcp" << d->name() << " = 1.0f / " << tensorLocal(d) << ";\n";
    }
    os << "    // loop " << l << " over the row\n";
    for (const Expr* r : ls.reductions) {
      os << "    float " << tensorLocal(r->out()) << " = " << opInfo(r->op()).cuda_init << ";  // " << r->toString()
         << "\n";
    }
    std::string in = "      ";
    auto persistentHeader = [&]() {
      os << "#pragma unroll\n    for (int it = 0; it < " << p.iters << "; ++it) {\n";
      os << "      const " << it << " j = " << timesText("(" + it + ")it * " + std::to_string(bx) + " + threadIdx.x", v)
         << ";\n";
      if (guarded) {
        os << "      if (j < " << s.red << ") {\n";
        in = "        ";
      }
    };
    auto offset = [&](const TensorView* tv, const std::unordered_map<const TensorView*, std::string>& col_off) {
      return "ro" + std::to_string(tv->name()) + " + " + col_off.at(tv);
    };
    if (p.persistent) {
      os << "    {  // this loop's registers\n";
      // Every load this loop makes, for all of the thread's groups, before any math.
      std::vector<const TensorView*> fresh;
      for (const TensorView* tv : ls.loads) {
        if (p.home.at(tv) != l && p.reread.count(tv)) continue;  // in registers since its first loop
        fresh.push_back(tv);
        if (!p.reread.count(tv)) os << "    " << arrayOf(tv, v) << " mf_c" << tv->name() << "[" << p.iters << "];\n";
      }
      if (!fresh.empty()) {
        if (l == 0 && !p.staged.empty()) os << "    mf_cp_async_wait();  // this thread's copies of the row\n";
        persistentHeader();
        auto col_off = emitOffsets(p.col_region, p.col_index, "j", "jc", it, in, os);
        for (const TensorView* tv : fresh) {
          if (l == 0 && p.staged.count(tv)) {  // later loops: the buffer holds the next row
            os << in << "mf_c" << tv->name() << "[it] = mf_s" << tv->name() << "[it][threadIdx.x];\n";
            continue;
          }
          os << in << "mf_c" << tv->name() << "[it] = *reinterpret_cast<const " << arrayOf(tv, v) << "*>("
             << tensorParam(tv) << " + " << offset(tv, col_off) << ");\n";
        }
        if (guarded) os << "      }\n";
        os << "    }\n";
        in = "      ";
      }
      persistentHeader();
    } else if (p.outer) {
      os << "    if (mf_active) {\n";
      os << "    for (" << it << " j = threadIdx.y; j < " << kCount << "; j += " << by << ") {\n";
    } else {
      os << "    for (" << it << " j = " << timesText("(" + it + ")threadIdx.x", v) << "; j < " << s.red << "; j += "
         << bx * v << ") {\n";
    }
    std::unordered_map<const TensorView*, std::string> col_off;
    if (!p.persistent) col_off = emitOffsets(p.col_region, p.col_index, "j", "jc", it, in, os);
    for (const TensorView* tv : ls.loads) {
      const std::string name = std::to_string(tv->name());
      if (p.persistent) {
        os << in << "const " << arrayOf(tv, v) << " v" << name << " = mf_c" << name << "[it];\n";
        continue;
      }
      os << in << "const " << arrayOf(tv, v) << " v" << name << " = *reinterpret_cast<const " << arrayOf(tv, v) << "*>("
         << tensorParam(tv) << " + " << offset(tv, col_off) << ");\n";
    }
    if (v > 1) emitStoreArrays(ls.stores, v, in, os);
    std::string lane = in;
    if (v > 1) {
      os << "#pragma unroll\n" << in << "for (int k = 0; k < " << v << "; ++k) {\n";
      lane = in + "  ";
    }
    for (const TensorView* tv : ls.loads) {
      std::string src = "v" + std::to_string(tv->name()) + (v > 1 ? ".v[k]" : ".v[0]");
      os << lane << "const float " << tensorLocal(tv) << " = " << loadExpr(tv->dtype(), src) << ";\n";
    }
    const std::string slot = p.persistent ? (v > 1 ? "[it * " + std::to_string(v) + " + k]" : "[it]") : "";
    for (const TensorView* tv : ls.cache_reads) {
      os << lane << "const float " << tensorLocal(tv) << " = mf_e" << tv->name() << slot << ";\n";
    }
    for (const Expr* e : ls.exprs) {
      emitVarying(e, lane);
      if (p.cached.count(e->out())) os << lane << "mf_e" << e->out()->name() << slot << " = " << tensorLocal(e->out()) << ";\n";
    }
    for (const Expr* r : ls.reductions) {
      const std::string acc = tensorLocal(r->out());
      os << lane << acc << " = " << fillTemplate(opInfo(r->op()).cuda_combine, {acc, operandText(r->input(0))})
         << ";\n";
    }
    for (const TensorView* tv : ls.stores) {
      if (v > 1) {
        os << lane << storeLane(tv, v) << "\n";
        continue;
      }
      std::string dst = p.outer ? tensorParam(tv) + "[j * " + std::to_string(s.rows) + " + row]"
                                : tensorParam(tv) + "[row * " + red_text + " + j]";
      os << lane << dst << " = " << storeOf(tv) << ";\n";
    }
    if (v > 1) {
      os << in << "}\n";
      for (const TensorView* tv : ls.stores) emitVectorStore(tv, v, tensorParam(tv) + " + row * " + red_text + " + j", in, os);
    }
    if (p.persistent && guarded) os << "      }\n";
    os << "    }\n";
    if (p.persistent) os << "    }\n";
    if (p.outer) {
      os << "    }\n";
      if (!ls.reductions.empty()) {  // every row of threads' partials, combined in a fixed order
        os << "    __syncthreads();  // earlier readers of mf_part are done\n";
        for (size_t i = 0; i < ls.reductions.size(); ++i) {
          os << "    mf_part[" << i << "][threadIdx.y][threadIdx.x] = " << tensorLocal(ls.reductions[i]->out())
             << ";\n";
        }
        os << "    __syncthreads();\n";
        for (size_t i = 0; i < ls.reductions.size(); ++i) {
          const Expr* r = ls.reductions[i];
          const std::string acc = tensorLocal(r->out());
          const std::string slot = "mf_part[" + std::to_string(i) + "]";
          os << "    " << acc << " = " << slot << "[0][threadIdx.x];\n";
          os << "    for (int w = 1; w < " << by << "; ++w) " << acc << " = "
             << fillTemplate(opInfo(r->op()).cuda_combine, {acc, slot + "[w][threadIdx.x]"}) << ";\n";
        }
        emitWraps(ls.reductions);
      }
      continue;
    }
    // Combine the loop's reductions over the warp, then the block.
    for (const Expr* r : ls.reductions) {
      if (!block_mode && bx == 1) break;  // a row per thread: nothing to combine
      const std::string acc = tensorLocal(r->out());
      os << "    for (int o = " << (block_mode ? 16 : bx / 2) << "; o > 0; o >>= 1) " << acc << " = "
         << fillTemplate(opInfo(r->op()).cuda_combine, {acc, "__shfl_xor_sync(0xffffffffu, " + acc + ", o)"}) << ";\n";
    }
    if (block_mode && !ls.reductions.empty()) {
      const std::string slot = "mf_red[" + (block_reductions % 2 == 1 ? std::string("mf_par") : std::to_string(next_slot)) + "]";
      next_slot ^= 1;
      os << "    if ((threadIdx.x & 31) == 0) {\n";
      for (size_t i = 0; i < ls.reductions.size(); ++i) {
        os << "      " << slot << "[" << i << "][threadIdx.x >> 5] = " << tensorLocal(ls.reductions[i]->out()) << ";\n";
      }
      os << "    }\n    __syncthreads();\n";
      for (size_t i = 0; i < ls.reductions.size(); ++i) {
        const Expr* r = ls.reductions[i];
        const std::string acc = tensorLocal(r->out());
        os << "    " << acc << " = " << slot << "[" << i << "][0];\n";
        os << "    for (int w = 1; w < " << bx / 32 << "; ++w) " << acc << " = "
           << fillTemplate(opInfo(r->op()).cuda_combine, {acc, slot + "[" + std::to_string(i) + "][w]"}) << ";\n";
      }
      if (block_reductions % 2 == 1) os << "    mf_par ^= 1;\n";
    }
    emitWraps(ls.reductions);
    // The row's staged vectors are all consumed (the reductions above depend on every one of them),
    // so the next row's copies may overwrite them.
    if (l == 0 && !p.staged.empty()) emitNextRow("row + (" + it + ")gridDim.x", "    ");
  }
  emitRowStage(loops);
  os << "  }\n}\n";
  return os.str();
}

}  // namespace codegen
}  // namespace mf
