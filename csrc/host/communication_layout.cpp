// communication_layout (a lowering step)
// Requires: lowered Communications (type, team and axes set by lowerToHostProgram).
// Guarantees: every Communication carries the buffer layout the runtime carries out:
//   - Allgather receives [team, ...local] and merges the blocks into the gathered axis;
//   - ReduceScatter drops the partials' device axis, then sends its input cut into team-size blocks
//     along the scattered axis, blocks outermost (what c10d's reduce_scatter expects);
//   - Allreduce drops the partials' device axis and reduces in place;
//   - AllToAll sends blocks of the axis it shards next and merges what it receives into the axis
//     it shards now; LocalSlice keeps this rank's block (a view); Gather concatenates the senders'
//     shards along the gathered axis; Scatter's root sends each receiver its block of that axis.
//   The send layout copies only when something other than size-1 axes sits outside the blocks
//   axis (send_copies); otherwise the buffer is a view of the input. When a device split of the
//   communicated axis is interleaved (not one block per device), blocks and merges go by index
//   (by_index): each team member's elements are picked or placed by their global positions.
#include "host/host_program.h"
#include "multidevice/sharding.h"

namespace mf {
namespace {

// True unless every axis before `axis` has constant local extent 1.
bool blocksNeedCopy(const TensorView* tv, int64_t axis, int64_t dropped_axis) {
  auto ids = tv->logicalNoReductions();
  auto shards = shardsPerAxis(tv);
  for (int64_t a = 0, kept = 0; a < static_cast<int64_t>(ids.size()); ++a) {
    if (a == dropped_axis) continue;
    if (kept++ >= axis) break;
    const Extent& e = ids[a]->extent();
    bool local_one = ids[a]->isDeviceDim() || (e.isConst() && e.value / shards[a] == 1);
    if (!local_one) return true;
  }
  return false;
}

bool interleaved(const TensorView* tv, ParallelType pt) {
  return shardedLoopId(tv, pt) != nullptr && !deviceSplit(tv, pt).blocked();
}

}  // namespace

std::string CommunicationLayout::toString() const {
  std::string s;
  auto add = [&](const std::string& part) { s += (s.empty() ? "" : " ") + part; };
  if (drop_axis >= 0) add("drop(" + std::to_string(drop_axis) + ")");
  if (send_blocks_axis >= 0) add("send=blocks(" + std::to_string(send_blocks_axis) + (send_copies ? ", copy)" : ", view)"));
  if (recv_merge_axis >= 0) add("recv=merge(" + std::to_string(recv_merge_axis) + ")");
  if (slice_axis >= 0) add("slice(" + std::to_string(slice_axis) + ")");
  if (by_index) add("by-index");
  return s;
}

void planCommunicationLayouts(HostProgram& hp) {
  for (Communication& c : hp.communications()) {
    CommunicationLayout& l = c.layout;
    bool reshapes_blocks = c.type == CommunicationType::Allgather || c.type == CommunicationType::ReduceScatter ||
                           c.type == CommunicationType::AllToAll || c.type == CommunicationType::LocalSlice;
    l.by_index = reshapes_blocks && (interleaved(c.input, c.pt) || interleaved(c.output, c.pt));
    switch (c.type) {
      case CommunicationType::Allgather: l.recv_merge_axis = c.out_axis; break;
      case CommunicationType::ReduceScatter:
        l.drop_axis = c.reduced_axis;
        l.send_blocks_axis = c.out_axis;
        l.send_copies = l.by_index || blocksNeedCopy(c.input, c.out_axis, c.reduced_axis);
        break;
      case CommunicationType::Allreduce:
      case CommunicationType::NoOp: l.drop_axis = c.reduced_axis; break;
      case CommunicationType::AllToAll:
        l.send_blocks_axis = c.out_axis;
        l.recv_merge_axis = c.in_axis;
        l.send_copies = l.by_index || blocksNeedCopy(c.input, c.out_axis, -1);
        break;
      case CommunicationType::LocalSlice: l.slice_axis = c.out_axis; break;
      case CommunicationType::Gather: l.recv_merge_axis = c.out_axis; break;   // senders' shards, in mesh order
      case CommunicationType::Scatter: l.slice_axis = c.out_axis; break;       // the root sends each receiver its block
      case CommunicationType::SendRecv:
      case CommunicationType::Broadcast:
      case CommunicationType::ExpertCounts:  // the exchanges: rows, regrouped by runtime/run_exchange.cpp
      case CommunicationType::Dispatch:
      case CommunicationType::Combine: break;  // whole contiguous buffers
    }
  }
}

}  // namespace mf
