// Reads the text printFusion writes back into a Fusion: print -> parse -> print is the identity.
// Pass tests use it to state a pass's input and expected output as a few lines of IR.
#pragma once

#include <memory>
#include <string>

#include "ir/fusion.h"

namespace mf {

// Parses printed IR. A malformed line is a user error naming the line number and what was expected.
std::unique_ptr<Fusion> parseFusion(const std::string& text);

}  // namespace mf
