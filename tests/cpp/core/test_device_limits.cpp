// Device limits and the scheduler parameters derived from them: the sm_90 table gives the numbers
// the H200 measurements chose, other architectures change what their limits force, and the
// launch configurations follow the limits given to generateKernel.
#include <gtest/gtest.h>

#include "codegen/device_limits.h"
#include "codegen/heuristics.h"
#include "codegen/kernel.h"
#include "codegen_test_util.h"
#include "ir/ops.h"
#include "support/error.h"

namespace mf {
namespace {

using namespace codegen_test;  // NOLINT: the shared cases and helpers
using codegen::NormalizationParams;
using codegen::PointwiseParams;
using codegen::ReductionParams;
using codegen::TransposeParams;

Case tanhFloat(std::vector<int64_t> shape) {
  return makeCase("tanh", [shape](Fusion& f) { f.addOutput(unaryOp(OpType::Tanh, defineTensor(f, shape, kF))); },
                  {arg(kF, shape)});
}

TEST(DeviceLimitsTest, DefaultIsTheSm90Table) {
  EXPECT_EQ(DeviceLimits{}, deviceLimitsForArch("sm_90"));
  EXPECT_EQ(knownArchitectures(),
            (std::vector<std::string>{"sm_80", "sm_86", "sm_87", "sm_89", "sm_90", "sm_100", "sm_120"}));
  for (const std::string& arch : knownArchitectures()) {
    DeviceLimits d = deviceLimitsForArch(arch);
    EXPECT_NO_THROW(checkDeviceLimits(d)) << arch;
    EXPECT_EQ("sm_" + std::to_string(d.compute_capability), arch);
  }
}

TEST(DeviceLimitsTest, Sm90ParamsAreTheMeasuredConstants) {
  const DeviceLimits h200;
  TransposeParams t = TransposeParams::forDevice(h200);
  EXPECT_EQ(t.tile_a, 64);
  EXPECT_EQ(t.lanes_b, 16);
  EXPECT_EQ(t.block_x * t.block_y, 256);
  EXPECT_EQ(t.tile_bytes_cap, 40960);
  EXPECT_EQ(t.blocks_per_sm, 4);
  NormalizationParams n = NormalizationParams::forDevice(h200);
  EXPECT_EQ(n.staged_bytes_per_block, 96 * 1024);
  EXPECT_TRUE(n.can_stage);
  EXPECT_EQ(n.max_row_threads, 512);
  EXPECT_EQ(n.registers_per_sm / (512 * n.registers_for_two_blocks), 2);  // __launch_bounds__(512, 2)
  EXPECT_EQ(PointwiseParams::forDevice(h200).threads_per_sm, 2048);
  ReductionParams r = ReductionParams::forDevice(h200);
  EXPECT_EQ(r.few_rows_max_block, 1024);
  EXPECT_EQ(r.outer_block, 512);
  EXPECT_EQ(r.warps_per_block, 8);
}

TEST(DeviceLimitsTest, SmallerSharedMemoryShrinksTilesAndStagedRows) {
  // sm_86: 100 KiB per SM. Four transpose blocks get 25 KiB less 1 KiB reserved each; two staged
  // normalization blocks 50 KiB less 2 KiB.
  const DeviceLimits a40 = deviceLimitsForArch("sm_86");
  EXPECT_EQ(TransposeParams::forDevice(a40).tile_bytes_cap, 24 * 1024);
  EXPECT_EQ(NormalizationParams::forDevice(a40).staged_bytes_per_block, 48 * 1024);
  EXPECT_EQ(PointwiseParams::forDevice(a40).threads_per_sm, 1536);
  // sm_80: 164 KiB per SM, still 40 KiB of tiles (the static limit's share), 80 KiB staged.
  const DeviceLimits a100 = deviceLimitsForArch("sm_80");
  EXPECT_EQ(TransposeParams::forDevice(a100).tile_bytes_cap, 40960);
  EXPECT_EQ(NormalizationParams::forDevice(a100).staged_bytes_per_block, 80 * 1024);
  // A device without cp.async (before sm_80) never stages.
  DeviceLimits old = withOverrides(a100, {{"compute_capability", 75}});
  EXPECT_FALSE(NormalizationParams::forDevice(old).can_stage);
  // Half the register file: two transpose blocks of 256 threads at 64 registers.
  EXPECT_EQ(TransposeParams::forDevice(withOverrides(DeviceLimits{}, {{"registers_per_sm", 32768}})).blocks_per_sm, 2);
}

TEST(DeviceLimitsTest, OverridesAreChecked) {
  EXPECT_EQ(withOverrides(DeviceLimits{}, {{"sm_count", 54}}).sm_count, 54);
  EXPECT_THROW(withOverrides(DeviceLimits{}, {{"sms", 1}}), UserError);
  EXPECT_THROW(withOverrides(DeviceLimits{}, {{"max_threads_per_block", 4096}}), UserError);
  EXPECT_THROW(withOverrides(DeviceLimits{}, {{"max_vector_bytes", 12}}), UserError);
  EXPECT_THROW(deviceLimitsForArch("sm_70"), UserError);
}

TEST(DeviceLimitsTest, LaunchesFollowTheLimits) {
  // Pointwise over 2^24 floats (2^22 groups of 4): one wave of 256-thread blocks.
  CodegenOptions o;
  auto grid = [&](const CodegenOptions& opts) {
    auto k = gen(tanhFloat({4096, 4096}), nullptr, opts);
    EXPECT_TRUE(k.has_value());
    return k ? k->launch.grid_x : 0;
  };
  EXPECT_EQ(grid(o), 132 * 2048 / 256);
  o.device = deviceLimitsForArch("sm_89");  // 142 SMs x 1536 threads
  EXPECT_EQ(grid(o), 142 * 1536 / 256);
  // The text does not hold the grid: the same source for both.
  CodegenOptions h200;
  EXPECT_EQ(gen(tanhFloat({4096, 4096}), nullptr, o)->source, gen(tanhFloat({4096, 4096}), nullptr, h200)->source);
  // The heuristics text names the device, the parameters and the choices.
  const std::string text = gen(tanhFloat({4096, 4096}), nullptr, o)->heuristics;
  EXPECT_NE(text.find("device: sm_89 [L40S (sm_89 table)]"), std::string::npos) << text;
  EXPECT_NE(text.find("pointwise params: "), std::string::npos) << text;
  EXPECT_NE(text.find("grid 852"), std::string::npos) << text;
  // Limits no device has are refused before anything is generated.
  o.device.warp_size = 64;
  EXPECT_THROW(gen(tanhFloat({4096, 4096}), nullptr, o), UserError);
}

}  // namespace
}  // namespace mf
