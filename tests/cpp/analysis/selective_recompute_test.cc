#include "analysis/selective_recompute.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace shardwise::analysis {
namespace {

ir::TensorType f32(std::vector<std::int64_t> shape) { return ir::TensorType{ir::DType::F32, std::move(shape), {}}; }

// A block's products with a weight and its fused attention are kept; the attention core
// written out (Q K^T as a batched matmul, softmax, P V), the norms and activations run again.
TEST(SelectiveRecompute, KeepsProductsWithAWeightAndFusedAttentionNotTheUnfusedCore) {
  ir::Graph g;
  const auto w = g.add_value("w", f32({64, 64}), ir::ValueRole::Parameter);
  const auto v = g.add_value("v", f32({64}), ir::ValueRole::Parameter);
  const auto x = g.add_value("x", f32({2, 8, 64}), ir::ValueRole::Input);
  auto add = [&](const char* op, std::vector<ir::ValueId> in, const char* name, std::vector<std::int64_t> shape) {
    return g.add_node(op, std::move(in), {{name, f32(std::move(shape))}});
  };
  const auto linear = add("aten::linear", {x, w}, "h", {2, 8, 64});
  const auto h = g.node(linear).outputs[0];
  const auto by_matrix = add("aten::matmul", {h, w}, "m", {2, 8, 64});         // folds into one mm
  const auto gelu = add("aten::gelu", {h}, "g", {2, 8, 64});
  const auto q = g.node(add("aten::view", {h}, "q", {2, 8, 4, 16})).outputs[0];
  const auto scores = add("aten::matmul", {q, q}, "s", {2, 8, 4, 4});          // a batched Q K^T: bmm
  const auto bmm = add("aten::bmm", {x, x}, "b", {2, 8, 8});
  const auto fused = add("aten::scaled_dot_product_attention", {q, q, q}, "o", {2, 8, 4, 16});
  const auto flash = add("aten::_scaled_dot_product_flash_attention_for_cpu", {q, q, q}, "o2", {2, 8, 4, 16});
  const auto math = add("aten::_scaled_dot_product_attention_math", {q, q, q}, "o3", {2, 8, 4, 16});
  const auto by_vector = add("aten::matmul", {h, v}, "mv", {2, 8});            // mv, not mm
  const auto addmm = add("aten::addmm.default", {v, x, w}, "a", {8, 64});

  const std::vector<bool> kept = kept_by_selective_recompute(g);
  auto is_kept = [&](ir::NodeId id) { return static_cast<bool>(kept[static_cast<std::size_t>(id)]); };
  EXPECT_TRUE(is_kept(linear));
  EXPECT_TRUE(is_kept(by_matrix));
  EXPECT_TRUE(is_kept(fused));
  EXPECT_TRUE(is_kept(flash));
  EXPECT_TRUE(is_kept(addmm));
  EXPECT_FALSE(is_kept(gelu));
  EXPECT_FALSE(is_kept(scores));
  EXPECT_FALSE(is_kept(bmm));
  EXPECT_FALSE(is_kept(math));
  EXPECT_FALSE(is_kept(by_vector));

  // What the runtime's policy saves: the dispatcher's mm and addmm and the fused kernels, not bmm.
  const auto& saved = selective_recompute_saved_ops();
  auto listed = [&](std::string_view op) { return std::find(saved.begin(), saved.end(), op) != saved.end(); };
  EXPECT_TRUE(listed("aten::mm"));
  EXPECT_TRUE(listed("aten::addmm"));
  EXPECT_TRUE(listed("aten::_scaled_mm"));  // an FP8 plan's linears
  EXPECT_TRUE(listed("aten::_scaled_dot_product_flash_attention_for_cpu"));
  EXPECT_FALSE(listed("aten::bmm"));
  EXPECT_FALSE(listed("aten::_scaled_dot_product_attention_math"));
}

}  // namespace
}  // namespace shardwise::analysis
