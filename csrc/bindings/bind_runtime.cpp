// Runtime bindings: executing fusions (with the process-wide executor cache), host programs,
// output shardings and the profiler.
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <functional>
#include <list>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "bindings/bind.h"
#include "ir/printer.h"
#include "multidevice/sharding.h"
#include "runtime/agreement.h"
#include "runtime/executor.h"
#include "runtime/profiler.h"
#include "support/error.h"
#include "support/log.h"
#include "support/options.h"

namespace py = pybind11;

namespace mf {
namespace {

// Executor caches shared by every definition that prints the same (ops + schedule, constants at
// full precision). Keyed by the whole text, not a hash of it: two definitions must never share a
// program by a hash collision. Bounded: past kUnusedDefinitions caches that no FusionDefinition
// holds any more, the least recently used of those go (a definition defined, run and dropped in a
// loop does not grow the process; one still alive keeps its cache through its handle).
constexpr size_t kUnusedDefinitions = 256;

class DefinitionCaches {
 public:
  std::shared_ptr<FusionExecutorCache> find(const std::string& text, const std::function<std::shared_ptr<FusionExecutorCache>()>& make) {
    auto it = entries_.find(text);
    if (it != entries_.end()) {
      order_.splice(order_.begin(), order_, it->second.second);
      return it->second.first;
    }
    order_.push_front(text);
    auto cache = make();
    entries_.emplace(text, std::make_pair(cache, order_.begin()));
    trim();
    return cache;
  }
  void clear() {
    entries_.clear();
    order_.clear();
  }
  size_t size() const { return entries_.size(); }

 private:
  // Drops the least recently used caches no handle holds, past the bound.
  void trim() {
    size_t unused = 0;
    for (const auto& [text, entry] : entries_) unused += entry.first.use_count() == 1 ? 1 : 0;
    for (auto it = order_.end(); unused > kUnusedDefinitions && it != order_.begin();) {
      --it;
      auto entry = entries_.find(*it);
      if (entry->second.first.use_count() != 1) continue;
      entries_.erase(entry);
      it = order_.erase(it);
      --unused;
    }
  }
  std::unordered_map<std::string, std::pair<std::shared_ptr<FusionExecutorCache>, std::list<std::string>::iterator>>
      entries_;
  std::list<std::string> order_;  // most recently used first
};

DefinitionCaches& globalCaches() {
  static DefinitionCaches caches;
  return caches;
}

// What a FusionDefinition holds on the C++ side.
class FusionHandle {
 public:
  explicit FusionHandle(std::shared_ptr<Fusion> fusion) : fusion_(std::move(fusion)) {}

  // release_inputs: the caller hands its list over: it is emptied, and each input is dropped after
  // its last use in the program (FusionExecutor::run).
  std::vector<at::Tensor> execute(const py::list& args, bool release_inputs) {
    ++entered_;
    setThreadTag();
    FusionExecutorCache& cache = this->cache();
    std::vector<RuntimeValue> inputs;
    try {
      inputs = toInputs(args);
    } catch (const std::exception& e) {
      // This rank still takes part in the call's agreement, so the others are told, not left waiting.
      refuse(e.what());
      throw;
    }
    if (release_inputs) {
      // The program's own handle on each storage: once the caller's tensor goes (its Python object,
      // and a view's base), the storage has no other reference and the program may free or reuse
      // it; a tensor the caller still holds keeps it shared, which the kernels check.
      for (RuntimeValue& rv : inputs) {
        if (!rv.is_tensor || !rv.tensor.defined() || !rv.tensor.has_storage()) continue;
        at::Tensor own = at::empty({0}, rv.tensor.options());
        own.set_(rv.tensor.storage(), rv.tensor.storage_offset(), rv.tensor.sizes(), rv.tensor.strides());
        rv.tensor = std::move(own);
      }
      args.attr("clear")();
    }
    std::shared_ptr<FusionExecutor> used;
    std::vector<at::Tensor> outputs;
    {
      py::gil_scoped_release release;
      outputs = cache.run(inputs, &used, release_inputs ? &inputs : nullptr);
    }
    last_ = used;  // this definition's own last program (identical definitions share the cache); under the GIL
    return outputs;
  }

  // A call that failed before reaching execute() (in the Python layer): this rank takes part in the
  // call's agreement with `error`, so that every other rank raises too.
  void refuse(const std::string& error) {
    setThreadTag();
    FusionExecutorCache& cache = this->cache();
    py::gil_scoped_release release;
    try {
      cache.refuseCall(error.empty() ? std::string("the call failed on this rank before it started") : error);
    } catch (const std::exception&) {
      // this rank raises its own error
    }
  }
  // execute() calls so far (the Python layer tells whether a failure happened before one).
  int64_t entered() const { return entered_; }

  // callThreadTag for this OS thread, from the Python thread's name (once per thread).
  static void setThreadTag() {
    thread_local bool set = false;
    if (set) return;
    set = true;
    py::module_ threading = py::module_::import("threading");
    py::object current = threading.attr("current_thread")();
    if (current.is(threading.attr("main_thread")())) return;  // tag 0
    std::string name = py::str(current.attr("name"));
    if (py::isinstance(current, threading.attr("_DummyThread"))) name = "a thread Python did not start";
    uint64_t h = 1469598103934665603ull;  // FNV-1a: the same on every rank
    for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
    int64_t tag = static_cast<int64_t>(h >> 1) | 1;  // never 0 (the main thread)
    registerThreadName(tag, name);
    callThreadTag() = tag;
  }

  std::vector<std::string> cudaKernels(const py::list& args, const std::optional<std::string>& arch,
                                       const py::object& device_limits) {
    std::vector<RuntimeValue> inputs = toInputs(args);
    const std::optional<DeviceLimits> device = deviceLimitsFromPython(arch, device_limits);
    std::shared_ptr<FusionExecutor> used;
    std::vector<std::string> sources;
    FusionExecutorCache& cache = this->cache();  // under the GIL: the definitions' map is shared
    {
      py::gil_scoped_release release;
      sources = cache.generatedKernels(inputs, &used, nullptr, device ? &*device : nullptr);
    }
    last_ = used;  // host_program() then shows the segmentation these inputs get
    return sources;
  }

  // The outputs' local shapes, dtypes and strides as meta tensors, without running anything.
  std::vector<at::Tensor> metaOutputs(const py::list& args) {
    std::vector<RuntimeValue> inputs = toInputs(args);
    std::vector<at::Tensor> outputs;
    FusionExecutorCache& cache = this->cache();
    {
      py::gil_scoped_release release;
      cache.generatedKernels(inputs, nullptr, &outputs);
    }
    return outputs;
  }

  static std::vector<RuntimeValue> toInputs(const py::list& args) {
    std::vector<RuntimeValue> inputs;
    inputs.reserve(args.size());
    for (const py::handle& a : args) {
      RuntimeValue rv;
      if (THPVariable_Check(a.ptr())) {
        rv.tensor = THPVariable_Unpack(a.ptr());
      } else if (py::isinstance<py::bool_>(a)) {
        rv.is_tensor = false;
        rv.scalar = a.cast<bool>();
      } else if (py::isinstance<py::int_>(a)) {
        rv.is_tensor = false;
        int overflow = 0;
        long long value = PyLong_AsLongLongAndOverflow(a.ptr(), &overflow);
        MF_USER_ARG_CHECK(overflow == 0, "execute: input ", inputs.size(), " is the integer ",
                          std::string(py::str(a)), ", outside the int64 range of integer scalars");
        rv.scalar = static_cast<int64_t>(value);
      } else if (py::isinstance<py::float_>(a)) {
        rv.is_tensor = false;
        rv.scalar = a.cast<double>();
      } else {
        MF_USER_ARG_CHECK(false, "execute: input ", inputs.size(), " is a ", std::string(py::str(py::type::handle_of(a))),
                          "; expected a torch.Tensor or a Python number");
      }
      inputs.push_back(std::move(rv));
    }
    return inputs;
  }

  FusionExecutorCache& cache() {
    if (cache_ == nullptr || version_ != fusion_->version()) {
      MF_USER_CHECK(fusion_->outputs().size() > 0, "execute: the fusion has no outputs; call add_output");
      cache_ = globalCaches().find(printFusion(*fusion_), [&] {
        return std::make_shared<FusionExecutorCache>(std::shared_ptr<const Fusion>(fusion_->clone()));
      });
      version_ = fusion_->version();
      last_ = nullptr;
    }
    return *cache_;
  }

  const FusionExecutor& last() const {
    MF_USER_CHECK(cache_ && last_ != nullptr, "no program yet: call execute() first");
    return *last_;
  }

  // Per output: (mesh devices, mesh shape, {parallel type: runtime axis}).
  py::list outputShardings() const {
    py::list result;
    for (const Val* v : last().compiledFusion().outputs()) {
      auto* tv = static_cast<const TensorView*>(v);
      MF_USER_CHECK(allSplitsBlocked(tv), "output ", tv->toString(), " is split interleaved across devices (a device ",
                    "axis that is not the outermost part of its axis), which a Sharding of one block per device ",
                    "cannot describe; shard the output with an outer split");
      py::dict axes;
      for (ParallelType pt : kDeviceParallelTypes) axes[py::cast(pt)] = shardedAxis(tv, pt);
      result.append(py::make_tuple(tv->mesh(), axes));
    }
    return result;
  }

 private:
  std::shared_ptr<Fusion> fusion_;
  std::shared_ptr<FusionExecutorCache> cache_;
  std::shared_ptr<FusionExecutor> last_;  // kept alive past its eviction from cache_
  int64_t version_ = -1;
  int64_t entered_ = 0;
};

}  // namespace

void bindRuntime(py::module& m) {
  py::class_<FusionHandle>(m, "FusionHandle")
      .def(py::init<std::shared_ptr<Fusion>>())
      .def("execute", &FusionHandle::execute, py::arg("inputs"), py::arg("release_inputs") = false)
      .def("refuse", &FusionHandle::refuse, py::arg("error"))
      .def_property_readonly("entered", &FusionHandle::entered)
      .def("cuda_kernels", &FusionHandle::cudaKernels, py::arg("inputs"), py::arg("arch") = py::none(),
           py::arg("device_limits") = py::none())
      .def("meta_outputs", &FusionHandle::metaOutputs, py::arg("inputs"))
      .def(
          "host_program",
          [](const FusionHandle& h, bool deallocations) { return h.last().hostProgramText(deallocations); },
          py::arg("deallocations") = false)
      .def("compiled_fusion", [](const FusionHandle& h) { return printFusion(h.last().compiledFusion()); })
      .def("output_shardings", &FusionHandle::outputShardings)
      .def("num_executors", [](FusionHandle& h) { return h.cache().numExecutors(); })
      .def("executors_built", [](FusionHandle& h) { return h.cache().executorsBuilt(); })
      .def("scheduler_names", [](const FusionHandle& h) { return h.last().segmentSchedulers(); });
  m.def("clear_caches", [] { globalCaches().clear(); });
  m.def("compile_counters", [] {
    const CompileCounters& c = compileCounters();
    py::dict d;
    d["executors"] = c.executors;
    d["kernels"] = c.kernels;
    d["sources"] = c.sources;
    return d;
  });
  m.def(
      "set_cache_limits",
      [](std::optional<int64_t> executors, std::optional<int64_t> kernel_modules) {
        MF_USER_ARG_CHECK(!executors || *executors >= 1, "set_cache_limits: executors must be >= 1, got ", *executors);
        MF_USER_ARG_CHECK(!kernel_modules || *kernel_modules >= 1, "set_cache_limits: kernel_modules must be >= 1, got ",
                          *kernel_modules);
        if (executors) cacheLimits().executors_per_definition = *executors;
        if (kernel_modules) cacheLimits().kernel_modules = *kernel_modules;
        return py::make_tuple(cacheLimits().executors_per_definition, cacheLimits().kernel_modules);
      },
      py::arg("executors") = py::none(), py::arg("kernel_modules") = py::none());
  m.def("num_cached_definitions", [] { return globalCaches().size(); });
  m.def("reload_options", &reloadOptions);

  py::class_<ProfileRecorder>(m, "ProfileRecorder")
      .def(py::init<>())
      .def("kernels", [](ProfileRecorder& r) {
        py::list l;
        r.finish();
        for (auto& k : r.kernels()) {
          l.append(py::make_tuple(k.name, k.scheduler, k.bytes_sent, k.bytes_received, k.device_ms, k.host_ms));
        }
        return l;
      });
  m.def("start_profiling", [](ProfileRecorder* r) { ProfileRecorder::active() = r; }, py::arg("recorder"),
        py::keep_alive<0, 1>());
  m.def("stop_profiling", [] { ProfileRecorder::active() = nullptr; });

  // support/log.h: lines reach Python's logging through this sink (meshfuser/_logging.py).
  m.def(
      "_set_log_sink",
      [](py::object fn) {
        if (fn.is_none()) {
          setLogSink(nullptr);
          return;
        }
        // Copies of the sink share one reference, dropped under the GIL.
        std::shared_ptr<py::object> held(new py::object(std::move(fn)), [](py::object* o) {
          py::gil_scoped_acquire gil;
          delete o;
        });
        setLogSink([held](const std::string& topic, const std::string& text) {
          if (!Py_IsInitialized()) return;
          py::gil_scoped_acquire gil;
          try {
            (*held)(topic, text);
          } catch (py::error_already_set& e) {
            e.discard_as_unraisable("meshfuser log sink");
          }
        });
      },
      py::arg("sink"));
  m.def("_set_log_rank", &setLogRank, py::arg("rank"));
}

}  // namespace mf
