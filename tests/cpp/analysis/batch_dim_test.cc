#include "analysis/batch_dim.h"

#include <gtest/gtest.h>

#include "gpt2_like_graph.h"

namespace shardwise::analysis {
namespace {

ir::TensorType f32(std::vector<std::int64_t> shape, int batch_dim = -1) {
  ir::TensorType t{ir::DType::F32, std::move(shape), {}};
  if (batch_dim >= 0) t.batch_dim = batch_dim;
  return t;
}

std::optional<int> batch_of(const ir::Graph& g, std::string_view name) {
  return g.value(*g.find_value(name)).type.batch_dim;
}

TEST(BatchDimTest, FollowsLinearViewTransposeAndAttention) {
  ir::Graph g;
  const auto x = g.add_value("x", f32({2, 16, 64}, 0), ir::ValueRole::Input);
  const auto w = g.add_value("w", f32({64, 64}), ir::ValueRole::Parameter);
  auto out = [&](ir::NodeId n) { return g.node(n).outputs[0]; };
  const auto q = out(g.add_node("aten::linear", {x, w}, {{"q", f32({2, 16, 64})}}));
  const auto heads = out(g.add_node("aten::view", {q}, {{"heads", f32({2, 16, 4, 16})}},
                                    {{"size", std::vector<std::int64_t>{2, 16, 4, 16}}}));
  const auto t = out(g.add_node("aten::transpose.int", {heads}, {{"t", f32({4, 16, 2, 16})}},
                                {{"dim0", std::int64_t{0}}, {"dim1", std::int64_t{2}}}));
  const auto back = out(g.add_node("aten::transpose.int", {t}, {{"back", f32({2, 16, 4, 16})}},
                                   {{"dim0", std::int64_t{0}}, {"dim1", std::int64_t{2}}}));
  const auto bhsd = out(g.add_node("aten::transpose.int", {back}, {{"bhsd", f32({2, 4, 16, 16})}},
                                   {{"dim0", std::int64_t{1}}, {"dim1", std::int64_t{2}}}));
  const auto attn =
      out(g.add_node("aten::scaled_dot_product_attention", {bhsd, bhsd, bhsd}, {{"attn", f32({2, 4, 16, 16})}}));
  const auto merged = out(
      g.add_node("aten::reshape", {attn}, {{"merged", f32({8, 256})}}, {{"shape", std::vector<std::int64_t>{8, 256}}}));
  g.add_node("aten::sum.dim_IntList", {merged}, {{"total", f32({256})}}, {{"dim", std::vector<std::int64_t>{0}}});
  g.add_node("aten::mean.dim", {attn}, {{"per_sample", f32({2})}}, {{"dim", std::vector<std::int64_t>{1, 2, 3}}});

  EXPECT_TRUE(propagate_batch_dim(ops::OpTable::builtin(), g));
  EXPECT_EQ(batch_of(g, "q"), 0);
  EXPECT_EQ(batch_of(g, "heads"), 0);
  EXPECT_EQ(batch_of(g, "t"), 2);  // moved by the transpose
  EXPECT_EQ(batch_of(g, "back"), 0);
  EXPECT_EQ(batch_of(g, "bhsd"), 0);
  EXPECT_EQ(batch_of(g, "attn"), 0);              // through sdpa's b index
  EXPECT_EQ(batch_of(g, "merged"), 0);            // [2,4,...] -> [8,...]: b is the major factor
  EXPECT_EQ(batch_of(g, "total"), std::nullopt);  // the batch was summed away
  EXPECT_EQ(batch_of(g, "per_sample"), 0);
  EXPECT_FALSE(propagate_batch_dim(ops::OpTable::builtin(), g));  // nothing left to change
}

TEST(BatchDimTest, MinorFactorIsNotTheBatch) {
  // [16, 2] -> [32]: the batch (dim 1) becomes the minor factor of the merged dim.
  ir::Graph g;
  const auto x = g.add_value("x", f32({16, 2}, 1), ir::ValueRole::Input);
  g.add_node("aten::view", {x}, {{"flat", f32({32})}}, {{"size", std::vector<std::int64_t>{32}}});
  EXPECT_FALSE(propagate_batch_dim(ops::OpTable::builtin(), g));
  EXPECT_EQ(batch_of(g, "flat"), std::nullopt);
}

TEST(BatchDimTest, KeepsExistingMarks) {
  ir::Graph g;
  const auto x = g.add_value("x", f32({4, 4}, 0), ir::ValueRole::Input);
  g.add_node("aten::relu", {x}, {{"y", f32({4, 4}, 1)}});
  EXPECT_FALSE(propagate_batch_dim(ops::OpTable::builtin(), g));
  EXPECT_EQ(batch_of(g, "y"), 1);
}

TEST(BatchDimTest, Gpt2ActivationsCarryTheBatch) {
  auto g = testing::gpt2_like_graph();
  EXPECT_TRUE(propagate_batch_dim(ops::OpTable::builtin(), g));
  EXPECT_EQ(g.value(g.outputs()[0]).type.batch_dim, 0);  // the logits
  for (const auto& node : g.nodes()) {
    if (node.op != "aten::scaled_dot_product_attention" && node.op != "aten::addmm") continue;
    EXPECT_EQ(g.value(node.outputs[0]).type.batch_dim, 0) << node.op << " at " << node.module_path;
  }
}

// DeepSeek-V3's attention (transformers) builds its keys in k.new_empty([b, heads, s, d]) and
// fills it by slice_scatter: the new tensor is the batch's, its dim 0 the batch dim (then what
// reads it follows). A tensor made at another size than the batch (a [1, ...] table) is not.
TEST(BatchDimTest, ATensorMadeAtTheBatchsSizeAndFilledWithTheBatchIsBatched) {
  ir::Graph g;
  const auto x = g.add_value("x", f32({2, 4, 8}, 0), ir::ValueRole::Input);
  auto out = [&](ir::NodeId n) { return g.node(n).outputs[0]; };
  const auto made = out(g.add_node("aten::new_empty", {x}, {{"made", f32({2, 4, 12})}},
                                   {{"size", std::vector<std::int64_t>{2, 4, 12}}}));
  const auto filled = out(g.add_node("aten::slice_scatter", {made, x}, {{"filled", f32({2, 4, 12})}},
                                     {{"dim", std::int64_t{2}}, {"start", std::int64_t{0}}, {"end", std::int64_t{8}},
                                      {"step", std::int64_t{1}}}));
  g.add_node("aten::relu", {made}, {{"read_again", f32({2, 4, 12})}});
  const auto table = out(g.add_node("aten::new_zeros", {x}, {{"table", f32({1, 4, 8})}},
                                    {{"size", std::vector<std::int64_t>{1, 4, 8}}}));
  g.add_node("aten::add.Tensor", {x, table}, {{"sum", f32({2, 4, 8})}}, {{"alpha", std::int64_t{1}}});
  EXPECT_TRUE(propagate_batch_dim(ops::OpTable::builtin(), g));
  EXPECT_EQ(g.value(made).type.batch_dim, 0);
  EXPECT_EQ(g.value(filled).type.batch_dim, 0);
  EXPECT_EQ(batch_of(g, "read_again"), 0);  // the propagation ran again from it
  EXPECT_FALSE(g.value(table).type.batch_dim.has_value());
}

}  // namespace
}  // namespace shardwise::analysis
