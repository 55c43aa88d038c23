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
std::unique_ptr<Pass> makeDecomposeReshardingsPass();
std::unique_ptr<Pass> makeFinalizeAllocationPass();

// The ordered pipeline.
std::vector<std::unique_ptr<Pass>> defaultPipeline();
// Runs the pipeline on `fusion`. `trace`, when given, receives the printed IR after each pass
// (tests compare it).
void runPipeline(Fusion& fusion, std::vector<std::pair<std::string, std::string>>* trace = nullptr);

}  // namespace mf
