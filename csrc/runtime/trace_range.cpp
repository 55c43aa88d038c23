#include "runtime/trace_range.h"

#include <algorithm>
#include <unordered_set>

#include "ir/op_registry.h"
#include "support/error.h"
#include "support/text.h"

namespace mf {

std::string segmentRangeName(int64_t index, const Segment& segment, const std::string& scheduler,
                             const std::unordered_map<const Val*, at::Tensor>& values) {
  std::vector<std::string> ops;
  std::unordered_set<const Val*> produced;
  std::vector<const Val*> inputs;
  for (const Expr* e : segment.exprs) {
    std::string op = opInfo(e->op()).name;
    if (std::find(ops.begin(), ops.end(), op) == ops.end()) ops.push_back(op);
    for (const Val* v : e->inputs()) {
      if (v->isTensor() && !produced.count(v) && std::find(inputs.begin(), inputs.end(), v) == inputs.end()) {
        inputs.push_back(v);
      }
    }
    for (const Val* v : e->outputs()) produced.insert(v);
  }
  constexpr size_t kMaxOps = 8;
  std::string text = "meshfuser::segment " + std::to_string(index) + " " + scheduler + ":";
  for (size_t i = 0; i < ops.size() && i < kMaxOps; ++i) text += (i ? ", " : " ") + ops[i];
  if (ops.size() > kMaxOps) text += ", ... (" + std::to_string(ops.size()) + " ops)";
  std::string shapes;
  for (const Val* v : inputs) {
    auto it = values.find(v);
    if (it == values.end() || !it->second.defined()) continue;
    shapes += (shapes.empty() ? "" : ", ") + v->toString() + " " + listText(it->second.sizes().vec()) + " " +
              std::string(c10::toString(it->second.scalar_type()));
  }
  if (!shapes.empty()) text += "; inputs " + shapes;
  return text;
}

std::string communicationRangeName(const Communication& c, const TransferBytes& bytes) {
  return mf::str("meshfuser::", toString(c.type), " ", c.output->toString(), " <- ", c.input->toString(),
                 " team=", listText(c.team), " sent ", bytes.sent, " B received ", bytes.received, " B");
}

}  // namespace mf
