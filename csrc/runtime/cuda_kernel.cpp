#include "runtime/cuda_kernel.h"

#include <dlfcn.h>

#include <cstdlib>
#include <list>
#include <mutex>
#include <unordered_map>

#include "runtime/aten_evaluator.h"
#include "runtime/shape_class.h"
#include "support/error.h"
#include "support/options.h"

#ifdef MESHFUSER_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace mf {

KernelTensorArg kernelArgOf(const at::Tensor& t) {
  KernelTensorArg arg;
  arg.dtype = fromAten(t.scalar_type());
  arg.sizes = t.sizes().vec();
  arg.strides = t.strides().vec();
  if (t.is_meta()) {
    arg.alignment_bytes = 16;
  } else {
    auto address = reinterpret_cast<uintptr_t>(t.data_ptr());
    int64_t align = 16;
    while (align > 1 && address % align != 0) align /= 2;
    arg.alignment_bytes = align;
  }
  return arg;
}

#ifndef MESHFUSER_WITH_CUDA

bool cudaKernelsAvailable() { return false; }
const DeviceLimits& currentDeviceLimits() {
  static const DeviceLimits sm90;
  return sm90;
}
void launchGeneratedKernel(const GeneratedKernel&, const std::vector<at::Tensor>&, const std::vector<at::Tensor>&,
                           const std::vector<double>&) {
  MF_THROW_INTERNAL("generated kernels need a CUDA build");
}

#else

namespace {

// Minimal driver / NVRTC signatures (resolved with dlsym; no link-time dependency).
using CUresult = int;
using CUmodule = void*;
using CUfunction = void*;
using nvrtcResult = int;
using nvrtcProgram = void*;

struct Api {
  CUresult (*cuModuleLoadData)(CUmodule*, const void*) = nullptr;
  CUresult (*cuModuleUnload)(CUmodule) = nullptr;
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*,
                             void**, void**) = nullptr;
  CUresult (*cuGetErrorString)(CUresult, const char**) = nullptr;
  CUresult (*cuFuncSetAttribute)(CUfunction, int, int) = nullptr;
  nvrtcResult (*nvrtcCreateProgram)(nvrtcProgram*, const char*, const char*, int, const char* const*,
                                    const char* const*) = nullptr;
  nvrtcResult (*nvrtcCompileProgram)(nvrtcProgram, int, const char* const*) = nullptr;
  nvrtcResult (*nvrtcGetProgramLogSize)(nvrtcProgram, size_t*) = nullptr;
  nvrtcResult (*nvrtcGetProgramLog)(nvrtcProgram, char*) = nullptr;
  nvrtcResult (*nvrtcGetCUBINSize)(nvrtcProgram, size_t*) = nullptr;
  nvrtcResult (*nvrtcGetCUBIN)(nvrtcProgram, char*) = nullptr;
  nvrtcResult (*nvrtcDestroyProgram)(nvrtcProgram*) = nullptr;
  std::string error;  // why loading failed, empty when fine
};

void* openFirst(const std::vector<std::string>& names) {
  for (const auto& n : names) {
    if (void* h = dlopen(n.c_str(), RTLD_NOW | RTLD_GLOBAL)) return h;
  }
  return nullptr;
}

template <typename F>
void resolve(void* lib, F& fn, const char* name, std::string& error) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (fn == nullptr && error.empty()) error = std::string("missing symbol ") + name;
}

Api& api() {
  static Api a = [] {
    Api api;
    void* cuda = openFirst({"libcuda.so.1", "libcuda.so"});
    std::vector<std::string> nvrtc_names;
    if (std::string p = envString("MESHFUSER_NVRTC_PATH"); !p.empty()) nvrtc_names.push_back(p);
    std::vector<std::string> dirs = {""};
    if (std::string home = envString("CUDA_HOME"); !home.empty()) dirs.push_back(home + "/lib64/");
    dirs.push_back("/usr/local/cuda/targets/x86_64-linux/lib/");
    dirs.push_back("/usr/local/cuda/lib64/");
    for (const auto& d : dirs) {
      for (const char* n : {"libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"}) nvrtc_names.push_back(d + n);
    }
    void* nvrtc = openFirst(nvrtc_names);
    if (cuda == nullptr) api.error = "libcuda could not be loaded";
    if (nvrtc == nullptr && api.error.empty()) api.error = "libnvrtc could not be loaded (set MESHFUSER_NVRTC_PATH)";
    if (!api.error.empty()) return api;
    resolve(cuda, api.cuModuleLoadData, "cuModuleLoadData", api.error);
    resolve(cuda, api.cuModuleGetFunction, "cuModuleGetFunction", api.error);
    resolve(cuda, api.cuModuleUnload, "cuModuleUnload", api.error);
    resolve(cuda, api.cuLaunchKernel, "cuLaunchKernel", api.error);
    resolve(cuda, api.cuGetErrorString, "cuGetErrorString", api.error);
    resolve(cuda, api.cuFuncSetAttribute, "cuFuncSetAttribute", api.error);
    resolve(nvrtc, api.nvrtcCreateProgram, "nvrtcCreateProgram", api.error);
    resolve(nvrtc, api.nvrtcCompileProgram, "nvrtcCompileProgram", api.error);
    resolve(nvrtc, api.nvrtcGetProgramLogSize, "nvrtcGetProgramLogSize", api.error);
    resolve(nvrtc, api.nvrtcGetProgramLog, "nvrtcGetProgramLog", api.error);
    resolve(nvrtc, api.nvrtcGetCUBINSize, "nvrtcGetCUBINSize", api.error);
    resolve(nvrtc, api.nvrtcGetCUBIN, "nvrtcGetCUBIN", api.error);
    resolve(nvrtc, api.nvrtcDestroyProgram, "nvrtcDestroyProgram", api.error);
    return api;
  }();
  return a;
}

void checkCu(CUresult r, const char* what) {
  if (r == 0) return;
  const char* msg = "unknown";
  if (api().cuGetErrorString) api().cuGetErrorString(r, &msg);
  MF_THROW_INTERNAL(what, " failed: ", msg);
}

// Loaded modules by key, least recently used last; at most cacheLimits().kernel_modules of them.
struct LoadedModule {
  CUfunction function = nullptr;
  CUmodule module = nullptr;
  std::list<std::string>::iterator position;
};

CUfunction compile(const GeneratedKernel& kernel) {
  static std::mutex mutex;
  static std::unordered_map<std::string, LoadedModule> cache;
  static std::list<std::string> recency;
  const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
  std::string arch = "sm_" + std::to_string(prop->major) + std::to_string(prop->minor);
  // The name carries a 64-bit hash of the source: a short key keeps the per-launch lookup cheap
  // (hashing a whole kernel's text on every launch cost microseconds).
  std::string key = arch + ":" + std::to_string(static_cast<int>(c10::cuda::current_device())) + ":" + kernel.name;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it != cache.end()) {
    recency.splice(recency.begin(), recency, it->second.position);
    return it->second.function;
  }
  Api& a = api();
  nvrtcProgram prog = nullptr;
  MF_CHECK(a.nvrtcCreateProgram(&prog, kernel.source.c_str(), (kernel.name + ".cu").c_str(), 0, nullptr, nullptr) == 0,
           "nvrtcCreateProgram");
  std::string arch_flag = "--gpu-architecture=" + arch;
  const char* opts[] = {arch_flag.c_str(), "-std=c++17", "--fmad=true"};
  nvrtcResult rc = a.nvrtcCompileProgram(prog, 3, opts);
  if (rc != 0) {
    size_t size = 0;
    a.nvrtcGetProgramLogSize(prog, &size);
    std::string log(size, '\0');
    a.nvrtcGetProgramLog(prog, log.data());
    a.nvrtcDestroyProgram(&prog);
    MF_THROW_INTERNAL("NVRTC could not compile generated kernel ", kernel.name, ":\n", log, "\n--- source ---\n",
                      kernel.source);
  }
  size_t cubin_size = 0;
  a.nvrtcGetCUBINSize(prog, &cubin_size);
  std::string cubin(cubin_size, '\0');
  a.nvrtcGetCUBIN(prog, cubin.data());
  a.nvrtcDestroyProgram(&prog);
  CUmodule module = nullptr;
  checkCu(a.cuModuleLoadData(&module, cubin.data()), "cuModuleLoadData");
  CUfunction fn = nullptr;
  checkCu(a.cuModuleGetFunction(&fn, module, kernel.name.c_str()), "cuModuleGetFunction");
  // Dynamic shared memory past the default per-block limit (48 KiB) must be asked for per function.
  constexpr int kMaxDynamicSharedSizeBytes = 8;  // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
  if (kernel.launch.shared_mem_bytes > static_cast<int64_t>(prop->sharedMemPerBlock)) {
    checkCu(a.cuFuncSetAttribute(fn, kMaxDynamicSharedSizeBytes, static_cast<int>(kernel.launch.shared_mem_bytes)),
            "cuFuncSetAttribute(max dynamic shared memory)");
  }
  recency.push_front(key);
  cache.emplace(key, LoadedModule{fn, module, recency.begin()});
  while (static_cast<int64_t>(cache.size()) > cacheLimits().kernel_modules) {
    // Launches of the evicted kernel may still be queued: let them finish before unloading it.
    C10_CUDA_CHECK(cudaDeviceSynchronize());
    auto victim = cache.find(recency.back());
    checkCu(a.cuModuleUnload(victim->second.module), "cuModuleUnload");
    cache.erase(victim);
    recency.pop_back();
  }
  return fn;
}

}  // namespace

bool cudaKernelsAvailable() { return at::cuda::is_available() && api().error.empty(); }

namespace {

DeviceLimits queryDeviceLimits() {
  const cudaDeviceProp* p = at::cuda::getCurrentDeviceProperties();
  DeviceLimits d;
  d.compute_capability = p->major * 10 + p->minor;
  d.arch = "sm_" + std::to_string(d.compute_capability);
  d.device_name = p->name;
  d.sm_count = p->multiProcessorCount;
  d.warp_size = p->warpSize;
  d.max_threads_per_block = p->maxThreadsPerBlock;
  d.max_threads_per_sm = p->maxThreadsPerMultiProcessor;
  d.max_blocks_per_sm = p->maxBlocksPerMultiProcessor;
  d.shared_mem_per_block = static_cast<int64_t>(p->sharedMemPerBlock);
  d.shared_mem_per_block_optin = static_cast<int64_t>(p->sharedMemPerBlockOptin);
  d.shared_mem_per_sm = static_cast<int64_t>(p->sharedMemPerMultiprocessor);
  d.reserved_shared_mem_per_block = static_cast<int64_t>(p->reservedSharedMemPerBlock);
  d.registers_per_block = p->regsPerBlock;
  d.registers_per_sm = p->regsPerMultiprocessor;
  d.l2_bytes = p->l2CacheSize;
  d.max_grid_x = p->maxGridSize[0];
  return d;
}

}  // namespace

const DeviceLimits& currentDeviceLimits() {
  static const DeviceLimits sm90;
  if (!at::cuda::is_available()) return sm90;
  // Per thread and device: the properties do not change, and a launch path must not take a lock.
  thread_local std::unordered_map<int, DeviceLimits> known;
  const int device = static_cast<int>(c10::cuda::current_device());
  auto it = known.find(device);
  if (it == known.end()) it = known.emplace(device, queryDeviceLimits()).first;
  return it->second;
}

void launchGeneratedKernel(const GeneratedKernel& kernel, const std::vector<at::Tensor>& inputs,
                           const std::vector<at::Tensor>& outputs, const std::vector<double>& scalars) {
  MF_CHECK(api().error.empty(), api().error);
  const at::Tensor& any = outputs.empty() ? inputs.at(0) : outputs[0];
  c10::cuda::CUDAGuard guard(any.device());
  // The driver calls below need the device's primary context current in this thread. A thread
  // that has only run PyTorch ops through the runtime API may not have one bound yet (autograd's
  // device threads: "invalid device context" on the H200); any runtime call binds it.
  thread_local int bound_device = -1;
  if (bound_device != any.device().index()) {
    C10_CUDA_CHECK(cudaFree(nullptr));
    bound_device = any.device().index();
  }
  CUfunction fn = compile(kernel);
  std::vector<void*> pointers;
  std::vector<double> scalar_values = scalars;
  std::vector<void*> args;
  pointers.reserve(inputs.size() + outputs.size());
  for (const at::Tensor& t : inputs) pointers.push_back(t.data_ptr());
  for (const at::Tensor& t : outputs) pointers.push_back(t.data_ptr());
  for (void*& p : pointers) args.push_back(&p);
  for (double& s : scalar_values) args.push_back(&s);
  long long count = kernel.count;  // the extent-dependent bound (kernel.h)
  args.push_back(&count);
  const KernelLaunch& l = kernel.launch;
  // Scratch for the launch (split outer reductions: partials and arrival counters). The caching
  // allocator keeps it valid for the kernel: a later allocation on this stream runs after it.
  at::Tensor workspace;
  void* workspace_ptr = nullptr;
  if (l.workspace_bytes > 0) {
    workspace = at::empty({l.workspace_bytes}, any.options().dtype(at::kByte));
    workspace_ptr = workspace.data_ptr();
    C10_CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(workspace_ptr) + l.workspace_zero_offset, 0,
                                   static_cast<size_t>(l.workspace_bytes - l.workspace_zero_offset),
                                   at::cuda::getCurrentCUDAStream().stream()));
  }
  // Always last: a kernel that declares no workspace parameter never reads this entry (the driver
  // takes as many parameters as the function declares); one that does sees null without a workspace.
  args.push_back(&workspace_ptr);
  checkCu(api().cuLaunchKernel(fn, l.grid_x, l.grid_y, l.grid_z, l.block_x, l.block_y, l.block_z,
                               static_cast<unsigned>(l.shared_mem_bytes), at::cuda::getCurrentCUDAStream().stream(),
                               args.data(), nullptr),
          "cuLaunchKernel");
}

#endif

}  // namespace mf
