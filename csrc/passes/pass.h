// The one pass interface. A pass rewrites a Fusion in place. Each pass file opens with what it
// requires and what it guarantees; the pipeline (pipeline.cpp) runs them in order, verifies the
// fusion after each, and dumps IR with MESHFUSER_DUMP=pass_ir.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ir/fusion.h"

namespace mf {

class Pass {
 public:
  virtual ~Pass() = default;
  virtual const char* name() const = 0;
  virtual void run(Fusion& fusion) = 0;
};

std::unique_ptr<Pass> makeValidateMeshesPass();
std::unique_ptr<Pass> makePropagateShardingsPass();
std::unique_ptr<Pass> makePartialGathersPass();
std::unique_ptr<Pass> makeDecomposeReshardingsPass();
std::unique_ptr<Pass> makeSumPartialsPass();
std::unique_ptr<Pass> makeFinalizeAllocationPass();

// The ordered pipeline.
std::vector<std::unique_ptr<Pass>> defaultPipeline();
// The pipeline's pass called `name`; a user error listing the names when there is none.
std::unique_ptr<Pass> makePass(const std::string& name);
// Runs one pass (or, with `with_prerequisites`, every pass up to and including it) on the fusion,
// verifying after each.
void runPass(Fusion& fusion, const std::string& name, bool with_prerequisites = false);
// Text in, text out: parses `ir`, runs the pass (as runPass) and prints the result.
std::string runPassOnText(const std::string& name, const std::string& ir, bool with_prerequisites = false);
// Runs the pipeline on `fusion`. `trace`, when given, receives the printed IR after each pass
// (tests compare it).
void runPipeline(Fusion& fusion, std::vector<std::pair<std::string, std::string>>* trace = nullptr);

}  // namespace mf
