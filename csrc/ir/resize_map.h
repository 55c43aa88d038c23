// Where a resize op (slice, pad, cat) reads each output element from: the consumer-side index
// arithmetic that lets a generated kernel compute these ops in place (codegen/resize.cpp) instead
// of materializing them. Each op's rule is one function below, named by its registry entry.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace mf {

class Expr;

// One axis of one tensor input of a resize op: output coordinate `o` reads the input at
// `step * o + offset`, for lo <= o < hi. Where no tensor input covers `o`, the op yields its fill
// value (pad's scalar operand); the inputs of cat partition the axis.
struct AxisResize {
  int64_t step = 1, offset = 0;
  int64_t lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
};

// For expr `e`'s tensor input `input_index`, given the local shapes of e's inputs (per input, empty
// for scalars): one AxisResize per axis of the input (same rank as the output), or false with the
// reason in *why (a runtime slice bound, say).
using ResizeFn = bool (*)(const Expr* e, size_t input_index, const std::vector<std::vector<int64_t>>& input_shapes,
                          std::vector<AxisResize>* axes, std::string* why);

bool resizeSlice(const Expr* e, size_t input_index, const std::vector<std::vector<int64_t>>& input_shapes,
                 std::vector<AxisResize>* axes, std::string* why);
bool resizePad(const Expr* e, size_t input_index, const std::vector<std::vector<int64_t>>& input_shapes,
               std::vector<AxisResize>* axes, std::string* why);
bool resizeCat(const Expr* e, size_t input_index, const std::vector<std::vector<int64_t>>& input_shapes,
               std::vector<AxisResize>* axes, std::string* why);

}  // namespace mf
