// FusionExecutorCache: a definition's executors, one per shape class, least recently used out
// past cacheLimits(); and the refusal of a call this rank cannot start (runtime/executor.h).
#include <ATen/record_function.h>

#include "ir/printer.h"
#include "multidevice/communicator.h"
#include "runtime/agreement.h"
#include "runtime/executor.h"
#include "support/error.h"
#include "support/log.h"
#include "support/options.h"

namespace mf {

namespace {
int64_t currentRank(const Communicator& comm) { return comm.initialized() ? comm.rank() : 0; }
}  // namespace

std::shared_ptr<FusionExecutor> FusionExecutorCache::executorFor(const std::vector<RuntimeValue>& inputs) {
  ShapeClass shape_class = shapeClassOf(inputs);
  for (auto it = executors_.begin(); it != executors_.end(); ++it) {
    if (!(it->shape_class == shape_class)) continue;
    executors_.splice(executors_.begin(), executors_, it);  // most recently used first
    last_ = executors_.front().executor;
    return last_;
  }
  if (isDumpEnabled(DumpOption::Recompile)) {
    logText("recompile", "recompile: " + (executors_.empty() ? std::string("first call of the definition")
                                                             : "new shape class (" +
                                                                   classChange(executors_.front().shape_class, shape_class) + ")"));
  }
  auto executor = std::make_shared<FusionExecutor>(*fusion_, currentRank(*comm_), *comm_);
  ++built_;
  ++compileCounters().executors;
  executors_.push_front(Entry{std::move(shape_class), executor});
  while (static_cast<int64_t>(executors_.size()) > cacheLimits().executors_per_definition) executors_.pop_back();
  last_ = executor;
  return executor;
}

void FusionExecutorCache::refuseCall(const std::string& error) {
  Communicator& comm = *comm_;
  if (!comm.initialized() || comm.size() == 1 || comm.broken() || isDisabled(DisableOption::CollectiveValidation)) return;
  std::lock_guard<std::mutex> call_lock(comm.callMutex());
  agreeOnCall(comm, *fusion_, fingerprint(*fusion_), {}, {}, error, strictAgreement());
}

std::vector<at::Tensor> FusionExecutorCache::run(const std::vector<RuntimeValue>& inputs,
                                                 std::shared_ptr<FusionExecutor>* used,
                                                 std::vector<RuntimeValue>* release) {
  RECORD_FUNCTION("meshfuser::execute", std::vector<c10::IValue>());  // holds the step ranges (trace_range.h)
  std::lock_guard<std::mutex> lock(mutex_);
  std::shared_ptr<FusionExecutor> executor = executorFor(inputs);
  if (used != nullptr) *used = executor;
  return executor->run(inputs, release);
}

std::vector<std::string> FusionExecutorCache::generatedKernels(const std::vector<RuntimeValue>& inputs,
                                                              std::shared_ptr<FusionExecutor>* used,
                                                              std::vector<at::Tensor>* meta_outputs,
                                                              const DeviceLimits* device) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::shared_ptr<FusionExecutor> executor = executorFor(inputs);
  if (used != nullptr) *used = executor;
  return executor->generatedKernels(inputs, meta_outputs, device);
}

}  // namespace mf
