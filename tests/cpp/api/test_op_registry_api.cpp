// The C++ API's ops come from the op registry: ops::names() lists every op, ops::op builds each by
// name (a case per op below; a new op without one fails the walk), attributes are checked against
// the op's declaration, and attention runs from C++ through the generic form.
#include <gtest/gtest.h>

#include <meshfuser/meshfuser.h>

#include <cmath>
#include <functional>
#include <map>
#include <set>

#include "api_test.h"

namespace {

using meshfuser::DataType;
using meshfuser::Fusion;
using meshfuser::Value;
using meshfuser::ops::op;
using Build = std::function<std::vector<Value>(Fusion&)>;

const std::set<std::string> kUnary = {"set",  "neg",     "abs",  "exp",        "log",  "tanh",  "relu", "gelu",
                                      "sigmoid", "sqrt", "reciprocal", "silu", "rsqrt", "erf", "sin", "cos"};
const std::set<std::string> kBinary = {"add", "sub", "mul", "div", "maximum", "minimum", "pow",
                                       "eq",  "ne",  "lt",  "le",  "gt",      "ge"};

std::map<std::string, Build> cases() {
  auto i64 = [](int64_t v) { return meshfuser::AttrValue(v); };
  auto ints = [](std::vector<int64_t> v) { return meshfuser::AttrValue(std::move(v)); };
  std::map<std::string, Build> c;
  for (const std::string& name : kUnary) c[name] = [name](Fusion& f) { return op(name, {f.defineTensor({2, 3})}); };
  for (const std::string& name : kBinary) {
    c[name] = [name](Fusion& f) { return op(name, {f.defineTensor({2, 3}), f.defineTensor({2, 3})}); };
  }
  c["cast"] = [](Fusion& f) { return op("cast", {f.defineTensor({2, 3})}, {{"dtype", DataType::Half}}); };
  c["where"] = [](Fusion& f) {
    auto x = f.defineTensor({2, 3}), y = f.defineTensor({2, 3});
    return op("where", {op("gt", {x, y}).at(0), x, y});
  };
  c["broadcast_in_dim"] = [=](Fusion& f) {
    return op("broadcast_in_dim", {f.defineTensor({2, 3})}, {{"shape", ints({2, 4, 3})}, {"broadcast_dims", ints({0, 2})}});
  };
  c["squeeze"] = [=](Fusion& f) { return op("squeeze", {f.defineTensor({2, 1, 3})}, {{"dims", ints({1})}}); };
  c["permute"] = [=](Fusion& f) { return op("permute", {f.defineTensor({2, 3})}, {{"dims", ints({1, 0})}}); };
  c["reshape"] = [=](Fusion& f) { return op("reshape", {f.defineTensor({2, 3})}, {{"shape", ints({3, 2})}}); };
  c["slice"] = [](Fusion& f) {
    auto b = [&](double v) { return f.constant(v, DataType::Int); };
    return op("slice", {f.defineTensor({2, 3}), b(0), b(1), b(1), b(3)});
  };
  c["pad"] = [=](Fusion& f) {
    return op("pad", {f.defineTensor({2, 3}), f.constant(0.5)}, {{"pad_widths", ints({1, 2})}});
  };
  c["cat"] = [=](Fusion& f) { return op("cat", {f.defineTensor({2, 3}), f.defineTensor({1, 3})}, {{"dim", i64(0)}}); };
  c["stride_order"] = [=](Fusion& f) {
    return op("stride_order", {f.defineTensor({2, 3})}, {{"stride_order", ints({0, 1})}});
  };
  c["uniform"] = [=](Fusion& f) {
    return op("uniform", {f.constant(0.0), f.constant(1.0), f.constant(7, DataType::Int), f.constant(0, DataType::Int)},
              {{"shape", ints({2, 3})}, {"dtype", DataType::Float}});
  };
  c["embedding_fwd"] = [=](Fusion& f) {
    return op("embedding_fwd", {f.defineTensor({4}, DataType::Int), f.defineTensor({10, 3})},
              {{"padding_idx", ints({-1})}});
  };
  for (const char* name : {"sum", "max", "min"}) {
    c[name] = [=](Fusion& f) { return op(name, {f.defineTensor({2, 3})}, {{"dims", ints({1})}}); };
  }
  c["matmul"] = [](Fusion& f) { return op("matmul", {f.defineTensor({2, 3}), f.defineTensor({3, 4})}); };
  c["linear"] = [](Fusion& f) { return op("linear", {f.defineTensor({2, 3}), f.defineTensor({4, 3}), f.defineTensor({4})}); };
  c["sdpfa_fwd"] = [](Fusion& f) {
    return op("sdpfa_fwd", {f.defineTensor({1, 2, 4, 8}), f.defineTensor({1, 2, 4, 8}), f.defineTensor({1, 2, 4, 8})},
              {{"is_causal", true}});
  };
  c["sdpfa_bwd"] = [](Fusion& f) {
    auto q = f.defineTensor({1, 2, 4, 8}), k = f.defineTensor({1, 2, 4, 8}), v = f.defineTensor({1, 2, 4, 8});
    auto fwd = op("sdpfa_fwd", {q, k, v});
    return op("sdpfa_bwd", {f.defineTensor({1, 2, 4, 8}), q, k, v, fwd[0], fwd[1], fwd[2], fwd[3]});
  };
  c["grouped_mm"] = [](Fusion& f) {
    return op("grouped_mm", {f.defineTensor({6, 4}), f.defineTensor({3, 4, 5}), f.defineTensor({3}, DataType::Int32)});
  };
  c["topk"] = [=](Fusion& f) { return op("topk", {f.defineTensor({2, 3})}, {{"k", i64(2)}, {"dim", i64(-1)}}); };
  for (const char* name : {"sort", "argsort"}) {
    c[name] = [=](Fusion& f) { return op(name, {f.defineTensor({2, 3})}, {{"dim", i64(1)}, {"descending", true}}); };
  }
  c["index_select"] = [=](Fusion& f) {
    return op("index_select", {f.defineTensor({2, 3}), f.defineTensor({2}, DataType::Int)}, {{"dim", i64(0)}});
  };
  c["gather"] = [=](Fusion& f) {
    return op("gather", {f.defineTensor({2, 3}), f.defineTensor({2, 3}, DataType::Int)}, {{"dim", i64(1)}});
  };
  c["scatter"] = [=](Fusion& f) {
    return op("scatter", {f.defineTensor({2, 3}), f.defineTensor({2, 3}, DataType::Int), f.defineTensor({2, 3})},
              {{"dim", i64(1)}});
  };
  c["index_add"] = [=](Fusion& f) {
    return op("index_add", {f.defineTensor({2, 3}), f.defineTensor({2}, DataType::Int), f.defineTensor({2, 3})},
              {{"dim", i64(0)}});
  };
  c["cumsum"] = [=](Fusion& f) { return op("cumsum", {f.defineTensor({2, 3})}, {{"dim", i64(1)}}); };
  c["bincount"] = [=](Fusion& f) {
    return op("bincount", {f.defineTensor({5}, DataType::Int)}, {{"minlength", i64(4)}});
  };
  c["scatter_reduce"] = [=](Fusion& f) {
    return op("scatter_reduce", {f.defineTensor({2, 3}), f.defineTensor({2, 3}, DataType::Int), f.defineTensor({2, 3})},
              {{"dim", i64(1)}, {"reduce", std::string("amax")}});
  };
  c["triu"] = [=](Fusion& f) { return op("triu", {f.defineTensor({2, 4, 4})}, {{"diagonal", i64(1)}}); };
  return c;
}

TEST(OpRegistryApiTest, EveryRegistryOpBuildsFromCpp) {
  const auto all = cases();
  const std::vector<std::string> names = meshfuser::ops::names();
  EXPECT_GE(names.size(), 59u);
  for (const std::string& name : names) {
    auto it = all.find(name);
    ASSERT_NE(it, all.end()) << "op " << name << " has no case in this walk; add one";
    Fusion f;
    std::vector<Value> outs = it->second(f);
    ASSERT_FALSE(outs.empty()) << name;
    for (const Value& v : outs) {
      ASSERT_TRUE(v.isTensor()) << name;
      f.addOutput(v.tensor());
    }
    EXPECT_NE(f.toString().find(" = " + name + "("), std::string::npos) << f.toString();
  }
  EXPECT_EQ(all.size(), names.size()) << "a case names an op the registry does not have";
}

std::string errorOf(const std::function<void()>& build) {
  try {
    build();
  } catch (const meshfuser::Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(OpRegistryApiTest, AttributesAreCheckedAgainstTheDeclaration) {
  Fusion f;
  auto x = f.defineTensor({2, 3});
  std::string msg = errorOf([&] { op("frobnicate", {x}); });
  EXPECT_NE(msg.find("unknown op 'frobnicate'"), std::string::npos) << msg;
  msg = errorOf([&] { op("sum", {x}, {{"axes", std::vector<int64_t>{0}}}); });
  EXPECT_NE(msg.find("sum: unknown attribute 'axes'; sum takes [dims]"), std::string::npos) << msg;
  msg = errorOf([&] { op("sum", {x}); });
  EXPECT_NE(msg.find("sum: missing attribute 'dims' (int list)"), std::string::npos) << msg;
  msg = errorOf([&] { op("permute", {x}, {{"dims", true}}); });
  EXPECT_NE(msg.find("permute: attribute 'dims' must be a int list; got a bool (true)"), std::string::npos) << msg;
  msg = errorOf([&] { op("topk", {x}, {{"k", int64_t{7}}, {"dim", int64_t{1}}}); });
  EXPECT_NE(msg.find("k = 7 is out of range for axis 1"), std::string::npos) << msg;
  msg = errorOf([&] { op("add", {x}); });
  EXPECT_NE(msg.find("add takes 2-2 operands, got 1"), std::string::npos) << msg;
}

TEST(OpRegistryApiTest, AttentionThroughTheGenericForm) {
  auto& comm = meshfuser_test::communicator();
  const int64_t b = 2, h = 2, s = 5, hd = 8;
  const double scale = 0.3;
  Fusion f;
  auto q = f.defineTensor({b, h, s, hd}), k = f.defineTensor({b, h, s, hd}), v = f.defineTensor({b, h, s, hd});
  auto dy = f.defineTensor({b, h, s, hd});
  meshfuser::Attrs attrs = {{"is_causal", true}, {"scale", scale}};
  auto fwd = op("sdpfa_fwd", {q, k, v}, attrs);
  auto grads = op("sdpfa_bwd", {dy, q, k, v, fwd[0], fwd[1], fwd[2], fwd[3]}, attrs);
  f.addOutput(fwd[0].tensor());
  for (const Value& g : grads) f.addOutput(g.tensor());
  at::manual_seed(3);
  std::vector<at::Tensor> in;
  for (int i = 0; i < 4; ++i) in.push_back(at::randn({b, h, s, hd}));
  meshfuser::Executor exec(f, comm);
  auto got = exec.execute(in);
  std::vector<at::Tensor> leaves;
  for (int i = 0; i < 3; ++i) leaves.push_back(in[i].clone().set_requires_grad(true));
  at::Tensor attn = at::scaled_dot_product_attention(leaves[0], leaves[1], leaves[2], {}, 0.0, true, scale);
  attn.backward(in[3]);
  EXPECT_TRUE(at::allclose(got.at(0), attn.detach(), 1e-4, 1e-4)) << (got.at(0) - attn).abs().max();
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(at::allclose(got.at(1 + i), leaves[i].grad(), 1e-4, 1e-4)) << i;
  }
}

}  // namespace
