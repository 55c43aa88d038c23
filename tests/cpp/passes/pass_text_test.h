// Helpers for text tests of one pass: IR in (as printFusion writes it), then CHECK lines on the IR
// out (../support/check_lines.h) or the user error it raises. The CHECK lines state what the pass
// changes; generated names are matched by pattern ([[T:T[0-9]+]], {{i[0-9]+}}), so a test keeps
// passing when numbering or the printing of unrelated attributes changes.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "../support/check_lines.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "passes/pass.h"
#include "support/error.h"

namespace mf {

// Running `pass` on `before` gives IR that satisfies `checks`.
inline void expectPass(const std::string& pass, const std::string& before, const std::string& checks) {
  std::string after = runPassOnText(pass, before);
  CheckLinesResult r = checkLines(after, checks);
  EXPECT_TRUE(r.ok) << pass << ": " << r.message;
}

// `pass` leaves `ir` as it is (compared as printed, so only a change the pass makes can fail it).
inline void expectPassUnchanged(const std::string& pass, const std::string& ir) {
  EXPECT_EQ(runPassOnText(pass, ir), printFusion(*parseFusion(ir))) << pass << " changed the IR";
}

// Running `pass` on `before` raises a user error whose message contains `message`.
inline void expectPassError(const std::string& pass, const std::string& before, const std::string& message) {
  try {
    runPassOnText(pass, before);
    ADD_FAILURE() << pass << " accepted the IR; expected an error containing: " << message;
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
  }
}

}  // namespace mf
