// Control messages over the rendezvous store, for groups without a CPU backend (an NCCL-only world
// made by a C++ embedder, or Communicator::fromEnvironment() for CUDA where no Gloo is available).
// A round is one key per rank: each rank sets its own and reads everyone else's (the store's get
// is polled, bounded by MESHFUSER_VALIDATION_TIMEOUT_S, not by the store's own timeout of minutes;
// a rank that shut its Communicator down leaves a key that ends the others' wait at once). Once a rank has read every key of round n, every rank
// has finished reading round n-1, so it deletes its own key of round n-1: the store stays small.
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "multidevice/communicator.h"
#include "support/error.h"

namespace mf {

std::string Communicator::controlKey(int64_t round, int64_t rank) const {
  return "meshfuser_control/" + std::to_string(id_) + "/" + std::to_string(round) + "/" + std::to_string(rank);
}

namespace {
std::string leftKey(int64_t id, int64_t rank) {
  return "meshfuser_control/" + std::to_string(id) + "/left/" + std::to_string(rank);
}
}  // namespace

void Communicator::leaveStore() {
  if (!control_store_) return;
  try {
    control_store_->set(leftKey(id_, rank_), std::vector<uint8_t>{1});
  } catch (const std::exception&) {
    // the store is gone already: nobody is left to tell
  }
}

// Waits for `key`, bounded by the control timeout; a peer that left ends the wait at once.
void Communicator::waitForStoreKey(const std::string& key, int64_t peer, int64_t round) {
  const auto start = std::chrono::steady_clock::now();
  auto pause = std::chrono::microseconds(20);
  for (;;) {
    if (control_store_->check({key})) return;
    if (control_store_->check({leftKey(id_, peer)})) {
      throw std::runtime_error(str("rank ", peer, " shut meshfuser down and will not take part in round ", round));
    }
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited >= control_timeout_s_) {
      throw std::runtime_error(str("rank ", peer, " did not reach round ", round, " within ", control_timeout_s_, " s"));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(10000));
  }
}

void Communicator::postToStore(PendingExchange& p) {
  p.store_round = rounds_;
  const auto* bytes = reinterpret_cast<const uint8_t*>(p.in.data_ptr<int64_t>());
  std::vector<uint8_t> value(bytes, bytes + p.in.numel() * sizeof(int64_t));
  try {
    control_store_->set(controlKey(p.store_round, rank_), value);
  } catch (const std::exception& e) {
    failExchange(p.what, e);
  }
}

void Communicator::finishFromStore(PendingExchange& p) {
  const int64_t n = p.in.numel();
  int64_t* out = p.out.data_ptr<int64_t>();
  try {
    for (int64_t r = 0; r < size_; ++r) {
      if (r == rank_) {
        std::memcpy(out + r * n, p.in.data_ptr<int64_t>(), n * sizeof(int64_t));
        continue;
      }
      waitForStoreKey(controlKey(p.store_round, r), r, p.store_round);
      std::vector<uint8_t> value = control_store_->get(controlKey(p.store_round, r));
      if (value.size() != static_cast<size_t>(n) * sizeof(int64_t)) {
        markBroken(str(p.what, ": rank ", r, " sent ", value.size() / sizeof(int64_t), " values, rank ", rank_,
                       " expected ", n));
        MF_THROW_USER(p.what, ": rank ", r, " sent ", value.size() / sizeof(int64_t), " control values where rank ",
                      rank_, " sent ", n, "; the ranks are running different meshfuser versions or calls");
      }
      std::memcpy(out + r * n, value.data(), value.size());
    }
    if (p.store_round > 0) control_store_->deleteKey(controlKey(p.store_round - 1, rank_));
  } catch (const UserError&) {
    throw;
  } catch (const std::exception& e) {
    p.store_round = -1;
    failExchange(p.what, e);
  }
  p.store_round = -1;
}

}  // namespace mf
