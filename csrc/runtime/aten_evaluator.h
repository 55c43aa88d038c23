// The ATen evaluator: runs one compute Expr on local (per-device) tensors with ATen. It is the
// reference executor: correct for every op, dtype and layout, on CPU or CUDA.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ir/nodes.h"

namespace mf {

at::ScalarType toAten(DataType dt);
DataType fromAten(at::ScalarType st);

// A runtime value: a tensor or a scalar.
struct RuntimeValue {
  at::Tensor tensor;
  c10::Scalar scalar;
  bool is_tensor = true;
};

// Global extents bound to symbols ("s0" -> 4096) while validating inputs.
using ExtentBindings = std::unordered_map<std::string, int64_t>;

// Global shape of tv's runtime axes; a user error when a symbolic extent is unknown here.
std::vector<int64_t> globalShape(const TensorView* tv, const ExtentBindings& bindings);

// t with the same values in the layout `stride_order` describes (stride_order[i] ranks axis i's
// stride, larger = outer); empty: row-major.
at::Tensor withStrideOrder(const at::Tensor& t, const std::vector<int64_t>& stride_order);

// The smallest and the largest element of a non-empty integer tensor, read to the host in one copy
// (each device-to-host read waits for the device's queue to drain).
std::pair<int64_t, int64_t> hostMinMax(const at::Tensor& t);

// Where an expr runs: ops whose values depend on where this rank's shard lies (uniform) read the
// rank; ops without tensor operands create their output on `device`.
struct EvalContext {
  int64_t rank = 0;
  c10::Device device = c10::Device(c10::kCPU);
};

// Calls the ATen operator `qualified` ("aten::sum.dim_IntList") through the dispatcher with
// positional `args`; `named` fills later arguments by name where the schema has them; the schema's
// defaults fill the rest. callAten returns the first result, callAtenAll every one.
at::Tensor callAten(const char* qualified, std::vector<c10::IValue> args,
                    const std::vector<std::pair<const char*, c10::IValue>>& named = {});
std::vector<c10::IValue> callAtenAll(const char* qualified, std::vector<c10::IValue> args,
                                     const std::vector<std::pair<const char*, c10::IValue>>& named = {});

// Evaluates `e` on `inputs` (one per e->inputs()) and returns the local output tensors, one per
// e->outputs().
std::vector<at::Tensor> evaluateExpr(const Expr* e, const std::vector<RuntimeValue>& inputs,
                                     const ExtentBindings& bindings, const EvalContext& context = {});

}  // namespace mf
