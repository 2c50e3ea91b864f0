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

// The default precision of a plan follows the dtype most parameter elements have; f64 is
// priced as f32; a graph without floating parameters goes by its activations.
TEST(ParameterStatsTest, TrainingPrecisionFollowsTheParameters) {
  auto graph = [](ir::DType big, ir::DType small) {
    ir::Graph g;
    g.add_value("x", ir::TensorType{ir::DType::F32, {2, 16}, 0}, ir::ValueRole::Input);
    g.add_value("w", ir::TensorType{big, {4, 16}, {}}, ir::ValueRole::Parameter);
    g.add_value("b", ir::TensorType{small, {4}, {}}, ir::ValueRole::Parameter);
    return g;
  };
  EXPECT_STREQ(training_precision(graph(ir::DType::BF16, ir::DType::F32)), "bf16");
  EXPECT_STREQ(training_precision(graph(ir::DType::F32, ir::DType::BF16)), "f32");
  EXPECT_STREQ(training_precision(graph(ir::DType::F16, ir::DType::F32)), "f16");
  EXPECT_STREQ(training_precision(graph(ir::DType::F64, ir::DType::F64)), "f32");
  EXPECT_STREQ(training_precision(testing::gpt2_like_graph(testing::Gpt2Config{})), "f32");
  ir::Graph no_parameters;
  no_parameters.add_value("x", ir::TensorType{ir::DType::I64, {2, 16}, 0}, ir::ValueRole::Input);
  EXPECT_STREQ(training_precision(no_parameters), "f32");
}

}  // namespace
}  // namespace shardwise::analysis
