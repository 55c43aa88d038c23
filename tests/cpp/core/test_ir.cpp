// IR construction, printing, scheduling, rfactor, fingerprint and verifier errors.
#include <gtest/gtest.h>

#include "ir/fusion.h"
#include "ir/ops.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "support/error.h"

namespace mf {
namespace {

TEST(DeviceMeshTest, SlicesFollowMeshAxes) {
  DeviceMesh mesh({3, 4, 1, 0, 8, 2}, {2, 3});
  EXPECT_EQ(mesh.slice(1, ParallelType::DIDx), (std::vector<int64_t>{3, 4, 1}));
  EXPECT_EQ(mesh.slice(1, ParallelType::DIDy), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(mesh.size(ParallelType::DIDy), 2);
  EXPECT_EQ(mesh.toString(), "[[3 4 1] [0 8 2]]");
  EXPECT_THROW(DeviceMesh({1, 2, 0, 2}, {2, 2}), UserError);
  EXPECT_THROW(mesh.size(ParallelType::DIDz), UserError);
}

TEST(IrTest, PrintsOpsDeterministically) {
  Fusion f;
  TensorView* a = defineTensor(f, {-1, 4}, DataType::Float);
  TensorView* b = defineTensor(f, {4}, DataType::Half);
  TensorView* relu = unaryOp(OpType::Relu, a);
  TensorView* cast = castOp(b, DataType::Float);
  TensorView* c = binaryOp(OpType::Add, relu, cast);
  f.addOutput(reductionOp(OpType::Sum, c, {1}));
  const char* expected =
      "Fusion {\n"
      "  input T0_float[i0{s0}, i1{4}]\n"
      "  input T1_half[i2{4}]\n"
      "  T2 = relu(T0)\n"
      "    T2_float[i3{s0}, i4{4}]\n"
      "  T3 = cast(T1, dtype=float)\n"
      "    T3_float[i5{4}]\n"
      "  T4 = add(T2, T3)\n"
      "    T4_float[i6{s0}, i7{4}]\n"
      "  T5 = sum(T4, dims=[1])\n"
      "    T5_float[i8{s0}, r9{4}]\n"
      "  outputs: T5\n"
      "}\n";
  EXPECT_EQ(printFusion(f), expected);
}

TEST(IrTest, SplitExtentsConstantAndSymbolic) {
  Fusion f;
  TensorView* a = defineTensor(f, {-1, 12}, DataType::Float);
  a->split(1, 4, /*inner_split=*/false);
  a->split(0, 2);
  EXPECT_EQ(a->axis(0)->toString(), "i4{s0/2}");
  EXPECT_EQ(a->axis(1)->toString(), "i5{2}");
  EXPECT_EQ(a->axis(2)->toString(), "i2{4}");
  EXPECT_EQ(a->axis(3)->toString(), "i3{3}");
  a->merge(2, 3);
  EXPECT_EQ(a->axis(2)->extent().value, 12);
  EXPECT_THROW(a->split(7, 2), UserError);
}

TEST(IrTest, RFactorOfShardedLinear) {
  Fusion f;
  DeviceMesh mesh({0, 1});
  TensorView* x = defineTensor(f, {-1, 8}, DataType::Float);
  TensorView* w = defineTensor(f, {6, 8}, DataType::Float);
  TensorView* out = linear(x, w);
  f.addOutput(out);
  for (TensorView* tv : {x, w, out}) {
    tv->setDeviceMesh(mesh);
    tv->split(-1, 2, false);
    tv->parallelize(-2, ParallelType::DIDx);
  }
  TensorView* partial = out->rfactor({-1});
  verifyFusion(f);
  EXPECT_EQ(printTensor(partial),
            "T3_float[i13{s0}, i14{6}, iDIDx16{2}rf, r17{4}rf] mesh=[0 1]\n"
            "    root: [i13{s0}, i14{6}, r15{8}]\n"
            "    OuterSplit(r15{8}, factor 2) -> iDIDx16{2}rf, r17{4}rf\n");
  EXPECT_EQ(printTensor(out), "T2_float[i4{s0}, i5{6}, rDIDx18{2}] mesh=[0 1]\n");
}

TEST(IrTest, RFactorRejectsBiasAndNonReductions) {
  Fusion f;
  TensorView* x = defineTensor(f, {4, 8}, DataType::Float);
  TensorView* w = defineTensor(f, {6, 8}, DataType::Float);
  TensorView* b = defineTensor(f, {6}, DataType::Float);
  TensorView* out = linear(x, w, b);
  EXPECT_THROW(out->rfactor({-1}), UserError);
  TensorView* s = reductionOp(OpType::Sum, x, {1});
  EXPECT_THROW(s->rfactor({0}), UserError);
}

TEST(IrTest, FingerprintCoversSchedule) {
  auto build = [](bool shard) {
    auto f = std::make_unique<Fusion>();
    TensorView* a = defineTensor(*f, {4, 8}, DataType::Float);
    TensorView* b = unaryOp(OpType::Neg, a);
    f->addOutput(b);
    if (shard) {
      a->setDeviceMesh(DeviceMesh({0, 1}));
      a->split(0, 2, false);
      a->parallelize(0, ParallelType::DIDx);
    }
    return f;
  };
  EXPECT_EQ(fingerprint(*build(false)), fingerprint(*build(false)));
  EXPECT_NE(fingerprint(*build(false)), fingerprint(*build(true)));
  auto f = build(true);
  auto before = fingerprint(*f);
  static_cast<TensorView*>(f->inputs()[0])->setDeviceMesh(DeviceMesh({1, 0}));
  EXPECT_NE(before, fingerprint(*f));
  EXPECT_EQ(fingerprint(*f), fingerprint(*f->clone()));
}

TEST(VerifierTest, NamesTensorAndAxis) {
  Fusion f;
  TensorView* a = defineTensor(f, {4, 8}, DataType::Float);
  f.addOutput(unaryOp(OpType::Neg, a));
  a->setDeviceMesh(DeviceMesh({0, 1, 2}));
  a->split(0, 2, false);
  a->parallelize(0, ParallelType::DIDx);
  try {
    verifyFusion(f);
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("T0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("expected extent 3"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace mf
