#include "multidevice/communicator.h"

#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>

#include <algorithm>

#include "multidevice/communicator_control_shm.h"
#include "multidevice/process_group.h"
#include "support/error.h"

namespace mf {

Communicator& Communicator::instance() {
  static Communicator comm;
  return comm;
}

void Communicator::init(const std::string& world_group, const std::string& cpu_group, int64_t rank, int64_t size,
                        int64_t local_rank, int64_t local_size) {
  world_ = c10d::resolve_process_group(world_group);
  cpu_ = cpu_group == world_group ? world_ : c10d::resolve_process_group(cpu_group);
  MF_CHECK(world_, "process group '", world_group, "' could not be resolved");
  rank_ = rank;
  size_ = size;
  local_rank_ = local_rank;
  local_size_ = local_size;
  MF_CHECK(world_->getRank() == rank && world_->getSize() == size, "process group rank/size disagree with launcher");
  teams_.clear();
  std::vector<int64_t> everyone(size);
  for (int64_t i = 0; i < size; ++i) everyone[i] = i;
  teams_[everyone] = world_;
  rounds_ = 0;
  calls_.clear();
  total_calls_ = 0;
  broken_reason_.clear();
  initialized_ = true;
  setUpControlTransport();
}

namespace {
bool hasCpuBackend(c10d::ProcessGroup& group) {
  try {
    return group.getBackend(c10::DeviceType::CPU) != nullptr;
  } catch (const c10::Error&) {
    return false;
  }
}
}  // namespace

void Communicator::initFromGroups(c10::intrusive_ptr<c10d::ProcessGroup> world,
                                  c10::intrusive_ptr<c10d::ProcessGroup> cpu, int64_t local_rank,
                                  int64_t local_size, bool control_over_store) {
  MF_USER_ARG_CHECK(world, "Communicator: the world process group is null");
  world_ = std::move(world);
  cpu_ = cpu ? std::move(cpu) : world_;
  control_store_.reset();
  if (world_->getSize() > 1 && (control_over_store || !hasCpuBackend(*cpu_))) {
    control_store_ = world_->getStore();
    MF_USER_ARG_CHECK(control_store_, "Communicator: the control group has no CPU backend (",
                      cpu_->getBackendName(), ") and the world group has no store to carry control messages; pass ",
                      "Options::control_group, a Gloo group over the same ranks");
  }
  rank_ = world_->getRank();
  size_ = world_->getSize();
  local_rank_ = local_rank >= 0 ? local_rank : rank_;
  local_size_ = local_size >= 0 ? local_size : size_;
  teams_.clear();
  std::vector<int64_t> everyone(size_);
  for (int64_t i = 0; i < size_; ++i) everyone[i] = i;
  teams_[everyone] = world_;
  id_ = nextCommunicatorId();
  initialized_ = true;
  setUpControlTransport();
}

Communicator::~Communicator() {
  leaveStore();
  if (!owns_groups_) return;
  try {
    for (auto& [team, group] : teams_) {
      if (group && group != world_) group->shutdown();
    }
    if (world_) world_->shutdown();
  } catch (const std::exception&) {
    // A group that cannot shut down cleanly (a peer gone) is released by its destructor anyway.
  }
}

void Communicator::shutdown() {
  // The bindings call this without the GIL: dropping the last reference to a Gloo group joins its
  // worker threads, and one of them may be freeing a Python-owned tensor (which takes the GIL).
  leaveStore();
  teams_.clear();
  world_.reset();
  cpu_.reset();
  control_store_.reset();
  shm_.reset();
  team_factory_ = nullptr;
  initialized_ = false;
}

void Communicator::checkInitialized() const {
  MF_USER_CHECK(initialized_, "the Communicator is not initialized; use meshfuser.Communicator.instance() from Python, "
                              "which initializes torch.distributed from the launcher's environment, or from C++ a "
                              "meshfuser::Communicator made from a c10d::ProcessGroup (or "
                              "Communicator::fromEnvironment())");
}

int64_t Communicator::indexIn(const std::vector<int64_t>& team, int64_t rank) {
  auto it = std::find(team.begin(), team.end(), rank);
  return it == team.end() ? -1 : static_cast<int64_t>(it - team.begin());
}

void Communicator::checkTeam(const std::vector<int64_t>& team) const {
  MF_USER_ARG_CHECK(!team.empty(), "a communication team must not be empty");
  for (size_t i = 0; i < team.size(); ++i) {
    MF_USER_ARG_CHECK(team[i] >= 0 && team[i] < size_, "team member ", team[i], " is not a rank of the world of size ", size_);
    MF_USER_ARG_CHECK(i == 0 || team[i] > team[i - 1], "team ranks must be strictly ascending (mesh order along the ",
                      "communicating axis); got rank ", team[i], " after ", team[i - 1]);
  }
  MF_USER_ARG_CHECK(indexIn(team, rank_) >= 0, "rank ", rank_, " posts a communication on a team it is not part of");
}

void Communicator::createTeams(const std::vector<std::vector<int64_t>>& teams) {
  checkInitialized();
  for (const auto& team : teams) {
    if (teams_.count(team)) continue;
    if (!team_factory_) {
      teams_[team] = splitTeam(*world_, team, id_);
      continue;
    }
    std::string name = team_factory_(team);
    // Ranks outside the team get no group (c10d returns a non-member sentinel); keep nothing then.
    if (indexIn(team, rank_) >= 0) teams_[team] = c10d::resolve_process_group(name);
    else teams_[team] = nullptr;
  }
}

c10::intrusive_ptr<c10d::ProcessGroup> Communicator::group(const std::vector<int64_t>& team) {
  checkInitialized();
  checkTeam(team);
  auto it = teams_.find(team);
  MF_CHECK(it != teams_.end() && it->second, "team was not created on all ranks before use");
  return it->second;
}

c10::intrusive_ptr<c10d::Backend> Communicator::backend(const std::vector<int64_t>& team, c10::DeviceType device) {
  return group(team)->getBackend(device);
}

void Communicator::barrier() {
  checkInitialized();
  if (size_ == 1) return;
  if (control_store_) {
    exchange({0}, "barrier");
    return;
  }
  cpu_->getBackend(c10::DeviceType::CPU)->barrier()->wait();
}

std::vector<int64_t> Communicator::exchange(const std::vector<int64_t>& mine, const std::string& what) {
  PendingExchange pending = postExchange(mine, what);
  return finishExchange(pending);
}

Communicator::PendingExchange Communicator::postExchange(const std::vector<int64_t>& mine, const std::string& what) {
  checkInitialized();
  checkUsable();
  ++rounds_;
  PendingExchange p;
  p.what = what;
  const int64_t n = static_cast<int64_t>(mine.size());
  p.in = at::empty({n}, at::kLong);
  std::copy(mine.begin(), mine.end(), p.in.data_ptr<int64_t>());
  if (size_ == 1) {
    p.out = p.in;
    return p;
  }
  p.out = at::empty({n * size_}, at::kLong);
  if (shm_ && n <= ShmControl::kCapacity) {
    shm_->post(rounds_, p.in.data_ptr<int64_t>(), n);
    p.shm_round = rounds_;
    return p;
  }
  if (control_store_) {
    postToStore(p);
    return p;
  }
  try {
    p.work = cpu_->getBackend(c10::DeviceType::CPU)->_allgather_base(p.out, p.in);
  } catch (const std::exception& e) {
    failExchange(what, e);
  }
  return p;
}

std::vector<int64_t> Communicator::finishExchange(PendingExchange& p) {
  if (p.shm_round >= 0) {
    const int64_t round = p.shm_round;
    p.shm_round = -1;
    try {
      std::vector<int64_t> all = shm_->collect(round, p.in.numel(), control_timeout_s_);
      std::copy(all.begin(), all.end(), p.out.data_ptr<int64_t>());
    } catch (const std::runtime_error& e) {
      failExchange(p.what, e);
    }
    return std::vector<int64_t>(p.out.data_ptr<int64_t>(), p.out.data_ptr<int64_t>() + p.out.numel());
  }
  if (p.store_round >= 0) finishFromStore(p);
  if (p.work) {
    try {
      p.work->wait();
    } catch (const std::exception& e) {
      p.work.reset();
      failExchange(p.what, e);
    }
    p.work.reset();
  }
  const int64_t* data = p.out.data_ptr<int64_t>();
  return std::vector<int64_t>(data, data + p.out.numel());
}

void Communicator::failExchange(const std::string& what, const std::exception& e) {
  // Gloo reports timeouts and lost peers as c10::Error or as gloo's own runtime_error.
  std::string cause = e.what();
  if (auto* ce = dynamic_cast<const c10::Error*>(&e)) cause = ce->what_without_backtrace();
  std::string reason = str(what, " on rank ", rank_, " did not complete with every rank (", cause, ")");
  markBroken(reason);
  MF_THROW_USER(reason, ": a rank did not reach the same call (it skipped an execute, failed earlier, ",
                "or died), so the ranks are out of step; every rank must call execute with the same ",
                "definition and matching inputs. MESHFUSER_VALIDATION_TIMEOUT_S bounds this wait.");
}

void Communicator::markBroken(const std::string& reason) {
  if (broken_reason_.empty()) broken_reason_ = reason;
  if (shm_) shm_->abandon();
}

void Communicator::checkUsable() const {
  MF_USER_CHECK(broken_reason_.empty(), "meshfuser's process groups are unusable after an earlier failure (",
                broken_reason_, "); they may hold unmatched operations, so this rank refuses to post more ",
                "instead of exchanging data from different calls. Restart every rank.");
}

}  // namespace mf
