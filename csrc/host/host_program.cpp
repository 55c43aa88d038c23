#include "host/host_program.h"

#include <algorithm>
#include <sstream>

#include "support/error.h"
#include "support/text.h"

namespace mf {

const char* toString(CommunicationType t) {
  switch (t) {
    case CommunicationType::Allgather: return "Allgather";
    case CommunicationType::ReduceScatter: return "ReduceScatter";
    case CommunicationType::Allreduce: return "Allreduce";
    case CommunicationType::LocalSlice: return "LocalSlice";
    case CommunicationType::AllToAll: return "AllToAll";
    case CommunicationType::Broadcast: return "Broadcast";
    case CommunicationType::Gather: return "Gather";
    case CommunicationType::Scatter: return "Scatter";
    case CommunicationType::SendRecv: return "SendRecv";
    case CommunicationType::NoOp: return "NoOp";
    case CommunicationType::ExpertCounts: return "AllToAll";
    case CommunicationType::Dispatch:
    case CommunicationType::Combine: return "AllToAllV";
  }
  MF_THROW_INTERNAL("bad CommunicationType");
}

namespace {
std::string ranks(const std::vector<int64_t>& r) {
  std::string s = "[";
  for (size_t i = 0; i < r.size(); ++i) s += (i ? " " : "") + std::to_string(r[i]);
  return s + "]";
}
}  // namespace

std::string Communication::toString() const {
  std::ostringstream ss;
  ss << mf::toString(type) << " " << output->toString() << " <- " << input->toString() << " on " << mf::toString(pt)
     << " team=" << ranks(team);
  if (root >= 0) ss << " root=" << root;
  if (in_axis >= 0) ss << " in_axis=" << in_axis;
  if (out_axis >= 0) ss << " out_axis=" << out_axis;
  if (reduced_axis >= 0) ss << " reduced_axis=" << reduced_axis << " op=" << mf::toString(reduce_op);
  for (auto [s, r] : pairs) ss << " " << s << "->" << r;
  if (type == CommunicationType::ExpertCounts) {
    ss << " (expert counts: rows per team member's experts from " << counts->toString() << ")";
  } else if (type == CommunicationType::Dispatch) {
    ss << " (dispatch: splits from " << counts->toString() << " and " << recv_counts->toString() << "; receives "
       << output->logicalNoReductions()[0]->extent().toString() << " rows, an extent bound at run time)";
  } else if (type == CommunicationType::Combine) {
    ss << " (combine: splits from " << counts->toString() << " and " << recv_counts->toString() << "; sends the "
       << input->logicalNoReductions()[0]->extent().toString() << " rows back)";
  }
  std::string l = layout.toString();
  if (!l.empty()) ss << " layout: " << l;
  return ss.str();
}

std::string Segment::toString() const {
  std::string s;
  for (size_t i = 0; i < exprs.size(); ++i) s += (i ? "; " : "") + exprs[i]->toString();
  return s;
}

std::string HostProgram::toString(const std::vector<std::string>& schedulers,
                                  const std::vector<std::pair<int64_t, int64_t>>& bytes,
                                  const std::vector<int64_t>& loop_chunks, bool show_deallocations) const {
  int64_t total_sent = 0, total_received = 0, hidden = 0;
  std::ostringstream ss;
  ss << "HostProgram (rank " << rank_ << ") {\n";
  for (const HostInstruction& inst : instructions_) {
    switch (inst.kind) {
      case HostInstruction::Kind::RunSegment:
        ss << "  run segment " << inst.index;
        if (static_cast<size_t>(inst.index) < schedulers.size()) ss << " (" << schedulers[inst.index] << ")";
        ss << ": " << segments_[inst.index].toString() << "\n";
        break;
      case HostInstruction::Kind::PostCommunication:
        ss << "  post " << inst.index << ": " << communications_[inst.index].toString();
        if (static_cast<size_t>(inst.index) < bytes.size()) {
          auto [sent, received] = bytes[inst.index];
          ss << " bytes: sent=" << sent << " received=" << received;
          total_sent += sent;
          total_received += received;
        }
        ss << "\n";
        break;
      case HostInstruction::Kind::Wait: ss << "  wait " << inst.index << "\n"; break;
      case HostInstruction::Kind::StreamLoop: {
        StreamLoop loop = stream_loops_[inst.index];
        if (static_cast<size_t>(inst.index) < loop_chunks.size()) loop.chunks = loop_chunks[inst.index];
        const Communication& c = communications_[loop.communication];
        const bool ring = isRing(loop.kind);
        // A ring moves data between its steps: one transfer fewer than steps.
        int64_t transfers = ring ? std::max<int64_t>(loop.chunks - 1, 1) : loop.chunks;
        ss << "  stream loop " << inst.index << ": " << loop.toString() << " {\n";
        ss << "    for " << (ring ? "step" : "chunk") << " i in 0.." << loop.chunks;
        if (ring) {
          ss << " (on one stream; the communication library's stream overlaps it):\n";
        } else {
          ss << " (one stream each, up to " << std::min<int64_t>(loop.chunks, 3)
             << " worker streams; events order them):\n";
        }
        std::string seg = segments_[loop.segment].toString();
        std::string comm = c.toString();
        std::string per_chunk;
        if (static_cast<size_t>(loop.communication) < bytes.size()) {
          auto [sent, received] = bytes[loop.communication];
          per_chunk = mf::str(" bytes per ", ring ? "step" : "chunk", ": sent=", sent / transfers,
                              " received=", received / transfers);
          total_sent += sent;
          total_received += received;
        }
        switch (loop.kind) {
          case StreamLoopKind::GemmReduceScatter:
          case StreamLoopKind::GemmAllreduce:
            ss << "      run segment " << loop.segment << " on rows of chunk i: " << seg << "\n";
            ss << "      post " << loop.communication << " on chunk i: " << comm << per_chunk << "\n";
            ss << "      wait " << loop.communication << " (before chunk i+2 reuses its buffer)\n";
            break;
          case StreamLoopKind::AllgatherGemm:
            ss << "      post " << loop.communication << " on chunk i+1: " << comm << per_chunk << "\n";
            ss << "      wait " << loop.communication << " on chunk i\n";
            ss << "      run segment " << loop.segment << " on rows of chunk i: " << seg << "\n";
            break;
          case StreamLoopKind::BroadcastGemm:
            ss << "      post Broadcast of team member i+1's shard " << c.input->toString() << " on "
               << mf::toString(c.pt) << per_chunk << "\n";
            ss << "      wait for team member i's shard\n";
            ss << "      run segment " << loop.segment << " on it: " << seg << "\n";
            break;
          case StreamLoopKind::RingAllgatherGemm:
            ss << "      post send of the held shard of " << c.input->toString() << " to the next rank, recv from the "
               << "previous on " << mf::toString(c.pt) << per_chunk << "\n";
            ss << "      run segment " << loop.segment << " on the held shard (rows of block rank-i): " << seg << "\n";
            ss << "      wait send/recv\n";
            break;
          case StreamLoopKind::RingGemmReduceScatter:
            ss << "      run segment " << loop.segment << " on rows of block rank+i+1: " << seg << "\n";
            ss << "      wait recv of the previous step's sum, add it\n";
            ss << "      post send of the sum to the previous rank, recv from the next on " << mf::toString(c.pt)
               << per_chunk << "\n";
            break;
        }
        ss << "    writes " << loop.result->toString() << " chunk by chunk\n  }\n";
        break;
      }
      case HostInstruction::Kind::Deallocate:
        if (show_deallocations) {
          ss << (fusion_->isInput(inst.tv) ? "  release input " : "  deallocate ") << inst.tv->toString() << "\n";
        }
        else ++hidden;
        break;
    }
  }
  if (!bytes.empty()) ss << "  total bytes: sent=" << total_sent << " received=" << total_received << "\n";
  ss << "  outputs:";
  for (Val* v : fusion_->outputs()) ss << " " << v->toString();
  std::string names;
  for (const TensorView* tv : fusion_->allTensors()) {
    if (!tv->userName().empty()) names += " " + tv->toString() + "=" + tv->userName();
  }
  if (!names.empty()) ss << "\n  names:" << names;
  if (hidden > 0) ss << "\n  (" << hidden << " deallocations not shown: host_program(deallocations=True) lists them)";
  ss << "\n}\n";
  return ss.str();
}

}  // namespace mf
