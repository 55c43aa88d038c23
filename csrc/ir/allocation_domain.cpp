// TensorView::setAllocationDomain (nvFuser's set_allocation_domain): the memory order of a
// tensor's loop axes, kept as the stride order of its local tensor, which the runtime honours
// (outputs come back in it). An order that no stride order describes is refused here, when the
// program is defined, rather than ignored.
#include <algorithm>
#include <set>

#include "ir/fusion.h"
#include "ir/nodes.h"
#include "support/error.h"
#include "support/text.h"

namespace mf {
namespace {

// The logical axis (index among logical()) that loop axis `id` is a piece of; -1 for a merge of
// several.
int64_t logicalAncestor(const TensorView* tv, const IterDomain* id) {
  const auto& logical = tv->logical();
  auto it = std::find(logical.begin(), logical.end(), id);
  if (it != logical.end()) return it - logical.begin();
  const IdTransform* t = id->definition();
  if (t == nullptr || t->inputs().size() != 1) return -1;
  return logicalAncestor(tv, t->inputs()[0]);
}

}  // namespace

void TensorView::setAllocationDomain(const std::vector<int64_t>& axes, const std::vector<bool>& contiguity) {
  const char* what = "set_allocation_domain";
  const int64_t n = nDims();
  MF_USER_ARG_CHECK(static_cast<int64_t>(axes.size()) == n, label(), ": ", what, " takes each of the ", n,
                    " loop axes once ", domainString(), "; got ", axes.size(), " axes");
  MF_USER_ARG_CHECK(contiguity.size() == 1 || static_cast<int64_t>(contiguity.size()) == n, label(), ": ", what,
                    " takes one contiguity flag, or one per axis (", n, "); got ", contiguity.size());
  std::vector<int64_t> order;
  std::set<int64_t> seen;
  for (int64_t a : axes) {
    int64_t p = normalizeAxis(a, n, what);
    MF_USER_ARG_CHECK(seen.insert(p).second, label(), ": ", what, " names loop axis ", p, " twice");
    order.push_back(p);
  }
  // Walk the order: each logical axis's pieces (mesh axes aside: one piece per device) must be
  // adjacent and outer first, so that the local tensor has them as one axis.
  std::vector<IterDomain*> runtime_logical = logicalNoReductions();
  std::vector<int64_t> logical_order;  // indices into runtime_logical, outermost first
  std::vector<bool> contiguous(runtime_logical.size(), true);
  int64_t last_axis = -1, last_loop_position = -1;
  for (size_t k = 0; k < order.size(); ++k) {
    const IterDomain* id = loop_[order[k]];
    if (id->isReduction() || id->isDeviceDim()) continue;
    const int64_t l = logicalAncestor(this, id);
    MF_USER_CHECK(l >= 0, label(), ": ", what, ": loop axis ", order[k], " (", id->toString(),
                  ") merges several logical axes; an allocation order of merged axes is not supported");
    const int64_t r = std::find(runtime_logical.begin(), runtime_logical.end(), logical_[l]) - runtime_logical.begin();
    const bool continues = r == last_axis;
    if (!continues) {
      MF_USER_CHECK(std::find(logical_order.begin(), logical_order.end(), r) == logical_order.end(), label(), ": ",
                    what, " ", listText(axes), " separates the pieces of logical axis ", r, " (",
                    logical_[l]->toString(), ") by other axes; the runtime keeps a logical axis's pieces together, "
                    "outer first");
      logical_order.push_back(r);
    } else {
      MF_USER_CHECK(order[k] > last_loop_position, label(), ": ", what, " ", listText(axes),
                    " puts an inner piece of logical axis ", r, " before its outer piece; the runtime keeps them "
                    "outer first");
    }
    contiguous[r] = contiguous[r] && (contiguity.size() == 1 ? contiguity[0] : contiguity[k]);
    last_axis = r;
    last_loop_position = order[k];
  }
  const auto rank = static_cast<int64_t>(runtime_logical.size());
  std::vector<int64_t> stride_order(rank, 0);
  bool row_major = true;
  for (int64_t k = 0; k < static_cast<int64_t>(logical_order.size()); ++k) {
    stride_order[logical_order[k]] = rank - 1 - k;
    row_major = row_major && logical_order[k] == k;
  }
  allocation_ = loop_;
  stride_order_ = row_major ? std::vector<int64_t>{} : stride_order;
  contiguity_ = std::all_of(contiguous.begin(), contiguous.end(), [](bool c) { return c; }) ? std::vector<bool>{}
                                                                                               : contiguous;
  if (fusion() != nullptr) fusion()->bump();
}

}  // namespace mf
