// generateKernel: analysis -> schedule -> CUDA text -> name.
//
// Requires: a KernelSegment (see makeKernelSegment) and one KernelTensorArg per tensor input (local
// sizes/strides in elements, pointer alignment). Guarantees: either a GeneratedKernel whose source
// is deterministic for a given (segment, args, options: the device limits) and whose name is
// mf_<scheduler>_<16 hex digits of a hash of the source>, or nullopt with *why_not saying why
// (never throws for an unsupported segment; limits no device has are a user error).
#include <cstdio>

#include "codegen/internal.h"
#include "support/error.h"
#include "support/text.h"

namespace mf {
namespace {

constexpr const char* kNameToken = "MF_KERNEL_NAME";

}  // namespace

std::optional<GeneratedKernel> generateKernel(const KernelSegment& segment, const std::vector<KernelTensorArg>& inputs,
                                              const CodegenOptions& options, std::string* why_not) {
  std::string why;
  codegen::Analysis a;
  codegen::Schedule s;
  checkDeviceLimits(options.device);
  if (!codegen::analyzeSegment(segment, inputs, &a, &why) || !codegen::chooseSchedule(a, options, &s, &why)) {
    if (why_not != nullptr) *why_not = why;
    return std::nullopt;
  }
  GeneratedKernel k;
  codegen::DoubleComputeScope compute_type(a.compute_double);
  std::string text;
  switch (s.kind) {
    case codegen::Kind::Pointwise:
      k.scheduler = "pointwise";
      text = codegen::emitPointwise(a, s, kNameToken);
      break;
    case codegen::Kind::Normalization:
      k.scheduler = "normalization";
      text = codegen::emitNormalization(a, s, kNameToken);
      break;
    case codegen::Kind::Transpose:
      k.scheduler = "transpose";
      text = codegen::emitTranspose(a, s, kNameToken);
      break;
    default:
      k.scheduler = "reduction";
      text = codegen::emitReduction(a, s, kNameToken);
  }
  if (a.compute_double) {  // the body after the prelude, which keeps its float helpers
    size_t body = codegen::prelude().size();
    text = text.substr(0, body) + codegen::doubleHelpers() + codegen::toDoubleCompute(text.substr(body));
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(fnv1a(text)));
  k.name = "mf_" + k.scheduler + "_" + hex;
  size_t pos = text.find(kNameToken);
  text.replace(pos, std::string(kNameToken).size(), k.name);
  k.source = std::move(text);
  k.launch = s.launch;
  k.count = s.count;
  k.choices = str(k.scheduler, ": vec ", s.vec, ", unroll ", s.unroll, ", index ", s.index64 ? 64 : 32, ", block ",
                  s.launch.block_x, "x", s.launch.block_y, s.kind == codegen::Kind::Normalization
                      ? str(s.norm.persistent ? ", persistent " : ", multi-pass ", s.norm.iters, " groups")
                      : std::string(),
                  s.split_rows ? ", chunked rows" : "");
  k.heuristics = codegen::heuristicsText(s, options.device);
  for (const TensorView* tv : segment.outputs) k.output_sizes.push_back(a.shape.at(tv));
  return k;
}

}  // namespace mf
