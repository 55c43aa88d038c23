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
