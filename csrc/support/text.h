// Small text and hashing helpers shared by the IR printer, codegen and the runtime.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mf {

// "[1, 2, 3]": shapes, dims and strides in messages and printed IR.
std::string listText(const std::vector<int64_t>& values);
std::string listText(const std::vector<std::string>& items);

// The shortest text that reads back as exactly x ("1e-05", not "1.0000000000000001e-05"): constants
// in printed IR, which is also a cache key, so no two values may print alike.
std::string numberText(double x);

// 64-bit FNV-1a: keys of caches (program text, kernel source, input signatures).
uint64_t fnv1a(const std::string& bytes);
uint64_t fnv1a(const std::vector<int64_t>& values);

}  // namespace mf
