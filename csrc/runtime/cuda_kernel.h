// Compiles generated CUDA source with NVRTC at run time and launches it through the CUDA driver
// API on PyTorch's current stream. NVRTC and libcuda are loaded with dlopen, so CPU-only builds
// and machines never need them. Kernels are cached by (name, which hashes the source; architecture; device).
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "codegen/kernel.h"

namespace mf {

// True when this build has CUDA code paths and a CUDA device is usable.
bool cudaKernelsAvailable();
// Compiles (cached) and launches `kernel` with the given tensor and scalar arguments.
void launchGeneratedKernel(const GeneratedKernel& kernel, const std::vector<at::Tensor>& inputs,
                           const std::vector<at::Tensor>& outputs, const std::vector<double>& scalars);
// The limits of the current CUDA device, queried from its properties; without a CUDA device, the
// sm_90 table (H100/H200 SXM: what fd.cuda_kernels generates for by default on a CPU machine).
const DeviceLimits& currentDeviceLimits();
// KernelTensorArg of a tensor: local sizes/strides and the alignment of its data pointer.
KernelTensorArg kernelArgOf(const at::Tensor& t);

}  // namespace mf
