// Structural checks of a Fusion, run after every pass in the pipeline. Violations a user can cause
// through scheduling are user errors naming the tensor and axis; the rest are internal errors.
#pragma once

#include "ir/fusion.h"

namespace mf {

void verifyFusion(const Fusion& f);
void verifyTensor(const TensorView* tv);

}  // namespace mf
