// A rank graph cut into pipeline stages (transform/stage_rank_graph.h): each node's stage, a
// region read on two stages run on each, the boundary's recv / send of the values the
// regions start at.
#include "transform/stage_rank_graph.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ir/parser.h"
#include "ir/printer.h"
#include "support/error.h"
#include "batch_norm_plan.h"

namespace shardwise::transform {
namespace {

// a's rows are split on a 2-rank axis; h (stage 0) and g (stage 1) read it gathered.
ir::Graph two_readers() {
  return ir::parse_graph(R"(graph(%x: f32[8,16]) {
  %w1: f32[16,16] parameter
  %w2: f32[16,16] parameter
  %a: f32[8,16] = aten::tanh(%x) @a
  %h: f32[8,16] = aten::linear(%a, %w1) {bias=none} @h
  %g: f32[8,16] = aten::linear(%a, %w2) {bias=none} @g
  %s: f32[8,16] = aten::add.Tensor(%h, %g) {alpha=1} @s
  %loss: f32[] = aten::sum(%s) {dtype=none}
  return (%loss)
})");
}

plan::Sharding rows_split() {
  plan::Sharding s;
  s.mesh = {2};
  s.axis_names = {"tensor"};
  s.placements = {{"x", {"S(0)"}}, {"w1", {"R"}}, {"w2", {"R"}}, {"a", {"S(0)"}},
                  {"h", {"R"}},    {"g", {"R"}},  {"s", {"R"}},  {"loss", {"R"}}};
  s.strategies = {{"a", {"split d0"}}, {"h", {"replicate"}}, {"g", {"replicate"}}, {"s", {"replicate"}},
                  {"loss", {"replicate"}}};
  return s;
}

std::vector<std::string> ops(const ir::Graph& g) {
  std::vector<std::string> out;
  for (const ir::Node& node : g.nodes()) {
    std::string text = node.op + "(";
    for (ir::ValueId in : node.inputs) text += "%" + g.value(in).name + (in == node.inputs.back() ? "" : ",");
    out.push_back(text + ")");
  }
  return out;
}

TEST(CutRankGraph, ARegionReadOnTwoStagesRunsOnEachAndTheStagesPassWhatItStartsAt) {
  const ir::Graph global = two_readers();
  const RankGraph rank = rank_graph(global, rows_split(), 1);
  const std::vector<ir::Graph> stages = cut_rank_graph(rank, global, {0, 0, 1, 1, 1}, 2);
  ASSERT_EQ(stages.size(), 2u);
  // (a depends on no parameter: its region has no backward step.)
  EXPECT_EQ(ops(stages[0]), (std::vector<std::string>{
                                "aten::tanh(%x)", "shardwise::all_gather(%a)", "aten::linear(%a.r1,%w1)", "shardwise::send(%a)", "shardwise::send(%h)"}))
      << ir::print_graph(stages[0]);
  EXPECT_EQ(ops(stages[1]), (std::vector<std::string>{
                                "shardwise::recv()", "shardwise::recv()", "shardwise::all_gather(%a)",
                                "aten::linear(%a.r1,%w2)", "aten::add.Tensor(%h,%g)",
                                "aten::sum(%s)"}))
      << ir::print_graph(stages[1]);
  EXPECT_FALSE(stages[0].find_value("w2").has_value());
  EXPECT_FALSE(stages[1].find_value("w1").has_value());
  EXPECT_TRUE(stages[0].outputs().empty());
  ASSERT_EQ(stages[1].outputs().size(), 1u);
  EXPECT_EQ(stages[1].value(stages[1].outputs()[0]).name, "loss");
  // Local shapes as the rank graph's: the received a is rank 1's rows.
  EXPECT_EQ(stages[1].value(*stages[1].find_value("a")).type.shape, (std::vector<std::int64_t>{4, 16}));
  for (const ir::Graph& stage : stages) EXPECT_EQ(ir::parse_graph(ir::print_graph(stage)), stage);
}

TEST(CutRankGraph, OneStageIsTheRankGraph) {
  const ir::Graph global = two_readers();
  const RankGraph rank = rank_graph(global, rows_split(), 0);
  const std::vector<ir::Graph> one = cut_rank_graph(rank, global, {0, 0, 0, 0, 0}, 1);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(ir::print_graph(one[0]), ir::print_graph(rank.graph));
}

TEST(CutRankGraph, AStageListOfAnotherLengthOrRangeIsRefused) {
  const ir::Graph global = two_readers();
  const RankGraph rank = rank_graph(global, rows_split(), 0);
  EXPECT_THROW(cut_rank_graph(rank, global, {0, 0, 1}, 2), support::ValidationError);
  EXPECT_THROW(cut_rank_graph(rank, global, {0, 0, 1, 1, 2}, 2), support::ValidationError);
}

TEST(CutRankGraph, AStateWriteBackRunsOnTheStageOfTheCallThatWroteIt) {
  // Batch norm on stage 0 (its channels split on a 2-rank axis, its running statistics
  // written in place: rank_graph.h), the loss on stage 1: the write-backs (the blocks
  // gathered, then written into the buffer) are stage 0's, none is stage 1's.
  const ir::Graph global = testing_plans::batch_norm_graph();
  const plan::Sharding s = testing_plans::batch_norm_channels_split();
  const std::vector<ir::Graph> stages = cut_rank_graph(rank_graph(global, s, 0), global, {0, 1}, 2);
  ASSERT_EQ(stages.size(), 2u);
  const std::vector<std::string> first = ops(stages[0]);
  const std::vector<std::string> expected = {
      "shardwise::slice(%x)", "shardwise::slice(%bn.running_mean)", "shardwise::slice(%bn.running_var)",
      "aten::batch_norm(%x.r1,%bn.weight,%bn.bias,%bn.running_mean.r1,%bn.running_var.r1)",
      "shardwise::all_gather(%bn.running_mean.r1)", "shardwise::write_state(%bn.running_mean,%bn.running_mean.w1)",
      "shardwise::all_gather(%bn.running_var.r1)", "shardwise::write_state(%bn.running_var,%bn.running_var.w1)",
      "shardwise::send(%y)"};
  EXPECT_EQ(first, expected) << ir::print_graph(stages[0]);
  for (const std::string& op : ops(stages[1])) EXPECT_EQ(op.find("write_state"), std::string::npos) << op;
  EXPECT_FALSE(stages[1].find_value("bn.running_mean").has_value());
}

}  // namespace
}  // namespace shardwise::transform
