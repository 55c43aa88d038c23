// meshfuser's C++ API: define a sharded program with global shapes, schedule it on device meshes,
// and run it on every rank with local at::Tensor shards. Link meshfuser::meshfuser
// (find_package(meshfuser)); see docs/cpp_api.md and examples/cpp/.
#pragma once

#include "meshfuser/communicator.h"
#include "meshfuser/error.h"
#include "meshfuser/executor.h"
#include "meshfuser/fusion.h"

namespace meshfuser {
const char* version();
}
