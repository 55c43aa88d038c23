// What the executor planned and ran, as text and figures: the host program of the last call with
// its schedulers, bytes, data-dependent extents, segmentation and attention kernels
// (FusionDefinition.host_program(), the profiler, the benchmarks).
#include <algorithm>

#include "host/communication_bytes.h"
#include "multidevice/communicator.h"
#include "runtime/attention_choice.h"
#include "runtime/executor.h"
#include "support/text.h"

namespace mf {

std::string FusionExecutor::schedulerOf(int64_t segment) const {
  size_t i = static_cast<size_t>(segment);
  auto accumulated = accumulated_in_place_.find(segment);
  if (accumulated != accumulated_in_place_.end()) return accumulated->second ? "gemm_accumulate" : "expr_eval";
  if (i >= kernels_.size() || kernels_[i].lastSchedulers().empty()) return "expr_eval";
  std::string names;
  for (const std::string& n : kernels_[i].lastSchedulers()) names += (names.empty() ? "" : "+") + n;
  return names;
}

std::vector<std::string> FusionExecutor::segmentSchedulers() const {
  std::vector<std::string> names;
  for (size_t i = 0; i < program_->segments().size(); ++i) names.push_back(schedulerOf(static_cast<int64_t>(i)));
  return names;
}

std::vector<std::pair<int64_t, int64_t>> FusionExecutor::communicationBytes() const {
  std::vector<std::pair<int64_t, int64_t>> bytes;
  std::vector<TransferBytes> all = programBytes(*program_, last_bindings_);
  for (size_t i = 0; i < all.size(); ++i) {
    const TransferBytes& b = isExchange(program_->communications()[i].type) && i < exchange_bytes_.size()
                                 ? exchange_bytes_[i]
                                 : all[i];
    bytes.emplace_back(b.sent, b.received);
  }
  return bytes;
}

std::string FusionExecutor::hostProgramText(bool show_deallocations) const {
  std::vector<int64_t> loop_chunks;
  for (const StreamLoop& loop : program_->streamLoops()) {
    loop_chunks.push_back(effectiveChunks(loop, globalRows(loop, last_bindings_)));
  }
  std::string mode;
  for (const Communication& c : program_->communications()) {  // the exchanges' data-dependent extents
    if (c.type != CommunicationType::Dispatch) continue;
    std::string symbol = c.output->fusion()->canonicalSymbol(c.output->logicalNoReductions()[0]->extent().symbol);
    auto it = last_bindings_.find(symbol);
    if (it != last_bindings_.end()) mode += mf::str("Rows received by ", c.output->toString(), " on the last call: ", symbol, " = ", it->second, "\n");
  }
  Communicator& comm = Communicator::instance();
  if (!program_->communications().empty() && eval_device_.is_cuda() && comm.cudaOverGloo()) {
    mode = "Communications of CUDA tensors run on Gloo (MESHFUSER_CUDA_BACKEND=gloo: the test mode for ranks "
           "sharing a GPU; point-to-point messages staged through host memory; not for speed)\n";
  }
  return program_->toString(segmentSchedulers(), communicationBytes(), loop_chunks, show_deallocations) + mode +
         segmentationText() +
         attentionKernelsText();
}

std::string FusionExecutor::attentionKernelsText() const {
  std::string text;
  for (const Segment& segment : program_->segments()) {
    for (const Expr* e : segment.exprs) {
      if (opInfo(e->op()).aten_args != AtenArgs::Attention) continue;
      std::string kernel = lastAttentionKernel(e);
      text += "  " + std::string(opInfo(e->op()).name) + " kernel: " +
              (kernel.empty() ? "chosen at the first call" : kernel) + " (" + e->output(0)->toString() + ")\n";
    }
  }
  return text.empty() ? text : "Attention kernels (PyTorch's dispatcher's choice) {\n" + text + "}\n";
}

std::string FusionExecutor::segmentationText() const {
  std::string text;
  // Only after a GPU plan was made (a CUDA run or cuda_kernels): that is what this text describes.
  if (std::none_of(kernels_.begin(), kernels_.end(), [](const SegmentKernels& k) { return k.planned(); })) return text;
  for (size_t i = 0; i < program_->segments().size(); ++i) {
    const Segment& segment = program_->segments()[i];
    if (segment.gemm_accumulate) {  // one piece: cuBLAS adding into the partial
      std::string ops;
      for (const Expr* e : segment.exprs) ops += std::string(ops.empty() ? "" : ", ") + opInfo(e->op()).name;
      text += "  segment " + std::to_string(i) + ":\n    piece 0 [" + ops +
              "]: ATen (one GEMM adding into the partial sum's buffer, cuBLAS beta = 1)\n";
      continue;
    }
    if (i >= kernels_.size() || !kernels_[i].planned()) continue;
    text += "  segment " + std::to_string(i) + ":\n" + kernels_[i].planText("    ");
  }
  return text.empty() ? text : "Segmentation (planned once per shape class) {\n" + text + "}\n";
}

}  // namespace mf
