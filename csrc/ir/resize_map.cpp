// Resize rules of slice, pad and cat (ir/resize_map.h).
//
// Requires: the op built by ops_shape.cpp (slice: x, then (start, end) scalars per axis, strides in
// the attribute; pad: x and the fill value, widths last axis first; cat: tensors, axis attribute),
// and local input shapes whose resized axes are whole (the axis maps send them nowhere, so a device
// split on them was gathered first). Guarantees: per input axis, the output range it covers and
// the input coordinate of each output coordinate in that range.
#include "ir/resize_map.h"

#include "ir/nodes.h"
#include "support/error.h"

namespace mf {

bool resizeSlice(const Expr* e, size_t input_index, const std::vector<std::vector<int64_t>>& input_shapes,
                 std::vector<AxisResize>* axes, std::string* why) {
  const Ints& strides = e->attr<Ints>("strides");
  const size_t rank = input_shapes.at(input_index).size();
  axes->assign(rank, AxisResize{});
  for (size_t a = 0; a < rank; ++a) {
    const auto* start = static_cast<const Scalar*>(e->input(1 + 2 * a));
    if (!start->value().has_value()) {
      *why = str(e->toString(), ": the start of axis ", a, " is a runtime value (", start->toString(),
                 "); generated kernels slice at constant starts");
      return false;
    }
    (*axes)[a].step = strides.at(a);
    (*axes)[a].offset = static_cast<int64_t>(*start->value());
  }
  return true;
}

bool resizePad(const Expr* e, size_t input_index, const std::vector<std::vector<int64_t>>& input_shapes,
               std::vector<AxisResize>* axes, std::string* why) {
  const Ints& widths = e->attr<Ints>("pad_widths");  // (low, high) pairs, last axis first
  const std::vector<int64_t>& shape = input_shapes.at(input_index);
  const size_t rank = shape.size();
  axes->assign(rank, AxisResize{});
  for (size_t a = 0; a < rank; ++a) {
    const size_t from_last = rank - 1 - a;
    if (2 * from_last >= widths.size()) continue;
    const int64_t low = widths[2 * from_last];
    (*axes)[a].offset = -low;  // a negative width crops: the offset is then positive
    (*axes)[a].lo = low;
    (*axes)[a].hi = low + shape[a];
  }
  return true;
}

bool resizeCat(const Expr* e, size_t input_index, const std::vector<std::vector<int64_t>>& input_shapes,
               std::vector<AxisResize>* axes, std::string* why) {
  const int64_t axis = e->attr<int64_t>("dim");
  axes->assign(input_shapes.at(input_index).size(), AxisResize{});
  int64_t begin = 0;
  for (size_t k = 0; k < input_index; ++k) begin += input_shapes.at(k).at(static_cast<size_t>(axis));
  AxisResize& r = (*axes)[static_cast<size_t>(axis)];
  r.offset = -begin;
  r.lo = begin;
  r.hi = begin + input_shapes.at(input_index).at(static_cast<size_t>(axis));
  return true;
}

}  // namespace mf
