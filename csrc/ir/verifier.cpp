#include "ir/verifier.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "ir/op_checks.h"
#include "support/error.h"

namespace mf {

void verifyTensor(const TensorView* tv) {
  // Every loop axis must derive from the logical domain.
  std::set<const IterDomain*> logical(tv->logical().begin(), tv->logical().end());
  std::function<bool(const IterDomain*)> derived = [&](const IterDomain* id) {
    if (logical.count(id)) return true;
    if (id->definition() == nullptr) return false;
    for (IterDomain* in : id->definition()->inputs()) {
      if (!derived(in)) return false;
    }
    return true;
  };
  std::map<ParallelType, const IterDomain*> seen;
  for (size_t i = 0; i < tv->loop().size(); ++i) {
    const IterDomain* id = tv->loop()[i];
    MF_CHECK(derived(id), "loop axis ", i, " (", id->toString(), ") of ", tv->label(), " is not derived from its logical domain");
    ParallelType pt = id->parallelType();
    if (!isDeviceParallel(pt) && pt != ParallelType::Stream) continue;
    if (!id->isReduction()) {
      auto [it, inserted] = seen.emplace(pt, id);
      MF_USER_CHECK(inserted, tv->label(), ": loop axes ", it->second->toString(), " and ", id->toString(),
                    " are both parallelized on ", toString(pt), "; at most one axis per parallel type");
    }
    if (!isDeviceParallel(pt)) continue;
    MF_USER_CHECK(tv->hasMesh(), tv->label(), ": loop axis ", i, " (", id->toString(), ") is parallelized on ",
                  toString(pt), " but the tensor has no device mesh; call set_device_mesh first");
    MF_USER_CHECK(tv->mesh().hasParallelType(pt), tv->label(), ": loop axis ", i, " is parallelized on ", toString(pt),
                  " but its mesh ", tv->mesh().toString(), " has only ", tv->mesh().rank(), " axes");
    int64_t d = tv->mesh().size(pt);
    MF_USER_CHECK(!id->extent().isConst() || id->extent().value == d, tv->label(), ": loop axis ", i, " (",
                  id->toString(), ") is parallelized on ", toString(pt), " with extent ", id->extent().value,
                  " but the mesh has ", d, " devices along ", toString(pt), "; expected extent ", d,
                  ". To shard an axis over the mesh, split it by the mesh size first: outer_split(", i, ", ", d,
                  ") (outer_split(axis, mesh.size)), then parallelize the outer part, axis ", i);
    // A symbolic logical axis on a mesh axis (define_tensor([-1, ...]) with axis 0 parallelized) is
    // a logical split: its extent is the mesh size and each device holds extent 1.
    bool logical_axis = std::find(tv->logical().begin(), tv->logical().end(), id) != tv->logical().end();
    MF_USER_CHECK(id->extent().isConst() || logical_axis, tv->label(), ": loop axis ", i, " (", id->toString(),
                  ") is parallelized on ", toString(pt), " but its extent is symbolic; split it by the mesh size first: ",
                  "outer_split(", i, ", ", d, ") (outer_split(axis, mesh.size)), then parallelize axis ", i);
  }
}

void verifyFusion(const Fusion& f) {
  for (const TensorView* tv : f.allTensors()) verifyTensor(tv);
  for (const Expr* e : f.exprs()) {
    for (const Val* out : e->outputs()) {
      MF_CHECK(out->definition() == e, out->toString(), " is not defined by the expr that lists it as output");
    }
    checkExpr(e);  // the op's attributes and its check, as its builder ran them
  }
}

}  // namespace mf
