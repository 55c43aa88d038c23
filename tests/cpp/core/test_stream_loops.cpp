// Stream loops (host/stream_loops.cpp): which contraction + communication pairs a stream axis turns
// into a loop, the printed loop, the errors for stream axes that cannot be honoured, and the
// parser round trip of swizzled axes and the overlap option.
#include <gtest/gtest.h>

#include "host/host_program.h"
#include "ir/ops.h"
#include "ir/parser.h"
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

// Row-parallel linear, output rows reduce-scattered over 2 devices: [8 rows] = [2 devices][chunks][rows].
std::unique_ptr<Fusion> rowParallel(int64_t chunks, bool ring) {
  auto f = std::make_unique<Fusion>();
  DeviceMesh mesh({0, 1});
  TensorView* x = defineTensor(*f, {8, 4}, DataType::Float);
  TensorView* w = defineTensor(*f, {3, 4}, DataType::Float);
  TensorView* out = linear(x, w);
  f->addOutput(out);
  for (TensorView* tv : {x, w, out}) shardLastAxis(tv, mesh);
  out->split(0, 2, false);
  out->parallelize(0, ParallelType::DIDx);
  if (chunks > 0) {
    out->split(1, chunks, false);
    out->parallelize(1, ParallelType::Stream);
  }
  if (ring) {
    x->split(0, 2, false);
    x->parallelize(0, ParallelType::Stream);
    x->swizzle1d(0, ParallelType::DIDx);
  }
  return f;
}

std::unique_ptr<HostProgram> lower(std::unique_ptr<Fusion> f, int64_t rank) {
  runPipeline(*f);
  return lowerToHostProgram(std::move(f), rank);
}

TEST(StreamLoopsTest, ChunkedGemmReduceScatterReplacesThePair) {
  auto hp = lower(rowParallel(2, false), 1);
  ASSERT_EQ(hp->streamLoops().size(), 1u);
  const StreamLoop& loop = hp->streamLoops()[0];
  EXPECT_EQ(loop.kind, StreamLoopKind::GemmReduceScatter);
  EXPECT_EQ(loop.chunks, 2);
  EXPECT_EQ(loop.blocks, 2);
  EXPECT_EQ(loop.x_row_axis, 0);
  EXPECT_EQ(loop.result_row_axis, 0);
  std::string text = hp->toString();
  // One loop instruction in place of the linear's segment, its post and its wait.
  EXPECT_EQ(text.find("\n  post 0"), std::string::npos) << text;
  EXPECT_EQ(text.find("\n  wait 0"), std::string::npos) << text;
  EXPECT_NE(text.find("  stream loop 0: GEMM+ReduceScatter over 2 chunks of rows [2 blocks][2 chunks][rows/4] (stream "
                      "axis of T2 axis 0) {\n"
                      "    for chunk i in 0..2 (one stream each, up to 2 worker streams; events order them):\n"
                      "      run segment 0 on rows of chunk i: T3 = linear(T0, T1)\n"
                      "      post 0 on chunk i: ReduceScatter T2 <- T3"),
            std::string::npos)
      << text;
}

TEST(StreamLoopsTest, RingIsChosenBySwizzle) {
  auto hp = lower(rowParallel(0, true), 0);
  ASSERT_EQ(hp->streamLoops().size(), 1u);
  EXPECT_EQ(hp->streamLoops()[0].kind, StreamLoopKind::RingGemmReduceScatter);
  EXPECT_EQ(hp->streamLoops()[0].chunks, 2);
  EXPECT_NE(hp->toString().find("post send of the sum to the previous rank"), std::string::npos) << hp->toString();
}

TEST(StreamLoopsTest, WithoutStreamAxesNothingChanges) {
  auto hp = lower(rowParallel(0, false), 0);
  EXPECT_TRUE(hp->streamLoops().empty());
}

TEST(StreamLoopsTest, OverlapOptionLoopsEverySuitablePair) {
  auto f = rowParallel(0, false);
  f->setOverlap("chunked");
  auto hp = lower(std::move(f), 0);
  ASSERT_EQ(hp->streamLoops().size(), 1u);
  EXPECT_TRUE(hp->streamLoops()[0].chunks_adjustable);
  EXPECT_EQ(effectiveChunks(hp->streamLoops()[0], 8), 4);  // 8 rows = 2 blocks x 4 chunks x 1
  EXPECT_EQ(effectiveChunks(hp->streamLoops()[0], 6), 3);
  EXPECT_EQ(effectiveChunks(hp->streamLoops()[0], 2), 1);
}

TEST(StreamLoopsTest, StreamOnAWeightCannotBeStreamed) {
  auto f = rowParallel(0, false);
  TensorView* w = static_cast<TensorView*>(f->inputs()[1]);
  w->split(0, 3, false);
  w->parallelize(0, ParallelType::Stream);
  try {
    lower(std::move(f), 0);
    FAIL() << "expected a user error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("ParallelType.stream on T1 axis 0 cannot be streamed"), std::string::npos)
        << e.what();
  }
}

TEST(StreamLoopsTest, StreamMustBeAWholeAxisOrTheOuterPartOfASplit) {
  auto f = rowParallel(0, false);
  TensorView* x = static_cast<TensorView*>(f->inputs()[0]);
  x->split(0, 4, false);
  x->parallelize(1, ParallelType::Stream);  // the inner part
  try {
    runPipeline(*f);
    FAIL() << "expected a user error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("a stream axis must be a whole axis of constant extent or the outer part"),
              std::string::npos)
        << e.what();
  }
}

TEST(StreamLoopsTest, UnevenChunksAreRefusedForTheRun) {
  auto hp = lower(rowParallel(2, false), 0);
  EXPECT_EQ(checkStreamLoopExtents(*hp, {}), "");  // 8 rows = 2 x 2 x 2
  auto odd = lower(rowParallel(3, false), 0);     // 8 rows do not split into 2 x 3
  EXPECT_EQ(checkStreamLoopExtents(*odd, {}),
            "T2 axis 0: extent 8 does not split into 2 blocks of 3 stream chunks (6 equal parts); uneven stream "
            "chunks are not supported");
}

TEST(StreamLoopsTest, SwizzleAndOverlapRoundTripThroughTheParser) {
  auto f = rowParallel(0, true);
  f->setOverlap("auto");
  std::string text = printFusion(*f);
  EXPECT_NE(text.find("  overlap: auto\n"), std::string::npos) << text;
  EXPECT_NE(text.find("iStream"), std::string::npos) << text;
  EXPECT_NE(text.find("~DIDx"), std::string::npos) << text;
  auto parsed = parseFusion(text);
  EXPECT_EQ(printFusion(*parsed), text);
  EXPECT_EQ(fingerprint(*parsed), fingerprint(*f));
  auto plain = rowParallel(0, true);
  EXPECT_NE(fingerprint(*plain), fingerprint(*f));  // the option keys the caches
}

TEST(StreamLoopsTest, UnknownOverlapModeIsAUserError) {
  Fusion f;
  EXPECT_THROW(f.setOverlap("fast"), UserError);
}

}  // namespace
}  // namespace mf
