#include "runtime/shape_class.h"

#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <sstream>

#include "support/error.h"
#include "support/options.h"
#include "support/text.h"

namespace mf {
namespace {

// Axes of extent > 1 from the largest stride to the smallest (ties: the later axis inner).
std::vector<int64_t> strideOrder(const at::Tensor& t) {
  std::vector<int64_t> axes;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) != 1) axes.push_back(d);
  }
  std::stable_sort(axes.begin(), axes.end(), [&](int64_t a, int64_t b) { return t.stride(a) > t.stride(b); });
  return axes;
}

// Dense in its stride order: each stride is the product of the extents inside it.
bool denseInOrder(const at::Tensor& t, const std::vector<int64_t>& order) {
  int64_t expected = 1;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    if (t.stride(*it) != expected) return false;
    expected *= t.size(*it);
  }
  return true;
}

int64_t envLimit(const char* name, int64_t fallback) { return envInt(name, fallback, /*min=*/1); }

}  // namespace

ShapeClass shapeClassOf(const std::vector<RuntimeValue>& inputs) {
  ShapeClass c;
  c.key.reserve(inputs.size() * 8);
  for (const RuntimeValue& rv : inputs) {
    if (!rv.is_tensor) {
      c.key.push_back(-1);
      c.key.push_back(static_cast<int64_t>(rv.scalar.type()));
      c.texts.push_back(mf::str("scalar of type ", rv.scalar.type()));
      continue;
    }
    const at::Tensor& t = rv.tensor;
    std::vector<int64_t> order = strideOrder(t);
    bool dense = denseInOrder(t, order);
    c.key.push_back(static_cast<int64_t>(t.scalar_type()));
    c.key.push_back(static_cast<int64_t>(t.device().type()) * 1000 + t.device().index());
    c.key.push_back(t.dim());
    std::vector<int64_t> ones;
    for (int64_t d = 0; d < t.dim(); ++d) {
      c.key.push_back(t.size(d) == 1 ? 1 : 0);
      if (t.size(d) == 1) ones.push_back(d);
    }
    c.key.push_back(static_cast<int64_t>(order.size()));
    c.key.insert(c.key.end(), order.begin(), order.end());
    c.key.push_back(dense ? 1 : 0);
    if (!dense) c.key.insert(c.key.end(), t.strides().begin(), t.strides().end());
    std::ostringstream ss;
    ss << t.scalar_type() << " on " << t.device() << ", " << t.dim() << "-D, extent-1 axes " << listText(ones)
       << ", stride order " << listText(order) << (dense ? ", dense" : ", strides " + listText(t.strides().vec()));
    c.texts.push_back(ss.str());
  }
  return c;
}

std::string classChange(const ShapeClass& before, const ShapeClass& now) {
  if (before.texts.size() != now.texts.size()) {
    return mf::str(before.texts.size(), " inputs -> ", now.texts.size(), " inputs");
  }
  for (size_t i = 0; i < now.texts.size(); ++i) {
    if (before.texts[i] != now.texts[i]) return mf::str("input ", i, ": ", before.texts[i], " -> ", now.texts[i]);
  }
  return "no input differs";
}

CacheLimits& cacheLimits() {
  static CacheLimits limits = [] {
    CacheLimits l;
    l.executors_per_definition = envLimit("MESHFUSER_EXECUTOR_CACHE_SIZE", l.executors_per_definition);
    l.kernel_modules = envLimit("MESHFUSER_KERNEL_CACHE_SIZE", l.kernel_modules);
    return l;
  }();
  return limits;
}

}  // namespace mf
