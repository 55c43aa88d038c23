// Public C++ API: meshfuser::Communicator over the internal mf::Communicator (not the Python
// layer's process-wide instance: each one is its own, made from the caller's process group).
#include "meshfuser/communicator.h"

#include <cstdlib>
#include <string>

#include "multidevice/communicator.h"
#include "multidevice/process_group.h"
#include "support/error.h"
#include "support/options.h"

namespace meshfuser {
using mf::envInt;

Communicator::Communicator(c10::intrusive_ptr<c10d::ProcessGroup> world) : Communicator(std::move(world), Options()) {}

Communicator::Communicator(c10::intrusive_ptr<c10d::ProcessGroup> world, Options options)
    : impl_(std::make_shared<mf::Communicator>()) {
  MF_USER_ARG_CHECK(world, "Communicator: the process group is null");
  int64_t local_rank = options.local_rank >= 0 ? options.local_rank : envInt("LOCAL_RANK", world->getRank());
  int64_t local_size = options.local_size >= 0 ? options.local_size : envInt("LOCAL_WORLD_SIZE", world->getSize());
  if (options.control_group) {
    MF_USER_ARG_CHECK(options.control_group->getSize() == world->getSize() &&
                          options.control_group->getRank() == world->getRank(),
                      "Communicator: the control group (rank ", options.control_group->getRank(), " of ",
                      options.control_group->getSize(), ") must span the same ranks as the world group (rank ",
                      world->getRank(), " of ", world->getSize(), ")");
  }
  impl_->initFromGroups(std::move(world), std::move(options.control_group), local_rank, local_size,
                        options.control_over_store);
}

Communicator Communicator::fromEnvironment(c10::DeviceType device, std::chrono::milliseconds timeout) {
  int64_t seconds = envInt("MESHFUSER_PG_TIMEOUT_S", -1);
  if (seconds > 0) timeout = std::chrono::seconds(seconds);
  mf::EnvironmentGroup g = mf::processGroupFromEnvironment(device, timeout);
  Options options;
  options.local_rank = g.local_rank;
  options.local_size = g.local_size;
  Communicator comm(g.world, options);
  comm.impl_->setOwnsGroups(true);
  return comm;
}

const std::shared_ptr<mf::Communicator>& Communicator::impl() const {
  MF_USER_CHECK(impl_ != nullptr, "this meshfuser::Communicator was moved from; use the one it was moved to");
  return impl_;
}

int64_t Communicator::rank() const { return impl()->rank(); }
int64_t Communicator::size() const { return impl()->size(); }
int64_t Communicator::localRank() const { return impl()->localRank(); }
int64_t Communicator::localSize() const { return impl()->localSize(); }
void Communicator::barrier() const { impl()->barrier(); }
const c10::intrusive_ptr<c10d::ProcessGroup>& Communicator::processGroup() const { return impl()->worldGroup(); }

}  // namespace meshfuser
