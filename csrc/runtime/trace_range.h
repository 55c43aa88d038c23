// torch.profiler ranges for what execute() runs: one `meshfuser::execute` range per call holding
// one range per segment (its scheduler, ops and input shapes) and per communication (its kind,
// team and bytes), so that a Chrome/Perfetto trace reads like the host program. A range's name is
// built only while a profiler listens.
#pragma once

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <string>
#include <unordered_map>
#include <utility>

#include "host/communication_bytes.h"
#include "host/host_program.h"

namespace mf {

class TraceRange {
 public:
  template <typename NameFn>
  explicit TraceRange(NameFn&& make_name) : guard_(at::RecordScope::USER_SCOPE) {
    if (guard_.isActive()) {
      name_ = make_name();
      guard_.before(std::string_view(name_));
    }
  }

 private:
  std::string name_;  // declared first: outlives the guard, which may read it when the range ends
  at::RecordFunction guard_;
};

// "meshfuser::segment 2 pointwise: add, gelu; inputs T1 [8, 64] float, T5 [64] float"
std::string segmentRangeName(int64_t index, const Segment& segment, const std::string& scheduler,
                             const std::unordered_map<const Val*, at::Tensor>& values);
// "meshfuser::ReduceScatter T4 <- T3 team=[0, 1] sent 4096 B received 2048 B"
std::string communicationRangeName(const Communication& c, const TransferBytes& bytes);

}  // namespace mf
