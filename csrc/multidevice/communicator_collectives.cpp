// Posting collectives on c10d backends. Every size check happens before anything is posted, so a
// bad call raises on the calling rank without leaving a half-posted collective behind.
#include <ATen/ATen.h>

#include "multidevice/communicator.h"
#include "support/error.h"

namespace mf {
namespace {

std::string sizesOf(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

c10d::ReduceOp toReduceOp(OpType op) {
  switch (op) {
    case OpType::Sum: return c10d::ReduceOp::SUM;
    case OpType::Max: return c10d::ReduceOp::MAX;
    case OpType::Min: return c10d::ReduceOp::MIN;
    default: MF_THROW_INTERNAL("no c10d reduce op for ", toString(op));
  }
}

void checkBuffers(const char* what, const at::Tensor& out, const at::Tensor& in) {
  MF_USER_ARG_CHECK(out.is_contiguous() && in.is_contiguous(), what, ": buffers must be contiguous");
  MF_USER_ARG_CHECK(out.scalar_type() == in.scalar_type(), what, ": output dtype ", out.scalar_type(),
                    " differs from input dtype ", in.scalar_type());
  MF_USER_ARG_CHECK(out.device() == in.device(), what, ": output is on ", out.device(), " but input is on ", in.device());
}

// Gloo takes CUDA tensors for its collectives but not for point-to-point messages: with CUDA
// tensors on Gloo (MESHFUSER_CUDA_BACKEND=gloo, the shared-GPU test mode) a send goes from a host
// copy and a receive lands in a host buffer copied to the device when the receive is waited on.
bool stagesThroughHost(const c10::intrusive_ptr<c10d::Backend>& b, const at::Tensor& t) {
  return t.is_cuda() && b->getBackendName() == "gloo";
}

class StagedRecvWork : public c10d::Work {
 public:
  StagedRecvWork(c10::intrusive_ptr<c10d::Work> inner, at::Tensor host, at::Tensor device)
      : inner_(std::move(inner)), host_(std::move(host)), device_(std::move(device)) {}
  bool wait(std::chrono::milliseconds timeout) override {
    bool done = inner_->wait(timeout);
    device_.copy_(host_);
    return done;
  }
  bool isCompleted() override { return inner_->isCompleted(); }

 private:
  c10::intrusive_ptr<c10d::Work> inner_;
  at::Tensor host_, device_;
};

}  // namespace

bool Communicator::cudaOverGloo() {
  if (!initialized_ || size_ == 1) return false;
  try {
    return world_->getBackend(c10::DeviceType::CUDA)->getBackendName() == "gloo";
  } catch (const c10::Error&) {  // no backend for CUDA tensors
    return false;
  }
}

c10::intrusive_ptr<c10d::Work> Communicator::allgather(const std::vector<int64_t>& team, at::Tensor out, at::Tensor in) {
  checkBuffers("allgather", out, in);
  int64_t n = static_cast<int64_t>(team.size());
  MF_USER_ARG_CHECK(out.numel() == in.numel() * n, "allgather: output of size ", sizesOf(out), " (", out.numel(),
                    " elements) must hold ", n, " x the input of size ", sizesOf(in), " (", in.numel() * n, " elements)");
  auto b = backend(team, in.device().type());
  at::Tensor flat_out = out.view({-1});
  at::Tensor flat_in = in.view({-1});
  ++posts_;  // counted before: a post that throws half-way may have reached the peers
  return b->_allgather_base(flat_out, flat_in);
}

c10::intrusive_ptr<c10d::Work> Communicator::reduceScatter(const std::vector<int64_t>& team, at::Tensor out, at::Tensor in,
                                                           OpType op) {
  checkBuffers("reduce_scatter", out, in);
  int64_t n = static_cast<int64_t>(team.size());
  MF_USER_ARG_CHECK(in.numel() == out.numel() * n, "reduce_scatter: input of size ", sizesOf(in), " (", in.numel(),
                    " elements) must hold ", n, " x the output of size ", sizesOf(out), " (", out.numel() * n, " elements)");
  auto b = backend(team, in.device().type());
  c10d::ReduceScatterOptions opts;
  opts.reduceOp = toReduceOp(op);
  at::Tensor flat_out = out.view({-1});
  at::Tensor flat_in = in.view({-1});
  ++posts_;  // counted before: a post that throws half-way may have reached the peers
  return b->_reduce_scatter_base(flat_out, flat_in, opts);
}

c10::intrusive_ptr<c10d::Work> Communicator::allreduce(const std::vector<int64_t>& team, at::Tensor t, OpType op) {
  MF_USER_ARG_CHECK(t.is_contiguous(), "allreduce: the buffer must be contiguous");
  auto b = backend(team, t.device().type());
  c10d::AllreduceOptions opts;
  opts.reduceOp = toReduceOp(op);
  std::vector<at::Tensor> ts = {t};
  ++posts_;  // counted before: a post that throws half-way may have reached the peers
  return b->allreduce(ts, opts);
}

c10::intrusive_ptr<c10d::Work> Communicator::allToAll(const std::vector<int64_t>& team, at::Tensor out, at::Tensor in) {
  checkBuffers("alltoall", out, in);
  int64_t n = static_cast<int64_t>(team.size());
  MF_USER_ARG_CHECK(out.numel() == in.numel() && in.numel() % n == 0, "alltoall: input of size ", sizesOf(in),
                    " and output of size ", sizesOf(out), " must have equal element counts divisible by ", n);
  auto b = backend(team, in.device().type());
  std::vector<int64_t> splits;  // empty: equal splits
  at::Tensor flat_out = out.view({-1});
  at::Tensor flat_in = in.view({-1});
  ++posts_;  // counted before: a post that throws half-way may have reached the peers
  return b->alltoall_base(flat_out, flat_in, splits, splits);
}

c10::intrusive_ptr<c10d::Work> Communicator::allToAllV(const std::vector<int64_t>& team, at::Tensor out, at::Tensor in,
                                                       std::vector<int64_t> out_rows, std::vector<int64_t> in_rows) {
  checkBuffers("alltoallv", out, in);
  const size_t n = team.size();
  int64_t out_total = 0, in_total = 0;
  for (int64_t r : out_rows) out_total += r;
  for (int64_t r : in_rows) in_total += r;
  MF_USER_ARG_CHECK(out_rows.size() == n && in_rows.size() == n && out.dim() >= 1 && in.dim() >= 1 &&
                        out.size(0) == out_total && in.size(0) == in_total,
                    "alltoallv: output of size ", sizesOf(out), " and input of size ", sizesOf(in),
                    " must have as many rows as their splits over ", n, " devices (", out_total, " and ", in_total, ")");
  auto b = backend(team, in.device().type());
  ++posts_;  // counted before: a post that throws half-way may have reached the peers
  return b->alltoall_base(out, in, out_rows, in_rows);
}

c10::intrusive_ptr<c10d::Work> Communicator::broadcast(const std::vector<int64_t>& team, at::Tensor t, int64_t root) {
  int64_t root_index = indexIn(team, root);
  MF_USER_ARG_CHECK(root_index >= 0, "broadcast: root ", root, " is not in the team");
  auto b = backend(team, t.device().type());
  c10d::BroadcastOptions opts;
  opts.rootRank = root_index;
  std::vector<at::Tensor> ts = {t};
  ++posts_;  // counted before: a post that throws half-way may have reached the peers
  return b->broadcast(ts, opts);
}

c10::intrusive_ptr<c10d::Work> Communicator::send(const std::vector<int64_t>& team, at::Tensor t, int64_t peer) {
  auto b = backend(team, t.device().type());
  std::vector<at::Tensor> ts = {stagesThroughHost(b, t) ? t.cpu() : t};
  ++posts_;  // counted before: a post that throws half-way may have reached the peers
  return b->send(ts, static_cast<int>(indexIn(team, peer)), 0);
}

c10::intrusive_ptr<c10d::Work> Communicator::recv(const std::vector<int64_t>& team, at::Tensor t, int64_t peer) {
  auto b = backend(team, t.device().type());
  if (stagesThroughHost(b, t)) {
    std::vector<at::Tensor> host = {at::empty_like(t, t.options().device(at::kCPU))};
    ++posts_;
    auto work = b->recv(host, static_cast<int>(indexIn(team, peer)), 0);
    return c10::make_intrusive<StagedRecvWork>(std::move(work), host[0], t);
  }
  std::vector<at::Tensor> ts = {t};
  ++posts_;  // counted before: a post that throws half-way may have reached the peers
  return b->recv(ts, static_cast<int>(indexIn(team, peer)), 0);
}

}  // namespace mf
