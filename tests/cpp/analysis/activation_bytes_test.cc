#include "analysis/activation_bytes.h"

#include <gtest/gtest.h>

namespace shardwise::analysis {
namespace {

TEST(ActivationBytesTest, SumsEachNodesOutputs) {
  ir::Graph g;
  const auto x = g.add_value("x", ir::TensorType{ir::DType::F32, {2, 16, 2304}, {}}, ir::ValueRole::Input);
  const ir::TensorType part{ir::DType::F32, {2, 16, 768}, {}};
  g.add_node("aten::split.Tensor", {x}, {{"q", part}, {"k", part}, {"v", part}},
             {{"split_size", std::int64_t{768}}, {"dim", std::int64_t{2}}});
  g.add_node("aten::_assert_tensor_metadata", {x}, {});
  g.add_node("aten::arange", {}, {{"r", ir::TensorType{ir::DType::I64, {16}, {}}}}, {{"end", std::int64_t{16}}});
  EXPECT_EQ(activation_bytes(g), (std::vector<std::int64_t>{3 * 2 * 16 * 768 * 4, 0, 16 * 8}));
}

}  // namespace
}  // namespace shardwise::analysis
