// Helpers for text tests of one pass: IR in (as printFusion writes it), IR or an error out.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "ir/parser.h"
#include "ir/printer.h"
#include "passes/pass.h"
#include "support/error.h"

namespace mf {

// `pass` turns `before` into `after`; `before` must also read back exactly as written.
inline void expectPass(const std::string& pass, const std::string& before, const std::string& after) {
  EXPECT_EQ(printFusion(*parseFusion(before)), before) << "the input IR does not print back as written";
  EXPECT_EQ(runPassOnText(pass, before), after);
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
