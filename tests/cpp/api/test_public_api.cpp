// The sharded-linear and ReduceScatter cases of tests/python/multidevice/test_seeds.py, through the
// public C++ API only (<meshfuser/meshfuser.h>, no internal header, no Python). Every rank builds
// the unsharded reference from a fixed seed and checks its own shard.
#include <gtest/gtest.h>

#include <meshfuser/meshfuser.h>

#include <cstdlib>
#include <optional>

#include "api_test.h"

namespace {

using meshfuser::ParallelType;
using meshfuser_test::communicator;

int countStartingWith(const std::vector<std::string>& names, const std::string& prefix) {
  int n = 0;
  for (const auto& s : names) n += s.rfind(prefix, 0) == 0;
  return n;
}

TEST(PublicApiTest, SeedLinearReduceScatter) {
  auto& comm = communicator();
  const int64_t d = comm.size(), rank = comm.rank(), e = 16, b = 2, s = 8 * d;
  auto mesh = meshfuser::DeviceMesh::range(d);
  meshfuser::Fusion f;
  auto inp = f.defineTensor({-1, -1, d * e});
  auto w = f.defineTensor({e, d * e});
  auto out = meshfuser::ops::linear(inp, w);
  f.addOutput(out);
  for (auto* tv : {&inp, &w, &out}) {
    tv->setDeviceMesh(mesh).outerSplit(-1, d).parallelize(-2, ParallelType::MeshX).setAllocationAsLoop();
  }
  out.outerSplit(1, d).parallelize(1, ParallelType::MeshX);

  at::manual_seed(0);
  at::Tensor full_inp = at::randn({b, s, d * e});
  at::Tensor full_w = at::randn({e, d * e});
  meshfuser::Executor exec(f, comm);
  auto outputs = exec.execute({full_inp.chunk(d, -1)[rank].contiguous(), full_w.chunk(d, -1)[rank].contiguous()});
  ASSERT_EQ(outputs.size(), 1u);
  at::Tensor expected = at::linear(full_inp, full_w).chunk(d, 1)[rank];
  EXPECT_TRUE(at::allclose(outputs[0], expected, 1e-4, 1e-3)) << (outputs[0] - expected).abs().max();
  EXPECT_EQ(exec.outputShardings().at(0).axisShardedOn(ParallelType::MeshX), 1);
  auto comms = exec.communications();
  // One ReduceScatter; on one device nothing is posted.
  EXPECT_EQ(comms.size(), d > 1 ? 1u : 0u) << exec.hostProgram();
  EXPECT_EQ(countStartingWith(comms, "ReduceScatter"), d > 1 ? 1 : 0) << exec.hostProgram();
  // A second call reuses the compiled program.
  auto again = exec.execute({full_inp.chunk(d, -1)[rank].contiguous(), full_w.chunk(d, -1)[rank].contiguous()});
  EXPECT_TRUE(at::allclose(again[0], expected, 1e-4, 1e-3));
}

// The transformer-layer ops of meshfuser::ops, on one device's view: var_mean over a sharded axis
// (partial sums + Allreduces), slice/cat/pad/stride_order of the result along unsharded axes.
TEST(PublicApiTest, TransformerOpsAgainstATen) {
  auto& comm = communicator();
  const int64_t d = comm.size(), rank = comm.rank(), m = 3, k = 4 * d;
  auto mesh = meshfuser::DeviceMesh::range(d);
  meshfuser::Fusion f;
  auto x = f.defineTensor({m, k});
  auto [var, mean] = meshfuser::ops::varMean(x, {1}, 1.0, true);
  auto both = meshfuser::ops::cat({var, mean}, 1);
  auto padded = meshfuser::ops::pad(meshfuser::ops::slice(both, {1, 0}, {m, 2}), {0, 1}, -1.0);
  auto out = meshfuser::ops::strideOrder(padded, {0, 1});
  f.addOutput(out);
  x.setDeviceMesh(mesh).outerSplit(1, d).parallelize(1, ParallelType::MeshX);

  at::manual_seed(0);
  at::Tensor full = at::randn({m, k});
  meshfuser::Executor exec(f, comm);
  auto outputs = exec.execute({full.chunk(d, 1)[rank].contiguous()});
  auto [ref_var, ref_mean] = at::var_mean(full, {1}, /*correction=*/1, /*keepdim=*/true);
  at::Tensor expected = at::constant_pad_nd(at::cat({ref_var, ref_mean}, 1).slice(0, 1, m), {0, 1}, -1.0);
  EXPECT_TRUE(at::allclose(outputs.at(0), expected, 1e-5, 1e-5)) << outputs.at(0) << expected;
  EXPECT_EQ(outputs.at(0).stride(0), 1);  // stride_order {0, 1}: axis 0 innermost
  EXPECT_EQ(countStartingWith(exec.communications(), "Allreduce"), d > 1 ? 2 : 0) << exec.hostProgram();
}

TEST(PublicApiTest, ReduceScatterLoopSplit) {
  auto& comm = communicator();
  const int64_t d = comm.size(), rank = comm.rank();
  auto mesh = meshfuser::DeviceMesh::range(d);
  meshfuser::Fusion f;
  auto inp = f.defineTensor({d, d * 4, 3});
  auto out = meshfuser::ops::sum(inp, {0});
  f.addOutput(out);
  inp.setDeviceMesh(mesh).outerSplit(0, d).parallelize(0, ParallelType::MeshX);
  out.setDeviceMesh(mesh).outerSplit(0, d).parallelize(0, ParallelType::MeshX);
  out.outerSplit(-2, d).parallelize(-3, ParallelType::MeshX);

  at::manual_seed(1);
  at::Tensor full = at::randn({d, d * 4, 3});
  meshfuser::Executor exec(f, comm);
  auto outputs = exec.execute({full.chunk(d, 0)[rank].contiguous()});
  at::Tensor expected = full.sum(0).chunk(d, 0)[rank];
  EXPECT_TRUE(at::allclose(outputs.at(0), expected, 1e-5, 1e-5));
  EXPECT_EQ(exec.outputShardings().at(0).axisShardedOn(ParallelType::MeshX), 0);
  EXPECT_EQ(countStartingWith(exec.communications(), "ReduceScatter"), d > 1 ? 1 : 0) << exec.hostProgram();
}

// Sub-teams created in C++: a 2x2 mesh whose rows and columns each reduce over their own team.
TEST(PublicApiTest, TwoDimensionalMeshSubTeams) {
  auto& comm = communicator();
  if (comm.size() != 4) GTEST_SKIP() << "needs 4 ranks for a 2x2 mesh";
  const int64_t rank = comm.rank();
  meshfuser::DeviceMesh mesh({0, 1, 2, 3}, {2, 2});
  at::manual_seed(2);
  at::Tensor full = at::randn({2, 2, 5});
  const int64_t y = rank / 2, x = rank % 2;
  for (ParallelType reduced : {ParallelType::MeshX, ParallelType::MeshY}) {
    ParallelType kept = reduced == ParallelType::MeshX ? ParallelType::MeshY : ParallelType::MeshX;
    // Axis 0 on `kept`, axis 1 (reduced) on `reduced`.
    meshfuser::Fusion f;
    auto in = f.defineTensor({2, 2, 5});
    auto out = meshfuser::ops::sum(in, {1});
    f.addOutput(out);
    in.setDeviceMesh(mesh).parallelize(0, kept).parallelize(1, reduced);
    out.setDeviceMesh(mesh).parallelize(0, kept).parallelize(1, reduced);
    int64_t k = kept == ParallelType::MeshY ? y : x, r = reduced == ParallelType::MeshY ? y : x;
    meshfuser::Executor exec(f, comm);
    auto outputs = exec.execute({full.narrow(0, k, 1).narrow(1, r, 1).contiguous()});
    at::Tensor expected = full.sum(1).narrow(0, k, 1);
    EXPECT_TRUE(at::allclose(outputs.at(0), expected, 1e-5, 1e-5))
        << "reduced over " << (reduced == ParallelType::MeshX ? "MeshX" : "MeshY") << "\n" << exec.hostProgram();
  }
}

// A Communicator made from a c10d::ProcessGroup the caller already has (here: the environment one's),
// a second one on the same group: its sub-teams must not collide with the first one's.
TEST(PublicApiTest, CommunicatorFromAnExistingProcessGroup) {
  meshfuser::Communicator comm(communicator().processGroup());
  ASSERT_EQ(comm.size(), communicator().size());
  ASSERT_EQ(comm.rank(), communicator().rank());
  const int64_t d = comm.size(), rank = comm.rank();
  meshfuser::DeviceMesh mesh = d == 4 ? meshfuser::DeviceMesh({0, 1, 2, 3}, {2, 2}) : meshfuser::DeviceMesh::range(d);
  // Sum over an axis sharded on MeshX: an Allreduce over each team along MeshX (rows of a 2x2 mesh).
  meshfuser::Fusion f;
  auto in = f.defineTensor({d, 5});
  auto out = meshfuser::ops::sum(in, {0});
  f.addOutput(out);
  const int64_t x = d == 4 ? 2 : d;
  in.setDeviceMesh(mesh).outerSplit(0, x).parallelize(0, ParallelType::MeshX);
  out.setDeviceMesh(mesh).outerSplit(0, x).parallelize(0, ParallelType::MeshX);
  at::manual_seed(3);
  at::Tensor full = at::randn({d, 5});
  const int64_t per = d / x, xi = rank % x;
  meshfuser::Executor exec(f, comm);
  auto outputs = exec.execute({full.narrow(0, xi * per, per).contiguous()});
  EXPECT_TRUE(at::allclose(outputs.at(0), full.sum(0), 1e-5, 1e-5)) << exec.hostProgram();
  comm.barrier();
}

TEST(PublicApiTest, EnvironmentWithoutMasterPortIsAMeshfuserError) {
  auto saved = [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    return v ? std::optional<std::string>(v) : std::nullopt;
  };
  auto restore = [](const char* name, const std::optional<std::string>& v) {
    if (v) setenv(name, v->c_str(), 1);
    else unsetenv(name);
  };
  auto rank = saved("RANK"), size = saved("WORLD_SIZE"), port = saved("MASTER_PORT");
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "2", 1);
  unsetenv("MASTER_PORT");
  try {
    meshfuser::Communicator::fromEnvironment();
    ADD_FAILURE() << "expected a meshfuser::Error";
  } catch (const meshfuser::Error& e) {
    EXPECT_NE(std::string(e.what()).find("MASTER_PORT is not set"), std::string::npos) << e.what();
  }
  restore("RANK", rank);
  restore("WORLD_SIZE", size);
  restore("MASTER_PORT", port);
}

TEST(PublicApiTest, WrongInputIsAMeshfuserError) {
  auto& comm = communicator();
  const int64_t d = comm.size();
  meshfuser::Fusion f;
  auto inp = f.defineTensor({d * 4, 3});
  auto out = meshfuser::ops::relu(inp);
  f.addOutput(out);
  inp.setDeviceMesh(meshfuser::DeviceMesh::range(d)).outerSplit(0, d).parallelize(0, ParallelType::MeshX);
  out.setDeviceMesh(meshfuser::DeviceMesh::range(d)).outerSplit(0, d).parallelize(0, ParallelType::MeshX);
  meshfuser::Executor exec(f, comm);
  try {
    exec.execute({at::randn({5, 3})});  // every rank passes the wrong local extent
    FAIL() << "expected a meshfuser::Error";
  } catch (const meshfuser::Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected local extent 4"), std::string::npos) << e.what();
  }
}

TEST(PublicApiTest, NoOutputsIsAMeshfuserError) {
  meshfuser::Fusion f;
  f.defineTensor({4});
  EXPECT_THROW(meshfuser::Executor(f, communicator()), meshfuser::Error);
}

}  // namespace
