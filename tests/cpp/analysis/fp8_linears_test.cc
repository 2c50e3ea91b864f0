#include "analysis/fp8_linears.h"

#include <gtest/gtest.h>

namespace shardwise::analysis {
namespace {

ir::TensorType typed(ir::DType dtype, std::vector<std::int64_t> shape) {
  return ir::TensorType{dtype, std::move(shape), {}};
}
ir::TensorType f32(std::vector<std::int64_t> shape) { return typed(ir::DType::F32, std::move(shape)); }

// A linear layer's product with its weight parameter runs in FP8: linear's [N, K] weight,
// addmm's and mm's [K, N]; K and N multiples of 16, operands float32 or bfloat16.
TEST(Fp8Linears, ALinearsProductWithItsWeightWhoseDimsDivideBy16) {
  ir::Graph g;
  const auto w_nk = g.add_value("w_nk", f32({48, 32}), ir::ValueRole::Parameter);
  const auto w_kn = g.add_value("w_kn", f32({32, 48}), ir::ValueRole::Parameter);
  const auto b = g.add_value("b", f32({48}), ir::ValueRole::Parameter);
  const auto odd = g.add_value("odd", f32({40, 32}), ir::ValueRole::Parameter);
  const auto w64 = g.add_value("w64", typed(ir::DType::F64, {48, 32}), ir::ValueRole::Parameter);
  const auto x = g.add_value("x", f32({2, 8, 32}), ir::ValueRole::Input);
  const auto rows = g.add_value("rows", f32({16, 32}), ir::ValueRole::Input);
  const auto x64 = g.add_value("x64", typed(ir::DType::F64, {2, 8, 32}), ir::ValueRole::Input);
  auto add = [&](const char* op, std::vector<ir::ValueId> in, const char* name, std::vector<std::int64_t> shape,
                 ir::Attributes attrs = {}) {
    return g.node(g.add_node(op, std::move(in), {{name, f32(std::move(shape))}}, std::move(attrs)));
  };
  const ir::Node& linear = add("aten::linear", {x, w_nk, b}, "y", {2, 8, 48});
  const ir::Node& addmm = add("aten::addmm", {b, rows, w_kn}, "a", {16, 48});
  const ir::Node& mm = add("aten::mm", {rows, w_kn}, "m", {16, 48});
  const ir::Node& scaled = add("aten::addmm", {b, rows, w_kn}, "s", {16, 48}, {{"alpha", 2.0}});
  const ir::Node& by_activation = add("aten::mm", {rows, g.node(0).outputs[0]}, "z", {16, 48});  // no parameter
  const ir::Node& not_16 = add("aten::linear", {x, odd}, "o", {2, 8, 40});
  const ir::Node& float64 = add("aten::linear", {x64, w64}, "d", {2, 8, 48});

  const auto l = fp8_linear(g, linear);
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->input, 0u);
  EXPECT_EQ(l->weight, 1u);
  EXPECT_EQ(l->weight_k_dim, 1);
  EXPECT_EQ(l->k, 32);
  EXPECT_EQ(l->n, 48);
  const auto a = fp8_linear(g, addmm);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->input, 1u);
  EXPECT_EQ(a->weight, 2u);
  EXPECT_EQ(a->weight_k_dim, 0);
  EXPECT_EQ(a->k, 32);
  EXPECT_EQ(a->n, 48);
  EXPECT_TRUE(fp8_linear(g, mm).has_value());
  EXPECT_FALSE(fp8_linear(g, scaled).has_value());         // alpha 2: not a linear layer's product
  EXPECT_FALSE(fp8_linear(g, by_activation).has_value());  // the second operand is an activation
  EXPECT_FALSE(fp8_linear(g, not_16).has_value());         // N = 40
  EXPECT_FALSE(fp8_linear(g, float64).has_value());        // torch._scaled_mm writes no float64
  EXPECT_EQ(count_fp8_linears(g), 3u);
}

}  // namespace
}  // namespace shardwise::analysis
