// meshfuser::Communicator: how a program reaches the other ranks. It wraps a c10d::ProcessGroup the
// embedding runtime already has (Gloo for CPU tensors, NCCL for CUDA tensors; rank r of the group
// is device r of every DeviceMesh), or one made from the launcher's environment. Sub-teams (the
// rows and columns of a 2-D mesh) are created in C++ by splitting that group, by their members.
//
// Copies share one underlying communicator. Every rank must construct its Communicators in the
// same order and run the same programs with them.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <chrono>
#include <memory>

namespace mf {
class Communicator;
}

namespace meshfuser {

class Communicator {
 public:
  struct Options {
    // Of this process on its node (for choosing cuda:local_rank); -1: LOCAL_RANK /
    // LOCAL_WORLD_SIZE from the environment, else the group's rank and size.
    int64_t local_rank = -1;
    int64_t local_size = -1;
    // A group over the same ranks for small control messages (the agreement exchanged on every
    // call, before anything is posted) that never touches a GPU stream; null: `world` itself.
    c10::intrusive_ptr<c10d::ProcessGroup> control_group;
    // Carry control messages through the world group's store (its rendezvous TCPStore) instead
    // of a CPU collective. Automatic when the control group has no CPU backend (an NCCL-only
    // group with no Gloo); slower (one store round trip per rank and call), never wrong.
    bool control_over_store = false;
  };

  explicit Communicator(c10::intrusive_ptr<c10d::ProcessGroup> world);
  Communicator(c10::intrusive_ptr<c10d::ProcessGroup> world, Options options);

  // From torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK,
  // LOCAL_WORLD_SIZE): a Gloo group for CPU tensors, an NCCL group for CUDA tensors (on
  // cuda:LOCAL_RANK; with Gloo for control messages when meshfuser was built with Gloo's headers,
  // else the rendezvous store). Without RANK/WORLD_SIZE: rank 0 of 1.
  // Collectives time out after `timeout` (MESHFUSER_PG_TIMEOUT_S overrides the default).
  static Communicator fromEnvironment(c10::DeviceType device = c10::DeviceType::CPU,
                                      std::chrono::milliseconds timeout = std::chrono::minutes(10));

  int64_t rank() const;
  int64_t size() const;
  int64_t localRank() const;
  int64_t localSize() const;
  void barrier() const;
  const c10::intrusive_ptr<c10d::ProcessGroup>& processGroup() const;

  // Internal (used by Executor); a meshfuser::Error on a moved-from Communicator.
  const std::shared_ptr<mf::Communicator>& impl() const;

 private:
  std::shared_ptr<mf::Communicator> impl_;
};

}  // namespace meshfuser
