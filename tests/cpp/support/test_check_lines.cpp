// Tests of the CHECK-line matcher the pass tests use (check_lines.h).
#include <gtest/gtest.h>

#include "check_lines.h"

namespace mf {
namespace {

const char* kText = R"(Fusion {
  input T0_float[i0{4}, i1{6}] mesh=[0 1]
    OuterSplit(i0{4}, factor 2) -> iDIDx6{2}, i7{2}
  T1 = relu(T0)
    T1_float[i2{4}, i3{6}] mesh=[0 1]
  outputs: T1
}
)";

void expectMatch(const std::string& checks) {
  CheckLinesResult r = checkLines(kText, checks);
  EXPECT_TRUE(r.ok) << r.message;
}

// The failure message contains `why`.
void expectMismatch(const std::string& checks, const std::string& why) {
  CheckLinesResult r = checkLines(kText, checks);
  EXPECT_FALSE(r.ok) << "matched: " << checks;
  EXPECT_NE(r.message.find(why), std::string::npos) << r.message;
}

TEST(CheckLines, CheckFindsLinesInOrder) {
  expectMatch("CHECK: input T0_float\nCHECK: relu\nCHECK: outputs: T1");
  expectMismatch("CHECK: relu\nCHECK: input T0_float", "CHECK: input T0_float (checks line 2) not found at or after line 4");
  expectMismatch("CHECK: sum(", "not found");
}

TEST(CheckLines, NextMustBeTheFollowingLine) {
  expectMatch("CHECK: input\nCHECK-NEXT: OuterSplit\nCHECK-NEXT: T1 = relu");
  expectMismatch("CHECK: input\nCHECK-NEXT: T1 = relu", "not found on line 3 (the line after the previous match)");
}

TEST(CheckLines, SameStaysOnTheLineAfterTheMatch) {
  expectMatch("CHECK: T1_float\nCHECK-SAME: mesh=[0 1]");
  expectMismatch("CHECK: mesh=[0 1]\nCHECK-SAME: T1_float", "not found on line 2");
  expectMismatch("CHECK-SAME: relu", "as the first directive");
}

TEST(CheckLines, NotHoldsBetweenTheMatchesAroundIt) {
  expectMatch("CHECK: T1 = relu\nCHECK-NOT: OuterSplit\nCHECK: outputs");  // OuterSplit is before relu
  expectMismatch("CHECK: input\nCHECK-NOT: relu\nCHECK: outputs", "CHECK-NOT: relu (checks line 2) matched line 4");
  expectMatch("CHECK: outputs\nCHECK-NOT: relu");  // a trailing NOT runs to the end
  expectMismatch("CHECK-NOT: iDIDx", "matched line 3");
  expectMatch("CHECK-NOT: Allgather");
}

TEST(CheckLines, RegexAndSpaces) {
  expectMatch("CHECK: T{{[0-9]+}} = relu(T{{[0-9]+}})");
  expectMatch("CHECK: T1   =   relu");  // a run of spaces matches any run
  expectMatch("CHECK: -> iDIDx{{.*}}{2}");  // literal braces and brackets outside {{ }}
  expectMismatch("CHECK: T{{[a-z]+}} = relu", "not found");
}

TEST(CheckLines, VariablesIgnoreNumbering) {
  // The split's outputs are bound once and must reappear as named.
  expectMatch(
      "CHECK: OuterSplit([[AXIS:i[0-9]+]]{4}, factor 2) -> [[DID:iDIDx[0-9]+]]{2}, [[REST:i[0-9]+]]{2}\n"
      "CHECK: [[OUT:T[0-9]+]] = relu\n"
      "CHECK: outputs: [[OUT]]");
  expectMismatch("CHECK: [[X:T[0-9]+]] = relu\nCHECK-NEXT: [[X]]_float[i9", "not found on line 5");
  // Used again on the line that binds it: a backreference.
  expectMatch("CHECK: [[T:T[0-9]+]] = relu([[U:T[0-9]+]])\nCHECK-NEXT: [[T]]_float");
  expectMismatch("CHECK: [[T:T[0-9]+]] = relu([[T]])", "not found");
  // Groups inside a {{regex}} before a binding do not shift it.
  expectMatch("CHECK: {{(input|output)}} [[T:T[0-9]+]]_float\nCHECK: relu([[T]])");
  // A literal "[" right before a variable.
  expectMatch("CHECK: -> [[D:iDIDx[0-9]+]]{2}, [[R:i[0-9]+]]{2}\nCHECK: T1_float[[[A:i[0-9]+]]{4}, {{i[0-9]+}}{6}]");
  // Brackets that do not open a variable are literal.
  CheckLinesResult mesh2d = checkLines("  T1_float[i1{12}] mesh=[[0 1 2] [3 4 5]]\n", "CHECK: T1_float[i1{12}] mesh=[[0 1 2] [3 4 5]]");
  EXPECT_TRUE(mesh2d.ok) << mesh2d.message;
  // A CHECK-NOT can use a variable.
  expectMismatch("CHECK: [[T:T[0-9]+]] = relu\nCHECK-NOT: outputs: [[T]]", "matched line 6");
}

TEST(CheckLines, MalformedChecksFail) {
  expectMismatch("CHECK relu", "not a directive");
  expectMismatch("CHECK-NEXT: relu", "as the first directive");
  expectMismatch("CHECK: T{{[0-9]+", "unterminated {{");
  expectMismatch("CHECK: [[X:T", "unterminated [[");
  expectMismatch("CHECK: [[X]]", "variable X is used before it is bound");
  expectMismatch("CHECK-NOT: [[X:T0]]", "a CHECK-NOT cannot bind X");
  expectMismatch("CHECK: {{(}}", "bad regular expression");
  expectMismatch("CHECK:", "empty pattern");
}

TEST(CheckLines, CommentsAndBlankLinesAreAllowed) {
  expectMatch("\n  // CHECK: relu\n\n  CHECK-NEXT: T1_float\n");
}

}  // namespace
}  // namespace mf
