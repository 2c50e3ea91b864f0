#include "transform/fp8_axes.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "megatron_mlp_plan.h"
#include "support/error.h"
#include "transform/fused_weight_accumulation.h"
#include "transform/rank_graph.h"

namespace shardwise::transform {
namespace {

// x [8, 16] -> linear 32 (fc1) -> gelu -> linear 16 (fc2) -> mean: K and N multiples of 16.
ir::Graph mlp() { return testing_plans::megatron_mlp_graph(); }

const NodeRewrite& node_named(const RankProgram& p, const ir::Graph& g, const std::string& output) {
  for (const NodeRewrite& n : p.nodes)
    if (g.value(g.node(n.node).outputs[0]).name == output) return n;
  throw std::runtime_error("no node " + output);
}

// Megatron's MLP on {data 2, tensor 2}: fc1 column-parallel splits N on the tensor axis (the
// backward's amaxes over it), fc2 row-parallel splits K (the forward's); the batch split on
// the data axis needs nothing; the gelu is no linear.
TEST(Fp8Axes, AColumnParallelWeightSplitsNARowParallelOneK) {
  const ir::Graph g = mlp();
  const RankProgram p = rank_program(g, testing_plans::megatron_mlp(), 3);
  const auto fc1 = fp8_axes(g, node_named(p, g, "h"));
  ASSERT_TRUE(fc1.has_value());
  EXPECT_TRUE(fc1->k_axes.empty());
  EXPECT_EQ(fc1->n_axes, (std::vector<int>{1}));
  const auto fc2 = fp8_axes(g, node_named(p, g, "y"));
  ASSERT_TRUE(fc2.has_value());
  EXPECT_EQ(fc2->k_axes, (std::vector<int>{1}));
  EXPECT_TRUE(fc2->n_axes.empty());
  EXPECT_FALSE(fp8_axes(g, node_named(p, g, "act")).has_value());
}

// An operand read as a partial sum would be scaled per rank's part: refused, naming the node.
TEST(Fp8Axes, APartialOperandIsRefusedNamingTheNode) {
  const ir::Graph g = mlp();
  const RankProgram p = rank_program(g, testing_plans::megatron_mlp(), 0);
  NodeRewrite fc2 = node_named(p, g, "y");
  fc2.inputs[0].required = {search::Placement::replicate(), search::Placement::partial()};
  try {
    fp8_axes(g, fc2);
    FAIL() << "a partial operand was accepted";
  } catch (const support::ValidationError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'y' (module 'fc2') reads 'act' as a partial sum over mesh axis 1"), std::string::npos)
        << what;
  }
}

const ir::Node& call_named(const ir::Graph& g, const std::string& output) {
  return g.node(*g.value(*g.find_value(output)).producer);
}

// The rank graph carries the decision: where the plan runs in fp8 each FP8 linear's call is
// marked with the axes above, read back by marked_fp8_axes; nothing is marked otherwise, and
// a marked call does not also accumulate its weight gradient in place (its products are
// runtime/fp8.py's).
TEST(Fp8Axes, TheRankGraphMarksEachFp8LinearWithItsAxes) {
  const ir::Graph g = mlp();
  RewriteOptions options;
  EXPECT_FALSE(marked_fp8_axes(call_named(rank_graph(g, testing_plans::megatron_mlp(), 3, options).graph, "h")));
  options.fp8 = true;
  ir::Graph marked = rank_graph(g, testing_plans::megatron_mlp(), 3, options).graph;
  const auto fc1 = marked_fp8_axes(call_named(marked, "h"));
  ASSERT_TRUE(fc1.has_value());
  EXPECT_TRUE(fc1->k_axes.empty());
  EXPECT_EQ(fc1->n_axes, (std::vector<int>{1}));
  const auto fc2 = marked_fp8_axes(call_named(marked, "y"));
  ASSERT_TRUE(fc2.has_value());
  EXPECT_EQ(fc2->k_axes, (std::vector<int>{1}));
  EXPECT_FALSE(marked_fp8_axes(call_named(marked, "act")).has_value());
  mark_fused_accumulations(marked);
  EXPECT_EQ(fused_accumulation_operand(call_named(marked, "h")), -1);
  EXPECT_EQ(fused_accumulation_operand(call_named(marked, "y")), -1);
}

// ZeRO-3 on the same mesh: both weights also held split on the data axis and gathered there
// for their reads. In float32 fc2's gathered weight is released and gathered again for dx
// (fc1's x, an input, takes no gradient: its backward reads no W). Run in fp8, fc2 saves the
// float8 copy of its W^T for backward instead, so its weight is not gathered again, and its
// call says so; fc1 saves none; a weight held as read is saved as it is.
TEST(Fp8Axes, AGatheredWeightIsSavedAsFloat8AndNotGatheredAgain) {
  const ir::Graph g = mlp();
  plan::Sharding zero3 = testing_plans::megatron_mlp();
  zero3.placements["fc1.weight"] = {"S(1)", "S(0)"};
  zero3.placements["fc2.weight"] = {"S(0)", "S(1)"};
  RewriteOptions options;
  const RankProgram plain = rank_program(g, zero3, 3, options);
  EXPECT_FALSE(node_named(plain, g, "h").inputs[1].regather);
  EXPECT_TRUE(node_named(plain, g, "y").inputs[1].regather);
  EXPECT_FALSE(node_named(plain, g, "y").inputs[1].float8_saved);
  options.fp8 = true;
  const RankProgram fp8 = rank_program(g, zero3, 3, options);
  const ir::Graph marked = rank_graph(g, zero3, 3, options).graph;
  for (const std::string name : {"h", "y"}) {
    const NodeRewrite& call = node_named(fp8, g, name);
    EXPECT_TRUE(gathered_for_read(call.inputs[1])) << name;
    EXPECT_FALSE(call.inputs[1].regather) << name;
    ASSERT_TRUE(fp8_axes(g, call).has_value());
    EXPECT_EQ(fp8_axes(g, call)->float8_weight, name == "y") << name;
    const auto axes = marked_fp8_axes(call_named(marked, name));
    ASSERT_TRUE(axes.has_value());
    EXPECT_EQ(axes->float8_weight, name == "y") << name;
  }
  const RankProgram held = rank_program(g, testing_plans::megatron_mlp(), 3, options);
  EXPECT_FALSE(fp8_axes(g, node_named(held, g, "y"))->float8_weight);
  EXPECT_FALSE(marked_fp8_axes(call_named(rank_graph(g, testing_plans::megatron_mlp(), 3, options).graph, "y"))
                   ->float8_weight);
}

// One of the two marks alone is a broken graph: refused, naming both.
TEST(Fp8Axes, OneMarkWithoutTheOtherIsRefused) {
  ir::Graph g = mlp();
  const ir::NodeId h = *g.value(*g.find_value("h")).producer;
  g.mutable_attrs(h)[std::string(kFp8KAxesAttr)] = std::vector<std::int64_t>{};
  EXPECT_THROW(marked_fp8_axes(g.node(h)), support::ValidationError);
}

}  // namespace
}  // namespace shardwise::transform
