// ATen evaluation of the mixture-of-experts ops (the registry's OpKind::Routing entries):
// grouped_mm on torch._grouped_mm (CUDA bfloat16) or one matmul per group, and the routing ops
// through the dispatcher by their registry names; index_add and index_select along the rows of CUDA
// tensors through generated kernels (row_gather.h: the atomic-free sorted gather-sum, a row gather).
#pragma once

#include <vector>

#include "runtime/aten_evaluator.h"

namespace mf {

// The local output tensors of `e` (one per output) from its local inputs. Offsets and bincount
// values out of range are user errors naming the tensor and the range.
std::vector<at::Tensor> evaluateMoeOp(const Expr* e, const std::vector<RuntimeValue>& inputs);

}  // namespace mf
