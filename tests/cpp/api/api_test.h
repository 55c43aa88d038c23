#pragma once

#include <meshfuser/meshfuser.h>

namespace meshfuser_test {
// This process's Communicator (from the launcher's environment), shared by every test.
meshfuser::Communicator& communicator();
}  // namespace meshfuser_test
