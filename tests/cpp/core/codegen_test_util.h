// Shared by the codegen gtests: kernel args, a fusion with its whole-fusion segment (Case), the
// generator call, and the cases more than one test file uses.
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "codegen/kernel.h"
#include "ir/ops.h"

namespace mf {
namespace codegen_test {

inline std::vector<int64_t> contiguousStrides(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> st(sizes.size(), 1);
  for (size_t i = sizes.size(); i-- > 1;) st[i - 1] = st[i] * std::max<int64_t>(sizes[i], 1);
  return st;
}

inline KernelTensorArg arg(DataType dt, std::vector<int64_t> sizes, std::vector<int64_t> strides = {},
                           int64_t align = 16) {
  KernelTensorArg a;
  a.dtype = dt;
  a.strides = strides.empty() ? contiguousStrides(sizes) : strides;
  a.sizes = std::move(sizes);
  a.alignment_bytes = align;
  return a;
}

// A fusion, its whole-fusion segment and the args of its tensor inputs.
struct Case {
  std::string label;
  std::unique_ptr<Fusion> fusion;
  std::vector<KernelTensorArg> args;
  KernelSegment segment;
};

inline Case makeCase(std::string label, const std::function<void(Fusion&)>& build,
                     std::vector<KernelTensorArg> args) {
  Case c;
  c.label = std::move(label);
  c.fusion = std::make_unique<Fusion>();
  build(*c.fusion);
  c.args = std::move(args);
  Fusion* f = c.fusion.get();
  c.segment = makeKernelSegment(f->exprs(), [f](const Val* v) { return f->isOutput(v); });
  return c;
}

inline std::optional<GeneratedKernel> gen(const Case& c, std::string* why = nullptr, CodegenOptions o = {}) {
  std::string w;
  auto k = generateKernel(c.segment, c.args, o, &w);
  if (why != nullptr) *why = w;
  return k;
}

inline const DataType kF = DataType::Float;
inline const DataType kBF = DataType::BFloat16;
inline const DataType kH = DataType::Half;
inline const DataType kB = DataType::Bool;

inline bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

inline Case sumOf(std::vector<int64_t> shape, std::vector<int64_t> dims) {
  return makeCase("sum", [shape, dims](Fusion& f) {
    f.addOutput(reductionOp(OpType::Sum, defineTensor(f, shape, kF), dims));
  }, {arg(kF, shape)});
}

inline Case negInt64() {
  return makeCase("neg_int64", [](Fusion& f) {
    f.addOutput(unaryOp(OpType::Neg, defineTensor(f, {4, 8}, DataType::Int)));
  }, {arg(DataType::Int, {4, 8})});
}

inline Case negInt32ToInt64() {  // an int64 output the kernel computes from int32 values
  return makeCase("neg_int32_to_int64", [](Fusion& f) {
    f.addOutput(castOp(unaryOp(OpType::Neg, defineTensor(f, {4, 8}, DataType::Int32)), DataType::Int));
  }, {arg(DataType::Int32, {4, 8})});
}

inline Case expDoubleScaled() {
  return makeCase("exp_double", [](Fusion& f) {
    TensorView* e = unaryOp(OpType::Exp, defineTensor(f, {64}, DataType::Double));
    f.addOutput(binaryOp(OpType::Mul, e, defineScalar(f, DataType::Double, 0.1)));
  }, {arg(DataType::Double, {64})});
}

inline Case countTrue() {  // sum of bool is int64
  return makeCase("count_true", [](Fusion& f) {
    f.addOutput(reductionOp(OpType::Sum, defineTensor(f, {16, 33}, kB), {1}));
  }, {arg(kB, {16, 33})});
}

// softmax over the last axis of a bf16 [rows, cols] tensor, float compute.
inline Case softmaxBf16(int64_t rows, int64_t cols, std::vector<int64_t> strides = {}) {
  return makeCase("softmax", [rows, cols](Fusion& f) {
    TensorView* x = castOp(defineTensor(f, {rows, cols}, kBF), kF);
    TensorView* m = broadcastInDim(reductionOp(OpType::Max, x, {1}), {rows, 1}, {0});
    TensorView* e = unaryOp(OpType::Exp, binaryOp(OpType::Sub, x, m));
    TensorView* s = broadcastInDim(reductionOp(OpType::Sum, e, {1}), {rows, 1}, {0});
    f.addOutput(castOp(binaryOp(OpType::Div, e, s), kBF));
  }, {arg(kBF, {rows, cols}, strides)});
}

}  // namespace codegen_test
}  // namespace mf
