// uniform and embedding_fwd in the IR: the counter-based generator's words are pinned (the ATen
// path, generated kernels and tests/python/test_random.py's NumPy reference must all compute these),
// the ops print and parse back, and each runs in a segment of its own.
#include <gtest/gtest.h>

#include "host/host_program.h"
#include "ir/ops.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "passes/pass.h"
#include "support/counter_rng.h"
#include "support/error.h"

namespace mf {
namespace {

TEST(CounterRngTest, WordsArePinned) {
  std::array<uint32_t, 4> keys = mixKeys(1234, 7);
  EXPECT_EQ(keys, (std::array<uint32_t, 4>{0xbc985470u, 0xb25512b3u, 0x47f00603u, 0xe5e37ceeu}));
  const int64_t indices[] = {0, 1, 5, (int64_t{1} << 32) + 3};
  const uint32_t word0[] = {0x00c2e653u, 0xcef5c068u, 0xe3720570u, 0xa38a1cd1u};
  const uint32_t word1[] = {0xbf41245au, 0xf0551e33u, 0x314c8ac0u, 0x391b97e8u};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(randomWord(keys, indices[i], 0), word0[i]) << "index " << indices[i];
    EXPECT_EQ(randomWord(keys, indices[i], 1), word1[i]) << "index " << indices[i];
  }
  EXPECT_NE(mixKeys(1234, 8), keys);
  EXPECT_NE(mixKeys(1235, 7), keys);
}

Fusion& dropoutAndEmbedding(Fusion& f) {
  TensorView* idx = defineTensor(f, {4, 6}, DataType::Int);
  TensorView* w = defineTensor(f, {10, 8}, DataType::BFloat16);
  TensorView* emb = embeddingFwd(idx, w, 3);
  Scalar* seed = defineScalar(f, DataType::Int, std::nullopt);
  TensorView* r = uniform(f.newScalar(DataType::Double, 0.0), f.newScalar(DataType::Double, 1.0), {4, 6, 8},
                          DataType::BFloat16, seed, f.newScalar(DataType::Int, 5));
  TensorView* keep = binaryOp(OpType::Lt, r, f.newScalar(DataType::Double, 0.9));
  f.addOutput(whereOp(keep, binaryOp(OpType::Mul, emb, f.newScalar(DataType::Double, 1.0 / 0.9)),
                      f.newScalar(DataType::Double, 0.0)));
  return f;
}

TEST(RandomOpsTest, PrintAndParseBack) {
  Fusion f;
  dropoutAndEmbedding(f);
  std::string text = printFusion(f);
  EXPECT_NE(text.find("= embedding_fwd(T0, T1, padding_idx=[3])"), std::string::npos) << text;
  EXPECT_NE(text.find("= uniform(0_double, 1_double, S"), std::string::npos) << text;
  EXPECT_NE(text.find("dtype=bfloat16, shape=[4, 6, 8])"), std::string::npos) << text;
  auto parsed = parseFusion(text);
  EXPECT_EQ(printFusion(*parsed), text);
}

TEST(RandomOpsTest, SourcesAndGathersRunInSegmentsOfTheirOwn) {
  Fusion f;
  dropoutAndEmbedding(f);
  runPipeline(f);
  auto program = lowerToHostProgram(f.clone(), 0);
  // uniform and embedding_fwd each alone; the pointwise ops after them share a segment (one
  // generated kernel on GPUs).
  int alone = 0;
  for (const auto& segment : program->segments()) {
    for (const Expr* e : segment.exprs) {
      if (e->op() != OpType::Uniform && e->op() != OpType::EmbeddingFwd) continue;
      EXPECT_EQ(segment.exprs.size(), 1u) << program->toString();
      ++alone;
    }
  }
  EXPECT_EQ(alone, 2);
  // The mask's compare, the scaling and the where: one segment (host/segment_order.cpp moves the
  // compare of the uniform draw past the embedding, next to its consumers).
  EXPECT_EQ(program->segments().back().exprs.size(), 3u) << program->toString();
}

TEST(RandomOpsTest, ArgumentErrors) {
  Fusion f;
  Scalar* zero = f.newScalar(DataType::Double, 0.0);
  Scalar* one = f.newScalar(DataType::Double, 1.0);
  Scalar* seed = f.newScalar(DataType::Int, 0.0);
  EXPECT_THROW(uniform(zero, one, {2}, DataType::Int, seed, seed), UserError);
  EXPECT_THROW(uniform(one, zero, {2}, DataType::Float, seed, seed), UserError);
  EXPECT_THROW(uniform(zero, one, {2}, DataType::Float, f.newScalar(DataType::Int, -1.0), seed), UserError);
  EXPECT_THROW(uniform(zero, one, {2}, DataType::Float, seed, one), UserError);  // a double offset
  EXPECT_THROW(uniform(zero, one, {-1}, DataType::Float, seed, seed), UserError);
  TensorView* idx = defineTensor(f, {3}, DataType::Int);
  EXPECT_THROW(embeddingFwd(idx, defineTensor(f, {3}, DataType::Float)), UserError);
  EXPECT_THROW(embeddingFwd(defineTensor(f, {3}, DataType::Float), defineTensor(f, {4, 2}, DataType::Float)), UserError);
  EXPECT_THROW(embeddingFwd(idx, defineTensor(f, {4, 2}, DataType::Float), -5), UserError);
}

}  // namespace
}  // namespace mf
