#include "analysis/repeated_blocks.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

#include "gpt2_like_graph.h"

namespace shardwise::analysis {
namespace {

ir::TensorType f32(std::vector<std::int64_t> shape) { return ir::TensorType{ir::DType::F32, std::move(shape), {}}; }

// A small transformer-like graph builder: each block is norm_a -> ff -> [act] -> norm_b -> +x.
class Blocks {
 public:
  explicit Blocks(std::int64_t hidden) : h_(hidden) { x_ = g_.add_value("x", f32({2, 4, h_}), ir::ValueRole::Input); }

  ir::ValueId norm(ir::ValueId x, const std::string& module) {
    const auto w = g_.add_value(module + ".weight", f32({h_}), ir::ValueRole::Parameter);
    const auto b = g_.add_value(module + ".bias", f32({h_}), ir::ValueRole::Parameter);
    return op("aten::layer_norm", {x, w, b}, module, {{"normalized_shape", std::vector<std::int64_t>{h_}}});
  }

  ir::ValueId op(std::string name, std::vector<ir::ValueId> inputs, const std::string& module,
                 ir::Attributes attrs = {}) {
    const auto n = g_.add_node(std::move(name), std::move(inputs), {{"v" + std::to_string(next_++), f32({2, 4, h_})}},
                               std::move(attrs), module);
    return g_.node(n).outputs[0];
  }

  // Two identical norms inside (norm_a, norm_b) unless `one_norm`; `act` adds a GELU.
  ir::ValueId block(ir::ValueId x, const std::string& p, bool act = false, bool one_norm = false) {
    auto y = norm(x, p + ".norm_a");
    const auto w = g_.add_value(p + ".ff.weight", f32({h_, h_}), ir::ValueRole::Parameter);
    y = op("aten::linear", {y, w}, p + ".ff");
    if (act) y = op("aten::gelu", {y}, p + ".act");
    if (!one_norm) y = norm(y, p + ".norm_b");
    return op("aten::add.Tensor", {x, y}, p);
  }

  ir::Graph& graph() { return g_; }
  ir::ValueId input() const { return x_; }

 private:
  std::int64_t h_;
  ir::Graph g_;
  ir::ValueId x_ = -1;
  int next_ = 0;
};

TEST(RepeatedBlocksTest, TwoIdenticalBlocksAndADifferentOne) {
  Blocks b(8);
  auto x = b.block(b.input(), "layers.0");
  x = b.block(x, "layers.1");
  b.block(x, "layers.2", /*act=*/true, /*one_norm=*/true);
  const auto groups = find_repeated_blocks(b.graph());
  // norm_a and norm_b inside layers.0 (and layers.1) are identical siblings too, but they sit
  // inside the members of the reported group: only the maximal group comes out.
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].parent, "layers");
  EXPECT_EQ(groups[0].module_paths, (std::vector<std::string>{"layers.0", "layers.1"}));
  EXPECT_EQ(groups[0].nodes, (std::vector<std::vector<ir::NodeId>>{{0, 1, 2, 3}, {4, 5, 6, 7}}));
}

TEST(RepeatedBlocksTest, NestedGroupOutsideAnyReportedGroupIsReported) {
  Blocks b(8);
  b.block(b.input(), "solo");  // its norm_a and norm_b are the only repetition
  const auto groups = find_repeated_blocks(b.graph());
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].parent, "solo");
  EXPECT_EQ(groups[0].module_paths, (std::vector<std::string>{"solo.norm_a", "solo.norm_b"}));
}

TEST(RepeatedBlocksTest, TopLevelSiblingsHaveTheRootAsParent) {
  Blocks b(8);
  b.block(b.block(b.input(), "encoder"), "decoder");
  const auto groups = find_repeated_blocks(b.graph());
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].parent, "");
  EXPECT_EQ(groups[0].module_paths, (std::vector<std::string>{"encoder", "decoder"}));
}

TEST(RepeatedBlocksTest, WiringAndParametersMatter) {
  {
    // Same ops, operands swapped inside the block.
    Blocks b(8);
    const auto x = b.input();
    const auto r0 = b.op("aten::relu", {x}, "m.0");
    const auto y = b.op("aten::add.Tensor", {r0, x}, "m.0");
    const auto r1 = b.op("aten::relu", {y}, "m.1");
    b.op("aten::add.Tensor", {y, r1}, "m.1");
    EXPECT_TRUE(find_repeated_blocks(b.graph()).empty());
  }
  {
    // One external read twice versus two externals of the same type.
    Blocks b(8);
    const auto x = b.input();
    const auto other = b.graph().add_value("other", f32({2, 4, 8}), ir::ValueRole::Input);
    b.op("aten::add.Tensor", {x, x}, "m.0");
    b.op("aten::add.Tensor", {x, other}, "m.1");
    EXPECT_TRUE(find_repeated_blocks(b.graph()).empty());
  }
  {
    // Same ops, a parameter of another shape.
    Blocks b(8);
    auto& g = b.graph();
    const auto w0 = g.add_value("m.0.w", f32({8}), ir::ValueRole::Parameter);
    const auto w1 = g.add_value("m.1.w", f32({1}), ir::ValueRole::Parameter);
    b.op("aten::mul.Tensor", {b.input(), w0}, "m.0");
    b.op("aten::mul.Tensor", {b.input(), w1}, "m.1");
    EXPECT_TRUE(find_repeated_blocks(b.graph()).empty());
  }
  {
    // A shared (tied) parameter outside both blocks is the same operand for each.
    Blocks b(8);
    auto& g = b.graph();
    const auto shared = g.add_value("shared.w", f32({8}), ir::ValueRole::Parameter);
    const auto y = b.op("aten::mul.Tensor", {b.input(), shared}, "m.0");
    b.op("aten::mul.Tensor", {y, shared}, "m.1");
    EXPECT_EQ(find_repeated_blocks(b.graph()).size(), 1u);
  }
}

TEST(RepeatedBlocksTest, Gpt2LayersFormOneGroup) {
  testing::Gpt2Config config;
  config.layers = 12;
  config.hidden = 64;
  config.heads = 4;
  const auto graph = testing::gpt2_like_graph(config);
  const auto groups = find_repeated_blocks(graph);
  ASSERT_EQ(groups.size(), 1u);
  const auto& group = groups[0];
  EXPECT_EQ(group.parent, "transformer.h");
  ASSERT_EQ(group.module_paths.size(), 12u);
  for (std::size_t l = 0; l < 12; ++l) {
    EXPECT_EQ(group.module_paths[l], "transformer.h." + std::to_string(l));
    ASSERT_EQ(group.nodes[l].size(), group.nodes[0].size());
    for (auto id : group.nodes[l]) {
      EXPECT_TRUE(graph.node(id).module_path.starts_with(group.module_paths[l])) << graph.node(id).module_path;
    }
  }
  EXPECT_EQ(group.nodes[0].size(), 29u);
}

TEST(RepeatedBlocksTest, DeepModelsAreFast) {
  testing::Gpt2Config config;
  config.layers = 96;  // about 3,400 nodes
  config.hidden = 64;
  config.heads = 4;
  config.expanded_gelu = true;
  const auto graph = testing::gpt2_like_graph(config);
  ASSERT_GT(graph.nodes().size(), 3000u);
  const auto start = std::chrono::steady_clock::now();
  const auto groups = find_repeated_blocks(graph);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].module_paths.size(), 96u);
  // Milliseconds in practice: printed, not asserted (a test bounds no wall clock).
  std::printf("[ timing ] repeated blocks of %zu nodes found in %.3f s\n", graph.nodes().size(),
              std::chrono::duration<double>(elapsed).count());

  config.layers = 48;
  const auto groups48 = find_repeated_blocks(testing::gpt2_like_graph(config));
  ASSERT_EQ(groups48.size(), 1u);
  EXPECT_EQ(groups48[0].module_paths.size(), 48u);
}

}  // namespace
}  // namespace shardwise::analysis
