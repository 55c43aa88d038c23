// The sharded-linear and ReduceScatter cases of tests/python/multidevice/test_seeds.py, through the
// public C++ API only (<meshfuser/meshfuser.h>, no internal header, no Python). Every rank builds
// the unsharded reference from a fixed seed and checks its own shard.
#include <gtest/gtest.h>

#include <meshfuser/meshfuser.h>

#include <chrono>
#include <cstdlib>
#include <memory>
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

// The routing ops and column-parallel experts through the public API: top-2 of router scores,
// tokens ordered by expert, per-expert offsets, grouped_mm with the experts' columns split (no
// communication), the weighted index_add combine of the gathered result.
TEST(PublicApiTest, MixtureOfExpertsOpsAgainstATen) {
  auto& comm = communicator();
  const int64_t d = comm.size(), rank = comm.rank(), tokens = 6, hidden = 4, experts = 3, n = 2 * d;
  auto mesh = meshfuser::DeviceMesh::range(d);
  meshfuser::Fusion f;
  auto x = f.defineTensor({tokens, hidden});
  auto scores = f.defineTensor({tokens, experts});
  auto w = f.defineTensor({experts, hidden, n});
  auto [weights, chosen] = meshfuser::ops::topk(scores, 2, 1);
  auto flat = meshfuser::ops::reshape(chosen, {tokens * 2});
  auto order = meshfuser::ops::argsort(flat, 0, false, true);
  auto sorted_experts = meshfuser::ops::gather(flat, 0, order);
  auto offsets = meshfuser::ops::cast(meshfuser::ops::cumsum(meshfuser::ops::bincount(flat, experts), 0),
                                      meshfuser::DataType::Int32);
  auto rows = meshfuser::ops::indexSelect(x, 0, meshfuser::ops::cast(meshfuser::ops::mul(order, 0.5),
                                                                     meshfuser::DataType::Int));
  auto y = meshfuser::ops::groupedMm(rows, w, offsets);
  f.addOutput(weights);
  f.addOutput(sorted_experts);
  f.addOutput(y);
  w.setDeviceMesh(mesh).outerSplit(2, d).parallelize(2, ParallelType::MeshX);
  y.setDeviceMesh(mesh).outerSplit(1, d).parallelize(1, ParallelType::MeshX);
  for (auto* t : {&x, &scores}) t->setDeviceMesh(mesh);

  at::manual_seed(0);
  at::Tensor ux = at::randn({tokens, hidden}), us = at::randn({tokens, experts}), uw = at::randn({experts, hidden, n});
  meshfuser::Executor exec(f, comm);
  auto outputs = exec.execute({ux, us, uw.chunk(d, 2)[rank].contiguous()});
  auto [ref_weights, ref_chosen] = at::topk(us, 2, 1);
  at::Tensor ref_flat = ref_chosen.reshape({-1});
  at::Tensor ref_order = at::argsort(ref_flat, /*stable=*/true, 0, false);
  at::Tensor ref_rows = ux.index_select(0, at::floor_divide(ref_order, 2));
  at::Tensor ends = at::bincount(ref_flat, {}, experts).cumsum(0);
  at::Tensor ref_y = at::zeros({tokens * 2, n});
  for (int64_t g = 0, start = 0; g < experts; ++g) {
    int64_t end = ends[g].item<int64_t>();
    ref_y.slice(0, start, end).copy_(at::mm(ref_rows.slice(0, start, end), uw[g]));
    start = end;
  }
  EXPECT_TRUE(at::allclose(outputs.at(0), ref_weights));
  EXPECT_TRUE(at::equal(outputs.at(1), ref_flat.index_select(0, ref_order)));
  EXPECT_TRUE(at::allclose(outputs.at(2), ref_y.chunk(d, 1)[rank], 1e-5, 1e-5)) << outputs.at(2) << ref_y;
  EXPECT_EQ(exec.communications().size(), 0u) << exec.hostProgram();
}

// A tensor-parallel attention block through the public API: LayerNorm (var_mean, rsqrt,
// broadcast), q/k/v projections sharded on heads, causal attention per head, the output
// projection sharded on its contraction, a residual add. Megatron's plan: one Allreduce. The
// attention backward of the same heads is checked against ATen's autograd.
TEST(PublicApiTest, AttentionBlockAgainstATen) {
  using namespace meshfuser::ops;
  auto& comm = communicator();
  const int64_t d = comm.size(), rank = comm.rank(), b = 2, s = 6, h = 2 * d, hd = 4, e = h * hd;
  auto mesh = meshfuser::DeviceMesh::range(d);
  meshfuser::Fusion f;
  auto x = f.defineTensor({b, s, e});
  auto wq = f.defineTensor({e, e}), wk = f.defineTensor({e, e}), wv = f.defineTensor({e, e});
  auto wo = f.defineTensor({e, e});
  auto [var, mean] = varMean(x, {2}, /*correction=*/0.0, /*keepdim=*/false);
  auto rstd = broadcastInDim(rsqrt(add(var, 1e-5)), {b, s, e}, {0, 1});
  auto ln = mul(sub(x, broadcastInDim(mean, {b, s, e}, {0, 1})), rstd);
  auto heads = [&](const meshfuser::TensorView& w) { return permute(reshape(linear(ln, w), {b, s, h, hd}), {0, 2, 1, 3}); };
  auto q = heads(wq), k = heads(wk), v = heads(wv);
  AttentionOptions causal{std::nullopt, true, std::nullopt};
  auto fwd = sdpfaFwd(q, k, v, causal);
  auto attn = reshape(permute(fwd.attn, {0, 2, 1, 3}), {b, s, e});
  auto out = add(x, linear(attn, wo));
  f.addOutput(out);
  x.setDeviceMesh(mesh);
  for (auto* w : {&wq, &wk, &wv}) w->setDeviceMesh(mesh).outerSplit(0, d).parallelize(0, ParallelType::MeshX);
  wo.setDeviceMesh(mesh).outerSplit(1, d).parallelize(1, ParallelType::MeshX);

  at::manual_seed(0);
  at::Tensor fx = at::randn({b, s, e});
  std::vector<at::Tensor> fw;
  for (int i = 0; i < 4; ++i) fw.push_back(at::randn({e, e}) * 0.3);
  meshfuser::Executor exec(f, comm);
  auto outputs = exec.execute({fx, fw[0].chunk(d, 0)[rank].contiguous(), fw[1].chunk(d, 0)[rank].contiguous(),
                               fw[2].chunk(d, 0)[rank].contiguous(), fw[3].chunk(d, 1)[rank].contiguous()});
  at::Tensor lnr = at::layer_norm(fx, {e}, {}, {}, 1e-5);
  auto ref_heads = [&](const at::Tensor& w) { return at::linear(lnr, w).view({b, s, h, hd}).permute({0, 2, 1, 3}); };
  at::Tensor ref_attn = at::scaled_dot_product_attention(ref_heads(fw[0]), ref_heads(fw[1]), ref_heads(fw[2]), {}, 0.0,
                                                         /*is_causal=*/true);
  at::Tensor expected = fx + at::linear(ref_attn.permute({0, 2, 1, 3}).reshape({b, s, e}), fw[3]);
  EXPECT_TRUE(at::allclose(outputs.at(0), expected, 1e-4, 1e-4)) << (outputs.at(0) - expected).abs().max();
  auto comms = exec.communications();
  EXPECT_EQ(comms.size(), d > 1 ? 1u : 0u) << exec.hostProgram();
  EXPECT_EQ(countStartingWith(comms, "Allreduce"), d > 1 ? 1 : 0) << exec.hostProgram();

  // The backward of attention alone, heads sharded (no communication): grads against autograd.
  meshfuser::Fusion g;
  auto gq = g.defineTensor({b, h, s, hd}), gk = g.defineTensor({b, h, s, hd}), gv = g.defineTensor({b, h, s, hd});
  auto dy = g.defineTensor({b, h, s, hd});
  auto gf = sdpfaFwd(gq, gk, gv, causal);
  auto grads = sdpfaBwd(dy, gq, gk, gv, gf, causal);
  for (auto* t : {&grads.grad_q, &grads.grad_k, &grads.grad_v}) g.addOutput(*t);
  for (auto* t : {&gq, &gk, &gv, &dy}) t->setDeviceMesh(mesh).outerSplit(1, d).parallelize(1, ParallelType::MeshX);
  std::vector<at::Tensor> full;
  for (int i = 0; i < 4; ++i) full.push_back(at::randn({b, h, s, hd}));
  std::vector<at::Tensor> mine;
  for (const at::Tensor& t : full) mine.push_back(t.chunk(d, 1)[rank].contiguous());
  meshfuser::Executor gexec(g, comm);
  auto got = gexec.execute(mine);
  std::vector<at::Tensor> leaves;
  for (int i = 0; i < 3; ++i) leaves.push_back(full[i].clone().set_requires_grad(true));
  at::scaled_dot_product_attention(leaves[0], leaves[1], leaves[2], {}, 0.0, true).backward(full[3]);
  for (int i = 0; i < 3; ++i) {
    at::Tensor want = leaves[i].grad().chunk(d, 1)[rank];
    EXPECT_TRUE(at::allclose(got.at(i), want, 1e-4, 1e-4)) << i << ": " << (got.at(i) - want).abs().max();
  }
  EXPECT_TRUE(gexec.communications().empty()) << gexec.hostProgram();
}

// The same layer with each device's output rows in 2 stream chunks (each chunk's ReduceScatter
// overlapping the next chunk's GEMM), and with the overlap option (the ring) instead.
TEST(PublicApiTest, SeedLinearReduceScatterOverlapped) {
  auto& comm = communicator();
  const int64_t d = comm.size(), rank = comm.rank(), e = 8, b = 2, s = 4 * d;
  auto mesh = meshfuser::DeviceMesh::range(d);
  at::manual_seed(0);
  at::Tensor full_inp = at::randn({b, s, d * e});
  at::Tensor full_w = at::randn({e, d * e});
  at::Tensor expected = at::linear(full_inp, full_w).chunk(d, 1)[rank];
  for (bool ring : {false, true}) {
    meshfuser::Fusion f;
    auto inp = f.defineTensor({-1, -1, d * e});
    auto w = f.defineTensor({e, d * e});
    auto out = meshfuser::ops::linear(inp, w);
    f.addOutput(out);
    for (auto* tv : {&inp, &w, &out}) tv->setDeviceMesh(mesh).outerSplit(-1, d).parallelize(-2, ParallelType::MeshX);
    out.outerSplit(1, d).parallelize(1, ParallelType::MeshX);
    if (ring) f.setOverlap("ring");
    else out.outerSplit(2, 2).parallelize(2, ParallelType::Stream);
    meshfuser::Executor exec(f, comm);
    auto outputs = exec.execute({full_inp.chunk(d, -1)[rank].contiguous(), full_w.chunk(d, -1)[rank].contiguous()});
    EXPECT_TRUE(at::allclose(outputs[0], expected, 1e-4, 1e-3)) << (outputs[0] - expected).abs().max();
    // The program still has its one ReduceScatter; the loop runs it chunk by chunk (or as a ring).
    EXPECT_EQ(countStartingWith(exec.communications(), "ReduceScatter"), d > 1 ? 1 : 0) << exec.hostProgram();
    std::string loop = ring ? "stream loop 0: ring GEMM+ReduceScatter over " + std::to_string(d) + " chunks"
                            : "stream loop 0: GEMM+ReduceScatter over 2 chunks";
    bool looped = !ring || d > 1;  // one device: nothing for the option to overlap
    EXPECT_EQ(exec.hostProgram().find(loop) != std::string::npos, looped) << exec.hostProgram();
  }
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

// A moved-from Fusion, Executor or Communicator is an error naming it, not a null dereference; the
// object moved to works.
TEST(PublicApiTest, MovedFromObjectsAreMeshfuserErrors) {
  meshfuser::Fusion f;
  f.addOutput(meshfuser::ops::relu(f.defineTensor({4})));
  meshfuser::Fusion g(std::move(f));
  EXPECT_THROW(f.toString(), meshfuser::Error);  // NOLINT(bugprone-use-after-move): the point of the test
  EXPECT_THROW(f.defineTensor({4}), meshfuser::Error);
  EXPECT_THROW(meshfuser::Executor(f, communicator()), meshfuser::Error);
  meshfuser::Executor moved_from(g, communicator());
  meshfuser::Executor exec(std::move(moved_from));
  const at::Tensor x = at::randn({4});
  try {
    moved_from.execute({x});
    FAIL() << "expected a meshfuser::Error";
  } catch (const meshfuser::Error& e) {
    EXPECT_NE(std::string(e.what()).find("Executor was moved from"), std::string::npos) << e.what();
  }
  EXPECT_THROW(moved_from.hostProgram(), meshfuser::Error);
  EXPECT_TRUE(at::equal(exec.execute({x}).at(0), at::relu(x)));
  meshfuser::Communicator comm = communicator();
  meshfuser::Communicator comm2(std::move(comm));
  EXPECT_THROW(comm.rank(), meshfuser::Error);
  EXPECT_EQ(comm2.rank(), communicator().rank());
}

TEST(PublicApiTest, NoOutputsIsAMeshfuserError) {
  meshfuser::Fusion f;
  f.defineTensor({4});
  EXPECT_THROW(meshfuser::Executor(f, communicator()), meshfuser::Error);
}

}  // namespace

// Control messages (the per-call agreement, barriers) over the rendezvous store instead of a CPU
// collective, as for an NCCL-only group without Gloo: the same results, and a disagreement between
// ranks is still an error on every rank, after which the Communicator keeps working.
TEST(PublicApiTest, ControlMessagesOverTheStore) {
  meshfuser::Communicator::Options options;
  options.control_over_store = true;
  meshfuser::Communicator comm(communicator().processGroup(), options);
  const int64_t d = comm.size(), rank = comm.rank();
  meshfuser::Fusion f;
  auto in = f.defineTensor({-1, d * 3});
  auto out = meshfuser::ops::sum(in, {1});
  f.addOutput(out);
  auto mesh = meshfuser::DeviceMesh::range(d);
  for (auto* tv : {&in, &out}) tv->setDeviceMesh(mesh).outerSplit(1, d).parallelize(1, ParallelType::MeshX);
  meshfuser::Executor exec(f, comm);
  for (int call = 0; call < 3; ++call) {
    at::manual_seed(10 + call);
    at::Tensor full = at::randn({4, d * 3});
    auto outputs = exec.execute({full.narrow(1, rank * 3, 3).contiguous()});
    EXPECT_TRUE(at::allclose(outputs.at(0), full.sum(1), 1e-5, 1e-5)) << exec.hostProgram();
  }
  if (d > 1) {
    // Rank 0 passes 5 rows where the others pass 4: every rank must refuse the call.
    try {
      exec.execute({at::zeros({rank == 0 ? 5 : 4, 3})});
      ADD_FAILURE() << "expected a meshfuser::Error on rank " << rank;
    } catch (const meshfuser::Error& e) {
      EXPECT_NE(std::string(e.what()).find("rank"), std::string::npos) << e.what();
    }
    at::Tensor full = at::ones({4, d * 3});
    auto outputs = exec.execute({full.narrow(1, rank * 3, 3).contiguous()});
    EXPECT_TRUE(at::allclose(outputs.at(0), full.sum(1))) << exec.hostProgram();
  }
  comm.barrier();
}

// Over the store, a rank that skips a call or shut its Communicator down no longer holds the
// others for the store's own timeout (minutes): MESHFUSER_VALIDATION_TIMEOUT_S bounds the wait, and
// a rank that left ends it at once.
TEST(PublicApiTest, ControlOverTheStoreIsBoundedAndNoticesARankThatLeft) {
  const int64_t d = communicator().size();
  if (d < 2) GTEST_SKIP() << "needs 2+ ranks";
  const int64_t rank = communicator().rank();
  setenv("MESHFUSER_VALIDATION_TIMEOUT_S", "2", 1);
  meshfuser::Communicator::Options options;
  options.control_over_store = true;
  auto program = [&](meshfuser::Fusion& f) {
    auto in = f.defineTensor({4, d * 3});
    auto out = meshfuser::ops::sum(in, {1});
    f.addOutput(out);
    auto mesh = meshfuser::DeviceMesh::range(d);
    for (auto* tv : {&in, &out}) tv->setDeviceMesh(mesh).outerSplit(1, d).parallelize(1, ParallelType::MeshX);
  };
  auto expectErrorWithin = [&](meshfuser::Executor& exec, double seconds, const std::string& fragment) {
    auto start = std::chrono::steady_clock::now();
    try {
      exec.execute({at::ones({4, 3})});
      ADD_FAILURE() << "expected a meshfuser::Error on rank " << rank;
    } catch (const meshfuser::Error& e) {
      double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      EXPECT_LT(took, seconds) << e.what();
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  {  // the last rank skips the call: the others fail after about 2 s
    meshfuser::Communicator comm(communicator().processGroup(), options);
    meshfuser::Fusion f;
    program(f);
    meshfuser::Executor exec(f, comm);
    if (rank != d - 1) expectErrorWithin(exec, 20, "did not reach round");
    communicator().barrier();
  }
  {  // the last rank shuts its Communicator down: the others fail at once, not after the timeout
    setenv("MESHFUSER_VALIDATION_TIMEOUT_S", "60", 1);
    auto comm = std::make_unique<meshfuser::Communicator>(communicator().processGroup(), options);
    if (rank == d - 1) {
      comm.reset();
    } else {
      meshfuser::Fusion f;
      program(f);
      meshfuser::Executor exec(f, *comm);
      expectErrorWithin(exec, 20, "shut meshfuser down");
    }
    communicator().barrier();
  }
  unsetenv("MESHFUSER_VALIDATION_TIMEOUT_S");
}

TEST(PublicApiTest, EnvironmentForAnUnsupportedDeviceIsAMeshfuserError) {
  try {
    meshfuser::Communicator::fromEnvironment(c10::DeviceType::Meta);
    ADD_FAILURE() << "expected a meshfuser::Error";
  } catch (const meshfuser::Error& e) {
    EXPECT_NE(std::string(e.what()).find("not for meta tensors"), std::string::npos) << e.what();
  }
  if (at::hasCUDA()) return;  // a CUDA build makes an NCCL group here: the C++ example runs it on GPUs
  try {
    meshfuser::Communicator::fromEnvironment(c10::DeviceType::CUDA);
    ADD_FAILURE() << "expected a meshfuser::Error";
  } catch (const meshfuser::Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs meshfuser built against a CUDA PyTorch"), std::string::npos)
        << e.what();
  }
}
