// Public C++ API: meshfuser::Executor over FusionExecutorCache, with the caller's Communicator.
#include "meshfuser/executor.h"

#include "ir/fusion.h"
#include "multidevice/sharding.h"
#include "runtime/executor.h"
#include "runtime/profiler.h"
#include "support/error.h"

namespace meshfuser {

int64_t Sharding::axisShardedOn(ParallelType type) const {
  switch (type) {
    case ParallelType::MeshX: return axes.at(0);
    case ParallelType::MeshY: return axes.at(1);
    case ParallelType::MeshZ: return axes.at(2);
    default: MF_USER_ARG_CHECK(false, "Sharding::axisShardedOn: expected MeshX, MeshY or MeshZ");
  }
  return -1;
}

Executor::Executor(const Fusion& fusion, Communicator comm) : comm_(std::move(comm)) {
  MF_USER_CHECK(!fusion.impl()->outputs().empty(), "Executor: the fusion has no outputs; call addOutput");
  std::shared_ptr<const mf::Fusion> copy(fusion.impl()->clone());
  cache_ = std::make_unique<mf::FusionExecutorCache>(std::move(copy), *comm_.impl());
}

Executor::~Executor() = default;
Executor::Executor(Executor&&) noexcept = default;
Executor& Executor::operator=(Executor&&) noexcept = default;

mf::FusionExecutorCache& Executor::live() const {
  MF_USER_CHECK(cache_ != nullptr, "this meshfuser::Executor was moved from; use the Executor it was moved to");
  return *cache_;
}

std::vector<at::Tensor> Executor::execute(const std::vector<at::Tensor>& inputs) {
  std::vector<mf::RuntimeValue> values;
  values.reserve(inputs.size());
  for (const at::Tensor& t : inputs) values.push_back({t, c10::Scalar(), true});
  try {
    return live().run(values);
  } catch (const c10::Error& e) {
    // A collective or ATen failure (timeout, a peer that went away): as a meshfuser::Error.
    MF_THROW_USER("execute on rank ", comm_.rank(), " failed in PyTorch: ", e.what_without_backtrace());
  } catch (const meshfuser::Error&) {
    throw;
  } catch (const meshfuser::InternalError&) {
    throw;
  } catch (const std::exception& e) {
    // Anything else (std::bad_alloc, a standard library error) is not the caller's mistake; callers
    // catch meshfuser's two exception types only.
    throw meshfuser::InternalError("execute on rank " + std::to_string(comm_.rank()) + " failed: " + e.what());
  }
}

std::string Executor::hostProgram() const {
  MF_USER_CHECK(live().lastExecutor(), "hostProgram: no program yet; call execute() first");
  return live().lastExecutor()->hostProgram().toString();
}

std::vector<Sharding> Executor::outputShardings() const {
  MF_USER_CHECK(live().lastExecutor(), "outputShardings: no program yet; call execute() first");
  std::vector<Sharding> result;
  for (const mf::Val* v : live().lastExecutor()->compiledFusion().outputs()) {
    auto* tv = static_cast<const mf::TensorView*>(v);
    MF_USER_CHECK(mf::allSplitsBlocked(tv), "outputShardings: output ", tv->toString(),
                  " is split interleaved across devices, which a Sharding of one block per device cannot describe");
    Sharding s{DeviceMesh(tv->mesh().devices(), tv->mesh().shape()), {}};
    for (mf::ParallelType pt : mf::kDeviceParallelTypes) s.axes.push_back(mf::shardedAxis(tv, pt));
    result.push_back(std::move(s));
  }
  return result;
}

std::vector<std::string> Executor::communications() const {
  MF_USER_CHECK(live().lastExecutor(), "communications: no program yet; call execute() first");
  std::vector<std::string> names;
  for (const auto& c : live().lastExecutor()->hostProgram().communications()) {
    if (c.type != mf::CommunicationType::NoOp) names.push_back(c.toString());  // a NoOp moves nothing
  }
  return names;
}

}  // namespace meshfuser
