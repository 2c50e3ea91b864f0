#include "analysis/saved_for_backward.h"

#include <gtest/gtest.h>

namespace shardwise::analysis {
namespace {

ir::TensorType f32(std::vector<std::int64_t> shape) { return ir::TensorType{ir::DType::F32, std::move(shape), {}}; }

std::int64_t at(const std::vector<std::int64_t>& saved, ir::ValueId id) { return saved[static_cast<std::size_t>(id)]; }

// The header's worked example: a product keeps the operand its partner's gradient needs, tanh
// its output, an add nothing; parameters are model state.
TEST(SavedForBackwardTest, ProductsKeepTheirPartnersOperandTanhItsOutputAddNothing) {
  ir::Graph g;
  const auto w = g.add_value("w", f32({64, 64}), ir::ValueRole::Parameter);
  const auto scale = g.add_value("scale", f32({64}), ir::ValueRole::Parameter);
  const auto x0 = g.add_value("x0", f32({8, 64}), ir::ValueRole::Input);
  const auto x = g.node(g.add_node("aten::mul.Tensor", {x0, scale}, {{"x", f32({8, 64})}})).outputs[0];
  const auto y = g.node(g.add_node("aten::linear", {x, w}, {{"y", f32({8, 64})}})).outputs[0];
  const auto t = g.node(g.add_node("aten::tanh", {y}, {{"t", f32({8, 64})}})).outputs[0];
  const auto z = g.node(g.add_node("aten::add.Tensor", {t, x}, {{"z", f32({8, 64})}})).outputs[0];
  const auto saved = saved_for_backward(g);
  EXPECT_EQ(at(saved, x0), 8 * 64 * 4);  // mul's operand whose partner (scale) needs a gradient
  EXPECT_EQ(at(saved, w), 0);            // parameters: counted as weights
  EXPECT_EQ(at(saved, scale), 0);
  EXPECT_EQ(at(saved, x), 8 * 64 * 4);   // linear's input, for dW
  EXPECT_EQ(at(saved, y), 0);            // tanh keeps its output, not its input
  EXPECT_EQ(at(saved, t), 8 * 64 * 4);
  EXPECT_EQ(at(saved, z), 0);
  const auto by_node = saved_bytes_by_node(g);
  EXPECT_EQ(by_node, (std::vector<std::int64_t>{8 * 64 * 4, 0, 8 * 64 * 4, 0}));
  // Which nodes save anything: the linear saves x (charged to mul's output, not its own) and
  // the weight; the add saves nothing, so a checkpoint's recomputation stops at tanh.
  const SavedTensors both = saved_tensors(g);
  EXPECT_EQ(both.saves_by_node, (std::vector<bool>{true, true, true, false}));
  EXPECT_EQ(both.bytes, saved);
}

// Nothing needs a gradient upstream of the parameters: position tables keep nothing, and a
// product with such a table keeps the table only.
TEST(SavedForBackwardTest, ValuesNoGradientReachesKeepNothingAndTheirProductsKeepOnlyThemselves) {
  ir::Graph g;
  const auto w = g.add_value("w", f32({16}), ir::ValueRole::Parameter);
  const auto h = g.add_value("h", f32({4, 32, 16}), ir::ValueRole::Input);
  const auto pos =
      g.node(g.add_node("aten::arange", {}, {{"pos", f32({32, 16})}}, {{"end", std::int64_t{32}}})).outputs[0];
  const auto cos = g.node(g.add_node("aten::cos", {pos}, {{"cos", f32({32, 16})}})).outputs[0];
  const auto q = g.node(g.add_node("aten::mul.Tensor", {h, w}, {{"q", f32({4, 32, 16})}})).outputs[0];
  g.add_node("aten::mul.Tensor", {q, cos}, {{"r", f32({4, 32, 16})}});
  const auto saved = saved_for_backward(g);
  EXPECT_EQ(at(saved, pos), 0);           // cos has no autograd node: nothing requires a gradient
  EXPECT_EQ(at(saved, cos), 32 * 16 * 4); // q needs a gradient, so q * cos keeps cos ...
  EXPECT_EQ(at(saved, q), 0);             // ... and not q, since cos needs none
  EXPECT_EQ(at(saved, h), 4 * 32 * 16 * 4);
}

// Attention keeps q, k and v, which are views of one projection: the projection is kept,
// once; the dropout after it keeps a byte per element besides; the loss keeps its
// log-softmax, the size of the logits.
TEST(SavedForBackwardTest, ViewsChargeTheirBaseOnceDropoutKeepsAByteMaskTheLossItsLogSoftmax) {
  ir::Graph g;
  const auto x = g.add_value("x", f32({2, 8, 12}), ir::ValueRole::Input);
  const auto w = g.add_value("w", f32({36, 12}), ir::ValueRole::Parameter);
  const auto target = g.add_value("target", ir::TensorType{ir::DType::I64, {16}, {}}, ir::ValueRole::Input);
  const auto qkv = g.node(g.add_node("aten::linear", {x, w}, {{"qkv", f32({2, 8, 36})}})).outputs[0];
  const auto parts = g.node(g.add_node("aten::split.Tensor", {qkv},
                                       {{"q", f32({2, 8, 12})}, {"k", f32({2, 8, 12})}, {"v", f32({2, 8, 12})}},
                                       {{"split_size", std::int64_t{12}}, {"dim", std::int64_t{2}}}))
                         .outputs;
  const auto o = g.node(g.add_node("aten::scaled_dot_product_attention", {parts[0], parts[1], parts[2]},
                                   {{"o", f32({2, 8, 12})}}, {{"is_causal", true}}))
                     .outputs[0];
  const auto d = g.node(g.add_node("aten::dropout", {o}, {{"d", f32({2, 8, 12})}}, {{"p", 0.1}, {"train", true}}))
                     .outputs[0];
  const auto flat =
      g.node(g.add_node("aten::view", {d}, {{"flat", f32({16, 12})}}, {{"size", std::vector<std::int64_t>{16, 12}}}))
          .outputs[0];
  g.add_node("aten::cross_entropy_loss", {flat, target}, {{"loss", f32({})}});
  const auto saved = saved_for_backward(g);
  EXPECT_EQ(at(saved, qkv), 2 * 8 * 36 * 4);  // split's views kept by attention: their base
  for (auto part : parts) EXPECT_EQ(at(saved, part), 0);
  EXPECT_EQ(at(saved, o), 2 * 8 * 12 * 4);                    // attention's output
  EXPECT_EQ(at(saved, d), 2 * 8 * 12 * 4 + 2 * 8 * 12);       // the loss's log-softmax and the mask
  EXPECT_EQ(at(saved, flat), 0);                              // a view: charged to d
  EXPECT_EQ(at(saved, x), 2 * 8 * 12 * 4);
  // The roots those charges go to (view_roots): a split's parts are views of qkv, the flattened
  // d of d; what a node computes is its own root.
  const std::vector<ir::ValueId> roots = view_roots(g);
  for (auto part : parts) EXPECT_EQ(roots[static_cast<std::size_t>(part)], qkv);
  EXPECT_EQ(roots[static_cast<std::size_t>(flat)], d);
  EXPECT_EQ(roots[static_cast<std::size_t>(d)], d);
  EXPECT_EQ(roots[static_cast<std::size_t>(o)], o);
}

}  // namespace
}  // namespace shardwise::analysis
