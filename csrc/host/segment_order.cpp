// Ordering exprs for segment formation.
//
// Requires: exprs in a topological order; runs_alone(e) true for the exprs that never share a segment
//   (lowering closes the open segment before and after them).
// Guarantees: a topological order of the same exprs in which the exprs that run alone keep their
//   relative order (except the terminal ones, last item), and each other expr sits in one of the
//   gaps between two of them:
//   - an expr on a path to an expr that runs alone goes in the last gap before its first such
//     consumer (as late as possible), so pointwise work split by an independent GEMM (silu(gate)
//     before the up projection, mul(silu, up) after it) meets its consumers in one segment;
//   - an expr on no such path (it only feeds outputs: a bias gradient's column sum, a saved
//     activation) goes in the gap of its latest producer, so it joins the segment that already
//     reads its operands instead of a segment of its own after the last GEMM; if its consumers sit
//     in a later gap, it goes with the first of them (work on inputs alone is not hoisted to the
//     first segment, away from what reads it).
//   - then computing work moves to the first earlier gap where it reads what is already made or
//     read there (siblings reading one GEMM's output: one kernel, one read; joinSiblings), unless
//     all it makes is read by fusible work in one later gap alone: then it goes back there, as a
//     move would store a product (often float) that the later kernel computes in registers
//     (sinkUnsharedMoves: silu's derivative pulled toward the silu that reads the same gate).
//   - then an expr that runs alone whose product no other such expr reads (a weight gradient's
//     GEMM; not a communication) moves, with the views and work only it reads, to where its
//     operands exist, or right after the first communication posted from there on that sends data
//     (not on a mesh of one device) (hoistTerminals); several landing in one place run those that
//     are the last readers of an operand first (it is freed before the others' outputs exist).
//   Work that reads a saved input (a fusion input) moves to an earlier gap that reads the same input
//   beside a GEMM's product (the activation recomputed for a weight gradient joins the GELU backward),
//   and a view of fusion inputs alone moves with the work that reads it.
//   Exprs in one gap keep their given relative order. The order depends on the fusion only (never on
//   the rank), so every rank posts its communications in the same order.
#include "host/segment_order.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <unordered_map>

#include "ir/op_registry.h"
#include "multidevice/sharding.h"
#include "support/error.h"

namespace mf {

bool closesSegment(const Expr* e) { return isExchange(e->op()) || isResharding(e) || runsAlone(e->op()); }

namespace {

// Moves computing work to the first earlier gap where it reads what is already read or made there:
// SwiGLU's backward computes dgate = dy * up * silu'(gate) right after dy's GEMM and dup = dy *
// silu(gate) before its own GEMM, both reading dy and gate; in one gap they are one kernel that
// reads them once (the price: dup is held across one GEMM). Views and layout ops stay (a permute
// joining a pointwise kernel would make it write a transposed copy), and a shared fusion input
// alone is no reason to move (it would pull work on the input into the first segment).
void joinSiblings(const std::vector<Expr*>& exprs, const std::vector<std::vector<size_t>>& producers,
                  const std::vector<int64_t>& alone_rank, const std::vector<int64_t>& earliest,
                  const std::vector<bool>& feeds_outputs_only, std::vector<int64_t>& gap) {
  const size_t n = exprs.size();
  auto moves = [&](size_t i) {
    const OpInfo& info = opInfo(exprs[i]->op());
    return alone_rank[i] < 0 && !feeds_outputs_only[i] && info.kind != OpKind::Layout && !info.aten_view;
  };
  // How many exprs of each gap read each value made by a GEMM, attention or communication.
  std::map<int64_t, std::unordered_map<const Val*, int>> reads;
  std::unordered_map<const Val*, size_t> made_by;
  for (size_t i = 0; i < n; ++i) {
    for (const Val* v : exprs[i]->outputs()) made_by[v] = i;
  }
  auto alone_made = [&](const Val* v) {
    auto it = made_by.find(v);
    return it != made_by.end() && alone_rank[it->second] >= 0;
  };
  // How many exprs of each gap read each fusion input (a saved activation of a backward).
  std::map<int64_t, std::unordered_map<const Val*, int>> input_reads;
  auto fusion_input = [&](const Val* v) { return v->isTensor() && !made_by.count(v); };
  for (size_t i = 0; i < n; ++i) {
    if (alone_rank[i] >= 0) continue;
    for (const Val* v : exprs[i]->inputs()) {
      if (alone_made(v)) ++reads[gap[i]][v];
      if (fusion_input(v)) ++input_reads[gap[i]][v];
    }
  }
  // A view of fusion inputs alone (a size-1 broadcast of a saved gate, as AOTAutograd's graphs
  // have) costs nothing where it stands: it moves with the work that reads it instead of holding
  // that work in its gap.
  auto input_view = [&](size_t p) {
    const OpInfo& info = opInfo(exprs[p]->op());
    return alone_rank[p] < 0 && (info.kind == OpKind::Layout || info.aten_view) && producers[p].empty();
  };
  for (size_t i = 0; i < n; ++i) {
    if (!moves(i)) continue;
    int64_t lo = earliest[i];
    for (size_t p : producers[i]) {
      if (alone_rank[p] < 0 && !input_view(p)) lo = std::max(lo, gap[p]);
    }
    for (int64_t g = lo; g < gap[i]; ++g) {
      bool shares = false;
      for (const Val* v : exprs[i]->inputs()) {
        auto it = made_by.find(v);
        if (it == made_by.end()) {
          // A fusion input read in a gap that follows a GEMM (the kernel after dy's GEMM reading the
          // saved pre-activation, beside the activation recomputed for the weight gradient's GEMM).
          shares = shares || (fusion_input(v) && input_reads[g].count(v) > 0 && !reads[g].empty());
          continue;
        }
        const size_t p = it->second;
        shares = shares || (alone_rank[p] < 0 && gap[p] == g) || (alone_rank[p] >= 0 && reads[g].count(v) > 0);
      }
      if (!shares) continue;
      for (const Val* v : exprs[i]->inputs()) {
        auto& counts = alone_made(v) ? reads : fusion_input(v) ? input_reads : reads;
        if (!alone_made(v) && !fusion_input(v)) continue;
        if (--counts[gap[i]][v] == 0) counts[gap[i]].erase(v);
        ++counts[g][v];
      }
      gap[i] = g;
      for (size_t p : producers[i]) {
        if (!input_view(p) || gap[p] <= g) continue;
        for (const Val* v : exprs[p]->inputs()) {
          if (!fusion_input(v)) continue;
          if (--input_reads[gap[p]][v] == 0) input_reads[gap[p]].erase(v);
          ++input_reads[g][v];
        }
        gap[p] = g;
      }
      break;
    }
  }
}

// Undoes the moves of joinSiblings that stored what only fusible work in one later gap reads: the
// autograd graph of SwiGLU computes sigmoid(gate) and 1 + gate * (1 - sigmoid(gate)) in float next
// to silu(gate), well before dy's GEMM; moved there they were two float tensors written and read
// back (0.6 ms of a Llama layer's backward on an H100) where the kernel after the GEMM computes them.
// Reverse order, so an expr sees where its consumers finally went.
void sinkUnsharedMoves(const std::vector<Expr*>& exprs, const std::vector<std::vector<size_t>>& consumers,
                       const std::vector<int64_t>& alone_rank, const std::vector<int64_t>& latest, std::vector<int64_t>& gap) {
  // Every reader of i's product (looking through views) is fusible work in gap `g`: none needs it
  // in memory. A view read by a GEMM does (the activation recomputed for a weight gradient).
  std::function<bool(size_t, int64_t)> computed_in_registers = [&](size_t i, int64_t g) {
    for (size_t c : consumers[i]) {
      if (alone_rank[c] >= 0 || gap[c] != g) return false;
      const OpInfo& info = opInfo(exprs[c]->op());
      if ((info.kind == OpKind::Layout || info.aten_view) && !computed_in_registers(c, g)) return false;
    }
    return true;
  };
  for (size_t i = consumers.size(); i-- > 0;) {
    if (alone_rank[i] >= 0 || consumers[i].empty() || gap[i] >= latest[i]) continue;
    if (computed_in_registers(i, latest[i])) gap[i] = latest[i];
  }
}

// Where an expr that runs alone but feeds no other such expr (a weight gradient's GEMM) moves to.
struct Hoist {
  size_t expr;
  std::vector<size_t> cone;  // views and work only it reads, in the gap before it: they move with it
  int64_t slot;              // it runs before alone expr `slot` ...
  bool after_gap;            // ... after the exprs of gap `slot` (else right after alone expr slot - 1)
  bool last_reader = false;  // it is the last to read something made before it (which then dies)
};

// A weight gradient's GEMM runs as soon as its operands exist, not where the fusion's output order
// left it (last): held until then, its operands (the activation gradient beside the dx GEMM, a
// recomputed activation) were the backward's peak, live through the attention backward. When a
// communication is posted between the point its operands exist and where it stood, it runs right
// after that post instead, so it overlaps the communication (as Megatron orders a TP backward: dx's
// GEMM, its Allreduce, then dW's GEMM). Communications themselves keep their place.
std::vector<Hoist> hoistTerminals(const std::vector<Expr*>& exprs, const std::vector<std::vector<size_t>>& producers,
                                  const std::vector<std::vector<size_t>>& consumers, const std::vector<int64_t>& alone_rank,
                                  const std::vector<int64_t>& gap, const std::function<bool(const Expr*)>& runs_alone) {
  const size_t n = exprs.size();
  std::vector<bool> feeds_alone(n, false);  // some expr that runs alone reads what it makes, maybe through others
  for (size_t i = n; i-- > 0;) {
    for (size_t c : consumers[i]) feeds_alone[i] = feeds_alone[i] || alone_rank[c] >= 0 || feeds_alone[c];
  }
  std::vector<const Expr*> alone;
  for (size_t i = 0; i < n; ++i) {
    if (alone_rank[i] >= 0) alone.push_back(exprs[i]);
  }
  auto communication = [](const Expr* e) { return isExchange(e->op()) || isResharding(e); };
  // On a mesh of one device a communication sends nothing (a NoOp): nothing to overlap, and the
  // GEMM is best right where its operands exist (its operands die sooner: a lower peak).
  auto sends_data = [&](const Expr* e) {
    const auto* out = e->outputs().empty() || !e->output(0)->isTensor() ? nullptr : static_cast<const TensorView*>(e->output(0));
    return communication(e) && !(out != nullptr && out->hasMesh() && out->mesh().size() <= 1);
  };
  std::vector<Hoist> hoists;
  std::vector<bool> in_cone(n, false);
  for (size_t t = 0; t < n; ++t) {
    if (alone_rank[t] < 0 || feeds_alone[t] || communication(exprs[t]) || !runs_alone(exprs[t])) continue;
    const int64_t rank = alone_rank[t];
    // The cone: exprs in the gap right before t whose products only t (or the cone) reads.
    std::vector<size_t> cone;
    std::vector<bool> mine(n, false);
    mine[t] = true;
    for (size_t i = t; i-- > 0;) {
      if (alone_rank[i] >= 0 || gap[i] != rank || in_cone[i] || consumers[i].empty()) continue;
      bool only_mine = true;
      for (size_t c : consumers[i]) only_mine = only_mine && mine[c];
      if (only_mine) mine[i] = true;
    }
    int64_t slot = 0;
    bool after_gap = false;
    auto later = [&](int64_t s, bool a) {
      if (s > slot || (s == slot && a && !after_gap)) slot = s, after_gap = a;
    };
    bool last_reader = false;
    for (size_t i = 0; i <= t; ++i) {
      if (!mine[i]) continue;
      if (i != t) cone.push_back(i);
      for (size_t p : producers[i]) {
        if (mine[p]) continue;
        bool only_mine = true;
        for (size_t c : consumers[p]) only_mine = only_mine && mine[c];
        last_reader = last_reader || only_mine;
        if (alone_rank[p] >= 0) {
          later(alone_rank[p] + 1, false);
        } else {
          later(gap[p], true);
        }
      }
    }
    if (slot > rank || (slot == rank && after_gap)) continue;  // no earlier than where it stands
    for (int64_t k = slot; k < rank; ++k) {
      if (sends_data(alone[static_cast<size_t>(k)])) {
        slot = k + 1, after_gap = false;
        break;
      }
    }
    for (size_t c : cone) in_cone[c] = true;
    hoists.push_back({t, cone, slot, after_gap, last_reader});
  }
  // Where several land in one place, those that free an operand run first (dW2 = dy^T gelu(pre)
  // before dW1 = d_pre^T ln1, whose d_pre the dx GEMM still reads): the others' outputs are not
  // allocated while the freed operand still lives.
  std::stable_sort(hoists.begin(), hoists.end(), [](const Hoist& a, const Hoist& b) { return a.last_reader && !b.last_reader; });
  return hoists;
}
}  // namespace

std::vector<Expr*> orderForSegments(const std::vector<Expr*>& exprs, const std::function<bool(const Expr*)>& runs_alone) {
  const size_t n = exprs.size();
  constexpr int64_t kFree = std::numeric_limits<int64_t>::max();  // no consumer that runs alone
  std::unordered_map<const Val*, size_t> producer;
  std::vector<int64_t> alone_rank(n, -1);  // the k-th expr that runs alone has rank k
  int64_t alone_count = 0;
  for (size_t i = 0; i < n; ++i) {
    for (const Val* v : exprs[i]->outputs()) producer[v] = i;
    if (runs_alone(exprs[i])) alone_rank[i] = alone_count++;
  }
  std::vector<std::vector<size_t>> consumers(n), producers(n);
  for (size_t i = 0; i < n; ++i) {
    for (const Val* v : exprs[i]->inputs()) {
      auto it = producer.find(v);
      if (it == producer.end()) continue;
      producers[i].push_back(it->second);
      consumers[it->second].push_back(i);
    }
  }
  // gap[i]: exprs in gap g run after the g-th alone expr's predecessors and before alone expr g.
  std::vector<int64_t> earliest(n, 0), gap(n, kFree);
  for (size_t i = 0; i < n; ++i) {
    if (alone_rank[i] >= 0) continue;
    for (size_t p : producers[i]) earliest[i] = std::max(earliest[i], alone_rank[p] >= 0 ? alone_rank[p] + 1 : earliest[p]);
  }
  for (size_t i = n; i-- > 0;) {  // as late as the consumers that run alone allow
    if (alone_rank[i] >= 0) continue;
    for (size_t c : consumers[i]) gap[i] = std::min(gap[i], alone_rank[c] >= 0 ? alone_rank[c] : gap[c]);
  }
  std::vector<bool> feeds_outputs_only(n, false);
  for (size_t i = 0; i < n; ++i) {  // what only feeds outputs: with its latest producer
    if (alone_rank[i] >= 0 || gap[i] != kFree) continue;
    feeds_outputs_only[i] = true;
    gap[i] = earliest[i];
    for (size_t p : producers[i]) {
      if (alone_rank[p] < 0) gap[i] = std::max(gap[i], gap[p]);
    }
  }
  for (size_t i = n; i-- > 0;) {  // ... unless its consumers come later: then with them
    if (!feeds_outputs_only[i] || consumers[i].empty()) continue;
    int64_t first_consumer = kFree;
    for (size_t c : consumers[i]) first_consumer = std::min(first_consumer, gap[c]);
    gap[i] = std::max(gap[i], first_consumer);
  }
  const std::vector<int64_t> latest = gap;
  joinSiblings(exprs, producers, alone_rank, earliest, feeds_outputs_only, gap);
  sinkUnsharedMoves(exprs, consumers, alone_rank, latest, gap);
  for (int64_t& g : gap) g = std::min(g, alone_count);
  const std::vector<Hoist> hoists = hoistTerminals(exprs, producers, consumers, alone_rank, gap, runs_alone);
  std::vector<bool> moved(n, false);
  std::vector<std::vector<size_t>> before_gap(static_cast<size_t>(alone_count) + 1), after_gap(before_gap.size());
  for (size_t h = 0; h < hoists.size(); ++h) {
    for (size_t c : hoists[h].cone) moved[c] = true;
    moved[hoists[h].expr] = true;
    (hoists[h].after_gap ? after_gap : before_gap)[static_cast<size_t>(hoists[h].slot)].push_back(h);
  }
  std::vector<std::vector<Expr*>> gaps(before_gap.size());
  std::vector<Expr*> alone;
  for (size_t i = 0; i < n; ++i) {
    if (alone_rank[i] >= 0) {
      alone.push_back(moved[i] ? nullptr : exprs[i]);
    } else if (!moved[i]) {
      gaps[static_cast<size_t>(gap[i])].push_back(exprs[i]);
    }
  }
  std::vector<Expr*> order;
  order.reserve(n);
  auto place = [&](const std::vector<size_t>& hs) {
    for (size_t h : hs) {
      for (size_t c : hoists[h].cone) order.push_back(exprs[c]);
      order.push_back(exprs[hoists[h].expr]);
    }
  };
  for (size_t g = 0; g < gaps.size(); ++g) {
    place(before_gap[g]);
    order.insert(order.end(), gaps[g].begin(), gaps[g].end());
    place(after_gap[g]);
    if (g < alone.size() && alone[g] != nullptr) order.push_back(alone[g]);
  }
  MF_CHECK(order.size() == n, "segment order lost exprs: ", order.size(), " of ", n);
  return order;
}

}  // namespace mf
