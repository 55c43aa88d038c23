// World process group from the launcher's environment. The store: torchrun's agent store when the
// launcher says so (TORCHELASTIC_USE_AGENT_STORE), else a TCPStore that rank 0 serves at
// MASTER_ADDR:MASTER_PORT (as torch.distributed's env:// rendezvous does); a HashStore for a single
// process.
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef MESHFUSER_WITH_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#ifdef MESHFUSER_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <cstdlib>
#include <string>

#include "multidevice/process_group.h"
#include "support/error.h"
#include "support/options.h"

namespace mf {
namespace {

std::string env(const char* name, const std::string& fallback = "") { return envString(name, fallback); }

// Registers a Gloo backend for CPU tensors on `world`, when meshfuser was built with Gloo's headers.
bool addGloo(c10d::ProcessGroup& world, const c10::intrusive_ptr<c10d::Store>& store, int64_t rank, int64_t size,
             std::chrono::milliseconds timeout) {
#ifdef MESHFUSER_WITH_GLOO
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  std::string ifname = env("GLOO_SOCKET_IFNAME");
  options->devices.push_back(ifname.empty() ? c10d::ProcessGroupGloo::createDefaultDevice()
                                            : c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
  auto gloo =
      c10::make_intrusive<c10d::ProcessGroupGloo>(store, static_cast<int>(rank), static_cast<int>(size), options);
  world.setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
  return true;
#else
  return false;
#endif
}

// Registers an NCCL backend for CUDA tensors on `world`, when meshfuser was built with NCCL.
bool addNccl(c10d::ProcessGroup& world, const c10::intrusive_ptr<c10d::Store>& store, int64_t rank, int64_t size,
             std::chrono::milliseconds timeout) {
#ifdef MESHFUSER_WITH_NCCL
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  // A store of its own: NCCL's rendezvous keys must not collide with Gloo's on the same store.
  auto nccl_store = c10::make_intrusive<c10d::PrefixStore>("nccl", store);
  auto nccl =
      c10::make_intrusive<c10d::ProcessGroupNCCL>(nccl_store, static_cast<int>(rank), static_cast<int>(size), options);
  world.setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, nccl);
  return true;
#else
  return false;
#endif
}

}  // namespace

EnvironmentGroup processGroupFromEnvironment(c10::DeviceType device, std::chrono::milliseconds timeout) {
  // Refused before any rendezvous, so that nothing is left half-made in the store.
#ifdef MESHFUSER_WITH_NCCL
  constexpr bool with_nccl = true;
#else
  constexpr bool with_nccl = false;
#endif
#ifdef MESHFUSER_WITH_GLOO
  constexpr bool with_gloo = true;
#else
  constexpr bool with_gloo = false;
#endif
  MF_USER_ARG_CHECK(device == c10::DeviceType::CPU || device == c10::DeviceType::CUDA,
                    "Communicator::fromEnvironment() makes groups for CPU (Gloo) and CUDA (NCCL) tensors, not for ",
                    device, " tensors; construct meshfuser::Communicator from your own c10d::ProcessGroup");
  MF_USER_CHECK(device != c10::DeviceType::CUDA || with_nccl,
                "Communicator::fromEnvironment() for CUDA tensors needs meshfuser built against a CUDA PyTorch ",
                "with NCCL's header (nccl.h); otherwise construct meshfuser::Communicator from your own ",
                "c10d::ProcessGroupNCCL");
  const bool launched = !env("RANK").empty() && !env("WORLD_SIZE").empty();
  const int64_t rank = launched ? envInt("RANK", 0) : 0;
  const int64_t size = launched ? envInt("WORLD_SIZE", 1) : 1;
  MF_USER_CHECK(size >= 1 && rank >= 0 && rank < size, "environment: RANK=", rank, " is not a rank of WORLD_SIZE=",
                size);
  // The launch environment first, whatever this build's backends: it is what the user fixes first.
  MF_USER_CHECK(size == 1 || !env("MASTER_PORT").empty(), "environment: WORLD_SIZE=", size,
                " but MASTER_PORT is not set; launch with torchrun or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT");
  // A single process never posts a collective: it needs no backend.
  MF_USER_CHECK(device != c10::DeviceType::CPU || with_gloo || size == 1,
                "Communicator::fromEnvironment() for CPU tensors on several ranks needs meshfuser built with Gloo ",
                "headers (Debian: libgloo-dev); otherwise make a Gloo c10d::ProcessGroup yourself and pass it to ",
                "the meshfuser::Communicator constructor");
  EnvironmentGroup result;
  result.local_rank = envInt("LOCAL_RANK", rank);
  result.local_size = envInt("LOCAL_WORLD_SIZE", size);

  c10::intrusive_ptr<c10d::Store> store;
  if (size == 1) {
    store = c10::make_intrusive<c10d::HashStore>();
  } else {
    std::string addr = env("MASTER_ADDR", "127.0.0.1");
    std::string port = env("MASTER_PORT");
    const bool agent_store = env("TORCHELASTIC_USE_AGENT_STORE") == "True";
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<uint16_t>(envInt("MASTER_PORT", 0));
    opts.isServer = !agent_store && rank == 0;
    opts.numWorkers = size;
    opts.timeout = timeout;
    try {
      store = c10::make_intrusive<c10d::TCPStore>(addr, opts);
    } catch (const c10::Error& e) {
      MF_THROW_USER("environment: could not reach the rendezvous store at ", addr, ":", port, " (rank ", rank,
                    "): ", e.what_without_backtrace());
    }
  }
  store = c10::make_intrusive<c10d::PrefixStore>("meshfuser", store);

  auto world = c10::make_intrusive<c10d::ProcessGroup>(store, static_cast<int>(rank), static_cast<int>(size));
  const bool have_gloo = addGloo(*world, store, rank, size, timeout);
  if (device == c10::DeviceType::CPU) {
    if (have_gloo) world->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  } else {
    MF_CHECK(addNccl(*world, store, rank, size, timeout), "NCCL backend unavailable after the check above");
    // Control messages use the Gloo backend when there is one, else the store (see Communicator).
    world->setDefaultBackend(c10d::ProcessGroup::BackendType::NCCL);
  }
  world->setGroupName("meshfuser:world");
  world->setGroupDesc("meshfuser:world");
  result.world = world;
  return result;
}

}  // namespace mf
