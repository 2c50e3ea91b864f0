#include "analysis/flops.h"

#include <gtest/gtest.h>

#include "../ops/one_node_graph.h"
#include "gpt2_like_graph.h"

namespace shardwise::analysis {
namespace {

using ops::testing::f32;
using ops::testing::one_node;

NodeFlops flops_of(std::string op, std::vector<ir::TensorType> inputs, std::vector<ir::TensorType> outputs,
                   ir::Attributes attrs = {}) {
  auto g = one_node(std::move(op), std::move(inputs), std::move(outputs), std::move(attrs));
  return node_flops(ops::OpTable::builtin(), g.graph, g.node());
}

TEST(FlopsTest, ContractionsCountTwoPerMultiplyAdd) {
  EXPECT_EQ(flops_of("aten::mm", {f32({32, 768}), f32({768, 2304})}, {f32({32, 2304})}),
            (NodeFlops{2 * 32 * 768 * 2304, 2 * 32 * 768 * 2304}));
  // A bias adds one per output element, outside the matmul count.
  EXPECT_EQ(flops_of("aten::addmm", {f32({2304}), f32({32, 768}), f32({768, 2304})}, {f32({32, 2304})}),
            (NodeFlops{2 * 32 * 768 * 2304 + 32 * 2304, 2 * 32 * 768 * 2304}));
  EXPECT_EQ(flops_of("aten::linear", {f32({2, 16, 768}), f32({3072, 768}), f32({3072})}, {f32({2, 16, 3072})}),
            (NodeFlops{2 * 32 * 768 * 3072 + 32 * 3072, 2 * 32 * 768 * 3072}));
  EXPECT_EQ(flops_of("aten::bmm", {f32({4, 2, 3}), f32({4, 3, 5})}, {f32({4, 2, 5})}), (NodeFlops{240, 240}));
  EXPECT_EQ(flops_of("aten::matmul", {f32({2, 3, 4}), f32({4, 5})}, {f32({2, 3, 5})}), (NodeFlops{240, 240}));
}

TEST(FlopsTest, ConvolutionPerOutputElement) {
  // 2 x (4*16*30*30 outputs) x (3*3*3 weights per output channel), + bias per output.
  const std::int64_t outputs = 4 * 16 * 30 * 30;
  EXPECT_EQ(flops_of("aten::conv2d", {f32({4, 3, 32, 32}), f32({16, 3, 3, 3}), f32({16})}, {f32({4, 16, 30, 30})}),
            (NodeFlops{2 * outputs * 27 + outputs, 2 * outputs * 27}));
  // Strided: only the computed outputs count.
  const std::int64_t strided = 4 * 16 * 15 * 15;
  EXPECT_EQ(flops_of("aten::conv2d", {f32({4, 3, 32, 32}), f32({16, 3, 3, 3})}, {f32({4, 16, 15, 15})},
                     {{"stride", std::vector<std::int64_t>{2, 2}}})
                .matmul,
            2 * strided * 27);
  // Depthwise: one input channel per output channel.
  EXPECT_EQ(flops_of("aten::conv2d", {f32({1, 8, 10, 10}), f32({8, 1, 3, 3})}, {f32({1, 8, 8, 8})},
                     {{"groups", std::int64_t{8}}})
                .matmul,
            2 * 8 * 8 * 8 * 9);
  // Transposed, stride 2: each input element meets out-channels x kernel weights.
  EXPECT_EQ(flops_of("aten::conv_transpose2d.input", {f32({1, 4, 5, 5}), f32({4, 6, 2, 2})}, {f32({1, 6, 10, 10})},
                     {{"stride", std::vector<std::int64_t>{2, 2}}})
                .matmul,
            2 * (4 * 5 * 5) * (6 * 2 * 2));
}

TEST(FlopsTest, AttentionCountsBothProductsAndTheSoftmax) {
  const std::int64_t b = 2, h = 12, s = 16, t = 20, d = 64, e = 32;
  const auto f = flops_of("aten::scaled_dot_product_attention",
                          {f32({b, h, s, d}), f32({b, h, t, d}), f32({b, h, t, e})}, {f32({b, h, s, e})});
  EXPECT_EQ(f.matmul, 2 * b * h * s * t * d + 2 * b * h * s * t * e);
  EXPECT_EQ(f.total, f.matmul + 5 * b * h * s * t);
}

TEST(FlopsTest, PointwiseReductionsAndDataMovement) {
  EXPECT_EQ(flops_of("aten::add.Tensor", {f32({4, 1, 16}), f32({3, 1})}, {f32({4, 3, 16})}),
            (NodeFlops{4 * 3 * 16, 0}));
  EXPECT_EQ(flops_of("aten::softmax.int", {f32({2, 8})}, {f32({2, 8})}, {{"dim", std::int64_t{-1}}}),
            (NodeFlops{5 * 16, 0}));
  EXPECT_EQ(flops_of("aten::sum.dim_IntList", {f32({2, 8})}, {f32({2})}, {{"dim", std::vector<std::int64_t>{1}}}),
            (NodeFlops{16, 0}));
  EXPECT_EQ(flops_of("aten::layer_norm", {f32({2, 8}), f32({8}), f32({8})}, {f32({2, 8})},
                     {{"normalized_shape", std::vector<std::int64_t>{8}}}),
            (NodeFlops{5 * 16, 0}));
  EXPECT_EQ(flops_of("aten::view", {f32({2, 8})}, {f32({16})}, {{"size", std::vector<std::int64_t>{-1}}}),
            (NodeFlops{}));
  EXPECT_EQ(flops_of("mylib::unknown", {f32({2, 8})}, {f32({16})}), (NodeFlops{}));
}

TEST(FlopsTest, Gpt2MatmulTotalIsTheAnalyticCount) {
  for (const auto& config : {testing::Gpt2Config{}, testing::Gpt2Config{4, 32, 256, 8, 5000, 64, 3, true, true}}) {
    const auto graph = testing::gpt2_like_graph(config);
    const auto report = forward_flops(ops::OpTable::builtin(), graph);
    EXPECT_EQ(report.matmul_total, testing::gpt2_matmul_flops(config));
    ASSERT_EQ(report.per_node.size(), graph.nodes().size());
    std::int64_t sum = 0;
    for (auto f : report.per_node) sum += f;
    EXPECT_EQ(sum, report.total);
    EXPECT_GT(report.total, report.matmul_total);  // biases, norms, softmax, pointwise on top
    EXPECT_LT(report.total, report.matmul_total * 11 / 10);
  }
}

}  // namespace
}  // namespace shardwise::analysis
