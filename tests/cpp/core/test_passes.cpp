// Golden IR after the whole pass pipeline and golden host programs for the lowering table
// (one pass at a time on IR text: tests/cpp/passes/).
#include <gtest/gtest.h>

#include <algorithm>

#include "host/host_program.h"
#include "ir/ops.h"
#include "ir/printer.h"
#include "passes/pass.h"
#include "support/error.h"

namespace mf {
namespace {

void shardLastAxis(TensorView* tv, const DeviceMesh& mesh) {
  tv->setDeviceMesh(mesh);
  tv->split(-1, static_cast<int64_t>(mesh.size()), false);
  tv->parallelize(-2, ParallelType::DIDx);
}

// Seed 001: linear + ReduceScatter becomes a local partial product and one ReduceScatter.
std::unique_ptr<Fusion> seedLinearReduceScatter() {
  auto f = std::make_unique<Fusion>();
  DeviceMesh mesh({0, 1});
  TensorView* inp = defineTensor(*f, {-1, 8, 4}, DataType::Float);
  TensorView* w = defineTensor(*f, {3, 4}, DataType::Float);
  TensorView* out = linear(inp, w);
  f->addOutput(out);
  for (TensorView* tv : {inp, w, out}) shardLastAxis(tv, mesh);
  out->split(1, 2, false);
  out->parallelize(1, ParallelType::DIDx);
  return f;
}

TEST(PassesTest, SeedLinearReduceScatterDecomposes) {
  auto f = seedLinearReduceScatter();
  std::vector<std::pair<std::string, std::string>> trace;
  runPipeline(*f, &trace);
  // The IR after decompose_reshardings, wherever it sits in the pipeline.
  auto after = std::find_if(trace.begin(), trace.end(), [](const auto& t) { return t.first == "decompose_reshardings"; });
  ASSERT_NE(after, trace.end());
  EXPECT_EQ(after->second,
            "Fusion {\n"
            "  input T0_float[i0{s0}, i1{8}, i2{4}] mesh=[0 1]\n"
            "    OuterSplit(i2{4}, factor 2) -> iDIDx9{2}, i10{2}\n"
            "    loop: [i0{s0}, i1{8}, iDIDx9{2}, i10{2}]\n"
            "  input T1_float[i3{3}, i4{4}] mesh=[0 1]\n"
            "    OuterSplit(i4{4}, factor 2) -> iDIDx11{2}, i12{2}\n"
            "    loop: [i3{3}, iDIDx11{2}, i12{2}]\n"
            "  T3 = linear(T0, T1)\n"
            "    T3_float[i17{s0}, i18{8}, i19{3}, iDIDx23{2}rf, r24{2}rf] mesh=[0 1]\n"
            "    root: [i17{s0}, i18{8}, i19{3}, r20{4}]\n"
            "    OuterSplit(r20{4}, factor 2) -> iDIDx23{2}rf, r24{2}rf\n"
            "    OuterSplit(i18{8}, factor 2) -> i21{2}, i22{4}\n"
            "    loop: [i17{s0}, i21{2}, i22{4}, i19{3}, iDIDx23{2}rf, r24{2}rf]\n"
            "  T2 = sum(T3, dims=[3])\n"
            "    T2_float[i5{s0}, i6{8}, i7{3}, rDIDx25{2}] mesh=[0 1]\n"
            "    OuterSplit(i6{8}, factor 2) -> iDIDx15{2}, i16{4}\n"
            "    loop: [i5{s0}, iDIDx15{2}, i16{4}, i7{3}, rDIDx25{2}]\n"
            "  outputs: T2\n"
            "}\n");
  auto hp = lowerToHostProgram(std::move(f), 1);
  EXPECT_EQ(hp->toString(),
            "HostProgram (rank 1) {\n"
            "  run segment 0: T3 = linear(T0, T1)\n"
            "  release input T0\n"
            "  release input T1\n"
            "  post 0: ReduceScatter T2 <- T3 on DIDx team=[0 1] out_axis=1 reduced_axis=3 op=sum layout: drop(3) send=blocks(1, copy)\n"
            "  wait 0\n"
            "  deallocate T3\n"
            "  outputs: T2\n"
            "}\n");
}

struct LoweringCase {
  const char* name;
  bool in_sharded;
  bool out_sharded;
  int64_t out_axis;  // which axis the output shards (when out_sharded)
  const char* expected_comm;
};

TEST(LoweringTest, SetTable) {
  std::vector<LoweringCase> cases = {
      {"allgather", true, false, 0, "Allgather"},
      {"local slice", false, true, 0, "LocalSlice"},
      {"alltoall", true, true, 1, "AllToAll"},
  };
  for (const auto& c : cases) {
    auto f = std::make_unique<Fusion>();
    DeviceMesh mesh({0, 1, 2});
    TensorView* in = defineTensor(*f, {6, 9}, DataType::Float);
    TensorView* out = unaryOp(OpType::Set, in);
    f->addOutput(out);
    in->setDeviceMesh(mesh);
    out->setDeviceMesh(mesh);
    if (c.in_sharded) {
      in->split(0, 3, false);
      in->parallelize(0, ParallelType::DIDx);
    }
    if (c.out_sharded) {
      out->split(c.out_axis, 3, false);
      out->parallelize(c.out_axis, ParallelType::DIDx);
    }
    runPipeline(*f);
    auto hp = lowerToHostProgram(std::move(f), 2);
    ASSERT_EQ(hp->communications().size(), 1u) << c.name;
    EXPECT_EQ(toString(hp->communications()[0].type), std::string(c.expected_comm)) << c.name;
    EXPECT_EQ(hp->communications()[0].team, (std::vector<int64_t>{0, 1, 2})) << c.name;
  }
}

// The buffer layout of each communication is decided at lowering and printed.
TEST(LoweringTest, CommunicationLayoutIsPlannedAndPrinted) {
  auto lowered = [](int64_t in_axis, int64_t out_axis, int64_t rows) {
    auto f = std::make_unique<Fusion>();
    DeviceMesh mesh({0, 1, 2});
    TensorView* in = defineTensor(*f, {rows, 9}, DataType::Float);
    TensorView* out = unaryOp(OpType::Set, in);
    f->addOutput(out);
    in->setDeviceMesh(mesh);
    out->setDeviceMesh(mesh);
    for (auto [tv, axis] : {std::make_pair(in, in_axis), std::make_pair(out, out_axis)}) {
      if (axis < 0) continue;
      tv->split(axis, 3, false);
      tv->parallelize(axis, ParallelType::DIDx);
    }
    runPipeline(*f);
    return lowerToHostProgram(std::move(f), 0)->communications().at(0).layout.toString();
  };
  EXPECT_EQ(lowered(0, -1, 6), "recv=merge(0)");                 // Allgather
  EXPECT_EQ(lowered(-1, 1, 6), "slice(1)");                      // LocalSlice
  EXPECT_EQ(lowered(0, 1, 6), "send=blocks(1, copy) recv=merge(0)");  // AllToAll: rows stay outside
  EXPECT_EQ(lowered(0, 1, 3), "send=blocks(1, view) recv=merge(0)");  // one local row: no copy
}

TEST(LoweringTest, TwoDimensionalMeshUsesRowOrColumnTeams) {
  auto f = std::make_unique<Fusion>();
  DeviceMesh mesh({0, 1, 2, 3}, {2, 2});
  TensorView* in = defineTensor(*f, {4, 6}, DataType::Float);
  TensorView* out = unaryOp(OpType::Set, in);
  f->addOutput(out);
  in->setDeviceMesh(mesh);
  out->setDeviceMesh(mesh);
  in->split(0, 2, false);
  in->parallelize(0, ParallelType::DIDy);
  in->split(2, 2, false);
  in->parallelize(2, ParallelType::DIDx);
  out->split(1, 2, false);
  out->parallelize(1, ParallelType::DIDx);  // keeps DIDx, gathers DIDy
  runPipeline(*f);
  auto hp = lowerToHostProgram(std::move(f), 3);
  ASSERT_EQ(hp->communications().size(), 1u);
  EXPECT_EQ(hp->communications()[0].type, CommunicationType::Allgather);
  EXPECT_EQ(hp->communications()[0].pt, ParallelType::DIDy);
  EXPECT_EQ(hp->communications()[0].team, (std::vector<int64_t>{1, 3}));  // rank 3's column
}

TEST(LoweringTest, RowParallelLinearWithBiasAddsBiasOnce) {
  auto f = std::make_unique<Fusion>();
  DeviceMesh mesh({0, 1});
  TensorView* x = defineTensor(*f, {4, 8}, DataType::Float);
  TensorView* w = defineTensor(*f, {6, 8}, DataType::Float);
  TensorView* b = defineTensor(*f, {6}, DataType::Float);
  TensorView* out = linear(x, w, b);
  f->addOutput(out);
  shardLastAxis(x, mesh);
  shardLastAxis(w, mesh);
  b->setDeviceMesh(mesh);
  shardLastAxis(out, mesh);
  runPipeline(*f);
  auto hp = lowerToHostProgram(std::move(f), 0);
  ASSERT_EQ(hp->communications().size(), 1u);
  EXPECT_EQ(hp->communications()[0].type, CommunicationType::Allreduce);
  // The bias add runs after the Allreduce.
  const auto& insts = hp->instructions();
  size_t wait_pos = 0, add_pos = 0;
  for (size_t i = 0; i < insts.size(); ++i) {
    if (insts[i].kind == HostInstruction::Kind::Wait) wait_pos = i;
    if (insts[i].kind == HostInstruction::Kind::RunSegment &&
        hp->segments()[insts[i].index].toString().find("add") != std::string::npos) add_pos = i;
  }
  EXPECT_GT(add_pos, wait_pos) << hp->toString();
}

TEST(PassesTest, InputWithoutMeshIsAUserError) {
  Fusion f;
  TensorView* a = defineTensor(f, {4}, DataType::Float);
  TensorView* b = defineTensor(f, {4}, DataType::Float);
  f.addOutput(binaryOp(OpType::Add, a, b));
  a->setDeviceMesh(DeviceMesh({0}));
  try {
    runPipeline(f);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("fusion input T1 has no device mesh"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mf

namespace mf {
namespace {

TEST(PassesTest, SetChangingTwoMeshAxesBecomesAChain) {
  auto f = std::make_unique<Fusion>();
  DeviceMesh mesh({0, 1, 2, 3}, {2, 2});
  TensorView* in = defineTensor(*f, {8, 12}, DataType::Float);
  TensorView* out = unaryOp(OpType::Set, in);
  f->addOutput(out);
  for (TensorView* tv : {in, out}) tv->setDeviceMesh(mesh);
  in->split(0, 2, false);
  in->parallelize(0, ParallelType::DIDy);
  in->split(2, 2, false);
  in->parallelize(2, ParallelType::DIDx);
  out->split(1, 2, false);
  out->parallelize(1, ParallelType::DIDy);  // DIDx gathered, DIDy moves from axis 0 to axis 1
  runPipeline(*f);
  auto hp = lowerToHostProgram(std::move(f), 3);
  ASSERT_EQ(hp->communications().size(), 2u) << hp->toString();
  EXPECT_EQ(hp->communications()[0].pt, ParallelType::DIDx) << hp->toString();
  EXPECT_EQ(hp->communications()[0].type, CommunicationType::Allgather) << hp->toString();
  EXPECT_EQ(hp->communications()[1].type, CommunicationType::AllToAll) << hp->toString();
  EXPECT_EQ(hp->communications()[1].team, (std::vector<int64_t>{1, 3})) << hp->toString();
}

}  // namespace
}  // namespace mf
