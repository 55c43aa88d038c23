// Control messages between the ranks of one host through a shared-memory segment: the default
// transport of the per-call agreement (MESHFUSER_CONTROL_TRANSPORT=auto or shm; gloo selects the
// Gloo allgather). One slot per rank holds the rank's last round number and two message buffers
// (round n uses buffer n % 2: a rank can only be one round ahead of the slowest, so the buffer a
// rank overwrites was read by everyone). A rank posts by writing its buffer and then its round
// number, and wakes the waiters through a futex word; a waiter spins briefly, then sleeps on the
// futex, and notices a peer that left (shut meshfuser down: a farewell round) or whose process is
// gone, and the timeout.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mf {

class ShmControl {
 public:
  static constexpr int64_t kCapacity = 1024;  // int64 per message; longer ones go through Gloo

  // Maps the segment `name` (created by the caller on one rank, opened by the others).
  ShmControl(const std::string& name, bool create, int64_t rank, int64_t size);
  ~ShmControl();
  ShmControl(const ShmControl&) = delete;
  ShmControl& operator=(const ShmControl&) = delete;
  static void unlink(const std::string& name);

  // Writes this rank's message of `round` and wakes the waiters.
  void post(int64_t round, const int64_t* data, int64_t n);
  // Every rank's message of `round`, rank-major (n per rank). Throws std::runtime_error naming the
  // rank and the cause when a peer left or died, sent another length, or the timeout passed.
  std::vector<int64_t> collect(int64_t round, int64_t n, double timeout_s);
  // Shutting down after `round` rounds: posts `farewell` as round + 1 and marks the slot left,
  // without waiting. Returns, per other rank, the round it has reached (to tell whether another
  // rank is already in a round this rank will never join).
  std::vector<int64_t> leave(int64_t round, const int64_t* farewell, int64_t n);
  // This rank's groups became unusable: the others' waits end at once from now on.
  void abandon();
  // The message a rank posted in `round` (valid when it reached it).
  std::vector<int64_t> peek(int64_t rank, int64_t round) const;

 private:
  struct Slot;
  Slot* slot(int64_t r) const;
  bool peerGone(int64_t r) const;
  void* base_ = nullptr;
  size_t bytes_ = 0;
  int64_t rank_, size_;
};

}  // namespace mf
