// The order in which lowering visits a fusion's exprs (host/segment_order.cpp).
#pragma once

#include <functional>
#include <vector>

#include "ir/fusion.h"

namespace mf {

// A topological order of `exprs` (given in one) that puts fusible work in as few segments as it
// can; `runs_alone` says which exprs close a segment (communications, contractions, attention, ...).
std::vector<Expr*> orderForSegments(const std::vector<Expr*>& exprs, const std::function<bool(const Expr*)>& runs_alone);

// The exprs lowering gives a segment of their own or a communication: resharding and exchange exprs
// and the ops the registry runs alone.
bool closesSegment(const Expr* e);

}  // namespace mf
