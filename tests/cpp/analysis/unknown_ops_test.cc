#include "analysis/unknown_ops.h"

#include <gtest/gtest.h>

#include "analysis/batch_dim.h"
#include "analysis/flops.h"
#include "analysis/shape_check.h"
#include "analysis/summary_table.h"
#include "ops/node_rule.h"

namespace shardwise::analysis {
namespace {

// x -> relu -> mylib::mix (unknown) -> relu -> mylib::mix -> prims::odd
ir::Graph graph_with_unknown_ops() {
  ir::Graph g;
  const ir::TensorType t{ir::DType::F32, {4, 8}, 0};
  const auto x = g.add_value("x", t, ir::ValueRole::Input);
  auto out = [&](ir::NodeId n) { return g.node(n).outputs[0]; };
  auto a = out(g.add_node("aten::relu", {x}, {{"a", ir::TensorType{ir::DType::F32, {4, 8}, {}}}}, {}, "blocks.0"));
  auto b = out(g.add_node("mylib::mix", {a}, {{"b", ir::TensorType{ir::DType::F32, {4, 8}, {}}}}, {}, "blocks.0.mix"));
  auto c = out(g.add_node("aten::relu", {b}, {{"c", ir::TensorType{ir::DType::F32, {4, 8}, {}}}}, {}, "blocks.1"));
  auto d = out(g.add_node("mylib::mix", {c}, {{"d", ir::TensorType{ir::DType::F32, {4, 8}, {}}}}, {}, "blocks.1.mix"));
  g.add_node("prims::odd", {d}, {{"e", ir::TensorType{ir::DType::F32, {3}, {}}}}, {}, "");
  return g;
}

TEST(UnknownOpsTest, OnePerOpWithFirstModuleAndCount) {
  const auto unknown = unknown_ops(ops::OpTable::builtin(), graph_with_unknown_ops());
  EXPECT_EQ(unknown, (std::vector<UnknownOp>{{"mylib::mix", "blocks.0.mix", 2}, {"prims::odd", "", 1}}));
}

TEST(UnknownOpsTest, NoPassBreaksOnThem) {
  const auto& table = ops::OpTable::builtin();
  auto g = graph_with_unknown_ops();
  EXPECT_FALSE(ops::dim_rule_for(table, g, g.node(1)));
  EXPECT_NO_THROW(check_shapes(table, g));
  const auto flops = forward_flops(table, g);
  EXPECT_EQ(flops.per_node, (std::vector<std::int64_t>{32, 0, 32, 0, 0}));
  // Batch marking reaches the first relu's output and stops at the unknown op.
  EXPECT_TRUE(propagate_batch_dim(table, g));
  EXPECT_EQ(g.value(*g.find_value("a")).type.batch_dim, 0);
  EXPECT_FALSE(g.value(*g.find_value("b")).type.batch_dim);
  const auto summary = summary_table(table, g);
  EXPECT_NE(summary.find("mylib::mix"), std::string::npos) << summary;
  EXPECT_NE(summary.find("blocks.0.mix"), std::string::npos) << summary;
}

}  // namespace
}  // namespace shardwise::analysis
