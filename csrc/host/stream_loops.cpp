// stream_loops (a lowering step, after lowerToHostProgram has placed every instruction)
// Requires: a lowered host program whose contractions run alone in their segments; stream axes
//   that validate_meshes accepted (each the outer part of a split with a constant chunk count).
// Guarantees: every stream axis of the program is honoured or refused with a user error naming the
//   tensor and the axis. A stream axis on the rows (a non-contracted axis of the first operand) of
//   a contraction that feeds a ReduceScatter/Allreduce, or reads an Allgather, turns that pair into
//   one StreamLoop instruction at the contraction's place: the pair's post and wait are removed, and
//   whatever the loop reads stays allocated until it ran. The fusion's overlap option does the same
//   for every such pair without a stream axis. Ring loops add their neighbour pairs to the teams.
//
// The rows of a loop are [blocks][chunks][rows per chunk] in global order, read off the scheduled
// axis: `outer_split(a, d)` (mesh or serial) then `outer_split(a + 1, s)` on stream gives blocks d,
// chunks s: chunk j holds rows j of every team member's block, which is what one ReduceScatter or
// Allgather of a chunk moves. A stream axis split straight off the rows (blocks 1) and swizzled on
// the mesh (`swizzle1d`) with one chunk per team member is the ring.
#include <algorithm>
#include <map>
#include <optional>

#include "host/host_program.h"
#include "ir/domain_map.h"
#include "ir/extent_expr.h"
#include "ir/op_registry.h"
#include "ir/printer.h"
#include "multidevice/sharding.h"
#include "support/error.h"

namespace mf {

const char* toString(StreamLoopKind k) {
  switch (k) {
    case StreamLoopKind::GemmReduceScatter: return "GEMM+ReduceScatter";
    case StreamLoopKind::GemmAllreduce: return "GEMM+Allreduce";
    case StreamLoopKind::AllgatherGemm: return "Allgather+GEMM";
    case StreamLoopKind::BroadcastGemm: return "Broadcast+GEMM";
    case StreamLoopKind::RingAllgatherGemm: return "ring Allgather+GEMM";
    case StreamLoopKind::RingGemmReduceScatter: return "ring GEMM+ReduceScatter";
  }
  MF_THROW_INTERNAL("bad StreamLoopKind");
}

std::string StreamLoop::toString() const {
  std::string s = mf::str(mf::toString(kind), " over ", chunks, " chunks of rows [", blocks, " blocks][", chunks,
                          " chunks][rows/", blocks * chunks, "]");
  if (scheduled) s += mf::str(" (stream axis of ", scheduled->toString(), " axis ", scheduled_axis, ")");
  else s += " (overlap option)";
  return s;
}

namespace {

struct Factor {
  int64_t extent = -1;  // -1: symbolic
  ParallelType pt = ParallelType::Serial;
  ParallelType swizzle = ParallelType::Serial;
};

// The loop factors that logical axis `axis` (runtime numbering) of tv is cut into, outermost first.
// Only chains of splits of the inner part are understood; anything else returns an empty list.
std::vector<Factor> rowFactors(const TensorView* tv, int64_t axis) {
  IterDomain* id = tv->logicalNoReductions().at(axis);
  std::map<const IterDomain*, const IdTransform*> use;
  for (const IdTransform* t : transformsOf(tv)) {
    for (const IterDomain* in : t->inputs()) use[in] = t;
  }
  std::vector<Factor> factors;
  auto factor_of = [](const IterDomain* d) {
    return Factor{d->extent().isConst() ? d->extent().value : -1, d->parallelType(), d->swizzle()};
  };
  const IterDomain* cur = id;
  while (true) {
    auto it = use.find(cur);
    if (it == use.end()) {
      factors.push_back(factor_of(cur));
      return factors;
    }
    const IdTransform* t = it->second;
    if (t->kind() != IdTransform::Kind::Split || use.count(t->outputs()[0])) return {};
    factors.push_back(factor_of(t->outputs()[0]));
    cur = t->outputs()[1];
  }
}

// Runtime axis of the logical axis a stream loop axis of tv was split from.
int64_t streamedAxis(const TensorView* tv, const IterDomain* stream_id) {
  const IterDomain* cur = stream_id;
  while (cur->definition() != nullptr) cur = cur->definition()->inputs().at(0);
  auto ids = tv->logicalNoReductions();
  auto it = std::find(ids.begin(), ids.end(), cur);
  return it == ids.end() ? -1 : static_cast<int64_t>(it - ids.begin());
}

// Runtime axis of `consumer` that producer runtime axis `p_axis` of input `input_index` maps to.
int64_t mapAxis(const Expr* e, size_t input_index, int64_t p_axis) {
  auto p2c = mapProducerToConsumer(e, input_index);
  if (p_axis < 0 || p_axis >= static_cast<int64_t>(p2c.size()) || p2c[p_axis] < 0) return -1;
  IterDomain* id = e->out()->rootOrLogical().at(p2c[p_axis]);
  auto ids = e->out()->logicalNoReductions();
  auto it = std::find(ids.begin(), ids.end(), id);
  return it == ids.end() ? -1 : static_cast<int64_t>(it - ids.begin());
}

struct Request {
  TensorView* tv;
  int64_t axis;
  bool used = false;
};

// One non-contracted axis of the contraction's first operand, followed through the pair: the
// runtime axis it is in each tensor (partial with its device axis dropped).
struct Line {
  int64_t x_axis = -1, part_axis = -1, result_axis = -1;
  std::vector<std::pair<TensorView*, int64_t>> rows;  // (tensor, runtime axis)
};

// A contraction + communication pair a loop may replace, with the axes a loop may cut.
struct Candidate {
  StreamLoop loop;
  bool reduce = false;  // the communication reduces the contraction's partials
  int64_t team = 1;
  std::vector<Line> lines;  // the communication's own axis first
};

std::string factorsText(const std::vector<Factor>& fs) {
  std::string s = "[";
  for (size_t i = 0; i < fs.size(); ++i) {
    s += (i ? ", " : "") + (fs[i].extent >= 0 ? std::to_string(fs[i].extent) : std::string("?"));
    if (fs[i].pt != ParallelType::Serial) s += std::string(" ") + mf::toString(fs[i].pt);
    if (fs[i].swizzle != ParallelType::Serial) s += std::string("~") + mf::toString(fs[i].swizzle);
  }
  return s + "]";
}

// Whether two tensors' row factors cut the same chunks (device or serial blocks alike).
bool sameChunks(const std::vector<Factor>& a, const std::vector<Factor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    bool stream_a = a[i].pt == ParallelType::Stream, stream_b = b[i].pt == ParallelType::Stream;
    if (a[i].extent != b[i].extent || stream_a != stream_b || a[i].swizzle != b[i].swizzle) return false;
  }
  return true;
}

// Sets the loop's kind, chunks and blocks from the scheduled row factors, or raises.
void applySchedule(Candidate& cand, const Request& req) {
  StreamLoop& loop = cand.loop;
  auto fs = rowFactors(req.tv, req.axis);
  std::string where = mf::str("ParallelType.stream on ", req.tv->toString(), " axis ", req.axis, " (loop factors ",
                              factorsText(fs), ")");
  auto is_stream = [](const Factor& f) { return f.pt == ParallelType::Stream; };
  MF_USER_CHECK(std::find_if(fs.begin(), fs.end(), is_stream) != fs.end(), where,
                ": the stream axis must come from outer splits of that axis (split the inner part again, never the "
                "outer one, and do not merge it)");
  // A stream on the whole axis: each index is a chunk of one row.
  if (is_stream(fs.back())) fs.push_back(Factor{1, ParallelType::Serial, ParallelType::Serial});
  auto stream_at = std::find_if(fs.begin(), fs.end(), is_stream);
  size_t k = static_cast<size_t>(stream_at - fs.begin());
  MF_USER_CHECK(k + 1 < fs.size() && k <= 1, where,
                ": expected [chunks] or [blocks][chunks] outside the rows of each chunk (at most one split before ",
                "the stream split)");
  int64_t chunks = stream_at->extent;
  int64_t blocks = k == 1 ? fs[0].extent : 1;
  MF_USER_CHECK(chunks > 0 && blocks > 0, where, ": the chunk count and the blocks outside it must be constants");
  loop.chunks = chunks;
  loop.blocks = blocks;
  loop.scheduled = req.tv;
  loop.scheduled_axis = req.axis;
  bool ring = stream_at->swizzle != ParallelType::Serial;
  const int64_t n = cand.team;
  if (loop.independent) {
    MF_USER_CHECK(!ring && k == 0, where, ": this axis is not the one the ", mf::toString(loop.kind),
                  " gathers or scatters, so each chunk runs the whole communication on its slice: cut it into ",
                  "stream chunks directly (outer_split(axis, chunks)), without swizzle1d or a split before it");
    return;
  }
  if (ring) {
    MF_USER_CHECK(k == 0 && chunks == n, where, ": a ring (swizzle1d) visits one chunk per team member: split the ",
                  "rows straight into ", n, " stream chunks (the team size), with no split before it");
    MF_USER_CHECK(loop.kind != StreamLoopKind::GemmAllreduce, where,
                  ": a ring needs a sharded side (an Allgather before or a ReduceScatter after the GEMM); this GEMM ",
                  "feeds an Allreduce: use chunks without swizzle1d");
    loop.kind = cand.reduce ? StreamLoopKind::RingGemmReduceScatter : StreamLoopKind::RingAllgatherGemm;
    return;
  }
  if (loop.kind == StreamLoopKind::GemmAllreduce) return;
  if (loop.kind == StreamLoopKind::AllgatherGemm && k == 0 && chunks == n && n > 1) {
    loop.kind = StreamLoopKind::BroadcastGemm;  // chunk j is member j's shard: it broadcasts it
    return;
  }
  MF_USER_CHECK(blocks == n || n == 1, where, ": a ", mf::toString(loop.kind),
                " of each chunk moves rows of every team member's block, so the chunks must sit inside the blocks: "
                "split the axis by the team size ",
                n, " first, then split its inner part by the chunk count (or swizzle1d a split into ", n,
                " chunks for the ring)");
}

}  // namespace

int64_t globalRows(const StreamLoop& loop, const std::unordered_map<std::string, int64_t>& extents) {
  IterDomain* id = loop.result->logicalNoReductions().at(loop.result_row_axis);
  // A derived extent (a sliced row axis: "s0-(min(1, s0))") is evaluated, not only looked up.
  return evaluateExtent(*loop.result->fusion(), id->extent(), extents).value_or(-1);
}

int64_t effectiveChunks(const StreamLoop& loop, int64_t rows) {
  if (!loop.chunks_adjustable || rows < 0) return loop.chunks;
  for (int64_t s = loop.chunks; s > 1; --s) {
    if (rows % (loop.blocks * s) == 0) return s;
  }
  return 1;
}

std::string checkStreamLoopExtents(const HostProgram& hp, const std::unordered_map<std::string, int64_t>& extents) {
  for (const StreamLoop& loop : hp.streamLoops()) {
    int64_t rows = globalRows(loop, extents);
    if (rows < 0 || loop.chunks_adjustable) continue;
    if (rows % (loop.blocks * loop.chunks) == 0) continue;
    return mf::str(loop.scheduled->toString(), " axis ", loop.scheduled_axis, ": extent ", rows,
                   " does not split into ", loop.blocks, " blocks of ", loop.chunks, " stream chunks (",
                   loop.blocks * loop.chunks,
                   " equal parts); uneven stream chunks are not supported");
  }
  return "";
}

void planStreamLoops(HostProgram& hp) {
  Fusion& f = hp.fusion();
  std::vector<Request> requests;
  for (TensorView* tv : f.allTensors()) {
    for (IterDomain* id : tv->loop()) {
      if (id->parallelType() != ParallelType::Stream) continue;
      int64_t axis = streamedAxis(tv, id);
      MF_USER_CHECK(axis >= 0, tv->toString(), " axis ", id->toString(),
                    ": ParallelType.stream must split a non-reduction logical axis");
      requests.push_back({tv, axis});
    }
  }
  const std::string& option = f.overlap();
  if (requests.empty() && option.empty()) return;

  auto& insts = hp.instructions();
  auto position = [&](HostInstruction::Kind kind, int64_t index) -> int64_t {
    for (size_t i = 0; i < insts.size(); ++i) {
      if (insts[i].kind == kind && insts[i].index == index) return static_cast<int64_t>(i);
    }
    return -1;
  };
  std::vector<Candidate> candidates;
  for (size_t ci = 0; ci < hp.communications().size(); ++ci) {
    const Communication& c = hp.communications()[ci];
    Expr* comm_expr = c.output->definition();
    // Chunks are runs of rows in global order; an interleaved split has no such runs per device.
    if (comm_expr == nullptr || c.layout.by_index) continue;
    bool reduce = isReduction(comm_expr->op());
    Candidate cand;
    cand.reduce = reduce;
    cand.team = static_cast<int64_t>(c.team.size());
    StreamLoop& loop = cand.loop;
    loop.communication = static_cast<int64_t>(ci);
    Expr* gemm = reduce ? c.input->definition() : nullptr;
    if (!reduce) {
      // An Allgather (NoOp on one device) whose only reader is a contraction, on the gathered rows.
      bool gathers = c.type == CommunicationType::Allgather ||
                     (c.type == CommunicationType::NoOp && c.reduced_axis < 0 && comm_expr->op() == OpType::Set);
      if (!gathers || c.output->uses().size() != 1 || f.isOutput(c.output)) continue;
      gemm = c.output->uses()[0];
      if (!isContraction(gemm->op()) || gemm->input(0) != c.output) continue;
      int64_t gathered = shardedAxis(c.input, c.pt);
      loop.x_row_axis = gathered < 0 ? -1 : mapAxis(comm_expr, 0, gathered);
      loop.kind = StreamLoopKind::AllgatherGemm;
      loop.result = gemm->out();
    } else {
      bool reduces = c.type == CommunicationType::ReduceScatter || c.type == CommunicationType::Allreduce ||
                     c.type == CommunicationType::NoOp;
      if (!reduces || gemm == nullptr || !isContraction(gemm->op()) || c.input->uses().size() != 1 ||
          f.isOutput(c.input)) {
        continue;
      }
      loop.result = c.output;
      bool scatters = shardedAxis(c.output, c.pt) >= 0;
      loop.kind = scatters ? StreamLoopKind::GemmReduceScatter : StreamLoopKind::GemmAllreduce;
      // Rows: the first operand's axes that reach the result; for a scatter, the scattered one.
      loop.x_row_axis = -1;
      int64_t x_rank = static_cast<int64_t>(static_cast<TensorView*>(gemm->input(0))->logicalNoReductions().size());
      for (int64_t a = 0; a + 1 < x_rank; ++a) {
        int64_t part = mapAxis(gemm, 0, a);
        int64_t res = part < 0 ? -1 : mapAxis(comm_expr, 0, part);
        if (res < 0) continue;
        if (scatters && res != shardedAxis(c.output, c.pt)) continue;
        loop.x_row_axis = a;
        break;
      }
    }
    loop.contraction = gemm;
    loop.segment = -1;
    for (size_t s = 0; s < hp.segments().size(); ++s) {
      const auto& exprs = hp.segments()[s].exprs;
      if (exprs.size() == 1 && exprs[0] == gemm) loop.segment = static_cast<int64_t>(s);
    }
    auto* x = static_cast<TensorView*>(gemm->input(0));
    int64_t x_rank = static_cast<int64_t>(x->logicalNoReductions().size());
    if (loop.segment < 0 || loop.x_row_axis < 0 || loop.x_row_axis + 1 >= x_rank) continue;
    // A line: one non-contracted axis of x followed through the pair (and a bias added after it).
    auto line_for = [&](int64_t x_axis) -> std::optional<Line> {
      Line line;
      line.x_axis = x_axis;
      int64_t part = mapAxis(gemm, 0, x_axis);
      if (part < 0) return std::nullopt;
      line.rows = {{x, x_axis}, {gemm->out(), part}};
      if (reduce) {
        // The partials' device axis is dropped before the communication: count rows without it.
        line.result_axis = mapAxis(comm_expr, 0, part);
        line.part_axis = c.reduced_axis >= 0 && c.reduced_axis < part ? part - 1 : part;
        if (line.result_axis < 0) return std::nullopt;
        line.rows.emplace_back(c.output, line.result_axis);
        TensorView* cur = c.output;
        int64_t axis = line.result_axis;
        while (cur->uses().size() == 1 && isPointwise(cur->uses()[0]->op())) {
          Expr* next = cur->uses()[0];
          auto input_index = std::find(next->inputs().begin(), next->inputs().end(), cur) - next->inputs().begin();
          axis = mapAxis(next, static_cast<size_t>(input_index), axis);
          if (axis < 0) break;
          cur = next->out();
          line.rows.emplace_back(cur, axis);
        }
      } else {
        line.part_axis = line.result_axis = part;
        // A set keeps the axes: the shard's axis is the gathered tensor's.
        line.rows.emplace_back(c.input, x_axis);
      }
      return line;
    };
    auto comm_line = line_for(loop.x_row_axis);
    if (!comm_line) continue;
    cand.lines.push_back(*comm_line);
    for (int64_t a = 0; a + 1 < x_rank; ++a) {
      if (a == loop.x_row_axis) continue;
      if (auto other = line_for(a)) cand.lines.push_back(*other);
    }
    candidates.push_back(cand);
  }

  std::vector<StreamLoop> chosen;
  for (Candidate& cand : candidates) {
    Request* match = nullptr;
    const Line* matched_line = nullptr;
    const Line& comm_line = cand.lines.front();
    // The partial product last: propagation may have copied the user's schedule onto it, and
    // messages should name what the user scheduled.
    auto ordered = comm_line.rows;
    std::stable_partition(ordered.begin(), ordered.end(),
                          [&](const auto& row) { return row.first != cand.loop.contraction->out(); });
    for (auto [tv, comm_axis] : ordered) {
      for (Request& r : requests) {
        if (r.tv != tv) continue;
        const Line* line = nullptr;
        for (const Line& l : cand.lines) {
          for (auto [ltv, laxis] : l.rows) {
            if (ltv == tv && laxis == r.axis) line = &l;
          }
        }
        MF_USER_CHECK(line != nullptr, "ParallelType.stream on ", tv->toString(), " axis ", r.axis,
                      " cannot be streamed: the overlapped loop of ", cand.loop.contraction->toString(),
                      " runs over its rows, which are axis ", comm_axis,
                      " of this tensor (or another axis the GEMM keeps, not a contracted or output-feature one)");
        MF_USER_CHECK(matched_line == nullptr || matched_line == line, "ParallelType.stream on ", tv->toString(),
                      " axis ", r.axis, " and on ", match->tv->toString(), " axis ", match->axis,
                      " cut different axes of the same loop; schedule one of them");
        // Propagation may have copied the schedule to the pair's other tensors: they must agree.
        MF_USER_CHECK(match == nullptr || sameChunks(rowFactors(match->tv, match->axis), rowFactors(tv, r.axis)),
                      "ParallelType.stream on ", tv->toString(), " axis ", r.axis, " and on ", match->tv->toString(),
                      " axis ", match->axis, " cut the rows of the same loop differently (",
                      factorsText(rowFactors(tv, r.axis)), " vs ", factorsText(rowFactors(match->tv, match->axis)),
                      "); schedule one of them");
        r.used = true;
        // Name the tensor the user scheduled, not the partial product propagation copied it to.
        if (match == nullptr || match->tv == cand.loop.contraction->out()) match = &r;
        matched_line = line;
      }
    }
    if (matched_line != nullptr) {
      cand.loop.x_row_axis = matched_line->x_axis;
      cand.loop.part_row_axis = matched_line->part_axis;
      cand.loop.result_row_axis = matched_line->result_axis;
      cand.loop.independent = matched_line != &comm_line && cand.loop.kind != StreamLoopKind::GemmAllreduce;
    } else {
      cand.loop.part_row_axis = comm_line.part_axis;
      cand.loop.result_row_axis = comm_line.result_axis;
    }
    if (match != nullptr) {
      applySchedule(cand, *match);
    } else if (!option.empty()) {
      // The option: the ring where one side is sharded (each step moves 1/d), chunks for an Allreduce.
      if (cand.team <= 1) continue;
      bool ring = option == "ring" || (option == "auto" && cand.loop.kind != StreamLoopKind::GemmAllreduce);
      if (ring && cand.loop.kind == StreamLoopKind::GemmAllreduce) continue;
      if (ring) {
        cand.loop.kind = cand.reduce ? StreamLoopKind::RingGemmReduceScatter : StreamLoopKind::RingAllgatherGemm;
        cand.loop.chunks = cand.team;
      } else {
        cand.loop.chunks = 4;
        cand.loop.chunks_adjustable = true;
        cand.loop.blocks = cand.loop.kind == StreamLoopKind::GemmAllreduce ? 1 : cand.team;
      }
    } else {
      continue;
    }
    chosen.push_back(cand.loop);
  }
  for (const Request& r : requests) {
    MF_USER_CHECK(r.used, "ParallelType.stream on ", r.tv->toString(), " axis ", r.axis,
                  " cannot be streamed: a stream loop runs over the rows of a linear or matmul together with the ",
                  "Allgather that feeds it or the ReduceScatter/Allreduce of its partial result (a contraction's ",
                  "first operand, its output, that communication's other side, or an elementwise consumer of a ",
                  "reduced result); this tensor is none of those");
  }

  // Rewrite the instructions: the loop takes the contraction's place; the pair's post and wait go.
  for (StreamLoop& loop : chosen) {
    const Communication& c = hp.communications()[loop.communication];
    hp.streamLoops().push_back(loop);
    int64_t index = static_cast<int64_t>(hp.streamLoops().size()) - 1;
    int64_t at = position(HostInstruction::Kind::RunSegment, loop.segment);
    MF_CHECK(at >= 0, "stream loop without its segment");
    insts[at] = {HostInstruction::Kind::StreamLoop, index, nullptr};
    std::vector<TensorView*> reads;
    for (Val* v : loop.contraction->inputs()) {
      if (v->isTensor() && v != c.output) reads.push_back(static_cast<TensorView*>(v));
    }
    if (loop.kind == StreamLoopKind::AllgatherGemm || loop.kind == StreamLoopKind::BroadcastGemm ||
        loop.kind == StreamLoopKind::RingAllgatherGemm) {
      reads.push_back(c.input);
    }
    std::vector<HostInstruction> rewritten;
    std::vector<TensorView*> free_after;
    for (size_t i = 0; i < insts.size(); ++i) {
      const HostInstruction& inst = insts[i];
      bool ours = (inst.kind == HostInstruction::Kind::PostCommunication || inst.kind == HostInstruction::Kind::Wait) &&
                  inst.index == loop.communication;
      if (ours) continue;
      bool early_free = inst.kind == HostInstruction::Kind::Deallocate && static_cast<int64_t>(i) < at &&
                        std::find(reads.begin(), reads.end(), inst.tv) != reads.end();
      if (early_free) {
        free_after.push_back(inst.tv);
        continue;
      }
      rewritten.push_back(inst);
      if (static_cast<int64_t>(i) == at) {
        for (TensorView* tv : free_after) rewritten.push_back({HostInstruction::Kind::Deallocate, -1, tv});
      }
    }
    insts = rewritten;
    // Ring kinds talk to their neighbours through pair groups, made on every rank in one order.
    if (isRing(loop.kind)) {
      const TensorView* tv = c.input;
      for (auto& team : tv->mesh().allSlices(c.pt)) {
        int64_t n = static_cast<int64_t>(team.size());
        for (int64_t i = 0; i < n && n > 1; ++i) {
          std::vector<int64_t> pair = {std::min(team[i], team[(i + 1) % n]), std::max(team[i], team[(i + 1) % n])};
          if (std::find(hp.teams().begin(), hp.teams().end(), pair) == hp.teams().end()) hp.teams().push_back(pair);
        }
      }
    }
  }
}

}  // namespace mf
