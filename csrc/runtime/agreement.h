// Per-call cross-rank agreement. Before a call posts any data collective, every rank contributes a
// fixed-size header (agreement round, program fingerprint, whether its inputs are valid, the device
// type of its inputs, the global extent it bound to each symbolic axis) to one small allgather on
// meshfuser's CPU (Gloo) group, and every rank draws the same conclusion from the same data: all
// agree, or every rank raises a UserError that names the ranks and what differs. Strict mode
// (MESHFUSER_DISTRIBUTED_DEBUG=DETAIL) also compares each input's dtype and local shape, and after
// the call checks that every rank completed it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "multidevice/communicator.h"
#include "runtime/aten_evaluator.h"

namespace mf {

class Fusion;

// MESHFUSER_DISTRIBUTED_DEBUG: OFF (default) or INFO: the per-call header; DETAIL: strict mode.
bool strictAgreement();

// The header every rank contributes per call: int64 slots, then the global extents of the first
// symbolic axes (more go in a second exchange).
enum CallHeaderSlot : int64_t {
  kMagicSlot,     // kCallMagic (a call) or kFarewellMagic (the rank shut its Communicator down)
  kRound,         // agreement round on this rank (every exchange counts)
  kFingerprint,   // the definition and its schedule
  kCall,          // this rank's call number of that definition (1, 2, ...); a farewell: calls in all
  kThread,        // which thread calls (callThreadTag)
  kOk,            // this rank's inputs are valid
  kDevice,        // the inputs' device type
  kNumSymbols,
  kDetailLength,  // strict mode's second exchange
  kStrict,
  kHeaderSlots
};
constexpr int64_t kCallHeaderLength = 24;
constexpr int64_t kCallMagic = 0x6d66636c6c;
constexpr int64_t kFarewellMagic = 0x6d66627965;
constexpr int64_t kFailedMagic = 0x6d66666169;

// Which thread runs a call, compared across ranks: calls from several threads of a process are
// serialized (one multi-rank call at a time), and a call must come from the same thread on every
// rank, or the ranks would pair one thread's call with another's. 0 is the main thread; the Python
// bindings set a hash of the Python thread's name for other threads (per OS thread, once).
int64_t& callThreadTag();
std::string threadTagName(int64_t tag);
void registerThreadName(int64_t tag, const std::string& name);

// One call's agreement. The constructor posts this rank's header and returns at once, so that
// local work (compute segments before the first communication) overlaps the round trip; finish()
// waits and checks, and must run before any data collective is posted. `error` is this rank's
// validation error (empty when its inputs are valid); `bindings` the global extents its inputs gave
// the symbolic axes. finish() returns when every rank agrees, and otherwise throws on every rank
// (this rank's own `error` where it has one); it also binds, in `bindings`, the symbolic axes this
// rank's inputs did not (a rank outside an input's mesh) to the extent the other ranks agreed on,
// so that it can size what it receives.
class CallAgreement {
 public:
  CallAgreement(Communicator& comm, const Fusion& f, uint64_t fingerprint, const std::vector<RuntimeValue>& inputs,
                ExtentBindings& bindings, std::string error, bool strict);
  void finish();
  bool finished() const { return finished_; }
  // finish() returned: every rank agreed on the call.
  bool agreed() const { return agreed_; }
  // Some symbolic axis is unbound on this rank: finish() before running (it binds it).
  bool missesExtents() const;

 private:
  Communicator& comm_;
  const Fusion& fusion_;
  uint64_t fingerprint_;
  std::string error_;
  bool strict_;
  int64_t call_ = 0;
  std::vector<std::string> symbols_, where_;
  std::vector<int64_t> extents_, detail_;
  ExtentBindings* bindings_;
  Communicator::PendingExchange pending_;
  bool finished_ = false;
  bool agreed_ = false;
};

// Posts and finishes at once.
void agreeOnCall(Communicator& comm, const Fusion& f, uint64_t fingerprint, const std::vector<RuntimeValue>& inputs,
                 const ExtentBindings& bindings, const std::string& error, bool strict);

// At shutdown (shared-memory transport): tells the other ranks that this one makes no more calls,
// without waiting. Returns an error text when another rank is already in a call this rank never
// joins (the ranks were out of step: this rank made fewer calls), else "".
std::string farewell(Communicator& comm);

// After a call failed on this rank before it posted any data (an allocation error, say): the ranks
// that failed so take part in one more round. When every rank did, no group holds an unmatched
// operation and the groups stay usable; otherwise (or when the round fails) this rank marks them
// unusable. Never throws: the caller raises its own error.
void settleFailure(Communicator& comm, uint64_t fingerprint);

// Strict mode, after a call: every rank says whether it completed. Throws on the ranks that
// completed when another did not (the failing rank rethrows its own error).
void agreeOnCompletion(Communicator& comm, uint64_t fingerprint, bool ok);

}  // namespace mf
