// meshfuser::Executor: compiles a Fusion for this rank and runs it on local shards.
//
//   meshfuser::Executor exec(fusion, comm);
//   std::vector<at::Tensor> out = exec.execute({inp_shard, w_shard});   // every rank, same program
//
// Inputs are this rank's local shards (of the global shapes the Fusion defines), on the device the
// program should run on; outputs are this rank's shards. The first execute per input signature
// (dtypes, sizes, device) compiles (passes, lowering, ranks agreeing on the program) and caches.
// Errors are meshfuser::Error (a wrong input, ranks that disagree, a failed collective).
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "meshfuser/communicator.h"
#include "meshfuser/fusion.h"

namespace mf {
class FusionExecutorCache;
}

namespace meshfuser {

// Where an output lives: its mesh and, per mesh axis, the tensor axis sharded on it.
struct Sharding {
  DeviceMesh mesh;
  std::vector<int64_t> axes;  // tensor axis sharded on MeshX, MeshY, MeshZ; -1: replicated
  int64_t axisShardedOn(ParallelType type) const;
};

class Executor {
 public:
  // The Fusion's definition and schedule are copied: later changes to `fusion` do not apply.
  Executor(const Fusion& fusion, Communicator comm);
  ~Executor();
  Executor(Executor&&) noexcept;
  Executor& operator=(Executor&&) noexcept;

  std::vector<at::Tensor> execute(const std::vector<at::Tensor>& inputs);

  // After the first execute: this rank's lowered program (communications with their teams and
  // bytes), the shardings of the outputs, and the names of the communications that ran.
  std::string hostProgram() const;
  std::vector<Sharding> outputShardings() const;
  std::vector<std::string> communications() const;

 private:
  mf::FusionExecutorCache& live() const;  // a meshfuser::Error on a moved-from Executor
  Communicator comm_;
  std::unique_ptr<mf::FusionExecutorCache> cache_;
};

}  // namespace meshfuser
