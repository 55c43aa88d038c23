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

#include "runtime/aten_evaluator.h"

namespace mf {

class Communicator;
class Fusion;

// MESHFUSER_DISTRIBUTED_DEBUG: OFF (default) or INFO: the per-call header; DETAIL: strict mode.
bool strictAgreement();

// `error` is this rank's validation error (empty when its inputs are valid); `bindings` the global
// extents its inputs gave the symbolic axes. Returns when every rank agrees; otherwise throws on
// every rank (this rank's own `error` where it has one).
void agreeOnCall(Communicator& comm, const Fusion& f, uint64_t fingerprint, const std::vector<RuntimeValue>& inputs,
                 const ExtentBindings& bindings, const std::string& error, bool strict);

// Strict mode, after a call: every rank says whether it completed. Throws on the ranks that
// completed when another did not (the failing rank rethrows its own error).
void agreeOnCompletion(Communicator& comm, uint64_t fingerprint, bool ok);

}  // namespace mf
