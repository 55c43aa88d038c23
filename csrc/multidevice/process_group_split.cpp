#include <atomic>
#include <string>

#include "multidevice/process_group.h"
#include "support/error.h"

namespace mf {

int64_t nextCommunicatorId() {
  static std::atomic<int64_t> next{0};
  return next++;
}

c10::intrusive_ptr<c10d::ProcessGroup> splitTeam(c10d::ProcessGroup& parent, const std::vector<int64_t>& team,
                                                 int64_t communicator_id) {
  const int64_t me = parent.getRank();
  bool member = false;
  std::vector<int> ranks;
  std::string name = "meshfuser" + std::to_string(communicator_id) + ":team";
  for (int64_t r : team) {
    ranks.push_back(static_cast<int>(r));
    name += "_" + std::to_string(r);
    member = member || r == me;
  }
  if (!member) return nullptr;
  try {
    auto group = parent.splitGroup(ranks, std::nullopt, std::nullopt, name, name);
    MF_CHECK(group, "splitting team ", name, " from the world group gave no group on member rank ", me);
    return group;
  } catch (const c10::Error& e) {
    MF_THROW_USER("could not create the process group of team ", name, " by splitting the world group (backend ",
                  parent.getBackendName(), "): ", e.what_without_backtrace());
  }
}

}  // namespace mf
