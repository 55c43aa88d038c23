#include "runtime/attention_choice.h"

#include <mutex>
#include <unordered_map>

#include "support/error.h"
#include "support/options.h"

namespace mf {
namespace {

// PyTorch's sdp::SDPBackend numbering, as at::_fused_sdp_choice returns it.
constexpr int64_t kSdpMath = 0, kSdpFlash = 1, kSdpEfficient = 2, kSdpCudnn = 3;

std::optional<AttentionKernel> forcedKernel() {
  const std::string v = envString("MESHFUSER_ATTENTION_KERNEL");
  if (v.empty()) return std::nullopt;
  if (v == "cudnn") return AttentionKernel::Cudnn;
  if (v == "flash") return AttentionKernel::Flash;
  if (v == "efficient") return AttentionKernel::Efficient;
  if (v == "math") return AttentionKernel::Math;
  MF_THROW_USER("MESHFUSER_ATTENTION_KERNEL: unknown kernel '", v, "'; valid kernels are cudnn, flash, efficient, math");
}

// Asks PyTorch's dispatcher as for a call that needs gradients: some kernels have a forward but no
// backward for some shapes, and the choice must hold for both.
int64_t pytorchChoice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout_p, bool is_causal,
                      double scale) {
  try {
    return at::_fused_sdp_choice(q.detach().requires_grad_(true), k.detach().requires_grad_(true),
                                 v.detach().requires_grad_(true), std::nullopt, dropout_p, is_causal, scale);
  } catch (const c10::Error&) {  // inference tensors refuse requires_grad: ask as for inference
    return at::_fused_sdp_choice(q, k, v, std::nullopt, dropout_p, is_causal, scale);
  }
}

struct Record {
  std::mutex mutex;
  std::unordered_map<const Expr*, AttentionKernel> last;
};

Record& record() {
  static Record r;
  return r;
}

}  // namespace

const char* attentionKernelName(AttentionKernel k) {
  switch (k) {
    case AttentionKernel::Cudnn: return "cudnn";
    case AttentionKernel::Flash: return "flash";
    case AttentionKernel::Efficient: return "efficient";
    case AttentionKernel::CpuFlash: return "cpu_flash";
    case AttentionKernel::Math: return "math";
  }
  MF_THROW_INTERNAL("unknown attention kernel");
}

AttentionKernel chooseAttentionKernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout_p,
                                      bool is_causal, double scale) {
  if (std::optional<AttentionKernel> forced = forcedKernel()) {
    MF_USER_CHECK(q.is_cuda() || *forced == AttentionKernel::Math, "MESHFUSER_ATTENTION_KERNEL=",
                  attentionKernelName(*forced), ": on CPU tensors only math can be forced (",
                  "cudnn, flash and efficient are CUDA kernels)");
    return *forced;
  }
  const bool half = q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16;
  if (!q.is_cuda()) return dropout_p > 0.0 ? AttentionKernel::Math : AttentionKernel::CpuFlash;
  // With dropout the mask comes from the kernel's random numbers: flash attention keeps its seed and
  // offset in the form its backward takes (meshfuser's saved seed/offset); else the math kernel.
  if (dropout_p > 0.0) return half ? AttentionKernel::Flash : AttentionKernel::Math;
  switch (pytorchChoice(q, k, v, dropout_p, is_causal, scale)) {
    case kSdpCudnn: return AttentionKernel::Cudnn;
    case kSdpFlash: return AttentionKernel::Flash;
    case kSdpEfficient: return AttentionKernel::Efficient;
    case kSdpMath:
    default: return AttentionKernel::Math;
  }
}

void recordAttentionKernel(const Expr* e, AttentionKernel k) {
  std::lock_guard<std::mutex> lock(record().mutex);
  constexpr size_t kMaxRecorded = 4096;  // display only: forget old definitions' entries
  if (record().last.size() >= kMaxRecorded && !record().last.count(e)) record().last.clear();
  record().last[e] = k;
}

std::string lastAttentionKernel(const Expr* e) {
  std::lock_guard<std::mutex> lock(record().mutex);
  auto it = record().last.find(e);
  return it == record().last.end() ? "" : attentionKernelName(it->second);
}

}  // namespace mf
