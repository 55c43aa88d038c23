// gtest main for the public C++ API tests: no Python anywhere. The Communicator comes from the
// launcher's environment (torchrun --no-python, or RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set
// by hand); alone, the binary runs as rank 0 of 1.
#include <gtest/gtest.h>

#include <meshfuser/meshfuser.h>

#include "api_test.h"

namespace meshfuser_test {
meshfuser::Communicator& communicator() {
  static meshfuser::Communicator comm = meshfuser::Communicator::fromEnvironment();
  return comm;
}
}  // namespace meshfuser_test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  meshfuser_test::communicator();
  int rc = RUN_ALL_TESTS();
  meshfuser_test::communicator().barrier();
  return rc;
}
