// FusionExecutor: one compiled program (pass pipeline + this rank's host program + segmentation)
// for one shape class of inputs (runtime/shape_class.h), and the interpreter that runs it for any
// extents of that class. FusionExecutorCache maps a definition's shape classes to executors, least
// recently used out past cacheLimits(); a definition's cache is found by its printed text, which
// covers the schedule, so equal ops with different shardings never share an entry (seed 001's bug).
#pragma once

#include <ATen/ATen.h>

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "codegen/kernel.h"
#include "host/communication_bytes.h"
#include "host/host_program.h"
#include "multidevice/communicator.h"
#include "runtime/aten_evaluator.h"
#include "runtime/segment_kernels.h"
#include "runtime/shape_class.h"
#include "support/error.h"
#include "support/text.h"

namespace mf {

class CallAgreement;

class FusionExecutor {
 public:
  // Clones `fusion`, runs the pass pipeline and lowers it for `rank`. Communications go through
  // `comm` (the Python layer passes the process-wide instance).
  FusionExecutor(const Fusion& fusion, int64_t rank, Communicator& comm = Communicator::instance());
  // `release`, when given, is `inputs` itself, handed over by the caller: its tensors are dropped
  // once the program holds them, and the program drops each after its last use, so an input no one
  // else references (a backward's saved activation) is freed as soon as the program is done with it.
  std::vector<at::Tensor> run(const std::vector<RuntimeValue>& inputs, std::vector<RuntimeValue>* release = nullptr);
  const HostProgram& hostProgram() const { return *program_; }
  // What runs each segment on the last call: "expr_eval" (ATen) or a generated kernel's scheduler.
  std::vector<std::string> segmentSchedulers() const;
  // The host program with those scheduler names and each communication's bytes on the last call.
  // Deallocations are listed only when asked (they are most of the lines of a large program).
  std::string hostProgramText(bool show_deallocations = false) const;
  // How each compute segment was split into generated kernels and ATen pieces (planned on the first
  // call of the shape class; empty for segments never planned, e.g. on CPU tensors).
  std::string segmentationText() const;
  std::string attentionKernelsText() const;  // the kernel each attention op ran last
  const Fusion& compiledFusion() const { return program_->fusion(); }
  // CUDA source of every kernel the GPU path generates for these inputs (any device, meta too).
  // `meta_outputs`, when given, receives the outputs as meta tensors of this rank's local shapes,
  // dtypes and strides (what torch.compile's fake implementation of execute returns). Kernels are
  // generated for `device` (null: the current device, see currentDeviceLimits).
  std::vector<std::string> generatedKernels(const std::vector<RuntimeValue>& inputs,
                                            std::vector<at::Tensor>* meta_outputs = nullptr,
                                            const DeviceLimits* device = nullptr);

 private:
  // Checks inputs and binds symbolic extents. Returns an error message, empty when fine.
  std::string validate(const std::vector<RuntimeValue>& inputs, ExtentBindings& bindings) const;
  // What only a real run needs: CPU or CUDA inputs, and even shards of every tensor (intermediates
  // and outputs included) at the bound extents. Returns an error message, empty when fine.
  std::string checkRunnable(const std::vector<RuntimeValue>& inputs, const ExtentBindings& bindings) const;
  // The part of run() after the ranks agreed on the call.
  // `pending`: the call's agreement, still in flight; finished before the first communication.
  // `bindings` gains the data-dependent extents (the rows an exchange received) as the call runs.
  std::vector<at::Tensor> runAgreed(const std::vector<RuntimeValue>& inputs, ExtentBindings bindings,
                                    CallAgreement* pending, std::vector<RuntimeValue>* release);
  void runCommunication(const Communication& c, std::unordered_map<const Val*, at::Tensor>& values,
                        const ExtentBindings& bindings, std::vector<c10::intrusive_ptr<c10d::Work>>& works);
  // The expert-parallel exchanges (run_exchange.cpp): communication `index` of the program. Binds the
  // received row count of a dispatch in `bindings` and records the bytes in exchange_bytes_.
  void runExchange(int64_t index, const Communication& c, std::unordered_map<const Val*, at::Tensor>& values,
                   ExtentBindings& bindings, std::vector<c10::intrusive_ptr<c10d::Work>>& works);
  // Posts the point-to-point transfers of SendRecv / Gather / Scatter.
  void runPointToPoint(const Communication& c, std::unordered_map<const Val*, at::Tensor>& values,
                       const ExtentBindings& bindings, std::vector<c10::intrusive_ptr<c10d::Work>>& works);

  // One stream-parallel loop of contraction + communication chunks (run_stream_loop.cpp).
  void runStreamLoop(int64_t index, std::unordered_map<const Val*, at::Tensor>& values,
                     const std::unordered_map<const Val*, c10::Scalar>& scalars, const ExtentBindings& bindings);
  void runSegment(int64_t index, std::unordered_map<const Val*, at::Tensor>& values,
                  const std::unordered_map<const Val*, c10::Scalar>& scalars, const ExtentBindings& bindings,
                  bool allow_kernels);
  std::string schedulerOf(int64_t segment) const;
  // Bytes each communication sends and receives on this rank, for the last call's extents.
  std::vector<std::pair<int64_t, int64_t>> communicationBytes() const;
  ExtentBindings last_bindings_;
  // Bytes of each exchange on the last call (they follow the counts, not the extents alone).
  std::vector<TransferBytes> exchange_bytes_;
  std::vector<const TensorView*> sharded_tensors_;  // checked for even shards on every call

  Communicator* comm_;
  std::unique_ptr<HostProgram> program_;
  std::vector<SegmentKernels> kernels_;  // per compute segment: its generated kernels
  // Per gemm_accumulate segment: whether the last run added into the partial in place.
  std::unordered_map<int64_t, bool> accumulated_in_place_;
  // Local reshuffles that finish a communication once its data arrived (run at its Wait).
  std::unordered_map<const Val*, std::function<at::Tensor()>> pending_finish_;
  bool multi_rank_ = false;
  bool settles_failures_ = false;  // every rank posts in a call (the teams cover the world)
  int64_t posts_at_start_ = 0;     // comm_->posts() when this call started running
  uint64_t fingerprint_ = 0;  // of the definition and schedule, compared across ranks
  bool teams_created_ = false;
  // Where ops without tensor operands (uniform) create their outputs in this call: the inputs'
  // device, CPU when there is no tensor input, meta under cuda_kernels.
  c10::Device eval_device_ = c10::Device(c10::kCPU);
};

// A user error, naming the mesh, when `program` spans several devices and `comm` is not initialized
// (run_communication.cpp): without it, communications would be skipped and the result wrong.
void requireCommunicatorFor(const HostProgram& program, const Communicator& comm);

// The runtime value of a scalar operand: its constant, or the value bound for this call.
RuntimeValue scalarRuntimeValue(const Val* v, const std::unordered_map<const Val*, c10::Scalar>& scalars,
                                const ExtentBindings& bindings);

// A c10d operation of `c` failed after the ranks agreed (a peer died, failed, or timed out): marks
// the Communicator broken and returns the user error to raise.
// When `posts_before` (comm.posts() at the start of the call) is given and nothing was posted since,
// the groups are not marked: run() settles that with the other ranks.
UserError collectiveFailure(Communicator& comm, const Communication& c, int64_t rank, const std::exception& e,
                            int64_t posts_before = -1);

class FusionExecutorCache {
 public:
  explicit FusionExecutorCache(std::shared_ptr<const Fusion> fusion, Communicator& comm = Communicator::instance())
      : fusion_(std::move(fusion)), comm_(&comm) {}
  // Runs the executor for these inputs (`used`, when given, receives it). One call at a time per
  // cache: execute() releases the GIL, and two threads running the same definition (or two
  // identical definitions, which share a cache) must not plan or bind into one executor at once.
  // `release`: see FusionExecutor::run.
  std::vector<at::Tensor> run(const std::vector<RuntimeValue>& inputs, std::shared_ptr<FusionExecutor>* used = nullptr,
                              std::vector<RuntimeValue>* release = nullptr);
  // The generated kernels' sources for these inputs (cuda_kernels()), under the same lock.
  std::vector<std::string> generatedKernels(const std::vector<RuntimeValue>& inputs,
                                            std::shared_ptr<FusionExecutor>* used = nullptr,
                                            std::vector<at::Tensor>* meta_outputs = nullptr,
                                            const DeviceLimits* device = nullptr);
  // A call this rank cannot even start (`error`, e.g. an input that is not a tensor): it still
  // takes part in the per-call agreement, so that every rank raises. Throws on the other ranks.
  void refuseCall(const std::string& error);
  // The executor used by the most recent run (for host_program() / shardings), or null.
  FusionExecutor* lastExecutor() const { return last_.get(); }
  // Executors held now (one per shape class still cached) and built so far (evicted ones too).
  size_t numExecutors() const { return executors_.size(); }
  int64_t executorsBuilt() const { return built_; }

 private:
  struct Entry {
    ShapeClass shape_class;
    std::shared_ptr<FusionExecutor> executor;
  };
  std::shared_ptr<const Fusion> fusion_;
  Communicator* comm_;
  // The executor for these inputs' shape class (compiled on first use); mutex_ held.
  std::shared_ptr<FusionExecutor> executorFor(const std::vector<RuntimeValue>& inputs);
  std::mutex mutex_;
  std::list<Entry> executors_;  // most recently used first
  std::shared_ptr<FusionExecutor> last_;
  int64_t built_ = 0;
};

}  // namespace mf
