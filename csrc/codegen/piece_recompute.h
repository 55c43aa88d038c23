// Which values a finished piece should not store because the next piece computes them again
// (runtime/segment_kernels.cpp plans with it; plain IR, no torch).
//
// A segment that needs two kernels (a norm backward: the row kernel of the input gradient, then
// the column sums of the weight gradients) hands values from one to the next. Where such a value
// is elementwise work on narrower tensors (dy cast to float; xhat = (x - mean) * rstd, from bf16 x
// and two per-row statistics), storing it in float and reading it back moves more bytes than
// reading its narrow inputs again: the next piece recomputes it, and the first stores only the
// small statistics it needs.
#pragma once

#include <unordered_set>
#include <vector>

#include "ir/fusion.h"

namespace mf {

struct Recompute {
  std::vector<Expr*> exprs;                 // to run again at the start of the next piece, in order
  std::unordered_set<const Val*> values;    // their outputs: the finished piece need not store them
  std::unordered_set<const Val*> leaves;    // values of the finished piece they read: it stores them
};

// For `group` (the piece being finished) and `rest` (the segment's exprs still to plan): the values
// of the group that `rest` reads and that are worth recomputing. Requires: group and rest in
// topological order. Guarantees: every expr returned is elementwise (unary, binary, ternary or a
// broadcast) and in `group`; a value is recomputed only when nothing outside `group` and `rest`
// reads it and it is not a fusion output, and only when its narrow inputs (those of the group's
// shape) take fewer bytes per element than storing and loading it does; the statistics it reads
// (values with a broadcast axis where it has none) are in `leaves`.
Recompute recomputeInNextPiece(const std::vector<Expr*>& group, const std::vector<Expr*>& rest, const Fusion& fusion);

}  // namespace mf
