#include <iostream>

#include "ir/printer.h"
#include "ir/verifier.h"
#include "passes/pass.h"
#include "support/options.h"

namespace mf {

std::vector<std::unique_ptr<Pass>> defaultPipeline() {
  std::vector<std::unique_ptr<Pass>> passes;
  passes.push_back(makeValidateMeshesPass());
  passes.push_back(makePropagateShardingsPass());
  passes.push_back(makeDecomposeReshardingsPass());
  passes.push_back(makeFinalizeAllocationPass());
  return passes;
}

void runPipeline(Fusion& fusion, std::vector<std::pair<std::string, std::string>>* trace) {
  verifyFusion(fusion);
  for (auto& pass : defaultPipeline()) {
    pass->run(fusion);
    verifyFusion(fusion);
    if (trace != nullptr) trace->emplace_back(pass->name(), printFusion(fusion));
    if (isDumpEnabled(DumpOption::PassIr)) std::cout << "=== after " << pass->name() << "\n" << printFusion(fusion);
  }
}

}  // namespace mf
