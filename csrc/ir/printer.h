// Deterministic text form of a Fusion: the test oracle. Equal fusions print equal text; every
// schedule detail that changes behaviour (domains, parallel types, meshes, allocation, contiguity)
// is printed.
#pragma once

#include <cstdint>
#include <string>

#include "ir/fusion.h"

namespace mf {

std::string printFusion(const Fusion& f);
std::string printTensor(const TensorView* tv);  // one tensor's domains, mesh and layout
// A 64-bit hash of everything printFusion shows plus scalar constants: the cache key of a
// definition together with its schedule.
uint64_t fingerprint(const Fusion& f);

}  // namespace mf
