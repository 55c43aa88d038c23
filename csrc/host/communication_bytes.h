// What one rank sends and receives in one communication, in bytes, given the run's extents.
//
// Counted as the usual ring algorithms move data (the bus-bandwidth convention of collective
// benchmarks), with P this rank's local input bytes and n the team size:
//   Allgather      sent = received = (n-1) * P            (P: this rank's shard)
//   ReduceScatter  sent = received = (n-1)/n * P          (P: this rank's partial)
//   Allreduce      sent = received = 2 (n-1)/n * P
//   AllToAll       sent = received = (n-1)/n * P
//   Broadcast      the root sends P to each other member; the others receive P
//   Gather/Scatter/SendRecv: each pair's piece, counted at its sender and its receiver
//   LocalSlice, NoOp: nothing.
//   The expert-parallel exchanges: 0 here; their bytes follow the counts, known when they run.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>

#include "host/host_program.h"

namespace mf {

struct TransferBytes {
  int64_t sent = 0;
  int64_t received = 0;
};

// `extents`: the global extent bound to each (canonical) symbol for this call.
TransferBytes communicationBytes(const Communication& c, int64_t rank,
                                 const std::unordered_map<std::string, int64_t>& extents);

// Per communication of the program, for its rank.
std::vector<TransferBytes> programBytes(const HostProgram& hp, const std::unordered_map<std::string, int64_t>& extents);

}  // namespace mf
