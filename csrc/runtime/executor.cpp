#include "runtime/executor.h"

#include <ATen/record_function.h>

#include <iostream>

#include "multidevice/communicator.h"
#include "multidevice/sharding.h"
#include "passes/pass.h"
#include "runtime/profiler.h"
#include "support/error.h"
#include "support/options.h"

namespace mf {

namespace {
std::string shapeText(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

int64_t currentRank() {
  Communicator& comm = Communicator::instance();
  return comm.initialized() ? comm.rank() : 0;
}
}  // namespace

FusionExecutor::FusionExecutor(const Fusion& fusion, int64_t rank) {
  auto copy = fusion.clone();
  runPipeline(*copy);
  program_ = lowerToHostProgram(std::move(copy), rank);
  multi_rank_ = Communicator::instance().initialized() && Communicator::instance().size() > 1;
  if (isDumpEnabled(DumpOption::HostProgram)) std::cout << program_->toString();
}

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
      continue;
    }
    if (!rv.is_tensor) return mf::str("input ", i, " (", v->toString(), ") must be a tensor but got a scalar");
    auto* tv = static_cast<const TensorView*>(v);
    const at::Tensor& t = rv.tensor;
    if (tv->hasMesh() && !tv->mesh().has(rank)) continue;  // not this rank's data
    if (t.scalar_type() != toAten(tv->dtype())) {
      return mf::str("input ", i, " (", tv->toString(), ") has dtype ", t.scalar_type(), " but the definition expects ",
                 toString(tv->dtype()));
    }
    if (device && t.device() != *device) {
      return mf::str("input ", i, " (", tv->toString(), ") is on ", t.device(), " but an earlier input is on ", *device,
                 "; all inputs must be on one device");
    }
    device = t.device();
    auto ids = tv->logicalNoReductions();
    if (t.dim() != static_cast<int64_t>(ids.size())) {
      return mf::str("input ", i, " (", tv->toString(), ") has ", t.dim(), " dimensions but the definition has ", ids.size());
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
          return mf::str("input ", i, " (", tv->toString(), ") axis ", a, ": global extent ", global,
                     " does not split evenly over ", shards[a], " devices (uneven sharding is not supported yet)");
        }
        if (local != expected) {
          return mf::str("input ", i, " (", tv->toString(), ") axis ", a, ": expected local extent ", expected,
                     shards[a] > 1 ? mf::str(" (global ", global, " over ", shards[a], " devices)") : std::string(),
                     " but got ", local, " (input shape ", shapeText(t.sizes().vec()), ")");
        }
      } else {
        int64_t global = local * shards[a];
        std::string symbol = f.canonicalSymbol(id->extent().symbol);
        auto [it, inserted] = bindings.emplace(symbol, global);
        if (!inserted && it->second != global) {
          return mf::str("input ", i, " (", tv->toString(), ") axis ", a, ": global extent ", global,
                         " must equal the extent ", it->second, " that an earlier input gives the same symbolic axis (",
                         id->extent().symbol, ")");
        }
      }
    }
  }
  return "";
}

std::vector<at::Tensor> FusionExecutor::run(const std::vector<RuntimeValue>& inputs) {
  const Fusion& f = program_->fusion();
  Communicator& comm = Communicator::instance();
  ExtentBindings bindings;
  std::string error = validate(inputs, bindings);
  bool has_comms = !program_->teams().empty();
  if (multi_rank_ && has_comms && !isDisabled(DisableOption::CollectiveValidation)) {
    // Agree before posting anything, so a bad input on one rank cannot leave the others waiting.
    auto failed = comm.failedRanks(error.empty());
    if (error.empty() && !failed.empty()) {
      std::string list;
      for (int64_t r : failed) list += (list.empty() ? "" : ", ") + std::to_string(r);
      MF_THROW_USER("input validation failed on rank(s) ", list, "; see the error raised there (rank ", comm.rank(),
                    " had valid inputs)");
    }
  }
  MF_USER_CHECK(error.empty(), "execute: ", error);
  if (!teams_created_ && multi_rank_) {
    comm.createTeams(program_->teams());
    teams_created_ = true;
  }

  std::unordered_map<const Val*, at::Tensor> values;
  std::unordered_map<const Val*, c10::Scalar> scalars;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].is_tensor) values[f.inputs()[i]] = inputs[i].tensor;
    else scalars[f.inputs()[i]] = inputs[i].scalar;
  }
  std::vector<c10::intrusive_ptr<c10d::Work>> works(program_->communications().size());
  ProfileRecorder* profile = ProfileRecorder::active();
  for (const HostInstruction& inst : program_->instructions()) {
    switch (inst.kind) {
      case HostInstruction::Kind::RunSegment: {
        const Segment& seg = program_->segments()[inst.index];
        if (profile) profile->kernels().push_back({"segment " + std::to_string(inst.index), seg.scheduler});
        RECORD_FUNCTION("meshfuser::segment", std::vector<c10::IValue>());
        for (const Expr* e : seg.exprs) {
          std::vector<RuntimeValue> ins;
          ins.reserve(e->inputs().size());
          for (const Val* v : e->inputs()) {
            RuntimeValue rv;
            if (v->isTensor()) {
              auto it = values.find(v);
              MF_CHECK(it != values.end(), "no value for ", v->toString(), " when running ", e->toString());
              rv.tensor = it->second;
            } else {
              auto* s = static_cast<const Scalar*>(v);
              rv.is_tensor = false;
              if (s->value()) {
                double x = *s->value();
                rv.scalar = isFloatingPoint(s->dtype()) ? c10::Scalar(x)
                            : s->dtype() == DataType::Bool ? c10::Scalar(x != 0)
                                                           : c10::Scalar(static_cast<int64_t>(x));
              } else {
                rv.scalar = scalars.at(v);
              }
            }
            ins.push_back(std::move(rv));
          }
          values[e->out()] = evaluateExpr(e, ins, bindings);
        }
        break;
      }
      case HostInstruction::Kind::PostCommunication: {
        const Communication& c = program_->communications()[inst.index];
        if (profile) profile->kernels().push_back({c.toString(), "communication"});
        RECORD_FUNCTION("meshfuser::communication", std::vector<c10::IValue>());
        runCommunication(c, values, bindings, works);
        break;
      }
      case HostInstruction::Kind::Wait: {
        auto& w = works[inst.index];
        if (w) w->wait();
        w.reset();
        const Communication& c = program_->communications()[inst.index];
        // Some communications finish with a local reshuffle once the data arrived.
        auto pending = pending_finish_.find(c.output);
        if (pending != pending_finish_.end()) {
          values[c.output] = pending->second();
          pending_finish_.erase(pending);
        }
        break;
      }
      case HostInstruction::Kind::Deallocate: values.erase(inst.tv); break;
    }
  }
  std::vector<at::Tensor> outputs;
  for (const Val* out : f.outputs()) {
    auto* tv = static_cast<const TensorView*>(out);
    auto it = values.find(out);
    if (it == values.end()) {
      // This rank is outside the output's mesh: an empty tensor stands in.
      MF_CHECK(tv->hasMesh() && !tv->mesh().has(program_->rank()), "output ", tv->toString(), " was not computed");
      at::Device dev = at::kCPU;
      for (const RuntimeValue& rv : inputs) {
        if (rv.is_tensor) dev = rv.tensor.device();
      }
      outputs.push_back(at::empty({0}, at::TensorOptions().dtype(toAten(tv->dtype())).device(dev)));
      continue;
    }
    outputs.push_back(it->second.is_contiguous() ? it->second : it->second.contiguous());
  }
  return outputs;
}

std::vector<int64_t> inputSignature(const std::vector<RuntimeValue>& inputs) {
  std::vector<int64_t> sig;
  sig.reserve(inputs.size() * 6);
  for (const RuntimeValue& rv : inputs) {
    if (!rv.is_tensor) {
      sig.push_back(-1);
      sig.push_back(static_cast<int64_t>(rv.scalar.type()));
      continue;
    }
    const at::Tensor& t = rv.tensor;
    sig.push_back(static_cast<int64_t>(t.scalar_type()));
    sig.push_back(static_cast<int64_t>(t.device().type()) * 1000 + t.device().index());
    sig.push_back(t.dim());
    for (int64_t s : t.sizes()) sig.push_back(s);
  }
  return sig;
}

std::vector<at::Tensor> FusionExecutorCache::run(const std::vector<RuntimeValue>& inputs) {
  auto sig = inputSignature(inputs);
  auto it = executors_.find(sig);
  if (it == executors_.end()) {
    it = executors_.emplace(sig, std::make_unique<FusionExecutor>(*fusion_, currentRank())).first;
  }
  last_ = it->second.get();
  return last_->run(inputs);
}

}  // namespace mf
