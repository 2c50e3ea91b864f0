#include "cost/op_cost.h"

#include <gtest/gtest.h>

#include "ir/graph.h"

namespace shardwise::cost {
namespace {

DeviceType a100() { return {"a100", {1.95e13, 1.56e14, 3.12e14, 3.12e14}, 80LL << 30, 2.039e12}; }

ir::TensorType bf16(std::vector<std::int64_t> shape, std::optional<int> batch_dim = std::nullopt) {
  ir::TensorType t;
  t.dtype = ir::DType::BF16;
  t.shape = std::move(shape);
  t.batch_dim = batch_dim;
  return t;
}

TEST(OpCost, MatmulFollowsTheEfficiencyCurve) {
  ir::Graph g;
  ir::ValueId x = g.add_value("x", bf16({2048, 4096}, 0), ir::ValueRole::Input);
  ir::ValueId w = g.add_value("w", bf16({4096, 4096}), ir::ValueRole::Parameter);
  g.add_node("aten::mm", {x, w}, {{"y", bf16({2048, 4096}, 0)}});
  AnalyticCostModel model;
  OpTime t = model.node_time(g, g.node(0), a100(), Precision::BF16, {});
  // d = 2*2048*4096^2 / (2 * (2048*4096*2 + 4096^2)) = 1024; eff = 0.75 * 1024 / 1120.
  double flops = 2.0 * 2048 * 4096 * 4096;
  double eff = 0.75 * 1024 / (1024 + 96);
  EXPECT_NEAR(t.forward, flops / (3.12e14 * eff), 1e-9);
  EXPECT_NEAR(t.backward, 2 * t.forward, 1e-12);
  EXPECT_TRUE(t.contraction);

  // Column split by 4 and batch x2: output and weight / 4, input x2.
  OpTime s = model.node_time(g, g.node(0), a100(), Precision::BF16, {2.0, 4, TensorSplit::Column});
  double m = 4096, k = 4096, n = 1024;
  double d = (m * k * n) / (m * k + k * n + m * n);
  EXPECT_NEAR(s.forward, 2 * m * k * n / (3.12e14 * 0.75 * d / (d + 96)), 1e-9);
}

TEST(OpCost, PointwiseIsMemoryBoundAndViewsAreFree) {
  ir::Graph g;
  ir::ValueId x = g.add_value("x", bf16({2048, 4096}, 0), ir::ValueRole::Input);
  ir::NodeId gelu = g.add_node("aten::gelu", {x}, {{"y", bf16({2048, 4096}, 0)}});
  ir::NodeId view = g.add_node("aten::view", {x}, {{"v", bf16({2048, 4096}, 0)}}, {{"size", std::vector<std::int64_t>{2048, 4096}}});
  AnalyticCostModel model;
  OpTime t = model.node_time(g, g.node(gelu), a100(), Precision::BF16, {});
  double bytes = 2.0 * 2048 * 4096 * 2;
  EXPECT_NEAR(t.forward, bytes / (2.039e12 * 0.75), 1e-12);
  EXPECT_NEAR(t.backward, 2 * t.forward, 1e-12);
  EXPECT_EQ(model.node_time(g, g.node(view), a100(), Precision::BF16, {}).forward, 0.0);
}

TEST(OpCost, EmbeddingBackwardWritesTheWholeTableGradient) {
  ir::Graph g;
  ir::ValueId table = g.add_value("wte", bf16({50304, 1024}), ir::ValueRole::Parameter);
  ir::TensorType ids{ir::DType::I64, {8, 128}, 0};
  ir::ValueId x = g.add_value("ids", ids, ir::ValueRole::Input);
  g.add_node("aten::embedding", {table, x}, {{"h", bf16({8, 128, 1024}, 0)}});
  AnalyticCostModel model;
  OpTime t = model.node_time(g, g.node(0), a100(), Precision::BF16, {});
  const double bandwidth = 2.039e12 * 0.75;
  const double out = 2.0 * 8 * 128 * 1024 * 2;  // read + write of the output
  EXPECT_NEAR(t.forward, out / bandwidth, 1e-12);
  // The output gradient read twice over, plus the dense table gradient zeroed and written.
  EXPECT_NEAR(t.backward, 2 * out / bandwidth + 2.0 * 50304 * 1024 * 2 / bandwidth, 1e-12);
}

TEST(OpCost, EfficiencyCurveSaturates) {
  AnalyticConstants c;
  EXPECT_NEAR(matmul_efficiency(c, 96), 0.375, 1e-12);
  EXPECT_LT(matmul_efficiency(c, 1e6), 0.75);
  EXPECT_GT(matmul_efficiency(c, 1e6), 0.749);
}

}  // namespace
}  // namespace shardwise::cost
