// generateGatherSum (gather_sum.h).
//
// Requires: dtype float, half or bfloat16; width >= 1; rows contiguous. Guarantees: deterministic
// text for a (dtype, width, vector width) and one thread per (row, vector group) in a grid-stride
// loop (no shared memory, barriers or shuffles), so one CPU thread at a time computes what the GPU
// does; each output element is x's value plus its src rows in ascending order of src row, summed in
// float and rounded once.
#include "codegen/gather_sum.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "codegen/internal.h"
#include "support/error.h"
#include "support/text.h"

namespace mf {
namespace {

constexpr int64_t kThreads = 256;
// Src rows whose loads one thread issues before it adds them: independent loads in flight hide the
// latency that the index lookup (order[j] before src[order[j]]) puts in front of every row.
constexpr int64_t kRowsInFlight = 4;

int64_t vectorWidth(const GatherSumShape& s, const DeviceLimits& device) {
  const int64_t bytes = sizeInBytes(s.dtype);
  int64_t vec = std::max<int64_t>(1, device.max_vector_bytes / bytes);
  while (vec > 1 && (s.width % vec != 0 || s.alignment_bytes < vec * bytes)) vec /= 2;
  return vec;
}

}  // namespace

GeneratedKernel generateGatherSum(const GatherSumShape& s, const DeviceLimits& device) {
  MF_CHECK(s.dtype == DataType::Float || s.dtype == DataType::Half || s.dtype == DataType::BFloat16,
           "gather-sum kernel for ", toString(s.dtype));
  MF_CHECK(s.width >= 1 && s.out_rows >= 0, "gather-sum kernel for rows of ", s.width);
  const int64_t vec = vectorWidth(s, device);
  const int64_t groups = s.width / vec;
  const std::string t = codegen::cudaType(s.dtype);
  const std::string array = "mf_array<" + t + ", " + std::to_string(vec) + ">";
  std::ostringstream k;
  k << codegen::prelude();
  k << "// index_add along rows: out[row] = x[row] + the src rows order[offsets[row] .. offsets[row + 1]).\n"
    << "// (mf_count groups of " << vec << " elements; " << groups << " groups per row of " << s.width << ")\n"
    << "extern \"C\" __global__ void __launch_bounds__(" << kThreads << ") MF_KERNEL_NAME(const " << t
    << "* __restrict__ x, const " << t << "* __restrict__ src, const long long* __restrict__ order, "
    << "const long long* __restrict__ offsets, " << t << "* __restrict__ out, double src_rows, long long mf_count) {\n"
    << "  const long long rows = mf_count / " << groups << ";\n"
    << "  if (blockIdx.x == 0 && threadIdx.x == 0 && (offsets[0] != 0 || offsets[rows] != (long long)src_rows)) {\n"
    << "    __trap();  // an index outside [0, rows): PyTorch's index_add asserts on the device too\n"
    << "  }\n"
    << "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < mf_count;\n"
    << "       i += (long long)blockDim.x * gridDim.x) {\n"
    << "    const long long row = i / " << groups << ";\n"
    << "    const long long col = (i - row * " << groups << ") * " << vec << ";\n"
    << "    float acc[" << vec << "];\n"
    << "    {\n"
    << "      const " << array << " v = *reinterpret_cast<const " << array << "*>(x + row * " << s.width
    << "LL + col);\n"
    << "      for (int l = 0; l < " << vec << "; ++l) acc[l] = " << codegen::loadExpr(s.dtype, "v.v[l]") << ";\n"
    << "    }\n"
    << "    const long long end = offsets[row + 1];\n"
    << "    for (long long j = offsets[row]; j < end; j += " << kRowsInFlight << ") {\n"
    << "      " << array << " v[" << kRowsInFlight << "];\n"
    << "      for (int u = 0; u < " << kRowsInFlight << "; ++u) {\n"
    << "        if (j + u < end) v[u] = *reinterpret_cast<const " << array << "*>(src + order[j + u] * "
    << s.width << "LL + col);\n"
    << "      }\n"
    << "      for (int u = 0; u < " << kRowsInFlight << "; ++u) {\n"
    << "        if (j + u < end) {\n"
    << "          for (int l = 0; l < " << vec << "; ++l) acc[l] += " << codegen::loadExpr(s.dtype, "v[u].v[l]")
    << ";\n"
    << "        }\n"
    << "      }\n"
    << "    }\n"
    << "    " << array << " o;\n"
    << "    for (int l = 0; l < " << vec << "; ++l) o.v[l] = " << codegen::storeExpr(s.dtype, "acc[l]") << ";\n"
    << "    *reinterpret_cast<" << array << "*>(out + row * " << s.width << "LL + col) = o;\n"
    << "  }\n"
    << "}\n";
  std::string text = k.str();
  GeneratedKernel g;
  g.scheduler = "gather_sum";
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(fnv1a(text)));
  g.name = "mf_gather_sum_" + std::string(hex);
  const std::string token = "MF_KERNEL_NAME";
  text.replace(text.find(token), token.size(), g.name);
  g.source = std::move(text);
  g.count = s.out_rows * groups;
  g.launch.block_x = kThreads;
  // Enough blocks to fill every SM at full occupancy; the grid-stride loop covers the rest.
  const int64_t resident = device.sm_count * std::max<int64_t>(1, device.max_threads_per_sm / kThreads);
  g.launch.grid_x = std::max<int64_t>(1, std::min(resident, (g.count + kThreads - 1) / kThreads));
  g.output_sizes = {{s.out_rows, s.width}};
  g.choices = str("gather_sum: vec ", vec, ", rows in flight ", kRowsInFlight, ", block ", kThreads);
  g.heuristics = str(device.toString(), "\n", g.choices, ", grid ", g.launch.grid_x);
  return g;
}

}  // namespace mf
