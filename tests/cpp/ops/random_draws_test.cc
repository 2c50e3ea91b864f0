#include "ops/random_draws.h"

#include <gtest/gtest.h>

#include <string>

#include "ops/op_table.h"

namespace shardwise::ops {
namespace {

ir::Node node(std::string op, ir::Attributes attrs = {}) {
  ir::Node n;
  n.op = std::move(op);
  n.attrs = std::move(attrs);
  return n;
}

TEST(RandomDraws, KindsByFullOrBaseName) {
  EXPECT_EQ(random_draw("aten::dropout"), RandomDraw::Mask);
  EXPECT_EQ(random_draw("aten::feature_dropout"), RandomDraw::Mask);
  EXPECT_EQ(random_draw("aten::randn_like"), RandomDraw::Like);
  EXPECT_EQ(random_draw("aten::bernoulli.p"), RandomDraw::Other);  // by its base name
  EXPECT_EQ(random_draw("aten::dropout_"), RandomDraw::Other);     // in place: not drawn whole and cut
  EXPECT_EQ(random_draw("aten::add.Tensor"), RandomDraw::None);
  EXPECT_EQ(random_draw("aten::randperm"), RandomDraw::Other);
  EXPECT_EQ(random_draw_name(RandomDraw::Like), "like");
}

TEST(RandomDraws, ProbabilityZeroAndEvalDrawNothingWhereATenSkipsTheDraw) {
  EXPECT_TRUE(draws(node("aten::dropout", {{"p", 0.1}, {"train", true}})));
  EXPECT_FALSE(draws(node("aten::dropout", {{"p", 0.0}, {"train", true}})));
  EXPECT_FALSE(draws(node("aten::dropout", {{"p", 0.1}, {"train", false}})));
  EXPECT_FALSE(draws(node("aten::native_dropout", {{"p", 0.1}, {"train", false}})));
  // native_dropout and bernoulli draw their mask even at p = 0.
  EXPECT_TRUE(draws(node("aten::native_dropout", {{"p", 0.0}, {"train", true}})));
  EXPECT_TRUE(draws(node("aten::bernoulli.p", {{"p", 0.0}})));
  EXPECT_TRUE(draws(node("aten::scaled_dot_product_attention", {{"dropout_p", 0.1}})));
  EXPECT_FALSE(draws(node("aten::scaled_dot_product_attention", {{"dropout_p", 0.0}})));
  EXPECT_TRUE(draws(node("aten::randn_like")));
  EXPECT_FALSE(draws(node("aten::relu")));
}

TEST(RandomDraws, EverySeededOpOfTheTableIsListed) {
  // The table's rows that draw (a dropout, rand_like, bernoulli, attention) each have a kind.
  for (const char* op : {"aten::dropout", "aten::native_dropout", "aten::feature_dropout", "aten::rand_like",
                         "aten::randn_like", "aten::bernoulli", "aten::scaled_dot_product_attention"}) {
    ASSERT_NE(OpTable::builtin().find(op), nullptr) << op;
    EXPECT_NE(random_draw(op), RandomDraw::None) << op;
  }
  for (const auto& [name, kind] : seeded_ops()) EXPECT_NE(kind, RandomDraw::None) << name;
}

}  // namespace
}  // namespace shardwise::ops
