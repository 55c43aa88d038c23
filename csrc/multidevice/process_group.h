// c10d process groups made by meshfuser itself, in C++ (no Python): a team split from a parent
// group (any backend that supports splitting: Gloo, NCCL), and a world group made from the
// launcher's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, as torchrun sets them).
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <chrono>
#include <cstdint>
#include <vector>

namespace mf {

// Process-wide counter; ranks that create Communicators in the same order get the same ids.
int64_t nextCommunicatorId();

// The group of `team` (ascending ranks of `parent`) for its members, null for the other ranks.
// Only members take part; the group's store prefix names the communicator id and the ranks, so
// every member derives the same rendezvous keys.
c10::intrusive_ptr<c10d::ProcessGroup> splitTeam(c10d::ProcessGroup& parent, const std::vector<int64_t>& team,
                                                 int64_t communicator_id);

struct EnvironmentGroup {
  c10::intrusive_ptr<c10d::ProcessGroup> world;
  int64_t local_rank = 0;
  int64_t local_size = 1;
};
// A world group for tensors on `device` from the launcher's environment; without RANK and
// WORLD_SIZE, rank 0 of 1. CPU: Gloo (needs meshfuser built with Gloo headers).
EnvironmentGroup processGroupFromEnvironment(c10::DeviceType device, std::chrono::milliseconds timeout);

}  // namespace mf
