// The IR parser: printed IR reads back into a fusion that prints identically, and malformed
// text is a user error naming the line.
#include <gtest/gtest.h>

#include "ir/ops.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "passes/pass.h"
#include "support/error.h"

namespace mf {
namespace {

void expectRoundTrip(const Fusion& f) {
  std::string text = printFusion(f);
  auto parsed = parseFusion(text);
  EXPECT_EQ(printFusion(*parsed), text);
  EXPECT_EQ(fingerprint(*parsed), fingerprint(f));
}

TEST(ParserTest, RoundTripsOpsScalarsAndLayouts) {
  Fusion f;
  TensorView* a = defineTensor(f, {-1, 6}, DataType::BFloat16, {true, false}, {1, 0});
  TensorView* b = defineTensor(f, {-1, 6}, DataType::BFloat16);
  Scalar* s = defineScalar(f, DataType::Double, std::nullopt);
  TensorView* c = binaryOp(OpType::Add, a, b);  // unifies the two symbols
  TensorView* d = binaryOp(OpType::Mul, c, s);
  TensorView* e = binaryOp(OpType::Sub, d, f.newScalar(DataType::Double, 1.0000001));
  TensorView* g = castOp(unaryOp(OpType::Sigmoid, e), DataType::Float);
  TensorView* h = reductionOp(OpType::Max, g, {1});
  TensorView* k = broadcastInDim(h, {-1, 3}, {0});
  TensorView* w = defineTensor(f, {2, 3}, DataType::Float);
  TensorView* r = reshape(permute(w, {1, 0}), {6});
  TensorView* q = whereOp(binaryOp(OpType::Gt, r, f.newScalar(DataType::Double, 0.5)), r,
                          f.newScalar(DataType::Double, -2.0));
  f.addOutput(k);
  f.addOutput(q);
  expectRoundTrip(f);
}

TEST(ParserTest, RoundTripsShapeOpsAndDerivedExtents) {
  Fusion f;
  TensorView* x = defineTensor(f, {-1, 8}, DataType::Float);
  TensorView* y = defineTensor(f, {-1, 8}, DataType::Float);
  Scalar* start = defineScalar(f, DataType::Int, std::nullopt);
  TensorView* sliced =
      slice(x, {start, f.newScalar(DataType::Int, 0)}, {size(x, 0), f.newScalar(DataType::Int, 8)}, {1, 2});
  TensorView* padded = pad(y, {0, 0, 0, 3}, f.newScalar(DataType::Double, 0.5));
  TensorView* joined = cat({x, padded}, 0);
  TensorView* heads = reshapeExtents(x, {size(x, 0), f.newScalar(DataType::Int, 2), f.newScalar(DataType::Int, -1)});
  auto [var, mean] = varMean(joined, {0}, 1.0, true);
  f.addOutput(sliced);
  f.addOutput(strideOrder(heads, {0, 2, 1}));
  f.addOutput(var);
  f.addOutput(mean);
  expectRoundTrip(f);
  std::string text = printFusion(f);
  // Derived extents: the scalar-bounded slice, the pad and the cat (printed inside the axes).
  // (The slice start is normalized as PyTorch does when the call binds S0: sliceIndex.)
  for (const char* extent : {"{s0-(sliceIndex(S0, s0))}", "{s1+3}", "{s0+(s1+3)}"}) {
    EXPECT_NE(text.find(extent), std::string::npos) << extent << " not in\n" << text;
  }
}

TEST(ParserTest, RoundTripsShardedProgramsAfterEveryPass) {
  Fusion f;
  DeviceMesh mesh({0, 1, 2, 3}, {2, 2});
  TensorView* x = defineTensor(f, {-1, 8, 4}, DataType::Float);
  TensorView* w = defineTensor(f, {6, 4}, DataType::Float);
  TensorView* b = defineTensor(f, {6}, DataType::Float);
  TensorView* out = linear(x, w, b);
  f.addOutput(out);
  for (TensorView* tv : {x, w, out}) {
    tv->setDeviceMesh(mesh);
    tv->split(-1, 2, false);
    tv->parallelize(-2, ParallelType::DIDx);
  }
  b->setDeviceMesh(mesh);
  out->split(1, 2, false);
  out->parallelize(1, ParallelType::DIDy);
  expectRoundTrip(f);
  for (auto& pass : defaultPipeline()) {
    pass->run(f);
    expectRoundTrip(f);
  }
}

// Attention: several outputs per expr (one header each), its attributes, 0-d RNG-state tensors;
// sharded on heads, through every pass.
TEST(ParserTest, RoundTripsAttentionWithSeveralOutputs) {
  Fusion f;
  DeviceMesh mesh({0, 1});
  std::vector<TensorView*> qkvg;
  for (int i = 0; i < 4; ++i) qkvg.push_back(defineTensor(f, {-1, 4, 8, 16}, DataType::BFloat16));
  AttentionOptions options;
  options.dropout_p = 0.125;
  options.is_causal = true;
  auto fwd = sdpfaFwd(qkvg[0], qkvg[1], qkvg[2], options);
  options.scale = 0.25;
  auto grads = sdpfaBwd(qkvg[3], qkvg[0], qkvg[1], qkvg[2], fwd[0], fwd[1], fwd[2], fwd[3], options);
  for (TensorView* tv : {fwd[0], fwd[1], grads[0], grads[1], grads[2]}) f.addOutput(tv);
  for (TensorView* tv : qkvg) {
    tv->setDeviceMesh(mesh);
    tv->split(1, 2, false);
    tv->parallelize(1, ParallelType::DIDx);
  }
  std::string text = printFusion(f);
  EXPECT_NE(text.find("T4, T5, T6, T7 = sdpfa_fwd(T0, T1, T2, dropout_p=0.125, is_causal=true, scale=none)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("T6_int64[]"), std::string::npos) << text;
  expectRoundTrip(f);
  for (auto& pass : defaultPipeline()) {
    pass->run(f);
    expectRoundTrip(f);
  }
}

TEST(ParserTest, RoundTripsMixtureOfExpertsOps) {
  Fusion f;
  TensorView* x = defineTensor(f, {6, 4}, DataType::Float);
  TensorView* w = defineTensor(f, {3, 4, 5}, DataType::Float);
  TensorView* offsets = defineTensor(f, {3}, DataType::Int32);
  auto [weights, experts] = topk(x, 2, -1, /*largest=*/false, /*sorted=*/true);
  TensorView* flat = reshape(experts, {12});
  auto [sorted, order] = sort(flat, 0, /*descending=*/true, /*stable=*/true);
  TensorView* rows = indexSelect(x, 0, argsort(flat, 0, false, true));
  TensorView* counts = cumsum(bincount(sorted, 3), 0, DataType::Int32);
  TensorView* picked = gather(x, 1, experts);
  f.addOutput(groupedMm(x, w, offsets));
  f.addOutput(weights);
  f.addOutput(order);
  f.addOutput(rows);
  f.addOutput(counts);
  f.addOutput(scatter(x, 1, experts, picked));
  f.addOutput(indexAdd(x, 0, reshape(order, {12}), indexSelect(x, 0, order)));
  expectRoundTrip(f);
  std::string text = printFusion(f);
  for (const char* attrs : {"k=2, dim=1, largest=false, sorted=true", "dim=0, descending=true, stable=true",
                            "minlength=3", "dtype=int32, dim=0)"}) {
    EXPECT_NE(text.find(attrs), std::string::npos) << attrs << " not in\n" << text;
  }
}

TEST(ParserTest, MalformedTextIsAUserErrorNamingTheLine) {
  auto message = [](const std::string& text) {
    try {
      parseFusion(text);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("Fusion {\n  input T0_float[i0{4}]\n  T1 = frobnicate(T0)\n    T1_float[i1{4}]\n  outputs: T1\n}\n")
                .find("line 3: unknown op 'frobnicate'"),
            std::string::npos);
  EXPECT_NE(message("Fusion {\n  input T0_float[i0{4}]\n  T1 = neg(T7)\n    T1_float[i1{4}]\n  outputs: T1\n}\n")
                .find("unknown operand 'T7'"),
            std::string::npos);
  EXPECT_NE(message("Fusion {\n  input T0_float[x0{4}]\n  outputs: T0\n}\n").find("must start with i, r or b"),
            std::string::npos);
  EXPECT_NE(message("Fusion {\n  input T0_float[i0{4}]\n").find("unexpected end"), std::string::npos);
  EXPECT_NE(message("Fusion {\n  input T0_float[i0{4}]\n  T1 = neg(T0)\n    T2_float[i1{4}]\n  outputs: T1\n}\n")
                .find("defines T1 but the next line describes T2"),
            std::string::npos);
}

TEST(PassDriverTest, UnknownPassNameListsThePasses) {
  try {
    makePass("fuse_everything");
    FAIL() << "expected an error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("validate_meshes, propagate_shardings"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mf
