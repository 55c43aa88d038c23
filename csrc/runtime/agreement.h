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
  // Some symbolic axis is unbound on this rank: finish() before running (it binds it).
  bool missesExtents() const;

 private:
  Communicator& comm_;
  const Fusion& fusion_;
  uint64_t fingerprint_;
  std::string error_;
  bool strict_;
  std::vector<std::string> symbols_, where_;
  std::vector<int64_t> extents_, detail_;
  ExtentBindings* bindings_;
  Communicator::PendingExchange pending_;
  bool finished_ = false;
};

// Posts and finishes at once.
void agreeOnCall(Communicator& comm, const Fusion& f, uint64_t fingerprint, const std::vector<RuntimeValue>& inputs,
                 const ExtentBindings& bindings, const std::string& error, bool strict);

// Strict mode, after a call: every rank says whether it completed. Throws on the ranks that
// completed when another did not (the failing rank rethrows its own error).
void agreeOnCompletion(Communicator& comm, uint64_t fingerprint, bool ok);

}  // namespace mf
