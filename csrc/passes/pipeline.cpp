#include <iostream>

#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "passes/pass.h"
#include "support/error.h"
#include "support/log.h"
#include "support/options.h"

namespace mf {

std::vector<std::unique_ptr<Pass>> defaultPipeline() {
  std::vector<std::unique_ptr<Pass>> passes;
  passes.push_back(makeValidateMeshesPass());
  passes.push_back(makePropagateShardingsPass());
  passes.push_back(makePartialGathersPass());
  passes.push_back(makeDecomposeReshardingsPass());
  passes.push_back(makeSumPartialsPass());
  passes.push_back(makeFinalizeAllocationPass());
  return passes;
}

std::unique_ptr<Pass> makePass(const std::string& name) {
  std::string names;
  for (auto& pass : defaultPipeline()) {
    if (pass->name() == name) return std::move(pass);
    names += std::string(names.empty() ? "" : ", ") + pass->name();
  }
  MF_USER_ARG_CHECK(false, "no pass named '", name, "'; the passes are ", names);
  return nullptr;
}

void runPass(Fusion& fusion, const std::string& name, bool with_prerequisites) {
  std::unique_ptr<Pass> target = makePass(name);
  verifyFusion(fusion);
  if (with_prerequisites) {
    for (auto& pass : defaultPipeline()) {
      if (pass->name() == name) break;
      pass->run(fusion);
      verifyFusion(fusion);
    }
  }
  target->run(fusion);
  verifyFusion(fusion);
}

std::string runPassOnText(const std::string& name, const std::string& ir, bool with_prerequisites) {
  auto fusion = parseFusion(ir);
  runPass(*fusion, name, with_prerequisites);
  return printFusion(*fusion);
}

void runPipeline(Fusion& fusion, std::vector<std::pair<std::string, std::string>>* trace) {
  verifyFusion(fusion);
  for (auto& pass : defaultPipeline()) {
    pass->run(fusion);
    verifyFusion(fusion);
    if (trace != nullptr) trace->emplace_back(pass->name(), printFusion(fusion));
    if (isDumpEnabled(DumpOption::PassIr)) logText("pass_ir", std::string("=== after ") + pass->name() + "\n" + printFusion(fusion));
  }
}

}  // namespace mf
