#include "transform/fp8_axes.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "megatron_mlp_plan.h"
#include "support/error.h"

namespace shardwise::transform {
namespace {

using Shape = std::vector<std::int64_t>;

// x [8, 16] -> linear 32 (fc1) -> gelu -> linear 16 (fc2) -> mean: K and N multiples of 16.
ir::Graph mlp() {
  ir::Graph g;
  auto f32 = [](Shape shape, std::optional<int> batch = std::nullopt) {
    return ir::TensorType{ir::DType::F32, std::move(shape), batch};
  };
  ir::ValueId x = g.add_value("x", f32({8, 16}, 0), ir::ValueRole::Input);
  ir::ValueId w1 = g.add_value("fc1.weight", f32({32, 16}), ir::ValueRole::Parameter);
  ir::ValueId w2 = g.add_value("fc2.weight", f32({16, 32}), ir::ValueRole::Parameter);
  ir::NodeId a = g.add_node("aten::linear", {x, w1}, {{"h", f32({8, 32}, 0)}}, {}, "fc1");
  ir::NodeId b = g.add_node("aten::gelu", {g.node(a).outputs[0]}, {{"act", f32({8, 32}, 0)}}, {}, "act");
  ir::NodeId c = g.add_node("aten::linear", {g.node(b).outputs[0], w2}, {{"y", f32({8, 16}, 0)}}, {}, "fc2");
  ir::NodeId d = g.add_node("aten::mean", {g.node(c).outputs[0]}, {{"loss", f32({})}}, {}, "");
  g.set_outputs({g.node(d).outputs[0]});
  return g;
}

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
