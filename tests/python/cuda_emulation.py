"""Runs a generated grid-stride kernel (pointwise, the sorted index_add's gather-sum) on the CPU: its CUDA text compiled as C++ by g++ with a CPU
prelude (the same helper names), every thread of a one-block launch run in turn. Pointwise kernels
are grid-stride loops with no shared memory, barriers or warp shuffles, so one thread at a time
computes exactly what the GPU does; bfloat16/half conversions are the prelude's integer forms
(round to nearest even), bit-identical to the hardware's cvt.rn. This checks a kernel's index
arithmetic (offsets, guards, vector lanes) against PyTorch without a GPU."""
import os
import re
import shutil
import subprocess
import tempfile

import torch

CPU_PRELUDE = r"""
#include <cmath>
#include <cstdint>
#include <cstring>
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
struct mf_dim3 { unsigned x = 0, y = 0, z = 0; };
static mf_dim3 threadIdx, blockIdx, blockDim, gridDim;
typedef unsigned short mf_bf16;
typedef unsigned short mf_half;
typedef unsigned char mf_bool;
template <typename T, int N>
struct alignas(sizeof(T) * N) mf_array { T v[N]; };
inline float __uint_as_float(unsigned int u) { float f; std::memcpy(&f, &u, 4); return f; }
inline float __int_as_float(int u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned int __float_as_uint(float f) { unsigned int u; std::memcpy(&u, &f, 4); return u; }
inline float mf_bf16_to_float(mf_bf16 x) { return __uint_as_float(((unsigned int)x) << 16); }
inline mf_bf16 mf_float_to_bf16(float f) {
  unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (mf_bf16)0x7fffu;
  u += 0x7fffu + ((u >> 16) & 1u);
  return (mf_bf16)(u >> 16);
}
inline unsigned int mf_pack_bf16x2(float lo, float hi) {
  return (unsigned int)mf_float_to_bf16(lo) | ((unsigned int)mf_float_to_bf16(hi) << 16);
}
inline float mf_max(float a, float b) { return (a != a || a > b) ? a : b; }
inline float mf_min(float a, float b) { return (a != a || a < b) ? a : b; }
inline float mf_relu(float x) { return (x != x || x > 0.0f) ? x : 0.0f; }
inline float mf_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
inline float mf_gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }
inline float __expf(float x) { return expf(x); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
#include <cstdlib>
inline void __trap() { std::abort(); }
"""

DTYPE_BYTES = {torch.float32: 4, torch.bfloat16: 2, torch.float16: 2, torch.bool: 1, torch.int64: 8}
C_TYPES = {torch.float32: "float", torch.bfloat16: "mf_bf16", torch.float16: "mf_half", torch.bool: "mf_bool",
           torch.int64: "long long"}


def available():
    return shutil.which("g++") is not None


def _kernel_text(source):
    start = source.index('extern "C"')
    return source[start:]


def kernel_parameters(source):
    """[(is_output, tensor number)] of a kernel's tensor parameters, in order ("const T* T3" is
    input tensor T3; a pointer without const an output)."""
    kernel = source[source.index('extern "C"'):]
    sig = kernel[:kernel.index(") {")]
    return [(m.group(1) is None, int(m.group(2))) for m in re.finditer(r"(const )?\w+\* __restrict__ T(\d+)", sig)]


def run_pointwise(source, tensors, threads=64):
    """Runs `source` (a pointwise kernel from fd.cuda_kernels) on CPU tensors: `tensors` maps the
    number of each tensor parameter (T3 -> 3) to its tensor (inputs may be strided views; outputs
    contiguous, filled in place). Scalar parameters are not supported."""
    assert "mf_pointwise_" in source, "only pointwise kernels run on the CPU emulation"
    vec = int(re.search(r"\(mf_count groups of (\d+) elements", source).group(1))
    params = kernel_parameters(source)
    outputs = [tensors[n] for is_out, n in params if is_out]
    name = re.search(r"(mf_pointwise_[0-9a-f]{16})\(", source).group(1)
    run_grid_stride(source, name, [tensors[n] for _, n in params], [is_out for is_out, _ in params],
                    outputs[0].numel() // vec, threads)
    return outputs


def run_grid_stride(source, name, args, is_output, count, threads=64):
    """Runs kernel `name` of `source` (a grid-stride loop over `count` items) as one block of
    `threads` threads, one thread after another. `args`: the parameters before the count, in order:
    tensors (CPU; those with is_output[i] are written back in place) or Python floats (doubles)."""
    launch = [f"  blockDim.x = {threads}; gridDim.x = 1;",
              f"  for (unsigned t = 0; t < {threads}; ++t) {{ threadIdx.x = t; {name}(MF_ARGS, {count}LL); }}"]
    _compile_and_run(CPU_PRELUDE, _kernel_text(source), args, is_output, launch, [])


# Blocks whose threads meet at barriers and exchange values in warps (reduction and normalization
# kernels): every thread of a block is an OS thread; __syncthreads is a barrier of the block,
# a warp shuffle writes its value to the warp's slots and reads its partner's between two barriers
# of the warp. Blocks run one after another, so __shared__ arrays (static here) are the block's.
BLOCK_PRELUDE = CPU_PRELUDE.replace("static mf_dim3 threadIdx, blockIdx, blockDim, gridDim;", r"""
#include <barrier>
#include <memory>
#include <thread>
#include <vector>
static thread_local mf_dim3 threadIdx;
static mf_dim3 blockIdx, blockDim, gridDim;
static std::barrier<>* mf_block_barrier;
static std::barrier<>* mf_warp_barrier[64];
static unsigned long long mf_lanes[64][32];
#define __shared__ static
#include <atomic>
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
template <typename T> T __ldcg(const T* p) { T v; __atomic_load(p, &v, __ATOMIC_SEQ_CST); return v; }
static unsigned char mf_workspace[1 << 24] __attribute__((aligned(64)));  // zeroed: the arrival counters
inline void __syncthreads() { mf_block_barrier->arrive_and_wait(); }
inline int mf_tid() { return threadIdx.x + threadIdx.y * blockDim.x + threadIdx.z * blockDim.x * blockDim.y; }
template <typename T>
T mf_exchange(T v, int src_lane) {
  const int t = mf_tid(), warp = t / 32, lane = t % 32;
  std::memcpy(&mf_lanes[warp][lane], &v, sizeof(T));
  mf_warp_barrier[warp]->arrive_and_wait();
  T r;
  std::memcpy(&r, &mf_lanes[warp][src_lane], sizeof(T));
  mf_warp_barrier[warp]->arrive_and_wait();
  return r;
}
template <typename T> T __shfl_xor_sync(unsigned, T v, int mask, int = 32) { return mf_exchange(v, (mf_tid() % 32) ^ mask); }
template <typename T> T __shfl_down_sync(unsigned, T v, unsigned d, int w = 32) {
  const int lane = mf_tid() % 32;
  return mf_exchange(v, (lane % w) + (int)d < w ? lane + (int)d : lane);
}
template <typename T> T __shfl_sync(unsigned, T v, int src, int w = 32) {
  return mf_exchange(v, (mf_tid() % 32) / w * w + src % w);
}
""")


def run_block_kernel(source, name, args, is_output, count, block, grid=(1, 1)):
    """Runs kernel `name` of `source` with `block` = (x, y) threads per block on a `grid` = (x, y)
    of blocks, on the CPU (BLOCK_PRELUDE). `args` as for run_grid_stride."""
    bx, by = block
    n = bx * by
    # Split reductions take a workspace (partials, then arrival counters that start at zero).
    workspace = ", mf_workspace" if "mf_work)" in source.replace("\n", "").replace(" ", "") else ""
    assert n <= 64 * 32
    launch = [f"  blockDim.x = {bx}; blockDim.y = {by}; gridDim.x = {grid[0]}; gridDim.y = {grid[1]};",
              f"  for (unsigned gy = 0; gy < {grid[1]}; ++gy) for (unsigned gx = 0; gx < {grid[0]}; ++gx) {{",
              "    blockIdx.x = gx; blockIdx.y = gy;",
              f"    std::barrier<> block_barrier({n}); mf_block_barrier = &block_barrier;",
              "    std::vector<std::unique_ptr<std::barrier<>>> warps;",
              f"    for (int w = 0; w * 32 < {n}; ++w) {{",
              f"      warps.emplace_back(new std::barrier<>(std::min(32, {n} - w * 32)));",
              "      mf_warp_barrier[w] = warps.back().get();",
              "    }",
              "    std::vector<std::thread> threads;",
              f"    for (unsigned t = 0; t < {n}; ++t) threads.emplace_back([&, t] {{",
              f"      threadIdx.x = t % {bx}; threadIdx.y = t / {bx}; {name}(MF_ARGS, {count}LL{workspace});",
              "    });",
              "    for (auto& th : threads) th.join();",
              "  }"]
    _compile_and_run(BLOCK_PRELUDE, _kernel_text(source), args, is_output, launch, ["-std=c++20", "-pthread"])


def _compile_and_run(prelude, kernel, args, is_output, launch, flags):
    lines = ["#include <cstdio>\n" + prelude, kernel, "int main(int argc, char** argv) {"]
    values = []
    tensors = [(i, t) for i, t in enumerate(args) if isinstance(t, torch.Tensor)]
    for i, t in tensors:
        storage = t.untyped_storage().nbytes()
        lines.append(f"  static unsigned char buf{i}[{max(storage, 1)}] __attribute__((aligned(64)));")
        lines.append(f"  FILE* f{i} = fopen(argv[{i + 1}], \"rb\"); fread(buf{i}, 1, {storage}, f{i}); fclose(f{i});")
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            values.append(f"({C_TYPES[a.dtype]}*)(buf{i} + {a.storage_offset() * DTYPE_BYTES[a.dtype]})")
        else:
            values.append(repr(float(a)))
    lines += [line.replace("MF_ARGS", ", ".join(values)) for line in launch]
    for i, t in tensors:
        if is_output[i]:
            storage = t.untyped_storage().nbytes()
            lines.append(f"  FILE* g{i} = fopen(argv[{i + 1}], \"wb\"); fwrite(buf{i}, 1, {storage}, g{i}); "
                         f"fclose(g{i});")
    lines.append("  return 0;\n}\n")
    with tempfile.TemporaryDirectory() as d:
        cpp = os.path.join(d, "k.cpp")
        with open(cpp, "w") as f:
            f.write("\n".join(lines))
        exe = os.path.join(d, "k")
        r = subprocess.run(["g++", "-O1", "-std=c++17", *flags, "-w", cpp, "-o", exe], capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr[-4000:]
        paths = [os.path.join(d, f"t{i}.bin") for i in range(len(args))]
        for i, t in tensors:
            raw = torch.empty(t.untyped_storage().nbytes(), dtype=torch.uint8)
            raw.untyped_storage().copy_(t.untyped_storage())
            raw.numpy().tofile(paths[i])
        r = subprocess.run([exe] + paths, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise RuntimeError(f"emulated kernel failed (exit {r.returncode}): {r.stderr[-2000:]}")
        for i, t in tensors:
            if is_output[i]:
                data = torch.from_file(paths[i], size=t.untyped_storage().nbytes(), dtype=torch.uint8)
                t.untyped_storage().copy_(data.untyped_storage())
