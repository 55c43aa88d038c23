// Ops on scalar values: fd.ops.reciprocal(s), fd.ops.mul(s1, s2), ... of scalars (inputs, constants,
// extents, and the results of other scalar ops). The op's registry entry says how it computes on
// scalars (`on_scalars`) and its dtype rule; nothing here names an op.
#include <algorithm>
#include <cmath>

#include "ir/ops.h"
#include "support/error.h"

namespace mf {
namespace {

// The dtype of `op` over scalar operands, by the op's dtype rule (Python's: a float result of
// integers is double).
DataType scalarResultType(const OpInfo& info, const std::vector<Val*>& operands) {
  DataType first = operands.at(0)->dtype();
  DataType promoted = first;
  for (const Val* v : operands) promoted = promote(promoted, v->dtype());
  switch (info.dtype_rule) {
    case DtypeRule::SameAsInput: return first;
    case DtypeRule::FloatIfIntegral: return isFloatingPoint(first) ? first : DataType::Double;
    case DtypeRule::Promote: return promoted;
    case DtypeRule::TrueDivide: return isFloatingPoint(promoted) ? promoted : DataType::Double;
    case DtypeRule::Bool: return DataType::Bool;
    default: MF_THROW_INTERNAL(info.name, ": no scalar dtype rule");
  }
}

// `x` as a value of `dtype`: integers truncate toward zero, bools are 0 or 1.
double roundToDtype(double x, DataType dtype) {
  if (dtype == DataType::Bool) return x != 0.0 ? 1.0 : 0.0;
  if (isIntegral(dtype)) return std::trunc(x);
  return x;
}

}  // namespace

Scalar* scalarOp(OpType op, const std::vector<Val*>& operands) {
  const OpInfo& info = opInfo(op);
  MF_USER_ARG_CHECK(info.on_scalars != nullptr, info.name, " takes tensors; it has no form on scalars");
  MF_USER_ARG_CHECK(static_cast<int>(operands.size()) >= info.min_inputs &&
                        static_cast<int>(operands.size()) <= info.max_inputs && operands.size() <= 2,
                    info.name, " takes ", info.min_inputs, " operands, got ", operands.size());
  Fusion* f = nullptr;
  for (const Val* v : operands) {
    MF_USER_ARG_CHECK(!v->isTensor(), info.name, ": ", v->toString(), " is a tensor; a scalar op takes scalars");
    if (f == nullptr) f = v->fusion();
    MF_USER_ARG_CHECK(v->fusion() == f, info.name, ": operand ", v->toString(),
                      " belongs to another fusion definition");
  }
  const bool integers = std::all_of(operands.begin(), operands.end(), [](const Val* v) { return isIntegral(v->dtype()); });
  // Integer add/sub/mul keep being extents: usable as shapes and slice bounds.
  if (integers && operands.size() == 2 && (op == OpType::Add || op == OpType::Sub || op == OpType::Mul)) {
    const auto usable = [](const Val* v) {
      const auto* s = static_cast<const Scalar*>(v);
      return s->value() || s->isExtent() || s->fusion()->isInput(s);
    };
    if (usable(operands[0]) && usable(operands[1])) return extentArithmetic(op, operands[0], operands[1]);
  }
  const DataType dtype = scalarResultType(info, operands);
  std::vector<std::optional<double>> constants;
  for (const Val* v : operands) constants.push_back(static_cast<const Scalar*>(v)->value());
  if (std::all_of(constants.begin(), constants.end(), [](const auto& c) { return c.has_value(); })) {
    const double b = constants.size() > 1 ? *constants[1] : 0.0;
    return f->newScalar(dtype, roundToDtype(info.on_scalars(*constants[0], b), dtype));
  }
  Scalar* out = f->newScalar(dtype, std::nullopt);
  out->setComputation({op, operands});
  return out;
}

double evaluateScalarOp(OpType op, const std::vector<double>& operands, DataType dtype) {
  const OpInfo& info = opInfo(op);
  MF_CHECK(info.on_scalars != nullptr && !operands.empty(), info.name, " has no form on scalars");
  return roundToDtype(info.on_scalars(operands[0], operands.size() > 1 ? operands[1] : 0.0), dtype);
}

}  // namespace mf
