// Building any op by name: the generic form of the builders (ir/ops.h) that the public C++ API's
// ops::op and the registry walk in the tests use. Each registry entry names its builder
// (OpInfo::build), so an op the registry has is an op every API can build.
#pragma once

#include <string>
#include <vector>

#include "ir/fusion.h"

namespace mf {

// Builds op `name` over `operands` (tensors and scalars, in the printed IR's order) with the
// attributes `attrs` (by their declared names; values as a user gives them, e.g. a negative dim,
// which the builder normalizes). Unknown ops and attributes and mistyped values are user errors;
// an attribute left out takes its declared default. Returns the op's outputs.
std::vector<Val*> buildOp(const std::string& name, const std::vector<Val*>& operands, const Attributes& attrs = {});

// The OpInfo::build functions (op_builders.cpp), one per family of builder signatures.
namespace builders {
// An output of operand 0's shape and dtype, the op's attributes as given (completed and checked by
// newExpr): ops whose meaning is all in their registry entry (triu).
std::vector<Val*> shapedLikeInput(OpType op, const std::vector<Val*>& in, const Attributes& a);
std::vector<Val*> unary(OpType op, const std::vector<Val*>& in, const Attributes& a);
std::vector<Val*> cast(OpType op, const std::vector<Val*>& in, const Attributes& a);
std::vector<Val*> binary(OpType op, const std::vector<Val*>& in, const Attributes& a);
std::vector<Val*> where(OpType op, const std::vector<Val*>& in, const Attributes& a);
std::vector<Val*> reduction(OpType op, const std::vector<Val*>& in, const Attributes& a);
std::vector<Val*> broadcastInDim(OpType op, const std::vector<Val*>& in, const Attributes& a);
std::vector<Val*> squeeze(OpType op, const std::vector<Val*>& in, const Attributes& a);
std::vector<Val*> permute(OpType op, const std::vector<Val*>& in, const Attributes& a);
std::vector<Val*> reshape(OpType op, const std::vector<Val*>& in, const Attributes& a);
std::vector<Val*> slice(OpType op, const std::vector<Val*>& in, const Attributes& a);
std::vector<Val*> pad(OpType op, const std::vector<Val*>& in, const Attributes& a);
std::vector<Val*> cat(OpType op, const std::vector<Val*>& in, const Attributes& a);
std::vector<Val*> strideOrder(OpType op, const std::vector<Val*>& in, const Attributes& a);
std::vector<Val*> uniform(OpType op, const std::vector<Val*>& in, const Attributes& a);
std::vector<Val*> embedding(OpType op, const std::vector<Val*>& in, const Attributes& a);
std::vector<Val*> matmul(OpType op, const std::vector<Val*>& in, const Attributes& a);
std::vector<Val*> linear(OpType op, const std::vector<Val*>& in, const Attributes& a);
std::vector<Val*> sdpfaFwd(OpType op, const std::vector<Val*>& in, const Attributes& a);
std::vector<Val*> sdpfaBwd(OpType op, const std::vector<Val*>& in, const Attributes& a);
std::vector<Val*> groupedMm(OpType op, const std::vector<Val*>& in, const Attributes& a);
std::vector<Val*> topk(OpType op, const std::vector<Val*>& in, const Attributes& a);
std::vector<Val*> sort(OpType op, const std::vector<Val*>& in, const Attributes& a);
std::vector<Val*> argsort(OpType op, const std::vector<Val*>& in, const Attributes& a);
std::vector<Val*> indexSelect(OpType op, const std::vector<Val*>& in, const Attributes& a);
std::vector<Val*> gather(OpType op, const std::vector<Val*>& in, const Attributes& a);
std::vector<Val*> scatter(OpType op, const std::vector<Val*>& in, const Attributes& a);
std::vector<Val*> indexAdd(OpType op, const std::vector<Val*>& in, const Attributes& a);
std::vector<Val*> cumsum(OpType op, const std::vector<Val*>& in, const Attributes& a);
std::vector<Val*> bincount(OpType op, const std::vector<Val*>& in, const Attributes& a);
std::vector<Val*> scatterReduce(OpType op, const std::vector<Val*>& in, const Attributes& a);
}  // namespace builders

}  // namespace mf
