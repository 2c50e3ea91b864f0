#include "transform/fp8_axes.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "megatron_mlp_plan.h"
#include "support/error.h"

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

}  // namespace
}  // namespace shardwise::transform
