#include "runtime/executor.h"

#include <ATen/record_function.h>

#include <iostream>
#include <unordered_set>

#include "host/communication_bytes.h"
#include "ir/extent_expr.h"
#include "ir/ops.h"
#include "multidevice/communicator.h"
#include "multidevice/sharding.h"
#include "ir/printer.h"
#include "passes/pass.h"
#include "runtime/agreement.h"
#include "runtime/attention_choice.h"
#include "runtime/call_checks.h"
#include "runtime/cuda_kernel.h"
#include "runtime/gemm_accumulate.h"
#include "runtime/profiler.h"
#include "runtime/trace_range.h"
#include "support/error.h"
#include "support/log.h"
#include "support/options.h"

namespace mf {

FusionExecutor::FusionExecutor(const Fusion& fusion, int64_t rank, Communicator& comm) : comm_(&comm) {
  fingerprint_ = fingerprint(fusion);
  auto copy = fusion.clone();
  if (isDumpEnabled(DumpOption::FusionIr)) logText("fusion_ir", printFusion(*copy));
  runPipeline(*copy);
  program_ = lowerToHostProgram(std::move(copy), rank);
  exchange_bytes_.resize(program_->communications().size());
  multi_rank_ = comm_->initialized() && comm_->size() > 1;
  // Every rank posts in a call of this program (its teams cover the world): a rank that failed
  // before posting can settle with the others whether they all did (run()).
  if (multi_rank_) {
    std::vector<bool> covered(static_cast<size_t>(comm_->size()), false);
    for (const auto& team : program_->teams()) {
      for (int64_t r : team) {
        if (r >= 0 && r < comm_->size()) covered[r] = true;
      }
    }
    settles_failures_ = !program_->teams().empty() && std::find(covered.begin(), covered.end(), false) == covered.end();
  }
  for (const TensorView* tv : program_->fusion().allTensors()) {
    if (tv->hasMesh() && isSharded(tv)) sharded_tensors_.push_back(tv);
  }
  if (isDumpEnabled(DumpOption::HostProgram)) logText("host_program", program_->toString());
}

namespace {
// A runtime scalar as its declared dtype (validate() refused the kinds that would change its value):
// a floating scalar given a Python int computes as a float, as the definition typed it.
c10::Scalar declaredScalar(DataType dt, const c10::Scalar& s) {
  if (isFloatingPoint(dt)) return c10::Scalar(s.toDouble());
  if (isIntegral(dt)) return c10::Scalar(s.toLong());
  if (dt == DataType::Bool) return c10::Scalar(s.toBool());
  return s;
}
}  // namespace

std::string FusionExecutor::validate(const std::vector<RuntimeValue>& inputs, ExtentBindings& bindings) const {
  const Fusion& f = program_->fusion();
  int64_t rank = program_->rank();
  if (inputs.size() != f.inputs().size()) {
    return mf::str("expected ", f.inputs().size(), " inputs but got ", inputs.size());
  }
  std::optional<c10::Device> device;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Val* v = f.inputs()[i];
    const RuntimeValue& rv = inputs[i];
    if (!v->isTensor()) {
      if (rv.is_tensor) return mf::str("input ", i, " must be a scalar (", toString(v->dtype()), ") but got a tensor");
      // The definition typed the ops by the scalar's declared dtype: a Python number of another
      // kind would compute something else (2.7 for an integer scalar truncated to 2).
      const bool integer = rv.scalar.isIntegral(/*includeBool=*/false);
      if (isIntegral(v->dtype()) && !integer) {
        return mf::str("input ", i, " (", v->toString(), ") is an integer scalar (", toString(v->dtype()), ") but got ",
                       rv.scalar.isBoolean() ? "a bool" : "a float", " (", rv.scalar.toDouble(), ")");
      }
      if (v->dtype() == DataType::Bool && !rv.scalar.isBoolean()) {
        return mf::str("input ", i, " (", v->toString(), ") is a bool scalar but got ",
                       integer ? "an integer" : "a float", " (", rv.scalar.toDouble(), ")");
      }
      // An integer scalar may be an extent (a slice bound, a reshape size): bound under its name.
      if (isIntegral(v->dtype())) {  // an integer, checked above
        bindings[v->toString()] = rv.scalar.toLong();
      }
      continue;
    }
    if (!rv.is_tensor) return mf::str("input ", i, " (", v->toString(), ") must be a tensor but got a scalar");
    auto* tv = static_cast<const TensorView*>(v);
    const at::Tensor& t = rv.tensor;
    if (tv->hasMesh() && !tv->mesh().has(rank)) continue;  // not this rank's data
    if (t.scalar_type() != toAten(tv->dtype())) {
      return mf::str("input ", i, " (", tv->label(), ") has dtype ", t.scalar_type(), " but the definition expects ",
                 toString(tv->dtype()));
    }
    if (device && t.device() != *device) {
      return mf::str("input ", i, " (", tv->label(), ") is on ", t.device(), " but an earlier input is on ", *device,
                 "; all inputs must be on one device");
    }
    device = t.device();
    auto ids = tv->logicalNoReductions();
    if (t.dim() != static_cast<int64_t>(ids.size())) {
      return mf::str("input ", i, " (", tv->label(), ") has ", t.dim(), " dimensions but the definition has ", ids.size());
    }
    auto shards = shardsPerAxis(tv);
    for (size_t a = 0; a < ids.size(); ++a) {
      const IterDomain* id = ids[a];
      int64_t local = t.size(static_cast<int64_t>(a));
      bool device_axis = id->isDeviceDim();
      if (id->extent().isConst()) {
        int64_t global = id->extent().value;
        int64_t expected = device_axis ? 1 : (shards[a] > 1 ? global / shards[a] : global);
        if (!device_axis && global % shards[a] != 0) {
          return mf::str("input ", i, " (", tv->label(), ") axis ", a, ": global extent ", global,
                     " does not split evenly over ", shards[a], " devices (uneven sharding is not supported yet)");
        }
        if (local != expected) {
          return mf::str("input ", i, " (", tv->label(), ") axis ", a, ": expected local extent ", expected,
                     shards[a] > 1 ? mf::str(" (global ", global, " over ", shards[a], " devices)") : std::string(),
                     " but got ", local, " (input shape ", listText(t.sizes().vec()), ")");
        }
      } else {
        if (device_axis && local != 1) {
          return mf::str("input ", i, " (", tv->label(), ") axis ", a, " is a device axis (", toString(id->parallelType()),
                         "): each device holds extent 1 of it, but got ", local);
        }
        int64_t global = 0;
        if (__builtin_mul_overflow(local, shards[a], &global)) {
          return mf::str("input ", i, " (", tv->label(), ") axis ", a, ": local extent ", local, " x ", shards[a],
                         " shards overflows a 64-bit global extent");
        }
        std::string symbol = f.canonicalSymbol(id->extent().symbol);
        auto [it, inserted] = bindings.emplace(symbol, global);
        if (!inserted && it->second != global) {
          return mf::str("input ", i, " (", tv->label(), ") axis ", a, ": global extent ", global,
                         " must equal the extent ", it->second, " that an earlier input gives the same symbolic axis (",
                         id->extent().symbol, ")");
        }
      }
    }
  }
  return "";
}

std::string FusionExecutor::checkRunnable(const std::vector<RuntimeValue>& inputs, const ExtentBindings& bindings) const {
  const Fusion& f = program_->fusion();
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].is_tensor) continue;
    c10::Device dev = inputs[i].tensor.device();
    if (!dev.is_cpu() && !dev.is_cuda()) {
      return mf::str("input ", i, " (", f.inputs()[i]->isTensor() ? static_cast<const TensorView*>(f.inputs()[i])->label() : f.inputs()[i]->toString(), ") is a ", dev.type(),
                     " tensor; execute runs on CPU or CUDA tensors (meta tensors only work with cuda_kernels)");
    }
  }
  std::string stream_error = checkStreamLoopExtents(*program_, bindings);
  if (!stream_error.empty()) return stream_error;
  // Uneven shards are refused everywhere, not only at inputs: a replicated tensor sharded later (a
  // LocalSlice) or an output whose extent is bound at run time must split evenly too.
  for (const TensorView* tv : sharded_tensors_) {
    auto ids = tv->logicalNoReductions();
    auto shards = shardsPerAxis(tv);
    for (size_t a = 0; a < ids.size() && a < shards.size(); ++a) {
      if (shards[a] <= 1 || ids[a]->isDeviceDim()) continue;
      std::optional<int64_t> extent = evaluateExtent(f, ids[a]->extent(), bindings);
      if (!extent) continue;
      int64_t global = *extent;
      if (global % shards[a] == 0) {
        std::string uneven = unevenSplit(tv, static_cast<int64_t>(a), global);  // nested splits must divide too
        if (uneven.empty()) continue;
        return uneven;
      }
      std::string role = "tensor";
      for (size_t k = 0; k < f.inputs().size(); ++k) {
        if (f.inputs()[k] == tv) role = mf::str("input ", k);
      }
      for (size_t k = 0; k < f.outputs().size(); ++k) {
        if (f.outputs()[k] == tv) role = mf::str("output ", k);
      }
      return mf::str(role, " (", tv->label(), ") axis ", a, ": global extent ", global, " does not split evenly over ",
                     shards[a], " devices (mesh ", tv->mesh().toString(), "); uneven sharding is not supported yet");
    }
  }
  return "";
}

std::vector<at::Tensor> FusionExecutor::run(const std::vector<RuntimeValue>& inputs, std::vector<RuntimeValue>* release) {
  MF_CHECK(release == nullptr || release == &inputs, "run: `release` must be the inputs themselves");
  Communicator& comm = *comm_;
  requireCommunicatorFor(*program_, comm);
  // One multi-rank call at a time per process (calls from other threads wait here); the agreement
  // checks that every rank runs the call from the same thread.
  std::unique_lock<std::mutex> call_lock;
  if (multi_rank_) call_lock = std::unique_lock<std::mutex>(comm.callMutex());
  if (multi_rank_) comm.checkUsable();
  ExtentBindings bindings;
  std::string error = meshWorldError(*program_, comm.initialized() ? comm.size() : 1);
  if (error.empty()) error = validate(inputs, bindings);
  if (error.empty()) error = checkRunnable(inputs, bindings);
  if (error.empty() && multi_rank_) error = embeddingIndexError(program_->fusion(), program_->rank(), inputs, bindings);
  // Agree on every call, before anything is posted (README "Reliability"): same program, same
  // round, valid inputs and the same global extents on every rank, or an error on every rank.
  bool agree = multi_rank_ && !isDisabled(DisableOption::CollectiveValidation);
  bool strict = agree && strictAgreement();
  std::optional<CallAgreement> agreement;
  if (agree) {
    agreement.emplace(comm, program_->fusion(), fingerprint_, inputs, bindings, error, strict);
    // The round trip overlaps the compute before the first communication, unless this rank's inputs
    // are invalid, teams are still to be created, or strict mode wants everything checked first.
    // Also when a symbolic axis is unbound here (no input on this rank gives it): the agreement
    // binds it to the other ranks' extent before this rank sizes a buffer by it.
    if (!error.empty() || strict || !teams_created_ || agreement->missesExtents()) agreement->finish();
  }
  MF_USER_CHECK(error.empty(), "execute: ", error);
  if (last_bindings_ != bindings) last_bindings_ = bindings;
  posts_at_start_ = comm.posts();
  if (!strict) {
    CallAgreement* pending = agreement && !agreement->finished() ? &*agreement : nullptr;
    try {
      return runAgreed(inputs, bindings, pending, release);
    } catch (...) {
      // The round must complete on this rank too; when the ranks disagree, that is the error to raise.
      if (pending && !pending->finished()) pending->finish();
      // Failed before posting anything: when every rank failed so, the groups hold nothing unmatched
      // and stay usable; otherwise this rank's groups are marked unusable.
      if (agreement && agreement->agreed() && settles_failures_ && !comm.broken() && comm.posts() == posts_at_start_) {
        settleFailure(comm, fingerprint_);
      }
      throw;
    }
  }
  std::vector<at::Tensor> outputs;
  try {
    outputs = runAgreed(inputs, bindings, nullptr, release);
  } catch (...) {
    try {
      if (!comm.broken()) agreeOnCompletion(comm, fingerprint_, false);
    } catch (...) {
    }
    throw;
  }
  agreeOnCompletion(comm, fingerprint_, true);
  return outputs;
}

namespace {
// Fault injection for the fault suite: MESHFUSER_INJECT_FAULT=<where>:<rank> makes that rank raise
// at `where` ("after_agreement": before the first communication; "at_end": after the last one).
// "before_post" raises a plain std::runtime_error where the first communication allocates its
// buffers, as an allocation failure would. <rank> may be "all".
void injectFault(const char* where, int64_t rank) {
  std::string v = envString("MESHFUSER_INJECT_FAULT");
  if (v.empty() || (mf::str(where, ":", rank) != v && mf::str(where, ":all") != v)) return;
  if (std::string(where) == "before_post") {
    throw std::runtime_error(mf::str("fault injected on rank ", rank, " before_post (MESHFUSER_INJECT_FAULT)"));
  }
  MF_THROW_USER("execute: fault injected on rank ", rank, " ", where, " (MESHFUSER_INJECT_FAULT)");
}

}  // namespace

// The groups may hold unmatched operations from now on.
UserError collectiveFailure(Communicator& comm, const Communication& c, int64_t rank, const std::exception& e,
                            int64_t posts_before) {
  std::string cause = e.what();
  if (auto* ce = dynamic_cast<const c10::Error*>(&e)) cause = ce->what_without_backtrace();
  std::string reason = mf::str(c.toString(), " failed on rank ", rank, " (", cause, ")");
  if (posts_before >= 0 && comm.posts() == posts_before) {
    // Nothing of this call left this rank (an allocation failed, say): run() settles with the others
    // whether the groups stay usable.
    return UserError(mf::str("execute: ", reason, " before this rank posted any data of the call"));
  }
  comm.markBroken(reason);
  return UserError(mf::str("execute: ", reason, ": another rank of its team failed, died, or did not reach this ",
                           "communication within the timeout (MESHFUSER_PG_TIMEOUT_S)"));
}

std::vector<at::Tensor> FusionExecutor::runAgreed(const std::vector<RuntimeValue>& inputs, ExtentBindings bindings,
                                                  CallAgreement* pending, std::vector<RuntimeValue>* release) {
  const Fusion& f = program_->fusion();
  Communicator& comm = *comm_;
  if (!teams_created_ && multi_rank_) {
    comm.createTeams(program_->teams());
    teams_created_ = true;
  }

  injectFault("after_agreement", program_->rank());  // run() still completes this rank's round
  std::unordered_map<const Val*, at::Tensor> values;
  std::unordered_map<const Val*, c10::Scalar> scalars;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].is_tensor) values[f.inputs()[i]] = inputs[i].tensor;
    else scalars[f.inputs()[i]] = declaredScalar(f.inputs()[i]->dtype(), inputs[i].scalar);
  }
  // Per communication, the works to wait for (point-to-point moves post several).
  std::vector<std::vector<c10::intrusive_ptr<c10d::Work>>> works(program_->communications().size());
  bool use_kernels = false;
  eval_device_ = c10::Device(c10::kCPU);
  for (const RuntimeValue& rv : inputs) {
    if (rv.is_tensor) eval_device_ = rv.tensor.device();
    if (rv.is_tensor && rv.tensor.is_cuda()) use_kernels = !isDisabled(DisableOption::Codegen) && cudaKernelsAvailable();
  }
  // From here `values` holds the inputs, and its entries go after their last use (Deallocate).
  if (release != nullptr) {
    for (RuntimeValue& rv : *release) rv.tensor = at::Tensor();
  }
  ProfileRecorder* profile = ProfileRecorder::active();
  // A communication's times run from its post to the end of its wait.
  std::vector<ProfiledStep> comm_steps(profile ? program_->communications().size() : 0);
  for (const HostInstruction& inst : program_->instructions()) {
    switch (inst.kind) {
      case HostInstruction::Kind::RunSegment: {
        TraceRange range([&] {
          return segmentRangeName(inst.index, program_->segments()[inst.index],
                                  use_kernels ? schedulerOf(inst.index) : "expr_eval", values);
        });
        const size_t first = profile ? profile->kernels().size() : 0;
        ProfiledStep step = profile ? ProfiledStep({"segment " + std::to_string(inst.index), "expr_eval"}, eval_device_)
                                    : ProfiledStep();
        runSegment(inst.index, values, scalars, bindings, use_kernels);
        step.stop();
        if (profile) {
          const auto* names = inst.index < static_cast<int64_t>(kernels_.size()) && use_kernels
                                  ? &kernels_[inst.index].lastSchedulers()
                                  : nullptr;
          if (names != nullptr && !names->empty()) {
            // One entry per generated kernel or ATen piece; the segment's times are on the first.
            for (size_t k = 0; k < names->size(); ++k) {
              std::string name = "segment " + std::to_string(inst.index) + (names->size() > 1 ? "." + std::to_string(k) : "");
              if (k == 0) {
                profile->kernels()[first].name = name;
                profile->kernels()[first].scheduler = (*names)[0];
              } else {
                profile->kernels().push_back({name, (*names)[k]});
              }
            }
          }
        }
        break;
      }
      case HostInstruction::Kind::PostCommunication: {
        if (pending) pending->finish();  // nothing is posted before the ranks agreed
        const Communication& c = program_->communications()[inst.index];
        if (profile && c.type != CommunicationType::NoOp) {
          TransferBytes b = mf::communicationBytes(c, program_->rank(), bindings);
          comm_steps[inst.index] = ProfiledStep({c.toString(), "communication", b.sent, b.received}, eval_device_);
        }
        if (isDumpEnabled(DumpOption::Communication)) logText("communication", "post " + c.toString());
        TraceRange range([&] { return communicationRangeName(c, mf::communicationBytes(c, program_->rank(), bindings)); });
        try {
          injectFault("before_post", program_->rank());
          if (isExchange(c.type)) {
            runExchange(inst.index, c, values, bindings, works[inst.index]);
            if (profile) comm_steps[inst.index].setBytes(exchange_bytes_[inst.index].sent, exchange_bytes_[inst.index].received);
          } else {
            runCommunication(c, values, bindings, works[inst.index]);
          }
        } catch (const UserError&) {
          throw;
        } catch (const InternalError&) {
          throw;
        } catch (const std::exception& e) {
          throw collectiveFailure(*comm_, c, program_->rank(), e, posts_at_start_);
        }
        break;
      }
      case HostInstruction::Kind::Wait: {
        const Communication& c = program_->communications()[inst.index];
        TraceRange range([&] { return mf::str("meshfuser::wait ", toString(c.type), " ", c.output->toString()); });
        try {
          for (auto& w : works[inst.index]) w->wait();
        } catch (const std::exception& e) {
          throw collectiveFailure(*comm_, c, program_->rank(), e);
        }
        works[inst.index].clear();
        if (profile) comm_steps[inst.index].stop();
        // Some communications finish with a local reshuffle once the data arrived.
        auto pending = pending_finish_.find(c.output);
        if (pending != pending_finish_.end()) {
          at::Tensor result = pending->second();
          if (result.defined()) values[c.output] = result;  // undefined: this rank only sent
          pending_finish_.erase(pending);
        }
        break;
      }
      case HostInstruction::Kind::Deallocate: values.erase(inst.tv); break;
      case HostInstruction::Kind::StreamLoop: {
        if (pending) pending->finish();  // nothing is posted before the ranks agreed
        const Communication& c = program_->communications()[program_->streamLoops()[inst.index].communication];
        TraceRange range([&] { return mf::str("meshfuser::stream_loop ", inst.index, " ", toString(c.type), " ",
                                              c.output->toString(), " <- ", c.input->toString(), " team=", listText(c.team)); });
        try {
          runStreamLoop(inst.index, values, scalars, bindings);
        } catch (const UserError&) {
          throw;
        } catch (const InternalError&) {
          throw;
        } catch (const std::exception& e) {
          throw collectiveFailure(*comm_, c, program_->rank(), e, posts_at_start_);
        }
        break;
      }
    }
  }
  if (pending) pending->finish();
  if (last_bindings_ != bindings) last_bindings_ = bindings;  // with the data-dependent extents
  injectFault("at_end", program_->rank());
  std::vector<at::Tensor> outputs;
  for (const Val* out : f.outputs()) {
    auto* tv = static_cast<const TensorView*>(out);
    auto it = values.find(out);
    if (it == values.end()) {
      // This rank is outside the output's mesh: an empty tensor stands in.
      MF_CHECK(tv->hasMesh() && !tv->mesh().has(program_->rank()), "output ", tv->toString(), " was not computed");
      outputs.push_back(at::empty({0}, at::TensorOptions().dtype(toAten(tv->dtype())).device(eval_device_)));
      continue;
    }
    outputs.push_back(withStrideOrder(it->second, tv->strideOrder()));
  }
  return outputs;
}

RuntimeValue scalarRuntimeValue(const Val* v, const std::unordered_map<const Val*, c10::Scalar>& scalars,
                                const ExtentBindings& bindings) {
  auto* s = static_cast<const Scalar*>(v);
  RuntimeValue rv;
  rv.is_tensor = false;
  if (s->computation()) {
    // A scalar op's result (fd.ops.reciprocal(s)): its operands' values, then the op on scalars.
    std::vector<double> operands;
    for (const Val* v : s->computation()->operands) {
      operands.push_back(scalarRuntimeValue(v, scalars, bindings).scalar.toDouble());
    }
    double x = evaluateScalarOp(s->computation()->op, operands, s->dtype());
    rv.scalar = isFloatingPoint(s->dtype()) ? c10::Scalar(x)
                : s->dtype() == DataType::Bool ? c10::Scalar(x != 0)
                                               : c10::Scalar(static_cast<int64_t>(x));
  } else if (s->isExtent()) {
    std::optional<int64_t> extent = evaluateExtent(*s->fusion(), Extent{-1, s->extent()}, bindings);
    MF_USER_CHECK(extent.has_value(), s->toString(), ": the extent ", s->extent(), " is not known on this rank");
    rv.scalar = c10::Scalar(*extent);
  } else if (s->value()) {
    double x = *s->value();
    rv.scalar = isFloatingPoint(s->dtype()) ? c10::Scalar(x)
                : s->dtype() == DataType::Bool ? c10::Scalar(x != 0)
                                               : c10::Scalar(static_cast<int64_t>(x));
  } else {
    rv.scalar = scalars.at(v);
  }
  return rv;
}

namespace {

// The ATen evaluator over `exprs` in order, reading and writing `values`.
void evaluateExprs(const std::vector<Expr*>& exprs, std::unordered_map<const Val*, at::Tensor>& values,
                   const std::unordered_map<const Val*, c10::Scalar>& scalars, const ExtentBindings& bindings,
                   const EvalContext& context) {
  for (const Expr* e : exprs) {
    std::vector<RuntimeValue> ins;
    ins.reserve(e->inputs().size());
    for (const Val* v : e->inputs()) {
      if (!v->isTensor()) {
        ins.push_back(scalarRuntimeValue(v, scalars, bindings));
        continue;
      }
      auto it = values.find(v);
      MF_CHECK(it != values.end(), "no value for ", v->toString(), " when running ", e->toString());
      RuntimeValue rv;
      rv.tensor = it->second;
      ins.push_back(std::move(rv));
    }
    std::vector<at::Tensor> results = evaluateExpr(e, ins, bindings, context);
    for (size_t i = 0; i < results.size(); ++i) values[e->output(i)] = std::move(results[i]);
  }
}

}  // namespace

void FusionExecutor::runSegment(int64_t index, std::unordered_map<const Val*, at::Tensor>& values,
                                const std::unordered_map<const Val*, c10::Scalar>& scalars,
                                const ExtentBindings& bindings, bool allow_kernels) {
  auto eval = [&](const std::vector<Expr*>& exprs, std::unordered_map<const Val*, at::Tensor>& vals) {
    evaluateExprs(exprs, vals, scalars, bindings, EvalContext{program_->rank(), eval_device_});
  };
  const std::vector<Expr*>& exprs = program_->segments()[index].exprs;
  if (program_->segments()[index].gemm_accumulate) {
    // The option is read again here: a program lowered before it was set keeps its segments.
    const bool in_place = !isDisabled(DisableOption::GemmAccumulate) && accumulateIntoPartial(exprs, values);
    accumulated_in_place_[index] = in_place;
    if (!in_place) eval(exprs, values);
    return;
  }
  if (!allow_kernels) {
    eval(exprs, values);
    return;
  }
  if (kernels_.size() != program_->segments().size()) kernels_.resize(program_->segments().size());
  kernels_[index].run(exprs, program_->fusion(), values, eval,
                      [&](const Val* v) { return scalarRuntimeValue(v, scalars, bindings).scalar; },
                      /*launch=*/true, "segment " + std::to_string(index), currentDeviceLimits(),
                      program_->segments()[index].last_reads);
}

std::vector<std::string> FusionExecutor::generatedKernels(const std::vector<RuntimeValue>& inputs,
                                                          std::vector<at::Tensor>* meta_outputs,
                                                          const DeviceLimits* device) {
  // Walks the program on meta tensors: shapes and strides as a real run would see them.
  const Fusion& f = program_->fusion();
  ExtentBindings bindings;
  std::string error = validate(inputs, bindings);
  MF_USER_CHECK(error.empty(), "cuda_kernels: ", error);
  std::unordered_map<const Val*, at::Tensor> values;
  std::unordered_map<const Val*, c10::Scalar> scalars;
  eval_device_ = c10::Device(at::kMeta);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].is_tensor) values[f.inputs()[i]] = inputs[i].tensor.to(at::kMeta);
    else scalars[f.inputs()[i]] = declaredScalar(f.inputs()[i]->dtype(), inputs[i].scalar);
  }
  std::vector<std::string> sources;
  if (kernels_.size() != program_->segments().size()) kernels_.resize(program_->segments().size());
  for (const HostInstruction& inst : program_->instructions()) {
    if (inst.kind == HostInstruction::Kind::RunSegment) {
      // Plans the pieces on the first call of the class, later finds each piece's kernel for these
      // extents; every piece is evaluated with ATen on the meta values.
      if (program_->segments()[inst.index].gemm_accumulate) {  // cuBLAS: no generated kernel
        evaluateExprs(program_->segments()[inst.index].exprs, values, scalars, bindings,
                      EvalContext{program_->rank(), eval_device_});
        continue;
      }
      SegmentKernels& sk = kernels_[inst.index];
      sk.run(program_->segments()[inst.index].exprs, f, values,
             [&](const std::vector<Expr*>& exprs, std::unordered_map<const Val*, at::Tensor>& vals) {
               evaluateExprs(exprs, vals, scalars, bindings, EvalContext{program_->rank(), eval_device_});
             },
             [](const Val*) { return c10::Scalar(0.0); }, /*launch=*/false, "segment " + std::to_string(inst.index),
             device ? *device : currentDeviceLimits());
      for (const GeneratedKernel* k : sk.lastKernels()) {
        if (k != nullptr) sources.push_back(k->source);
      }
    } else if (inst.kind == HostInstruction::Kind::PostCommunication) {
      const Communication& c = program_->communications()[inst.index];
      if (c.type == CommunicationType::Dispatch) {
        // The rows a dispatch receives are known only when it runs: a meta walk takes as many as
        // it sends, a stand-in that keeps the shapes after the combine exact.
        const std::string& symbol = c.output->logicalNoReductions()[0]->extent().symbol;
        bindings[f.canonicalSymbol(symbol)] = values.at(c.input).size(0);
      }
      auto shape = localShape(c.output, globalShape(c.output, bindings));
      values[c.output] = at::empty(shape, at::TensorOptions().dtype(toAten(c.output->dtype())).device(at::kMeta));
    } else if (inst.kind == HostInstruction::Kind::StreamLoop) {
      const TensorView* result = program_->streamLoops()[inst.index].result;
      auto shape = localShape(result, globalShape(result, bindings));
      values[result] = at::empty(shape, at::TensorOptions().dtype(toAten(result->dtype())).device(at::kMeta));
    }
  }
  if (meta_outputs != nullptr) {
    for (const Val* out : f.outputs()) {
      auto* tv = static_cast<const TensorView*>(out);
      auto it = values.find(out);
      meta_outputs->push_back(it == values.end()
                                  ? at::empty({0}, at::TensorOptions().dtype(toAten(tv->dtype())).device(at::kMeta))
                                  : withStrideOrder(it->second, tv->strideOrder()));
    }
  }
  return sources;
}

}  // namespace mf
