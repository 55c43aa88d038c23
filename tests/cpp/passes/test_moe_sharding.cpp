// Sharding of the mixture-of-experts ops: a device split on an axis the op does not read across
// passes through with no communication; a split on the axis it reads across (the sorted axis,
// grouped_mm's token rows) is gathered before the op.
#include <gtest/gtest.h>

#include "ir/ops.h"
#include "multidevice/sharding.h"
#include "passes/pass.h"

namespace mf {
namespace {

const DeviceMesh kMesh({0, 1});

void shardOn(TensorView* tv, int64_t axis) {
  tv->setDeviceMesh(kMesh);
  if (axis < 0) return;
  tv->split(axis, 2, /*inner_split=*/false);
  tv->parallelize(axis, ParallelType::DIDx);
}

int64_t reshardingSets(const Fusion& f) {
  int64_t n = 0;
  for (const Expr* e : f.exprs()) n += e->op() == OpType::Set && isResharding(e);
  return n;
}

TEST(MoeSharding, RowsSplitPassThroughArgsortAndTopk) {
  Fusion f;
  TensorView* x = defineTensor(f, {4, 6}, DataType::Float);
  shardOn(x, 0);
  TensorView* order = argsort(x, 1);
  auto [values, indices] = topk(x, 2, 1);
  f.addOutput(order);
  f.addOutput(values);
  f.addOutput(indices);
  runPass(f, "decompose_reshardings", /*with_prerequisites=*/true);
  EXPECT_EQ(reshardingSets(f), 0);
  for (TensorView* out : {order, values, indices}) EXPECT_EQ(shardedAxis(out, ParallelType::DIDx), 0);
}

TEST(MoeSharding, SortedAxisSplitIsGatheredFirst) {
  Fusion f;
  TensorView* x = defineTensor(f, {4, 6}, DataType::Float);
  shardOn(x, 1);
  TensorView* order = argsort(x, 1);
  f.addOutput(order);
  runPass(f, "decompose_reshardings", /*with_prerequisites=*/true);
  EXPECT_EQ(reshardingSets(f), 1);
  const auto* in = static_cast<const TensorView*>(order->definition()->input(0));
  EXPECT_EQ(shardedAxis(in, ParallelType::DIDx), -1);
  EXPECT_EQ(shardedAxis(order, ParallelType::DIDx), -1);
}

// Column-parallel experts: mat2 [experts, k, n] split on n gives out [m, n] split on n locally.
TEST(MoeSharding, GroupedMmColumnsPassThrough) {
  Fusion f;
  TensorView* tokens = defineTensor(f, {8, 4}, DataType::Float);
  TensorView* w = defineTensor(f, {3, 4, 6}, DataType::Float);
  TensorView* offsets = defineTensor(f, {3}, DataType::Int32);
  shardOn(tokens, -1);
  shardOn(offsets, -1);
  shardOn(w, 2);
  TensorView* out = groupedMm(tokens, w, offsets);
  f.addOutput(out);
  runPass(f, "decompose_reshardings", /*with_prerequisites=*/true);
  EXPECT_EQ(reshardingSets(f), 0);
  EXPECT_EQ(shardedAxis(out, ParallelType::DIDx), 1);
}

// Tokens split across devices meet offsets that count every token: the rows are gathered first.
TEST(MoeSharding, GroupedMmTokenRowsAreGathered) {
  Fusion f;
  TensorView* tokens = defineTensor(f, {8, 4}, DataType::Float);
  TensorView* w = defineTensor(f, {3, 4, 6}, DataType::Float);
  TensorView* offsets = defineTensor(f, {3}, DataType::Int32);
  shardOn(tokens, 0);
  shardOn(offsets, -1);
  shardOn(w, -1);
  TensorView* out = groupedMm(tokens, w, offsets);
  f.addOutput(out);
  runPass(f, "decompose_reshardings", /*with_prerequisites=*/true);
  EXPECT_EQ(reshardingSets(f), 1);
  EXPECT_EQ(shardedAxis(out, ParallelType::DIDx), -1);
}

// The weighted combine with the hidden axis split (tensor-parallel experts) stays local.
TEST(MoeSharding, IndexAddHiddenSplitPassesThrough) {
  Fusion f;
  TensorView* x = defineTensor(f, {5, 8}, DataType::Float);
  TensorView* index = defineTensor(f, {6}, DataType::Int);
  TensorView* src = defineTensor(f, {6, 8}, DataType::Float);
  shardOn(x, 1);
  shardOn(index, -1);
  shardOn(src, 1);
  TensorView* out = indexAdd(x, 0, index, src);
  f.addOutput(out);
  runPass(f, "decompose_reshardings", /*with_prerequisites=*/true);
  EXPECT_EQ(reshardingSets(f), 0);
  EXPECT_EQ(shardedAxis(out, ParallelType::DIDx), 1);
}

}  // namespace
}  // namespace mf
