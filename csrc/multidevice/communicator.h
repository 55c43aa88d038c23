// The Communicator: meshfuser's handle on c10d. It uses the process group that torch.distributed
// created (resolved by name) and never a transport of its own. Teams (sub-groups) are created
// through a factory the bindings install (torch.distributed.new_group), identically on all ranks.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <functional>
#include <map>
#include <mutex>
#include <unordered_map>
#include <string>
#include <vector>

#include "ir/op_registry.h"
#include "ir/types.h"

namespace mf {

class ShmControl;

class Communicator {
 public:
  // The process-wide instance the Python layer initializes. C++ embedders construct their own
  // (the public meshfuser::Communicator) and pass it to the executor.
  static Communicator& instance();
  Communicator() = default;
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // Called by the Python layer once torch.distributed is initialized. world_group names
  // meshfuser's own group over all ranks (made from the user's, with meshfuser's timeout: its
  // collectives never interleave with the user's); cpu_group names a Gloo group over all ranks for
  // control messages (the per-call agreement), possibly the same.
  void init(const std::string& world_group, const std::string& cpu_group, int64_t rank, int64_t size,
            int64_t local_rank, int64_t local_size);
  // From process groups the caller already has (C++ embedders). cpu may be null (then world serves
  // control messages too). Teams are split from world (see setTeamFactory) unless a factory is set.
  // Control messages go over the world group's store instead of a CPU collective when
  // `control_over_store` is set or when the control group has no CPU backend (an NCCL-only group).
  void initFromGroups(c10::intrusive_ptr<c10d::ProcessGroup> world, c10::intrusive_ptr<c10d::ProcessGroup> cpu,
                      int64_t local_rank, int64_t local_size, bool control_over_store = false);
  bool initialized() const { return initialized_; }
  const c10::intrusive_ptr<c10d::ProcessGroup>& worldGroup() const { return world_; }
  // Drops every process group reference (called at interpreter exit, before torch tears c10d down).
  void shutdown();
  // The groups were made by meshfuser (Communicator::fromEnvironment): shut them down (NCCL's
  // communicators are destroyed) when this Communicator goes away, not at process exit.
  void setOwnsGroups(bool owns) { owns_groups_ = owns; }
  int64_t rank() const { return rank_; }
  int64_t size() const { return size_; }
  int64_t localRank() const { return local_rank_; }
  int64_t localSize() const { return local_size_; }

  // Creates a group for a team (called with the same teams, in the same order, on every rank).
  // Without a factory, the team's members split it from the world group in C++
  // (multidevice/process_group.h).
  using TeamFactory = std::function<std::string(const std::vector<int64_t>&)>;
  void setTeamFactory(TeamFactory factory) { team_factory_ = std::move(factory); }
  void createTeams(const std::vector<std::vector<int64_t>>& teams);
  c10::intrusive_ptr<c10d::Backend> backend(const std::vector<int64_t>& team, c10::DeviceType device);

  void barrier();
  // One round of control data on meshfuser's CPU (Gloo) group, never touching a GPU stream: every
  // rank contributes `mine` (the same length on every rank) and receives every rank's, rank-major.
  // A failure (timeout, a peer gone) raises a UserError that names `what` and marks the
  // Communicator broken.
  std::vector<int64_t> exchange(const std::vector<int64_t>& mine, const std::string& what);
  // The same in two steps, so that local work can overlap the round trip.
  struct PendingExchange {
    c10::intrusive_ptr<c10d::Work> work;
    at::Tensor in, out;
    std::string what;
    int64_t store_round = -1;  // >= 0: posted to the control store in this round
    int64_t shm_round = -1;    // >= 0: posted to the shared-memory segment in this round
  };
  PendingExchange postExchange(const std::vector<int64_t>& mine, const std::string& what);
  std::vector<int64_t> finishExchange(PendingExchange& pending);
  // Numbers the calls of a definition (its fingerprint) on this rank: 1, 2, ... A small map entry
  // per definition ever called; compared across ranks by the per-call agreement.
  int64_t nextCall(uint64_t fingerprint) {
    ++total_calls_;
    return ++calls_[fingerprint];
  }
  int64_t totalCalls() const { return total_calls_; }
  // After the ranks found their calls out of step, each takes the highest call number any rank
  // reached for each definition seen, so that the next calls agree again.
  void syncCall(uint64_t fingerprint, int64_t call) {
    int64_t& mine = calls_[fingerprint];
    if (call > mine) mine = call;
  }
  // Held for the whole of a multi-rank call: calls from several threads run one at a time.
  std::mutex& callMutex() { return call_mutex_; }
  // The control transport: "shm" (one host, the default), "gloo" or "store".
  std::string controlTransport() const;
  // Shutting down: with the shared-memory transport, posts a farewell (`farewell`, a message as
  // long as a call header) in place of this rank's next round without waiting, so that a rank still
  // calling learns at once that this one made fewer calls. Returns, per other rank already in a
  // round this rank never joins, that rank and its message there (else empty).
  std::vector<std::pair<int64_t, std::vector<int64_t>>> leave(const std::vector<int64_t>& farewell);
  // Rounds of exchange() so far on this rank (equal on every rank while the ranks are in step).
  int64_t rounds() const { return rounds_; }
  // After a collective failed (timed out, a peer died) the groups hold unmatched operations: every
  // later call fails fast with `reason` instead of exchanging data from different calls.
  void markBroken(const std::string& reason);
  bool broken() const { return !broken_reason_.empty(); }
  void checkUsable() const;

  // Data operations posted so far on this rank (a call that fails before posting any leaves its
  // groups clean).
  int64_t posts() const { return posts_; }

  // Collectives over a team (ranks ascending). Asynchronous: the returned work is waited on by the
  // caller; for NCCL, wait() makes the current stream wait, not the host. Inputs are checked
  // before anything is posted.
  c10::intrusive_ptr<c10d::Work> allgather(const std::vector<int64_t>& team, at::Tensor out, at::Tensor in);
  c10::intrusive_ptr<c10d::Work> reduceScatter(const std::vector<int64_t>& team, at::Tensor out, at::Tensor in, OpType op);
  c10::intrusive_ptr<c10d::Work> allreduce(const std::vector<int64_t>& team, at::Tensor t, OpType op);
  c10::intrusive_ptr<c10d::Work> allToAll(const std::vector<int64_t>& team, at::Tensor out, at::Tensor in);
  // Uneven AllToAll along rows (axis 0): team member j gets in_rows[j] rows of `in` (in order) and
  // out_rows[j] rows of `out` come from member j.
  c10::intrusive_ptr<c10d::Work> allToAllV(const std::vector<int64_t>& team, at::Tensor out, at::Tensor in,
                                           std::vector<int64_t> out_rows, std::vector<int64_t> in_rows);
  c10::intrusive_ptr<c10d::Work> broadcast(const std::vector<int64_t>& team, at::Tensor t, int64_t root);
  c10::intrusive_ptr<c10d::Work> send(const std::vector<int64_t>& team, at::Tensor t, int64_t peer);
  c10::intrusive_ptr<c10d::Work> recv(const std::vector<int64_t>& team, at::Tensor t, int64_t peer);
  // CUDA tensors travel over Gloo (MESHFUSER_CUDA_BACKEND=gloo): the test mode in which several
  // ranks share one GPU, which NCCL refuses. fd.host_program() says so.
  bool cudaOverGloo();

  // Position of `rank` in `team`.
  static int64_t indexIn(const std::vector<int64_t>& team, int64_t rank);

 private:
  // Chooses the control transport after the groups are set (MESHFUSER_CONTROL_TRANSPORT).
  void setUpControlTransport();
  void postToStore(PendingExchange& p);
  void waitForStoreKey(const std::string& key, int64_t peer, int64_t round);
  void leaveStore();  // tells the others this rank shut down (store transport)
  void finishFromStore(PendingExchange& p);
  std::string controlKey(int64_t round, int64_t rank) const;
  [[noreturn]] void failExchange(const std::string& what, const std::exception& e);
  void checkInitialized() const;
  void checkTeam(const std::vector<int64_t>& team) const;
  c10::intrusive_ptr<c10d::ProcessGroup> group(const std::vector<int64_t>& team);

  bool initialized_ = false;
  int64_t rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  c10::intrusive_ptr<c10d::ProcessGroup> world_;
  c10::intrusive_ptr<c10d::ProcessGroup> cpu_;
  // Set when control messages travel through the rendezvous store (no CPU backend available).
  c10::intrusive_ptr<c10d::Store> control_store_;
  // Set when control messages travel through shared memory (every rank on this host).
  std::shared_ptr<ShmControl> shm_;
  double control_timeout_s_ = 120;
  TeamFactory team_factory_;
  int64_t id_ = 0;  // distinguishes the teams of several Communicators on one world group
  std::map<std::vector<int64_t>, c10::intrusive_ptr<c10d::ProcessGroup>> teams_;
  int64_t rounds_ = 0;
  int64_t posts_ = 0;
  std::unordered_map<uint64_t, int64_t> calls_;
  int64_t total_calls_ = 0;
  std::mutex call_mutex_;
  std::string broken_reason_;
  bool owns_groups_ = false;
};

}  // namespace mf
