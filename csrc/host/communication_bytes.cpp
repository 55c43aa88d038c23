#include "host/communication_bytes.h"

#include <algorithm>

#include "ir/extent_expr.h"
#include "multidevice/sharding.h"
#include "support/error.h"

namespace mf {
namespace {

// Bytes of tv's buffer on one device of its mesh.
int64_t localBytes(const TensorView* tv, const std::unordered_map<std::string, int64_t>& extents) {
  auto ids = tv->logicalNoReductions();
  auto shards = shardsPerAxis(tv);
  int64_t numel = 1;
  for (size_t a = 0; a < ids.size(); ++a) {
    if (ids[a]->isDeviceDim()) continue;  // a logical device axis: local extent 1
    std::optional<int64_t> extent = evaluateExtent(*tv->fusion(), ids[a]->extent(), extents);
    MF_CHECK(extent.has_value(), "no extent bound to ", ids[a]->extent().symbol, " of ", tv->toString());
    int64_t global = *extent;
    numel *= global / shards[a];
  }
  return numel * sizeInBytes(tv->dtype());
}

}  // namespace

TransferBytes communicationBytes(const Communication& c, int64_t rank,
                                 const std::unordered_map<std::string, int64_t>& extents) {
  TransferBytes b;
  const int64_t n = static_cast<int64_t>(c.team.size());
  auto both = [&](int64_t bytes) {
    b.sent = b.received = bytes;
    return b;
  };
  switch (c.type) {
    case CommunicationType::LocalSlice:
    case CommunicationType::NoOp: return b;
    // The exchanges move what the counts say: the executor counts them as they run
    // (FusionExecutor::exchange_bytes_); from the extents alone they are unknown.
    case CommunicationType::ExpertCounts:
    case CommunicationType::Dispatch:
    case CommunicationType::Combine: return b;
    case CommunicationType::Allgather: return both((n - 1) * localBytes(c.input, extents));
    case CommunicationType::ReduceScatter: return both((n - 1) * localBytes(c.input, extents) / n);
    case CommunicationType::Allreduce: return both(2 * (n - 1) * localBytes(c.input, extents) / n);
    case CommunicationType::AllToAll: return both((n - 1) * localBytes(c.input, extents) / n);
    case CommunicationType::Broadcast: {
      int64_t bytes = localBytes(c.output, extents);
      if (rank == c.root) b.sent = (n - 1) * bytes;
      else b.received = bytes;
      return b;
    }
    case CommunicationType::Gather:
    case CommunicationType::Scatter:
    case CommunicationType::SendRecv: {
      // Scatter pieces are receiver-sized blocks; Gather and SendRecv pieces are sender shards.
      int64_t piece = localBytes(c.type == CommunicationType::Scatter ? c.output : c.input, extents);
      for (auto [sender, receiver] : c.pairs) {
        if (sender == receiver) continue;
        if (sender == rank) b.sent += piece;
        if (receiver == rank) b.received += piece;
      }
      return b;
    }
  }
  MF_THROW_INTERNAL("bad CommunicationType");
}

std::vector<TransferBytes> programBytes(const HostProgram& hp, const std::unordered_map<std::string, int64_t>& extents) {
  std::vector<TransferBytes> bytes;
  for (const Communication& c : hp.communications()) bytes.push_back(communicationBytes(c, hp.rank(), extents));
  return bytes;
}

}  // namespace mf
