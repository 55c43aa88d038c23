// Deterministic text form of a Fusion: the test oracle. Equal fusions print equal text; every
// schedule detail that changes behaviour (domains, parallel types, meshes, allocation, contiguity)
// is printed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/fusion.h"

namespace mf {

std::string printFusion(const Fusion& f);
std::string printTensor(const TensorView* tv);  // one tensor's domains, mesh and layout
// The splits and merges that derive tv's logical (from root), loop and allocation axes, in order.
std::vector<const IdTransform*> transformsOf(const TensorView* tv);
// A 64-bit hash of everything printFusion shows plus scalar constants: the cache key of a
// definition together with its schedule.
uint64_t fingerprint(const Fusion& f);

}  // namespace mf
