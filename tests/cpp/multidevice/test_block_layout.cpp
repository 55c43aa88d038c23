// The blocked layout of a communicated axis (runtime/block_layout.h), shared by single
// communications and stream loops: a round trip, and the divisibility check both paths rely on.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <string>

#include "runtime/block_layout.h"
#include "support/error.h"

namespace mf {
namespace {

TEST(BlockLayout, BlocksOutermostAreTheAxisCutInOrder) {
  at::Tensor t = at::arange(24, at::kFloat).reshape({2, 6, 2});
  at::Tensor blocks = blocksOutermost(t, 1, 3);  // [3, 2, 2, 2]: block i holds rows 2i, 2i+1 of axis 1
  ASSERT_EQ(blocks.sizes().vec(), (std::vector<int64_t>{3, 2, 2, 2}));
  for (int64_t i = 0; i < 3; ++i) EXPECT_TRUE(at::equal(blocks[i], t.narrow(1, 2 * i, 2))) << "block " << i;
  EXPECT_TRUE(at::equal(mergeBlocks(blocks, 1), t));
}

// The stream loop's per-chunk ReduceScatter cut its send buffer with a copy of this helper that
// had no check: an indivisible chunk would have been reshaped into wrong blocks (or failed inside
// ATen). Both paths now raise the same internal error.
TEST(BlockLayout, IndivisibleExtentIsAnInternalError) {
  at::Tensor t = at::zeros({5, 3});
  try {
    blocksOutermost(t, 0, 2);
    ADD_FAILURE() << "blocksOutermost accepted an extent of 5 for 2 blocks";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("axis 0 of extent 5 does not split into 2 blocks"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace mf
