// The per-call cross-rank agreement (runtime/agreement.h) through the C++ API: the control exchange
// is rank-major, and ranks that disagree all get a UserError that names the ranks and what differs.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <functional>

#include "ir/ops.h"
#include "multidevice/communicator.h"
#include "runtime/agreement.h"
#include "support/error.h"

namespace mf {
namespace {

TEST(AgreementTest, ExchangeIsRankMajorAndCountsRounds) {
  Communicator& comm = Communicator::instance();
  int64_t before = comm.rounds();
  std::vector<int64_t> all = comm.exchange({comm.rank(), 10 * comm.rank()}, "a test exchange");
  ASSERT_EQ(static_cast<int64_t>(all.size()), 2 * comm.size());
  for (int64_t r = 0; r < comm.size(); ++r) {
    EXPECT_EQ(all[2 * r], r);
    EXPECT_EQ(all[2 * r + 1], 10 * r);
  }
  EXPECT_EQ(comm.rounds(), before + 1);
}

TEST(AgreementTest, SymbolicExtentsThatDisagreeAreNamedOnEveryRank) {
  Communicator& comm = Communicator::instance();
  if (comm.size() < 2) GTEST_SKIP() << "needs 2+ ranks";
  Fusion f;
  TensorView* x = defineTensor(f, {-1, 3}, DataType::Float);
  f.addOutput(unaryOp(OpType::Relu, x));
  // Rank 0 saw a global extent of 6 for the symbolic axis, every other rank 8.
  ExtentBindings bindings = {{f.canonicalSymbol(x->logical()[0]->extent().symbol), comm.rank() == 0 ? 6 : 8}};
  std::vector<RuntimeValue> inputs(1);
  inputs[0].tensor = at::zeros({comm.rank() == 0 ? 6 : 8, 3});
  try {
    agreeOnCall(comm, f, /*fingerprint=*/42, inputs, bindings, "", /*strict=*/false);
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("input 0 axis 0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 0: 6, rank 1: 8"), std::string::npos) << msg;
  }
  // The ranks are still in step: an agreeing call passes.
  bindings.begin()->second = 8;
  agreeOnCall(comm, f, 42, inputs, bindings, "", false);
}

// Expects agreeOnCall to throw a UserError containing `fragment` on this rank.
void expectAgreementError(const std::function<void()>& call, const std::string& fragment) {
  try {
    call();
    FAIL() << "expected a UserError with: " << fragment;
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

Fusion& constantProgram() {
  static Fusion f;
  if (f.inputs().empty()) {
    TensorView* x = defineTensor(f, {4, 3}, DataType::Float);
    f.addOutput(unaryOp(OpType::Relu, x));
  }
  return f;
}

TEST(AgreementTest, DeviceKindsThatDifferAreNamedOnEveryRank) {
  Communicator& comm = Communicator::instance();
  if (comm.size() < 2) GTEST_SKIP() << "needs 2+ ranks";
  std::vector<RuntimeValue> inputs(1);
  inputs[0].tensor = at::zeros({4, 3}, at::TensorOptions().device(comm.rank() == 1 ? at::kMeta : at::kCPU));
  expectAgreementError([&] { agreeOnCall(comm, constantProgram(), 7, inputs, {}, "", false); },
                       "different kinds of device (rank 0: cpu, rank 1: meta");
}

TEST(AgreementTest, StrictModeComparesLocalShapes) {
  Communicator& comm = Communicator::instance();
  if (comm.size() < 2) GTEST_SKIP() << "needs 2+ ranks";
  // Validation is bypassed here: strict mode must catch what reaches it anyway.
  std::vector<RuntimeValue> inputs(1);
  inputs[0].tensor = at::zeros({comm.rank() == 1 ? 5 : 4, 3});
  expectAgreementError([&] { agreeOnCall(comm, constantProgram(), 7, inputs, {}, "", /*strict=*/true); },
                       "input 0 (");
  inputs[0].tensor = at::zeros({4, 3});
  agreeOnCall(comm, constantProgram(), 7, inputs, {}, "", true);
}

TEST(AgreementTest, StrictModeOnSomeRanksOnlyIsAnError) {
  Communicator& comm = Communicator::instance();
  if (comm.size() < 2) GTEST_SKIP() << "needs 2+ ranks";
  std::vector<RuntimeValue> inputs(1);
  inputs[0].tensor = at::zeros({4, 3});
  expectAgreementError([&] { agreeOnCall(comm, constantProgram(), 7, inputs, {}, "", comm.rank() == 0); },
                       "MESHFUSER_DISTRIBUTED_DEBUG differs across ranks");
}

TEST(AgreementTest, AHeaderFromSomethingElseIsOutOfStep) {
  Communicator& comm = Communicator::instance();
  if (comm.size() < 2) GTEST_SKIP() << "needs 2+ ranks";
  std::vector<RuntimeValue> inputs(1);
  inputs[0].tensor = at::zeros({4, 3});
  if (comm.rank() == comm.size() - 1) {
    comm.exchange(std::vector<int64_t>(24, 7), "not a call header");  // e.g. another version's message
  } else {
    expectAgreementError([&] { agreeOnCall(comm, constantProgram(), 7, inputs, {}, "", false); },
                         "the ranks are out of step: rank(s) " + std::to_string(comm.size() - 1));
  }
}

}  // namespace
}  // namespace mf
