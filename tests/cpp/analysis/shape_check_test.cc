#include "analysis/shape_check.h"

#include <gtest/gtest.h>

#include "gpt2_like_graph.h"
#include "support/error.h"

namespace shardwise::analysis {
namespace {

TEST(ShapeCheckTest, Gpt2IsConsistent) {
  EXPECT_NO_THROW(check_shapes(ops::OpTable::builtin(), testing::gpt2_like_graph()));
  testing::Gpt2Config gelu;
  gelu.expanded_gelu = true;
  EXPECT_NO_THROW(check_shapes(ops::OpTable::builtin(), testing::gpt2_like_graph(gelu)));
}

std::string error_of(const ir::Graph& g) {
  try {
    check_shapes(ops::OpTable::builtin(), g);
  } catch (const support::ValidationError& e) {
    return e.what();
  }
  return "";
}

TEST(ShapeCheckTest, RuleContradictionNamesOpValueAndModule) {
  ir::Graph g;
  const auto x = g.add_value("x", ir::TensorType{ir::DType::F32, {2, 3}, {}}, ir::ValueRole::Input);
  const auto w = g.add_value("fc.weight", ir::TensorType{ir::DType::F32, {4, 5}, {}}, ir::ValueRole::Parameter);
  g.add_node("aten::linear", {x, w}, {{"fc_out", ir::TensorType{ir::DType::F32, {2, 4}, {}}}}, {}, "encoder.fc");
  const auto what = error_of(g);
  EXPECT_NE(what.find("aten::linear"), std::string::npos) << what;
  EXPECT_NE(what.find("fc_out"), std::string::npos) << what;
  EXPECT_NE(what.find("encoder.fc"), std::string::npos) << what;
  EXPECT_NE(what.find("is 5 but index k is 3"), std::string::npos) << what;
}

TEST(ShapeCheckTest, OutputThatAttributesContradict) {
  // Same element count, so the view's factorisation fits, but its size attribute says otherwise.
  ir::Graph g;
  const auto x = g.add_value("x", ir::TensorType{ir::DType::F32, {2, 16, 768}, {}}, ir::ValueRole::Input);
  g.add_node("aten::view", {x}, {{"heads", ir::TensorType{ir::DType::F32, {2, 16, 24, 32}, {}}}},
             {{"size", std::vector<std::int64_t>{2, 16, 12, 64}}}, "attn");
  const auto what = error_of(g);
  EXPECT_NE(what.find("aten::view"), std::string::npos) << what;
  EXPECT_NE(what.find("'heads'"), std::string::npos) << what;
  EXPECT_NE(what.find("attn"), std::string::npos) << what;
  EXPECT_NE(what.find("[2,16,24,32]"), std::string::npos) << what;
  EXPECT_NE(what.find("[2,16,12,64]"), std::string::npos) << what;
}

}  // namespace
}  // namespace shardwise::analysis
