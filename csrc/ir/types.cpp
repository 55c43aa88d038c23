#include "ir/types.h"

#include "support/error.h"

namespace mf {

const char* toString(DataType dt) {
  switch (dt) {
    case DataType::Float: return "float";
    case DataType::Half: return "half";
    case DataType::BFloat16: return "bfloat16";
    case DataType::Double: return "double";
    case DataType::Int: return "int64";
    case DataType::Int32: return "int32";
    case DataType::Bool: return "bool";
  }
  MF_THROW_INTERNAL("bad DataType");
}

const char* toString(IterType it) {
  switch (it) {
    case IterType::Iteration: return "i";
    case IterType::Reduction: return "r";
    case IterType::Broadcast: return "b";
  }
  MF_THROW_INTERNAL("bad IterType");
}

const char* toString(ParallelType pt) {
  switch (pt) {
    case ParallelType::DIDx: return "DIDx";
    case ParallelType::DIDy: return "DIDy";
    case ParallelType::DIDz: return "DIDz";
    case ParallelType::Stream: return "Stream";
    case ParallelType::BIDx: return "BIDx";
    case ParallelType::BIDy: return "BIDy";
    case ParallelType::BIDz: return "BIDz";
    case ParallelType::TIDx: return "TIDx";
    case ParallelType::TIDy: return "TIDy";
    case ParallelType::TIDz: return "TIDz";
    case ParallelType::Vectorize: return "V";
    case ParallelType::Unroll: return "U";
    case ParallelType::Serial: return "S";
  }
  MF_THROW_INTERNAL("bad ParallelType");
}

const char* toString(OpType op) {
  switch (op) {
    case OpType::Set: return "set";
    case OpType::Neg: return "neg";
    case OpType::Abs: return "abs";
    case OpType::Exp: return "exp";
    case OpType::Log: return "log";
    case OpType::Tanh: return "tanh";
    case OpType::Relu: return "relu";
    case OpType::Gelu: return "gelu";
    case OpType::Sigmoid: return "sigmoid";
    case OpType::Sqrt: return "sqrt";
    case OpType::Reciprocal: return "reciprocal";
    case OpType::Cast: return "cast";
    case OpType::Add: return "add";
    case OpType::Sub: return "sub";
    case OpType::Mul: return "mul";
    case OpType::Div: return "div";
    case OpType::Maximum: return "maximum";
    case OpType::Minimum: return "minimum";
    case OpType::Pow: return "pow";
    case OpType::Eq: return "eq";
    case OpType::Ne: return "ne";
    case OpType::Lt: return "lt";
    case OpType::Le: return "le";
    case OpType::Gt: return "gt";
    case OpType::Ge: return "ge";
    case OpType::Where: return "where";
    case OpType::BroadcastInDim: return "broadcast_in_dim";
    case OpType::Squeeze: return "squeeze";
    case OpType::Permute: return "permute";
    case OpType::Reshape: return "reshape";
    case OpType::Sum: return "sum";
    case OpType::Max: return "max";
    case OpType::Min: return "min";
    case OpType::Matmul: return "matmul";
    case OpType::Linear: return "linear";
  }
  MF_THROW_INTERNAL("bad OpType");
}

bool isDeviceParallel(ParallelType pt) {
  return pt == ParallelType::DIDx || pt == ParallelType::DIDy || pt == ParallelType::DIDz;
}

bool isFloatingPoint(DataType dt) {
  return dt == DataType::Float || dt == DataType::Half || dt == DataType::BFloat16 || dt == DataType::Double;
}
bool isIntegral(DataType dt) { return dt == DataType::Int || dt == DataType::Int32; }

int64_t sizeInBytes(DataType dt) {
  switch (dt) {
    case DataType::Float: return 4;
    case DataType::Half: return 2;
    case DataType::BFloat16: return 2;
    case DataType::Double: return 8;
    case DataType::Int: return 8;
    case DataType::Int32: return 4;
    case DataType::Bool: return 1;
  }
  MF_THROW_INTERNAL("bad DataType");
}

bool isUnary(OpType op) { return op >= OpType::Set && op <= OpType::Cast; }
bool isBinary(OpType op) { return op >= OpType::Add && op <= OpType::Ge; }
bool isComparison(OpType op) { return op >= OpType::Eq && op <= OpType::Ge; }
bool isPointwise(OpType op) { return op >= OpType::Set && op <= OpType::Where; }
bool isReduction(OpType op) { return op == OpType::Sum || op == OpType::Max || op == OpType::Min; }
bool isContraction(OpType op) { return op == OpType::Matmul || op == OpType::Linear; }

namespace {
int category(DataType dt) {  // bool < integral < floating
  if (dt == DataType::Bool) return 0;
  if (isIntegral(dt)) return 1;
  return 2;
}
int width(DataType dt) {
  switch (dt) {
    case DataType::Bool: return 0;
    case DataType::Int32: return 1;
    case DataType::Int: return 2;
    case DataType::Half: return 1;
    case DataType::BFloat16: return 1;
    case DataType::Float: return 2;
    case DataType::Double: return 3;
  }
  return 0;
}
}  // namespace

DataType promote(DataType a, DataType b) {
  if (a == b) return a;
  if (category(a) != category(b)) return category(a) > category(b) ? a : b;
  // half and bfloat16 promote to float, as in PyTorch.
  if ((a == DataType::Half && b == DataType::BFloat16) || (a == DataType::BFloat16 && b == DataType::Half)) {
    return DataType::Float;
  }
  return width(a) >= width(b) ? a : b;
}

}  // namespace mf
