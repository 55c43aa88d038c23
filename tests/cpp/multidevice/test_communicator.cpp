// The Communicator's collectives from C++, checked against arithmetic every rank can do locally,
// on 1..N ranks, including the row and column teams of a 2-D mesh when there are 4 ranks.
#include <gtest/gtest.h>
#include <pybind11/embed.h>

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include "ir/device_mesh.h"
#include "multidevice/communicator.h"
#include "support/error.h"

namespace mf {
namespace {

at::Device testDevice() {
  const char* dev = std::getenv("MESHFUSER_TEST_DEVICE");
  bool cuda = torch::cuda::is_available() && (dev == nullptr || std::string(dev) == "cuda");
  return cuda ? at::Device(at::kCUDA, Communicator::instance().localRank() % torch::cuda::device_count()) : at::Device(at::kCPU);
}

std::vector<int64_t> world() {
  std::vector<int64_t> team(Communicator::instance().size());
  for (size_t i = 0; i < team.size(); ++i) team[i] = static_cast<int64_t>(i);
  return team;
}

// Rank r's contribution: a deterministic tensor every rank can rebuild.
at::Tensor contribution(int64_t r, int64_t n) {
  return at::arange(n, at::kFloat) * 10 + static_cast<double>(r);
}

TEST(CommunicatorTest, AllgatherMatchesConcatenation) {
  Communicator& comm = Communicator::instance();
  int64_t d = comm.size(), n = 6;
  at::Tensor in = contribution(comm.rank(), n).to(testDevice());
  at::Tensor out = at::empty({d * n}, in.options());
  comm.allgather(world(), out, in)->wait();
  std::vector<at::Tensor> parts;
  for (int64_t r = 0; r < d; ++r) parts.push_back(contribution(r, n));
  EXPECT_TRUE(at::equal(out.cpu(), at::cat(parts)));
}

TEST(CommunicatorTest, ReduceScatterMatchesSumOfChunks) {
  Communicator& comm = Communicator::instance();
  int64_t d = comm.size(), n = 4;
  at::Tensor in = contribution(comm.rank(), d * n).to(testDevice());
  at::Tensor out = at::empty({n}, in.options());
  comm.reduceScatter(world(), out, in, OpType::Sum)->wait();
  at::Tensor expected = at::zeros({d * n});
  for (int64_t r = 0; r < d; ++r) expected += contribution(r, d * n);
  EXPECT_TRUE(at::allclose(out.cpu(), expected.narrow(0, comm.rank() * n, n)));
}

TEST(CommunicatorTest, AllreduceMax) {
  Communicator& comm = Communicator::instance();
  at::Tensor t = contribution(comm.rank(), 5).to(testDevice());
  comm.allreduce(world(), t, OpType::Max)->wait();
  EXPECT_TRUE(at::equal(t.cpu(), contribution(comm.size() - 1, 5)));
}

TEST(CommunicatorTest, MismatchedSizesFailBeforePosting) {
  Communicator& comm = Communicator::instance();
  at::Tensor in = at::zeros({3}, at::TensorOptions().device(testDevice()));
  at::Tensor out = at::zeros({3 * comm.size() + 1}, in.options());
  try {
    comm.allgather(world(), out, in);
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("[" + std::to_string(3 * comm.size() + 1) + "]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[3]"), std::string::npos) << msg;
  }
}

TEST(CommunicatorTest, TwoDimensionalMeshTeams) {
  Communicator& comm = Communicator::instance();
  if (comm.size() != 4) GTEST_SKIP() << "needs 4 ranks for a 2x2 mesh";
  DeviceMesh mesh({0, 1, 2, 3}, {2, 2});
  std::vector<std::vector<int64_t>> teams;
  for (ParallelType pt : {ParallelType::DIDx, ParallelType::DIDy}) {
    for (auto& t : mesh.allSlices(pt)) teams.push_back(t);
  }
  {
    pybind11::gil_scoped_acquire gil;
    comm.createTeams(teams);
  }
  for (ParallelType pt : {ParallelType::DIDx, ParallelType::DIDy}) {
    auto team = mesh.slice(comm.rank(), pt);
    at::Tensor t = contribution(comm.rank(), 3).to(testDevice());
    comm.allreduce(team, t, OpType::Sum)->wait();
    at::Tensor expected = contribution(team[0], 3) + contribution(team[1], 3);
    EXPECT_TRUE(at::allclose(t.cpu(), expected)) << "team along " << toString(pt);
  }
}

}  // namespace
}  // namespace mf
