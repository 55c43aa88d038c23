// Generated kernels beyond pointwise and single reductions: normalizations (softmax, multi-pass),
// middle-axis reductions, double and integer compute. Golden fragments of the CUDA text.
#include <gtest/gtest.h>

#include "codegen_test_util.h"

namespace mf {
namespace {

using namespace codegen_test;  // NOLINT: the shared cases and helpers

TEST(CodegenTest, DoubleAndIntegerKernelsComputeInDouble) {
  // An int64 input may hold values past 2^53, which double compute would round: ATen runs it.
  std::string why;
  EXPECT_FALSE(gen(negInt64(), &why).has_value());
  EXPECT_TRUE(contains(why, "is int64: kernels compute integers in double, exact below 2^53 only")) << why;
  auto neg = gen(negInt32ToInt64());
  ASSERT_TRUE(neg.has_value()) << why;
  EXPECT_TRUE(contains(neg->source, "long long* __restrict__ T2")) << neg->source;
  // -(-2^31) wraps to -2^31 in int32, as PyTorch gives, before the cast to int64.
  EXPECT_TRUE(contains(neg->source, "const double t1 = (double)(int)(long long)(-t0);")) << neg->source;
  EXPECT_TRUE(contains(neg->source, "o2.v[k] = (long long)(t2);")) << neg->source;
  auto e = gen(expDoubleScaled());
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(contains(e->source, "= exp(t0);") && !contains(e->source, "expf(t0)")) << e->source;
  EXPECT_TRUE(contains(e->source, "0.10000000000000001")) << e->source;  // a double literal, not 0.1f
  auto count = gen(countTrue());
  ASSERT_TRUE(count.has_value());
  EXPECT_EQ(count->scheduler, "reduction");
  EXPECT_TRUE(contains(count->source, "double t1 = 0.0;")) << count->source;
}

TEST(CodegenTest, MiddleAxisReductionIsAnOuterReductionPerSlice) {
  auto k = gen(sumOf({6, 1000, 40}, {1}));
  ASSERT_TRUE(k.has_value());
  EXPECT_EQ(k->scheduler, "reduction");
  EXPECT_TRUE(contains(k->source, "(col / 40) * mf_count * 40 + j * 40 + col % 40")) << k->source;
  EXPECT_EQ(k->count, 1000);  // the reduced extent, a launch argument
}

TEST(CodegenTest, SoftmaxIsOneNormalizationKernel) {
  auto k = gen(softmaxBf16(32768, 4096));
  ASSERT_TRUE(k.has_value());
  EXPECT_EQ(k->scheduler, "normalization");
  EXPECT_EQ((std::vector<int64_t>{k->launch.block_x, k->launch.block_y}), (std::vector<int64_t>{128, 1}));
  EXPECT_TRUE(contains(k->source, "3 loop(s) over the row, persistent (4 groups per thread in registers)"))
      << k->source;
  // x is read once into registers (one 16-byte load per group), the output written once; a block
  // per row (the grid covers every row: rows are handed to SMs as slots free up).
  EXPECT_TRUE(contains(k->source, "mf_c0[it] = *reinterpret_cast<const mf_array<mf_bf16, 8>*>(T0 + ro0 + j);"))
      << k->source;
  EXPECT_EQ(k->launch.grid_x, 32768);
  EXPECT_EQ(k->launch.shared_mem_bytes, 0);
  // 512-thread rows (at most two blocks per SM) copy the block's next row into shared memory by
  // cp.async while this one computes; the grid is one wave striding over the rows.
  auto wide = gen(softmaxBf16(8192, 16384));
  ASSERT_TRUE(wide.has_value());
  EXPECT_EQ(wide->launch.block_x, 512);
  EXPECT_TRUE(contains(wide->source, "mf_cp_async<16>(&mf_s0[it][threadIdx.x], T0 + (mf_row * 16384) + j);"))
      << wide->source;
  EXPECT_TRUE(contains(wide->source, "mf_c0[it] = mf_s0[it][threadIdx.x];")) << wide->source;
  EXPECT_EQ(wide->launch.shared_mem_bytes, 4 * 512 * 16);
  EXPECT_LT(wide->launch.grid_x, 8192);
  auto multi = gen(softmaxBf16(8, 1 << 20));
  ASSERT_TRUE(multi.has_value());
  EXPECT_TRUE(contains(multi->source, "multi-pass")) << multi->source;
}

// ---- launch configs ----

}  // namespace
}  // namespace mf

namespace mf {
namespace {

using namespace codegen_test;  // NOLINT: the shared cases and helpers

// Another outer extent, same choices: the same source (one compile serves both), only the count
// (a launch argument) and the launch differ. One definition (as with symbolic extents), two args.
TEST(CodegenShapeClassTest, OuterExtentIsALaunchArgumentNotText) {
  struct Variant {
    Case c;
    std::vector<int64_t> other_shape;
    int64_t count, other_count;
  };
  std::vector<Variant> variants;
  variants.push_back({sumOf({1000, 4096}, {1}), {1237, 4096}, 1000, 1237});  // inner reduction: rows
  variants.push_back({sumOf({5000, 96}, {0}), {7001, 96}, 5000, 7001});      // outer: reduced rows
  variants.push_back({softmaxBf16(1000, 4096), {1999, 4096}, 1000, 1999});   // normalization: rows
  for (Variant& v : variants) {
    auto ka = gen(v.c);
    v.c.args[0].sizes = v.other_shape;
    v.c.args[0].strides = {v.other_shape[1], 1};
    auto kb = gen(v.c);
    ASSERT_TRUE(ka.has_value() && kb.has_value()) << v.c.label;
    EXPECT_EQ(ka->source, kb->source) << v.c.label;
    EXPECT_EQ(ka->name, kb->name);
    EXPECT_EQ(ka->count, v.count);
    EXPECT_EQ(kb->count, v.other_count);
  }
}

// What changes the code still changes the source: another inner extent, or an index width.
TEST(CodegenShapeClassTest, InnerExtentAndIndexWidthStillSpecialize) {
  EXPECT_NE(gen(sumOf({1000, 4096}, {1}))->source, gen(sumOf({1000, 2048}, {1}))->source);
  EXPECT_NE(gen(softmaxBf16(1000, 4096))->source, gen(softmaxBf16(1 << 20, 4096))->source);  // 2^32 elements: 64-bit
}

}  // namespace
}  // namespace mf
