// Multi-rank numerics through the C++ executor: seed 001 (sharded linear + ReduceScatter) and a
// loop-split ReduceScatter, each rank checking its shard against ATen on the unsharded tensors.
#include <gtest/gtest.h>
#include <pybind11/embed.h>

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include "ir/ops.h"
#include "multidevice/communicator.h"
#include "runtime/executor.h"
#include "support/error.h"

namespace mf {
namespace {

at::Device device() {
  const char* dev = std::getenv("MESHFUSER_TEST_DEVICE");
  bool cuda = torch::cuda::is_available() && (dev == nullptr || std::string(dev) == "cuda");
  return cuda ? at::Device(at::kCUDA, Communicator::instance().localRank() % torch::cuda::device_count())
              : at::Device(at::kCPU);
}

std::vector<at::Tensor> runOnAllRanks(const Fusion& f, const std::vector<at::Tensor>& inputs) {
  std::vector<RuntimeValue> values;
  for (const at::Tensor& t : inputs) values.push_back({t, c10::Scalar(), true});
  FusionExecutor executor(f, Communicator::instance().rank());
  {
    // Team creation calls into torch.distributed.
    pybind11::gil_scoped_acquire gil;
    Communicator::instance().createTeams(executor.hostProgram().teams());
  }
  return executor.run(values);
}

TEST(ExecutorMultiRankTest, SeedLinearReduceScatter) {
  Communicator& comm = Communicator::instance();
  int64_t d = comm.size(), rank = comm.rank(), e = 8, s = 4 * d;
  DeviceMesh mesh([&] {
    std::vector<int64_t> r(d);
    for (int64_t i = 0; i < d; ++i) r[i] = i;
    return r;
  }());
  Fusion f;
  TensorView* inp = defineTensor(f, {-1, -1, d * e}, DataType::Float);
  TensorView* w = defineTensor(f, {e, d * e}, DataType::Float);
  TensorView* out = linear(inp, w);
  f.addOutput(out);
  for (TensorView* tv : {inp, w, out}) {
    tv->setDeviceMesh(mesh);
    tv->split(-1, d, false);
    tv->parallelize(-2, ParallelType::DIDx);
  }
  out->split(1, d, false);
  out->parallelize(1, ParallelType::DIDx);

  at::manual_seed(0);
  at::Tensor full_inp = at::randn({2, s, d * e});
  at::Tensor full_w = at::randn({e, d * e});
  at::Tensor local_inp = full_inp.chunk(d, -1)[rank].contiguous().to(device());
  at::Tensor local_w = full_w.chunk(d, -1)[rank].contiguous().to(device());
  auto outputs = runOnAllRanks(f, {local_inp, local_w});
  at::Tensor expected = at::linear(full_inp, full_w).chunk(d, 1)[rank];
  EXPECT_TRUE(at::allclose(outputs[0].cpu(), expected, 1e-4, 1e-4));
}

TEST(ExecutorMultiRankTest, AllreduceOfLogicalSplit) {
  Communicator& comm = Communicator::instance();
  int64_t d = comm.size(), rank = comm.rank();
  std::vector<int64_t> ranks(d);
  for (int64_t i = 0; i < d; ++i) ranks[i] = i;
  DeviceMesh mesh(ranks);
  Fusion f;
  TensorView* x = defineTensor(f, {d, 5}, DataType::Float);
  TensorView* s = reductionOp(OpType::Sum, x, {0});
  f.addOutput(s);
  x->setDeviceMesh(mesh);
  x->parallelize(0, ParallelType::DIDx);
  s->setDeviceMesh(mesh);
  s->parallelize(0, ParallelType::DIDx);
  at::manual_seed(0);
  at::Tensor full = at::randn({d, 5});
  auto outputs = runOnAllRanks(f, {full.narrow(0, rank, 1).contiguous().to(device())});
  EXPECT_TRUE(at::allclose(outputs[0].cpu(), full.sum(0), 1e-5, 1e-5));
}

// Defect: without an initialized Communicator, a program on a mesh of several devices used to skip
// its communications and return a wrong result. It is an error naming the mesh and what to set up.
TEST(ExecutorMultiRankTest, UninitializedCommunicatorOnMultiDeviceMeshIsAnError) {
  DeviceMesh mesh({0, 1});
  Fusion f;
  TensorView* x = defineTensor(f, {4, 3}, DataType::Float);
  TensorView* y = reductionOp(OpType::Sum, x, {0});
  f.addOutput(y);
  for (TensorView* tv : {x, y}) {
    tv->setDeviceMesh(mesh);
    tv->split(0, 2, false);
    tv->parallelize(0, ParallelType::DIDx);
  }
  Communicator uninitialized;
  FusionExecutor executor(f, 0, uninitialized);
  try {
    executor.run({{at::randn({2, 3}), c10::Scalar(), true}});
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(mesh.toString()), std::string::npos) << msg;
    EXPECT_NE(msg.find("Communicator is not initialized"), std::string::npos) << msg;
    EXPECT_NE(msg.find("meshfuser::Communicator"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace mf
