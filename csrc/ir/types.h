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


const char* toString(DataType dt);
const char* toString(IterType it);
const char* toString(ParallelType pt);

bool isDeviceParallel(ParallelType pt);
bool isFloatingPoint(DataType dt);
bool isIntegral(DataType dt);
int64_t sizeInBytes(DataType dt);


// Result type of a binary op between two tensors, following PyTorch's promotion of tensor
// operands (scalars take part only through their category: an int scalar never widens a float).
DataType promote(DataType a, DataType b);

}  // namespace mf
