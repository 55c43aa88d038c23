// The per-call cross-rank agreement (runtime/agreement.h) through the C++ API: the control exchange
// is rank-major, and ranks that disagree all get a UserError that names the ranks and what differs.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

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

}  // namespace
}  // namespace mf
