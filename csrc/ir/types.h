// Enumerations shared by the whole IR: data types, iteration types, parallel types, op types.
#pragma once

#include <cstdint>
#include <string>

namespace mf {

enum class DataType { Float, Half, BFloat16, Double, Int, Int32, Bool };

enum class IterType { Iteration, Reduction, Broadcast };

// DIDx/y/z: spread across devices (mesh axes, DIDx = innermost). Stream: a host loop whose
// iterations may run on different streams. The rest describe kernel loops.
enum class ParallelType {
  DIDx, DIDy, DIDz, Stream, BIDx, BIDy, BIDz, TIDx, TIDy, TIDz, Vectorize, Unroll, Serial
};
constexpr ParallelType kDeviceParallelTypes[] = {ParallelType::DIDx, ParallelType::DIDy, ParallelType::DIDz};

enum class OpType {
  // unary
  Set, Neg, Abs, Exp, Log, Tanh, Relu, Gelu, Sigmoid, Sqrt, Reciprocal, Cast,
  // binary
  Add, Sub, Mul, Div, Maximum, Minimum, Pow, Eq, Ne, Lt, Le, Gt, Ge,
  // ternary
  Where,
  // shape
  BroadcastInDim, Squeeze, Permute, Reshape,
  // reductions
  Sum, Max, Min,
  // contractions
  Matmul, Linear,
};

const char* toString(DataType dt);
const char* toString(IterType it);
const char* toString(ParallelType pt);
const char* toString(OpType op);

bool isDeviceParallel(ParallelType pt);
bool isFloatingPoint(DataType dt);
bool isIntegral(DataType dt);
int64_t sizeInBytes(DataType dt);

bool isUnary(OpType op);
bool isBinary(OpType op);
bool isComparison(OpType op);
bool isPointwise(OpType op);  // unary, binary, ternary and cast
bool isReduction(OpType op);
bool isContraction(OpType op);

// Result type of a binary op between two tensors, following PyTorch's promotion of tensor
// operands (scalars take part only through their category: an int scalar never widens a float).
DataType promote(DataType a, DataType b);

}  // namespace mf
