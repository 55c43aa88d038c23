// Checks of a call that run before the per-call agreement, so that what they find is reported to
// every rank (runtime/agreement.h) instead of leaving the others waiting in a collective.
#pragma once

#include <string>
#include <vector>

#include "host/host_program.h"
#include "runtime/aten_evaluator.h"

namespace mf {

// Every mesh of the program must fit the world of `world_size` processes: no more devices than
// processes, no device id outside [0, world_size). Empty when it does; else the error, naming the
// mesh and the world size and suggesting the launcher command.
std::string meshWorldError(const HostProgram& program, int64_t world_size);

// The indices of every embedding_fwd whose indices are an input of the program, on this rank, lie
// in [0, rows of the table). Empty when they do (or cannot be checked here: meta tensors, tables
// whose row count is not bound yet). Costs one min/max of the indices (a device sync on CUDA).
std::string embeddingIndexError(const Fusion& f, int64_t rank, const std::vector<RuntimeValue>& inputs,
                                const ExtentBindings& bindings);

}  // namespace mf
