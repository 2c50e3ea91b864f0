#include "transform/stage_split.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ir/parser.h"
#include "ir/printer.h"
#include "support/error.h"

namespace shardwise::transform {
namespace {

// %a = f(%x), %b = g(%a), %c = h(%a, %b): the skip of stage_split.h's worked example.
constexpr const char* kSkip = R"(graph(%x: f32[b4,8]) {
  %w: f32[8,8] parameter
  %a: f32[b4,8] = aten::linear(%x, %w) @f
  %b: f32[b4,8] = aten::gelu(%a) {approximate="none"} @g
  %c: f32[b4,8] = aten::add.Tensor(%a, %b) {alpha=1} @h
  return (%c)
})";

std::vector<std::string> lines_with(const ir::Graph& g, const std::string& op) {
  std::vector<std::string> out;
  for (const ir::Node& n : g.nodes())
    if (n.op == op) out.push_back(g.value(n.outputs.empty() ? n.inputs[0] : n.outputs[0]).name);
  return out;
}

TEST(StageSplit, ASkipIsForwardedThroughTheStagesBetween) {
  const ir::Graph g = ir::parse_graph(kSkip);
  const std::vector<ir::Graph> stages = split_stages(g, {0, 1, 2}, 3);
  ASSERT_EQ(stages.size(), 3u);
  EXPECT_EQ(lines_with(stages[0], "shardwise::send"), (std::vector<std::string>{"a"}));
  EXPECT_EQ(lines_with(stages[1], "shardwise::recv"), (std::vector<std::string>{"a"}));
  EXPECT_EQ(lines_with(stages[1], "shardwise::send"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(lines_with(stages[2], "shardwise::recv"), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(stages[1].outputs().empty());
  ASSERT_EQ(stages[2].outputs().size(), 1u);
  EXPECT_EQ(stages[2].value(stages[2].outputs()[0]).name, "c");
  // The input is read by stage 0 only; the weight lives where it is read.
  EXPECT_TRUE(stages[0].find_value("x") && stages[0].find_value("w"));
  EXPECT_FALSE(stages[1].find_value("x") || stages[2].find_value("w"));
  for (const ir::Graph& s : stages) EXPECT_EQ(ir::parse_graph(ir::print_graph(s)), s);
}

TEST(StageSplit, OneStageIsTheGraph) {
  const ir::Graph g = ir::parse_graph(kSkip);
  EXPECT_EQ(ir::print_graph(split_stages(g, {0, 0, 0}, 1)[0]), ir::print_graph(g));
}

TEST(StageSplit, BadAssignmentsAreRefused) {
  const ir::Graph g = ir::parse_graph(kSkip);
  auto refused = [&](const std::vector<int>& stage_of_node, int stages) -> std::string {
    try {
      split_stages(g, stage_of_node, stages);
    } catch (const support::ValidationError& e) {
      return e.what();
    }
    return "accepted";
  };
  EXPECT_EQ(refused({0, 1}, 2), "split_stages: 2 stage entries for 3 nodes");
  EXPECT_EQ(refused({0, 1, 2}, 2), "split_stages: node 2 (aten::add.Tensor) in stage 2 of 2");
  EXPECT_EQ(refused({0, 1, 0}, 2),
            "split_stages: node 2 (aten::add.Tensor) in stage 0 after a node in stage 1: stages must follow the node "
            "order");
}

}  // namespace
}  // namespace shardwise::transform
