#include "multidevice/communicator_control_shm.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <stdexcept>
#include <thread>

#include "multidevice/communicator.h"
#include "support/error.h"
#include "support/options.h"
#include "support/text.h"

namespace mf {

struct ShmControl::Slot {
  std::atomic<int64_t> round;  // the last round this rank posted
  std::atomic<int64_t> left;   // 1: the rank shut down (its last round is a farewell)
  int64_t pid;
  int64_t length[2];
  int64_t data[2][kCapacity];
};

namespace {
struct SegmentHeader {
  std::atomic<uint32_t> wake;  // bumped by every post; the futex waiters sleep on it
  uint32_t pad;
  int64_t size;
};
constexpr size_t kHeaderBytes = 64;
// Busy-wait this many pause instructions before sleeping on the futex (MESHFUSER_CONTROL_SPINS).
const int kSpins = static_cast<int>(envInt("MESHFUSER_CONTROL_SPINS", 2000, 0));

long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
}  // namespace

ShmControl::ShmControl(const std::string& name, bool create, int64_t rank, int64_t size) : rank_(rank), size_(size) {
  bytes_ = kHeaderBytes + sizeof(Slot) * static_cast<size_t>(size);
  int fd = shm_open(name.c_str(), create ? (O_CREAT | O_EXCL | O_RDWR) : O_RDWR, 0600);
  if (fd < 0) throw std::runtime_error(str("shm_open(", name, "): ", std::strerror(errno)));
  if (create && ftruncate(fd, static_cast<off_t>(bytes_)) != 0) {
    int err = errno;
    close(fd);
    throw std::runtime_error(str("ftruncate(", name, "): ", std::strerror(err)));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < bytes_) {
    close(fd);
    throw std::runtime_error(str("shared memory segment ", name, " is smaller than expected"));
  }
  base_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base_ == MAP_FAILED) {
    base_ = nullptr;
    throw std::runtime_error(str("mmap(", name, "): ", std::strerror(errno)));
  }
  slot(rank_)->pid = static_cast<int64_t>(getpid());
}

ShmControl::~ShmControl() {
  if (base_ != nullptr) munmap(base_, bytes_);
}

void ShmControl::unlink(const std::string& name) { shm_unlink(name.c_str()); }

ShmControl::Slot* ShmControl::slot(int64_t r) const {
  return reinterpret_cast<Slot*>(static_cast<char*>(base_) + kHeaderBytes + sizeof(Slot) * static_cast<size_t>(r));
}

void ShmControl::post(int64_t round, const int64_t* data, int64_t n) {
  Slot* s = slot(rank_);
  const int b = static_cast<int>(round % 2);
  std::memcpy(s->data[b], data, static_cast<size_t>(n) * sizeof(int64_t));
  s->length[b] = n;
  s->round.store(round, std::memory_order_release);
  auto* header = static_cast<SegmentHeader*>(base_);
  header->wake.fetch_add(1, std::memory_order_acq_rel);
  futex(&header->wake, FUTEX_WAKE, INT_MAX, nullptr);
}

bool ShmControl::peerGone(int64_t r) const {
  pid_t pid = static_cast<pid_t>(slot(r)->pid);
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  // A process that exited but was not reaped yet (a zombie) is gone too.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  std::getline(stat, text);
  size_t paren = text.rfind(')');
  return paren != std::string::npos && paren + 2 < text.size() && (text[paren + 2] == 'Z' || text[paren + 2] == 'X');
}

std::vector<int64_t> ShmControl::collect(int64_t round, int64_t n, double timeout_s) {
  auto* header = static_cast<SegmentHeader*>(base_);
  const auto start = std::chrono::steady_clock::now();
  auto next_liveness = start + std::chrono::milliseconds(20);
  std::vector<int64_t> all(static_cast<size_t>(n * size_));
  int spins = 0;
  for (int64_t r = 0; r < size_; ++r) {
    Slot* s = slot(r);
    for (;;) {
      uint32_t seen = header->wake.load(std::memory_order_acquire);
      int64_t reached = s->round.load(std::memory_order_acquire);
      if (s->left.load(std::memory_order_acquire) == 2 && r != rank_) {
        throw std::runtime_error(str("rank ", r, " gave up after an earlier failure (its meshfuser groups are "
                                     "unusable) and takes part in no more rounds"));
      }
      if (reached >= round) break;
      if (s->left.load(std::memory_order_acquire) != 0) {
        throw std::runtime_error(str("rank ", r, " shut meshfuser down after its round ", reached,
                                     " and will not take part in round ", round));
      }
      if (spins < kSpins) {  // the peer may be about to post: spin, yielding the core now and then
        ++spins;
        if (spins % 64 == 0) sched_yield();
        else cpuRelax();
        continue;
      }
      auto now = std::chrono::steady_clock::now();
      if (now >= next_liveness) {
        next_liveness = now + std::chrono::milliseconds(20);
        if (peerGone(r)) throw std::runtime_error(str("rank ", r, "'s process (pid ", s->pid, ") is gone"));
      }
      double waited = std::chrono::duration<double>(now - start).count();
      if (waited >= timeout_s) {
        throw std::runtime_error(str("rank ", r, " did not reach round ", round, " within ", timeout_s,
                                     " s (it is at round ", reached, ")"));
      }
      timespec ts{0, 5 * 1000 * 1000};  // wake up to check liveness and the deadline
      futex(&header->wake, FUTEX_WAIT, seen, &ts);
    }
    const int b = static_cast<int>(round % 2);
    if (s->length[b] != n) {
      throw std::runtime_error(str("rank ", r, " sent ", s->length[b], " values in round ", round, " where rank ", rank_,
                                   " sent ", n, " (a different kind of message)"));
    }
    std::memcpy(all.data() + r * n, s->data[b], static_cast<size_t>(n) * sizeof(int64_t));
  }
  return all;
}

std::vector<int64_t> ShmControl::leave(int64_t round, const int64_t* farewell, int64_t n) {
  post(round + 1, farewell, n);
  slot(rank_)->left.store(1, std::memory_order_release);
  auto* header = static_cast<SegmentHeader*>(base_);
  header->wake.fetch_add(1, std::memory_order_acq_rel);
  futex(&header->wake, FUTEX_WAKE, INT_MAX, nullptr);
  std::vector<int64_t> reached(static_cast<size_t>(size_));
  for (int64_t r = 0; r < size_; ++r) reached[r] = slot(r)->round.load(std::memory_order_acquire);
  return reached;
}

void ShmControl::abandon() {
  slot(rank_)->left.store(2, std::memory_order_release);
  auto* header = static_cast<SegmentHeader*>(base_);
  header->wake.fetch_add(1, std::memory_order_acq_rel);
  futex(&header->wake, FUTEX_WAKE, INT_MAX, nullptr);
}

std::vector<int64_t> ShmControl::peek(int64_t r, int64_t round) const {
  Slot* s = slot(r);
  const int b = static_cast<int>(round % 2);
  int64_t n = std::min<int64_t>(s->length[b], kCapacity);
  return std::vector<int64_t>(s->data[b], s->data[b] + std::max<int64_t>(n, 0));
}

// ---- The Communicator's choice of control transport ------------------------------------------

namespace {
// Identifies this host: the hostname and the kernel's boot id (two containers may share a name).
int64_t hostIdentity() {
  char name[256] = {0};
  gethostname(name, sizeof(name) - 1);
  std::string id = name;
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  std::getline(boot, boot_id);
  id += "/" + boot_id;
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : id) h = (h ^ c) * 1099511628211ull;
  return static_cast<int64_t>(h >> 1);
}

std::string transportSetting() {
  const std::string v = envString("MESHFUSER_CONTROL_TRANSPORT");
  std::string s = v;
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s.empty()) s = "auto";
  MF_USER_CHECK(s == "auto" || s == "shm" || s == "gloo", "MESHFUSER_CONTROL_TRANSPORT: unknown value '", v,
                "'; valid values are auto (shared memory when every rank is on this host, else Gloo; the default), ",
                "shm and gloo");
  return s;
}
}  // namespace

void Communicator::setUpControlTransport() {
  shm_.reset();
  control_timeout_s_ = static_cast<double>(envInt("MESHFUSER_VALIDATION_TIMEOUT_S", 120, 1));
  if (size_ == 1 || control_store_) return;
  const std::string setting = transportSetting();  // the same on every rank, or the exchanges below differ
  if (setting == "gloo") return;
  // Every rank must be on this host; rank 0 names the segment after its pid and a random word.
  std::random_device random;
  int64_t nonce = (static_cast<int64_t>(random()) << 20) ^ random();
  std::vector<int64_t> who = exchange({hostIdentity(), static_cast<int64_t>(getpid()), nonce}, "control set-up");
  bool one_host = true;
  for (int64_t r = 0; r < size_; ++r) one_host = one_host && who[3 * r] == who[0];
  MF_USER_CHECK(one_host || setting == "auto", "MESHFUSER_CONTROL_TRANSPORT=shm: the ranks run on several hosts; ",
                "shared memory reaches the ranks of one host only (use auto or gloo)");
  if (!one_host) return;
  const std::string name = str("/meshfuser-", who[1], "-", who[2] & 0xffffffffff, "-", id_);
  std::string error;
  std::shared_ptr<ShmControl> shm;
  if (rank_ == 0) {
    try {
      shm = std::make_shared<ShmControl>(name, /*create=*/true, rank_, size_);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  std::vector<int64_t> ok = exchange({error.empty() ? 1 : 0}, "control set-up");
  if (ok[0] == 1 && rank_ != 0) {
    try {
      shm = std::make_shared<ShmControl>(name, /*create=*/false, rank_, size_);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  ok = exchange({error.empty() ? 1 : 0}, "control set-up");
  if (rank_ == 0 && shm) ShmControl::unlink(name);  // every rank mapped it (or gave up): no file is left
  bool everyone = true;
  for (int64_t r = 0; r < size_; ++r) everyone = everyone && ok[r] == 1;
  MF_USER_CHECK(everyone || setting == "auto", "MESHFUSER_CONTROL_TRANSPORT=shm: the shared-memory segment could ",
                "not be set up on every rank", error.empty() ? std::string() : " (" + error + ")");
  // The set-up exchanges went over Gloo; the shared-memory rounds continue the same count.
  if (everyone) shm_ = std::move(shm);
}

std::string Communicator::controlTransport() const {
  if (!initialized_ || size_ == 1) return "none";
  return shm_ ? "shm" : control_store_ ? "store" : "gloo";
}

std::vector<std::pair<int64_t, std::vector<int64_t>>> Communicator::leave(const std::vector<int64_t>& farewell) {
  std::vector<std::pair<int64_t, std::vector<int64_t>>> ahead;
  if (!shm_ || broken() || farewell.size() > static_cast<size_t>(ShmControl::kCapacity)) return ahead;
  std::vector<int64_t> reached = shm_->leave(rounds_, farewell.data(), static_cast<int64_t>(farewell.size()));
  for (int64_t r = 0; r < size_; ++r) {
    if (r != rank_ && reached[r] > rounds_) ahead.emplace_back(r, shm_->peek(r, rounds_ + 1));
  }
  shm_.reset();  // nothing more goes through it from this rank
  return ahead;
}

}  // namespace mf
