// Lowering a pass-pipeline-processed Fusion to one rank's host program.
// Requires: every resharding expr is a single `set` or a single-axis device reduction
//   (decompose_reshardings).
// Guarantees: compute exprs are grouped into segments in the order of host/segment_order.cpp; each resharding expr
//   becomes one Communication chosen by the table of docs/design.md section 6, with its team taken from
//   the mesh slice along the parallel type that changes; a Wait sits right before the first use of
//   a communication's output (right after the post for a NoOp); a GEMM's output added to a partial sum is
//   accumulated by the GEMM where nothing else reads either (host/gemm_accumulate.cpp); a Deallocate follows each
//   intermediate's last use. Exprs whose output mesh excludes this rank are dropped.
#include <algorithm>
#include <map>
#include <set>

#include "host/gemm_accumulate.h"
#include "host/host_program.h"
#include "host/segment_order.h"
#include "ir/domain_map.h"
#include "multidevice/sharding.h"
#include "support/error.h"

namespace mf {
namespace {

void addTeams(HostProgram& hp, const DeviceMesh& mesh, ParallelType pt) {
  if (mesh.size(pt) == 1) return;  // one-device teams post nothing (NoOp)
  for (auto& team : mesh.allSlices(pt)) {
    if (std::find(hp.teams().begin(), hp.teams().end(), team) == hp.teams().end()) hp.teams().push_back(team);
  }
}

void addTeam(HostProgram& hp, std::vector<int64_t> team) {
  if (std::find(hp.teams().begin(), hp.teams().end(), team) == hp.teams().end()) hp.teams().push_back(team);
}

std::vector<int64_t> unionSorted(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  std::set<int64_t> s(a.begin(), a.end());
  s.insert(b.begin(), b.end());
  return {s.begin(), s.end()};
}

Communication lowerSameMeshOrMove(HostProgram& hp, Expr* e, int64_t rank);

// A collective over a one-device team moves nothing: it becomes a NoOp (no post, no copy).
Communication lowerResharding(HostProgram& hp, Expr* e, int64_t rank) {
  Communication c = lowerSameMeshOrMove(hp, e, rank);
  bool collective = c.type == CommunicationType::Allgather || c.type == CommunicationType::ReduceScatter ||
                    c.type == CommunicationType::Allreduce || c.type == CommunicationType::AllToAll ||
                    c.type == CommunicationType::LocalSlice;
  if (collective && c.team.size() == 1) {
    c.type = CommunicationType::NoOp;
    c.in_axis = c.out_axis = -1;
  }
  return c;
}

Communication lowerSameMeshOrMove(HostProgram& hp, Expr* e, int64_t rank) {
  Communication c;
  c.input = static_cast<TensorView*>(e->input(0));
  c.output = e->out();
  TensorView* p = c.input;
  TensorView* q = c.output;
  auto changed = reshardedTypes(e, 0);
  MF_CHECK(changed.size() == 1, "resharding expr ", e->toString(), " changes ", changed.size(), " parallel types");
  ParallelType pt = changed[0];
  c.pt = pt;
  bool same_mesh = p->mesh() == q->mesh();
  bool p_sharded = shardedLoopId(p, pt) != nullptr;
  bool q_sharded = shardedLoopId(q, pt) != nullptr;
  auto p2c = mapProducerToConsumer(e, 0);
  auto in_mesh_team = [&](const DeviceMesh& mesh) {
    return mesh.has(rank) ? mesh.slice(rank, pt) : std::vector<int64_t>{};
  };

  if (isReduction(e->op())) {
    MF_USER_CHECK(same_mesh, e->toString(), ": reducing across devices from mesh ", p->mesh().toString(), " into mesh ",
                  q->mesh().toString(), " is not supported; reduce on the producer's mesh, then set to the other mesh");
    c.reduce_op = e->op();
    // The producer's device axis holds the partials.
    c.reduced_axis = shardedAxis(p, pt);
    MF_CHECK(c.reduced_axis >= 0, "device reduction without a sharded producer axis: ", e->toString());
    addTeams(hp, p->mesh(), pt);
    c.team = in_mesh_team(p->mesh());
    if (q_sharded) {
      c.type = CommunicationType::ReduceScatter;
      c.out_axis = shardedAxis(q, pt);
    } else {
      c.type = CommunicationType::Allreduce;
    }
    return c;
  }
  MF_CHECK(e->op() == OpType::Set, "resharding expr is neither set nor device reduction: ", e->toString());
  if (same_mesh) {
    addTeams(hp, p->mesh(), pt);
    c.team = in_mesh_team(p->mesh());
    if (p_sharded && !q_sharded) {
      c.type = CommunicationType::Allgather;
      c.out_axis = p2c[shardedAxis(p, pt)];
    } else if (!p_sharded && q_sharded) {
      c.type = CommunicationType::LocalSlice;
      c.out_axis = shardedAxis(q, pt);
    } else {
      DeviceSplit ps = deviceSplit(p, pt);
      DeviceSplit qs = deviceSplit(q, pt);
      MF_USER_CHECK(!ps.whole_axis && !qs.whole_axis, e->toString(), ": AllToAll needs loop-split shardings on both sides");
      c.type = CommunicationType::AllToAll;
      c.in_axis = p2c[ps.axis];  // in consumer axis numbering (set keeps the shape)
      c.out_axis = qs.axis;
    }
    return c;
  }
  // Different meshes: 1-D meshes only for now.
  MF_USER_CHECK(p->mesh().rank() == 1 && q->mesh().rank() == 1, e->toString(), ": resharding between different meshes ",
                p->mesh().toString(), " and ", q->mesh().toString(), " supports 1-D meshes only");
  const auto& senders = p->mesh().devices();
  const auto& receivers = q->mesh().devices();
  if (!p_sharded && !q_sharded) {
    c.type = CommunicationType::Broadcast;
    c.root = senders[0];
    auto team = unionSorted(receivers, {c.root});
    addTeam(hp, team);
    c.team = std::find(team.begin(), team.end(), rank) != team.end() ? team : std::vector<int64_t>{};
  } else {
    // Point-to-point moves between the meshes: `pairs` lists (sender, receiver) transfers; a rank
    // that is both ends of a pair keeps its data.
    if (p_sharded && q_sharded) {
      DeviceSplit ps = deviceSplit(p, pt);
      DeviceSplit qs = deviceSplit(q, pt);
      MF_USER_CHECK(ps.signature == qs.signature && ps.whole_axis == qs.whole_axis, e->toString(),
                    ": between different meshes, a sharded tensor moves only with the same split on both sides; ",
                    p->toString(), " and ", q->toString(), " split axis ", ps.axis, " differently on ", toString(pt));
      MF_USER_CHECK(p2c[ps.axis] == qs.axis && senders.size() == receivers.size(), e->toString(),
                    ": between different meshes, a sharded tensor can move only to a mesh of the same size on the ",
                    "same axis; got ", p->mesh().toString(), " axis ", ps.axis, " -> ", q->mesh().toString(), " axis ",
                    qs.axis);
      c.type = CommunicationType::SendRecv;
      c.out_axis = qs.axis;
      for (size_t i = 0; i < senders.size(); ++i) c.pairs.emplace_back(senders[i], receivers[i]);
    } else if (p_sharded) {
      // Gather: every receiver collects every sender's shard, concatenated in mesh order.
      MF_USER_CHECK(deviceSplit(p, pt).blocked(), e->toString(), ": gathering ", p->toString(),
                    " onto another mesh needs one block per device along ", toString(pt),
                    "; its split is interleaved. Gather on its own mesh first (set to a replicated tensor there)");
      c.type = CommunicationType::Gather;
      c.out_axis = p2c[shardedAxis(p, pt)];
      for (int64_t r : receivers) {
        for (int64_t s : senders) c.pairs.emplace_back(s, r);
      }
    } else {
      // Scatter: the first sender holds the whole tensor and sends each receiver its block.
      MF_USER_CHECK(deviceSplit(q, pt).blocked(), e->toString(), ": scattering onto ", q->toString(),
                    " from another mesh needs one block per device along ", toString(pt),
                    "; its split is interleaved. Move the whole tensor, then shard it on its mesh");
      c.type = CommunicationType::Scatter;
      c.root = senders[0];
      c.out_axis = shardedAxis(q, pt);
      for (int64_t r : receivers) c.pairs.emplace_back(c.root, r);
    }
    std::vector<int64_t> participants;
    for (auto [s, r] : c.pairs) {
      if (s != r) addTeam(hp, unionSorted({s}, {r}));
      participants = unionSorted(participants, {s, r});
    }
    c.team = std::find(participants.begin(), participants.end(), rank) != participants.end() ? participants
                                                                                            : std::vector<int64_t>{};
  }
  return c;
}

bool participates(const TensorView* tv, int64_t rank) { return !tv->hasMesh() || tv->mesh().has(rank); }

// An expert-parallel exchange (ir/ops_exchange.cpp) as one communication over its mesh axis. Its
// operands and results are rank-local rows: a device split on any of them is a user error here.
Communication lowerExchange(HostProgram& hp, Expr* e, int64_t rank) {
  // Named as the user wrote it (the counts' exchange is part of all_to_all_dispatch).
  const char* op = e->op() == OpType::AllToAllCombine ? "all_to_all_combine" : "all_to_all_dispatch";
  Communication c;
  const std::string& axis = e->attr<std::string>("mesh_axis");
  for (ParallelType pt : kDeviceParallelTypes) {
    if (axis == toString(pt)) c.pt = pt;
  }
  c.input = static_cast<TensorView*>(e->input(0));
  c.output = e->out();
  c.counts = static_cast<TensorView*>(e->op() == OpType::AllToAllCounts ? e->input(0) : e->input(1));
  if (e->op() == OpType::AllToAllCounts) {
    c.type = CommunicationType::ExpertCounts;
    c.rows = static_cast<TensorView*>(e->input(1));
  } else {
    c.type = e->op() == OpType::AllToAllDispatch ? CommunicationType::Dispatch : CommunicationType::Combine;
    c.recv_counts = static_cast<TensorView*>(e->input(2));
  }
  std::vector<const TensorView*> tvs = {c.output};
  for (Val* v : e->inputs()) tvs.push_back(static_cast<const TensorView*>(v));
  const DeviceMesh& mesh = c.input->mesh();
  MF_USER_CHECK(c.input->hasMesh() && mesh.hasParallelType(c.pt), op, ": ", c.input->label(),
                " needs a device mesh with axis ", toString(c.pt), " (set_device_mesh); its mesh is ",
                c.input->hasMesh() ? mesh.toString() : std::string("none"));
  for (const TensorView* tv : tvs) {
    MF_USER_CHECK(tv->mesh() == mesh, op, ": ", tv->label(), " lives on mesh ", tv->mesh().toString(), " but ",
                  c.input->label(), " on ", mesh.toString(), "; the exchange runs on one mesh");
    for (const IterDomain* id : tv->loop()) {
      MF_USER_CHECK(!id->isDeviceDim() || id->isReduction(), op, ": ", tv->label(), " is split on ",
                    toString(id->parallelType()), " (", tv->domainString(), "); the exchange's operands and results ",
                    "are this rank's own rows, never split over devices");
    }
  }
  const int64_t team_size = mesh.size(c.pt);
  const TensorView* recv_counts = e->op() == OpType::AllToAllCounts ? c.output : c.recv_counts;
  const int64_t declared = recv_counts->logicalNoReductions()[0]->extent().value;
  MF_USER_CHECK(declared == team_size, op, ": the exchange was defined for ", declared, " devices, but mesh ",
                mesh.toString(), " has ", team_size, " along ", toString(c.pt));
  addTeams(hp, mesh, c.pt);
  if (mesh.has(rank)) c.team = mesh.slice(rank, c.pt);
  return c;
}

}  // namespace

std::unique_ptr<HostProgram> lowerToHostProgram(std::unique_ptr<Fusion> fusion, int64_t rank) {
  auto hp = std::make_unique<HostProgram>(std::move(fusion), rank);
  Fusion& f = hp->fusion();
  std::map<const Val*, int64_t> pending;  // communication output -> communication index
  std::vector<HostInstruction>& insts = hp->instructions();
  int64_t open_segment = -1;
  auto wait_for = [&](const std::vector<Val*>& vals) {
    for (Val* v : vals) {
      auto it = pending.find(v);
      if (it == pending.end()) continue;
      insts.push_back({HostInstruction::Kind::Wait, it->second, nullptr});
      open_segment = -1;
      pending.erase(it);
    }
  };
  // Fusible work split by an independent GEMM or communication is moved next to its consumers first.
  for (Expr* e : orderForSegments(f.exprs(), closesSegment)) {
    const bool exchange = isExchange(e->op());
    if (exchange || isResharding(e)) {
      Communication c = exchange ? lowerExchange(*hp, e, rank) : lowerResharding(*hp, e, rank);
      if (c.team.empty()) continue;  // this rank takes no part
      wait_for(e->inputs());
      hp->communications().push_back(c);
      int64_t index = static_cast<int64_t>(hp->communications().size()) - 1;
      insts.push_back({HostInstruction::Kind::PostCommunication, index, nullptr});
      open_segment = -1;
      if (c.type == CommunicationType::NoOp) {
        // Nothing to overlap with (the output is the input): waiting now lets the work that reads
        // the output share a segment with the independent work after the post (a LayerNorm
        // backward's statistics and the rest of it: one kernel plan, no intermediate in between).
        insts.push_back({HostInstruction::Kind::Wait, index, nullptr});
        continue;
      }
      pending[e->out()] = index;
      continue;
    }
    if (!participates(e->outTensor(0), rank)) continue;
    wait_for(e->inputs());
    // Contractions, attention, sources and gathers run alone (cuBLAS, fused attention, ATen), so
    // the pointwise work around them can be a generated kernel.
    if (runsAlone(e->op())) open_segment = -1;
    if (open_segment < 0) {
      hp->segments().emplace_back();
      open_segment = static_cast<int64_t>(hp->segments().size()) - 1;
      insts.push_back({HostInstruction::Kind::RunSegment, open_segment, nullptr});
    }
    hp->segments()[open_segment].exprs.push_back(e);
    if (runsAlone(e->op())) open_segment = -1;
  }
  std::vector<Val*> remaining;
  for (auto& [v, index] : pending) remaining.push_back(const_cast<Val*>(v));
  // Deterministic order of the final waits: by communication index.
  std::sort(remaining.begin(), remaining.end(), [&](Val* a, Val* b) { return pending[a] < pending[b]; });
  wait_for(remaining);

  foldSumsIntoGemms(*hp);
  // Deallocate intermediates after their last use, and drop the program's reference to each tensor
  // input after its last use: with execute(..., release_inputs=True) the caller gave up its own,
  // so a backward's saved activations are freed as the backward consumes them.
  std::map<const Val*, size_t> last_use;
  for (size_t i = 0; i < insts.size(); ++i) {
    const HostInstruction& inst = insts[i];
    if (inst.kind == HostInstruction::Kind::RunSegment) {
      for (Expr* e : hp->segments()[inst.index].exprs) {
        for (Val* in : e->inputs()) last_use[in] = i;
        // An output nothing reads (attention's RNG state, say) dies where it is made.
        for (Val* out : e->outputs()) last_use.emplace(out, i);
      }
    } else if (inst.kind == HostInstruction::Kind::PostCommunication ||
               inst.kind == HostInstruction::Kind::Wait) {
      // The input of a communication lives until its wait, as do the counts an exchange reads.
      const Communication& c = hp->communications()[inst.index];
      for (TensorView* tv : {c.input, c.counts, c.recv_counts, c.rows}) {
        if (tv != nullptr) last_use[tv] = i;
      }
    }
  }
  std::vector<HostInstruction> with_frees;
  for (size_t i = 0; i < insts.size(); ++i) {
    with_frees.push_back(insts[i]);
    std::vector<TensorView*> dead;
    for (auto& [v, idx] : last_use) {
      if (idx == i && v->isTensor() && !f.isOutput(v)) dead.push_back(static_cast<TensorView*>(const_cast<Val*>(v)));
    }
    std::sort(dead.begin(), dead.end(), [](TensorView* a, TensorView* b) { return a->name() < b->name(); });
    for (TensorView* tv : dead) with_frees.push_back({HostInstruction::Kind::Deallocate, -1, tv});
    if (insts[i].kind == HostInstruction::Kind::RunSegment) {
      // Inputs too: one the caller released (no reference but the program's) is as free as an
      // intermediate; the kernels check the references before they write into a buffer.
      hp->segments()[insts[i].index].last_reads.assign(dead.begin(), dead.end());
    }
  }
  insts = with_frees;
  planCommunicationLayouts(*hp);
  planStreamLoops(*hp);
  return hp;
}

}  // namespace mf
