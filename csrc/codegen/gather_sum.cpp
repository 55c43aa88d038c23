// generateGatherSum (gather_sum.h): the sorted index_add's gather-sum and index_select's row gather.
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

namespace {

// The body of the grid-stride loop for Sum: x's row plus the row's run of src rows.
void emitSum(std::ostringstream& k, const GatherSumShape& s, const std::string& array, int64_t vec) {
  k << "    {\n"
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
    << "    }\n";
}

}  // namespace

GeneratedKernel generateGatherSum(const GatherSumShape& s, const DeviceLimits& device) {
  MF_CHECK(s.dtype == DataType::Float || s.dtype == DataType::Half || s.dtype == DataType::BFloat16,
           "gather-sum kernel for ", toString(s.dtype));
  MF_CHECK(s.width >= 1 && s.out_rows >= 0, "gather-sum kernel for rows of ", s.width);
  const bool sum = s.mode == GatherSumShape::Mode::Sum;
  const int64_t vec = vectorWidth(s, device);
  const int64_t groups = s.width / vec;
  const std::string t = codegen::cudaType(s.dtype);
  const std::string array = "mf_array<" + t + ", " + std::to_string(vec) + ">";
  std::ostringstream k;
  k << codegen::prelude();
  if (sum) {
    k << "// index_add along rows: out[row] = x[row] + the src rows order[offsets[row] .. offsets[row + 1]).\n";
  } else {
    k << "// index_select along rows: out[row] = src[index[row]].\n";
  }
  k << "// (mf_count groups of " << vec << " elements; " << groups << " groups per row of " << s.width << ")\n"
    << "extern \"C\" __global__ void __launch_bounds__(" << kThreads << ") MF_KERNEL_NAME(";
  if (sum) {
    k << "const " << t << "* __restrict__ x, const " << t << "* __restrict__ src, const long long* __restrict__ order, "
      << "const long long* __restrict__ offsets, ";
  } else {
    k << "const " << t << "* __restrict__ src, const long long* __restrict__ index, ";
  }
  k << t << "* __restrict__ out, double src_rows, long long mf_count) {\n";
  if (sum) {
    k << "  const long long rows = mf_count / " << groups << ";\n"
      << "  if (blockIdx.x == 0 && threadIdx.x == 0 && (offsets[0] != 0 || offsets[rows] != (long long)src_rows)) {\n"
      << "    __trap();  // an index outside [0, rows): PyTorch's index_add asserts on the device too\n"
      << "  }\n";
  }
  k << "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < mf_count;\n"
    << "       i += (long long)blockDim.x * gridDim.x) {\n"
    << "    const long long row = i / " << groups << ";\n"
    << "    const long long col = (i - row * " << groups << ") * " << vec << ";\n";
  if (sum) {
    k << "    float acc[" << vec << "];\n";
    emitSum(k, s, array, vec);
    k << "    " << array << " o;\n"
      << "    for (int l = 0; l < " << vec << "; ++l) o.v[l] = " << codegen::storeExpr(s.dtype, "acc[l]") << ";\n";
  } else {
    k << "    const long long from = index[row];\n"
      << "    if (from < 0 || from >= (long long)src_rows) __trap();  // as PyTorch's device-side assert\n"
      << "    const " << array << " o = *reinterpret_cast<const " << array << "*>(src + from * " << s.width
      << "LL + col);\n";
  }
  k << "    *reinterpret_cast<" << array << "*>(out + row * " << s.width << "LL + col) = o;\n"
    << "  }\n"
    << "}\n";
  std::string text = k.str();
  GeneratedKernel g;
  g.scheduler = sum ? "gather_sum" : "gather_rows";
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(fnv1a(text)));
  g.name = "mf_" + g.scheduler + "_" + std::string(hex);
  const std::string token = "MF_KERNEL_NAME";
  text.replace(text.find(token), token.size(), g.name);
  g.source = std::move(text);
  g.launch.block_x = kThreads;
  setGatherSumRows(g, s, device);
  g.choices = str(g.scheduler, ": vec ", vec, sum ? str(", rows in flight ", kRowsInFlight) : std::string(), ", block ",
                  kThreads);
  g.heuristics = str(device.toString(), "\n", g.choices);
  return g;
}

void setGatherSumRows(GeneratedKernel& g, const GatherSumShape& s, const DeviceLimits& device) {
  g.count = s.out_rows * (s.width / vectorWidth(s, device));
  // One (row, vector group) per thread: blocks start as others finish, so the uneven runs of src
  // rows (experts that received many tokens next to ones that received none) balance themselves.
  // The grid-stride loop only matters past the grid limit (and for the CPU emulation's one block).
  g.launch.grid_x = std::max<int64_t>(1, std::min(device.max_grid_x, (g.count + kThreads - 1) / kThreads));
  g.output_sizes = {{s.out_rows, s.width}};
}

}  // namespace mf
