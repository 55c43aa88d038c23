// ATen evaluation of sdpfa_fwd and sdpfa_bwd with PyTorch's fused attention kernels.
#pragma once

#include <vector>

#include "runtime/aten_evaluator.h"

namespace mf {

// Runs `e` (sdpfa_fwd or sdpfa_bwd) on local tensors: on CPU tensors PyTorch's CPU flash kernel
// (no dropout), on CUDA tensors flash attention (half and bfloat16). Returns one tensor per output.
std::vector<at::Tensor> evaluateAttention(const Expr* e, const std::vector<RuntimeValue>& inputs);

}  // namespace mf
