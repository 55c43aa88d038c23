// Symbolic extents as small integer expressions.
//
// A symbolic extent is text: a symbol bound by an input ("s0"), a scalar input ("S2", an integer
// given to execute), or an expression over them that an op derived: "s0+4" (pad), "s0+s1" (cat),
// "ceilDiv(S3-S2, 2)" (a slice with scalar bounds), "s0*s1" (a reshape that merges), "s0/2" (a
// split). The printer writes the text inside an axis's braces and the parser reads it back, so a
// derived extent needs no node of its own; the runtime evaluates it once the inputs bound the
// symbols. Grammar: sum := product (('+'|'-') product)*; product := atom (('*'|'/') atom)*;
// atom := integer | name | ceilDiv(sum, sum) | min(sum, sum) | max(sum, sum) | sliceIndex(sum, sum)
//         | '(' sum ')'.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/nodes.h"

namespace mf {

class Fusion;

// The value of `extent` given the symbols (and scalar inputs) bound for a call; nullopt when a
// name in it is unbound. Names are looked up through the fusion's unified symbols.
std::optional<int64_t> evaluateExtent(const Fusion& f, const Extent& extent,
                                      const std::unordered_map<std::string, int64_t>& bindings);

// Extents built from others, folding constants ("s0" + 0 is "s0", 3 + 4 is 7).
Extent extentConst(int64_t v);
Extent extentAdd(const Extent& a, const Extent& b);
Extent extentSub(const Extent& a, const Extent& b);
Extent extentMul(const Extent& a, const Extent& b);
Extent extentCeilDiv(const Extent& a, int64_t b);
Extent extentMin(const Extent& a, const Extent& b);
Extent extentMax(const Extent& a, const Extent& b);
// PyTorch's normalization of slice bound `index` on an axis of `extent`: index + extent when
// negative, then clamped to [0, extent] ("sliceIndex(S2, s0)").
Extent extentSliceIndex(const Extent& index, const Extent& extent);

// An extent as a product: constant * atoms (each atom a canonical symbol or an expression that is
// not itself a product). Two extents with equal factors are equal for any binding.
struct ExtentFactors {
  int64_t constant = 1;
  std::vector<std::string> atoms;  // sorted
  bool operator==(const ExtentFactors& o) const { return constant == o.constant && atoms == o.atoms; }
  // True when this divides `o` for every binding (its atoms are among o's, its constant divides o's).
  bool divides(const ExtentFactors& o) const;
};
ExtentFactors factorsOf(const Fusion& f, const Extent& extent);
// The same, reading a product that an op unified as a whole with another ("s3*s4=s0*s1") as it is
// written (s3 * s4), not as its representative: a reshape's output extents are products of its
// input's extents as written.
ExtentFactors factorsAsWritten(const Fusion& f, const Extent& extent);
// `total` divided by `part`: the leftover factors when `part` divides `total`, else "(t)/(p)".
Extent extentQuotient(const Fusion& f, const Extent& total, const Extent& part);

}  // namespace mf
