#include "analysis/parameter_stats.h"

#include <gtest/gtest.h>

#include "gpt2_like_graph.h"

namespace shardwise::analysis {
namespace {

TEST(ParameterStatsTest, CountsParametersAndBuffersSeparately) {
  ir::Graph g;
  g.add_value("x", ir::TensorType{ir::DType::F32, {2, 16}, 0}, ir::ValueRole::Input);
  g.add_value("fc.weight", ir::TensorType{ir::DType::F32, {4, 16}, {}}, ir::ValueRole::Parameter);
  g.add_value("fc.bias", ir::TensorType{ir::DType::BF16, {4}, {}}, ir::ValueRole::Parameter);
  g.add_value("bn.num_batches_tracked", ir::TensorType{ir::DType::I64, {}, {}}, ir::ValueRole::Buffer);
  g.add_value("table", ir::TensorType{ir::DType::F32, {100}, {}}, ir::ValueRole::Constant);
  EXPECT_EQ(parameter_stats(g), (ParameterStats{68, 64 * 4 + 4 * 2, 1, 8}));
}

TEST(ParameterStatsTest, TiedWeightsCountOnce) {
  const testing::Gpt2Config config;
  const auto stats = parameter_stats(testing::gpt2_like_graph(config));
  // The LM head reads transformer.wte.weight: no second copy.
  EXPECT_EQ(stats.parameters, testing::gpt2_parameter_count(config));
  EXPECT_EQ(stats.parameter_bytes, 4 * stats.parameters);
  EXPECT_EQ(stats.buffers, 0);
}

}  // namespace
}  // namespace shardwise::analysis
