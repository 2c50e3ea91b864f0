#include "ops/node_rule.h"

#include <gtest/gtest.h>

#include <limits>

#include "one_node_graph.h"
#include "support/error.h"

namespace shardwise::ops {
namespace {

using testing::boolean;
using testing::c64;
using testing::f32;
using testing::i64;
using testing::one_node;
using Ints = std::vector<std::int64_t>;

DimRule rule_of(const testing::OneNodeGraph& g) {
  auto rule = dim_rule_for(OpTable::builtin(), g.graph, g.node());
  if (!rule) throw std::runtime_error("no rule for " + g.node().op);
  return *rule;
}

std::string rule_str(std::string op, std::vector<ir::TensorType> inputs, std::vector<ir::TensorType> outputs,
                     ir::Attributes attrs = {}) {
  return rule_of(one_node(std::move(op), std::move(inputs), std::move(outputs), std::move(attrs))).str();
}

std::optional<std::vector<Shape>> inferred(std::string op, std::vector<ir::TensorType> inputs,
                                           std::vector<ir::TensorType> outputs, ir::Attributes attrs = {}) {
  auto g = one_node(std::move(op), std::move(inputs), std::move(outputs), std::move(attrs));
  return infer_output_shapes(OpTable::builtin(), g.graph, g.node());
}

const Index& index_at(const DimRule& rule, const DimIndices& dims, std::size_t k = 0) {
  return rule.indices.at(static_cast<std::size_t>(dims.at(k)));
}

// ---- contractions --------------------------------------------------------------

TEST(NodeRuleTest, Mm) {
  EXPECT_EQ(rule_str("aten::mm", {f32({32, 768}), f32({768, 2304})}, {f32({32, 2304})}),
            "m k, k n -> m n  [m=32, k=768 reduced, n=2304]");
}

TEST(NodeRuleTest, LinearWithAndWithoutBias) {
  EXPECT_EQ(rule_str("aten::linear", {f32({2, 16, 768}), f32({3072, 768})}, {f32({2, 16, 3072})}),
            "_0 _1 k, n k -> _0 _1 n  [_0=2, _1=16, k=768 reduced, n=3072]");
  EXPECT_EQ(rule_str("aten::linear", {f32({2, 16, 768}), f32({3072, 768}), f32({3072})}, {f32({2, 16, 3072})}),
            "_0 _1 k, n k, n -> _0 _1 n  [_0=2, _1=16, k=768 reduced, n=3072]");
  EXPECT_EQ(rule_str("aten::linear", {f32({768}), f32({10, 768})}, {f32({10})}), "k, n k -> n  [k=768 reduced, n=10]");
}

TEST(NodeRuleTest, AddmmAsGpt2Conv1D) {
  EXPECT_EQ(rule_str("aten::addmm", {f32({2304}), f32({32, 768}), f32({768, 2304})}, {f32({32, 2304})}),
            "n, m k, k n -> m n  [n=2304, m=32, k=768 reduced]");
  // A [1, n] bias broadcasts over m.
  EXPECT_EQ(rule_str("aten::addmm", {f32({1, 2304}), f32({32, 768}), f32({768, 2304})}, {f32({32, 2304})}),
            "1 n, m k, k n -> m n  [m=32, n=2304, k=768 reduced]");
}

TEST(NodeRuleTest, MatmulBroadcastsBatchDims) {
  EXPECT_EQ(rule_str("aten::matmul", {f32({2, 12, 16, 64}), f32({2, 12, 64, 16})}, {f32({2, 12, 16, 16})}),
            "_0 _1 m k, _0 _1 k n -> _0 _1 m n  [_0=2, _1=12, m=16, k=64 reduced, n=16]");
  EXPECT_EQ(rule_str("aten::matmul", {f32({2, 16, 64}), f32({64, 8})}, {f32({2, 16, 8})}),
            "_0 m k, k n -> _0 m n  [_0=2, m=16, k=64 reduced, n=8]");
  EXPECT_EQ(rule_str("aten::matmul", {f32({16, 64}), f32({64})}, {f32({16})}), "m k, k -> m  [m=16, k=64 reduced]");
  EXPECT_EQ(rule_str("aten::bmm", {f32({4, 2, 3}), f32({4, 3, 5})}, {f32({4, 2, 5})}),
            "b m k, b k n -> b m n  [b=4, m=2, k=3 reduced, n=5]");
}

TEST(NodeRuleTest, Einsum) {
  EXPECT_EQ(rule_str("aten::einsum", {f32({2, 4, 8, 16}), f32({2, 4, 6, 16})}, {f32({2, 4, 8, 6})},
                     {{"equation", std::string("bhqd,bhkd->bhqk")}}),
            "b h q d, b h k d -> b h q k  [b=2, h=4, q=8, d=16 reduced, k=6]");
}

// ---- views ---------------------------------------------------------------------

TEST(NodeRuleTest, ViewSplitKeepsHeadsShardable) {
  auto g = one_node("aten::view", {f32({2, 8, 768})}, {f32({2, 8, 12, 64})}, {{"size", Ints{2, 8, -1, 64}}});
  const auto rule = rule_of(g);
  EXPECT_EQ(rule.str(), "i0 i1 (i2 i3) -> i0 i1 i2 i3  [i0=2, i1=8, i2=12, i3=64]");
  // Input dim 2 factorises into (heads, d); heads is its major factor and output dim 2.
  const auto& in_dim2 = rule.inputs[0][2];
  ASSERT_EQ(in_dim2.size(), 2u);
  EXPECT_EQ(in_dim2[0], rule.outputs[0][2][0]);
  EXPECT_EQ(index_at(rule, in_dim2).size, 12);
  EXPECT_EQ(index_at(rule, in_dim2).kind, IndexKind::Spatial);
  EXPECT_EQ(inferred("aten::view", {f32({2, 8, 768})}, {f32({2, 8, 12, 64})}, {{"size", Ints{2, 8, -1, 64}}}),
            (std::vector<Shape>{{2, 8, 12, 64}}));
}

TEST(NodeRuleTest, ViewMergeAndOtherReshapes) {
  EXPECT_EQ(rule_str("aten::reshape", {f32({2, 8, 12, 64})}, {f32({2, 8, 768})}, {{"shape", Ints{2, 8, -1}}}),
            "i0 i1 i2 i3 -> i0 i1 (i2 i3)  [i0=2, i1=8, i2=12, i3=64]");
  EXPECT_EQ(
      rule_str("aten::flatten.using_ints", {f32({4, 32, 1, 1})}, {f32({4, 32})}, {{"start_dim", std::int64_t{1}}}),
      "i0 i1 1 1 -> i0 i1  [i0=4, i1=32]");
  EXPECT_EQ(rule_str("aten::unsqueeze", {f32({16})}, {f32({1, 16})}, {{"dim", std::int64_t{0}}}),
            "i0 -> 1 i0  [i0=16]");
  EXPECT_EQ(inferred("aten::squeeze.dim", {f32({2, 1, 3})}, {f32({2, 3})}, {{"dim", std::int64_t{1}}}),
            (std::vector<Shape>{{2, 3}}));
  EXPECT_EQ(inferred("aten::unflatten.int", {f32({2, 768})}, {f32({2, 12, 64})},
                     {{"dim", std::int64_t{1}}, {"sizes", Ints{12, -1}}}),
            (std::vector<Shape>{{2, 12, 64}}));
  // view_as takes its shape from its second input, which it reads for metadata only.
  EXPECT_EQ(rule_str("aten::view_as", {f32({6}), f32({2, 3})}, {f32({2, 3})}),
            "(i0 i1), m1.0 m1.1 -> i0 i1  [i0=2, i1=3, m1.0=2, m1.1=3]");
}

TEST(NodeRuleTest, PermuteAndTranspose) {
  EXPECT_EQ(rule_str("aten::transpose.int", {f32({2, 16, 12, 64})}, {f32({2, 12, 16, 64})},
                     {{"dim0", std::int64_t{1}}, {"dim1", std::int64_t{2}}}),
            "d0 d1 d2 d3 -> d0 d2 d1 d3  [d0=2, d1=16, d2=12, d3=64]");
  EXPECT_EQ(rule_str("aten::permute", {f32({2, 16, 12, 64})}, {f32({2, 12, 64, 16})}, {{"dims", Ints{0, 2, -1, 1}}}),
            "d0 d1 d2 d3 -> d0 d2 d3 d1  [d0=2, d1=16, d2=12, d3=64]");
  EXPECT_EQ(rule_str("aten::t", {f32({3, 5})}, {f32({5, 3})}), "d0 d1 -> d1 d0  [d0=3, d1=5]");
  EXPECT_EQ(rule_str("aten::t", {f32({5})}, {f32({5})}), "d0 -> d0  [d0=5]");  // rank 1 passes through
  EXPECT_THROW(rule_str("aten::permute", {f32({2, 3})}, {f32({3, 2})}, {{"dims", Ints{0, 0}}}),
               support::ValidationError);
  // x.T (Falcon's `x @ self.weight.T`) reverses every dim; x.mT swaps the last two.
  EXPECT_EQ(rule_str("aten::numpy_T", {f32({3, 5})}, {f32({5, 3})}), "d0 d1 -> d1 d0  [d0=3, d1=5]");
  EXPECT_EQ(inferred("aten::numpy_T", {f32({2, 3, 5})}, {f32({5, 3, 2})}), (std::vector<Shape>{{5, 3, 2}}));
  EXPECT_EQ(rule_str("aten::mT", {f32({2, 3, 5})}, {f32({2, 5, 3})}), "d0 d1 d2 -> d0 d2 d1  [d0=2, d1=3, d2=5]");
}

TEST(NodeRuleTest, ExpandAddsSpatialDims) {
  EXPECT_EQ(rule_str("aten::expand", {f32({1, 16})}, {f32({2, 16})}, {{"size", Ints{2, -1}}}),
            "1 d1 -> d0 d1  [d0=2, d1=16]");
  EXPECT_EQ(inferred("aten::expand", {f32({16})}, {f32({3, 16})}, {{"size", Ints{3, -1}}}),
            (std::vector<Shape>{{3, 16}}));
}

// ---- pointwise and whole-dim ops ---------------------------------------------------

TEST(NodeRuleTest, ElementwiseBroadcasting) {
  EXPECT_EQ(rule_str("aten::add.Tensor", {f32({4, 1, 16}), f32({3, 1})}, {f32({4, 3, 16})}),
            "d0 1 d2, d1 1 -> d0 d1 d2  [d0=4, d1=3, d2=16]");
  // A scalar `other` is an attribute: one tensor input.
  EXPECT_EQ(rule_str("aten::mul.Tensor", {f32({2, 3})}, {f32({2, 3})}, {{"other", 0.5}}),
            "d0 d1 -> d0 d1  [d0=2, d1=3]");
  EXPECT_EQ(rule_str("aten::where.self", {boolean({16, 1}), f32({16, 16}), f32({})}, {f32({16, 16})}),
            "d0 1, d0 d1, () -> d0 d1  [d0=16, d1=16]");
  EXPECT_EQ(inferred("aten::eq.Tensor", {i64({2, 1, 16, 1}), i64({2, 1, 1, 16})}, {boolean({2, 1, 16, 16})}),
            (std::vector<Shape>{{2, 1, 16, 16}}));
  EXPECT_THROW(rule_str("aten::add.Tensor", {f32({4, 3}), f32({5})}, {f32({4, 3})}), support::ValidationError);
}

// torch.min(a, b) / torch.max(a, b) are binary pointwise ops (T5's relative position
// buckets), not the full reductions aten::min / aten::max: the overloads have rows of
// their own, so they never borrow the base name's rule.
TEST(NodeRuleTest, BinaryMinAndMaxAreElementwise) {
  for (const char* op : {"aten::min.other", "aten::max.other", "aten::minimum", "aten::fmax"}) {
    EXPECT_EQ(rule_str(op, {i64({16, 16}), i64({16, 1})}, {i64({16, 16})}),
              "d0 d1, d0 1 -> d0 d1  [d0=16, d1=16]")
        << op;
    EXPECT_EQ(inferred(op, {i64({16, 1}), i64({1, 16})}, {i64({16, 16})}), (std::vector<Shape>{{16, 16}})) << op;
  }
  // The unary forms stay reductions.
  EXPECT_EQ(rule_str("aten::min", {f32({2, 3})}, {f32({})}), "r0 r1 -> ()  [r0=2 reduced(min), r1=3 reduced(min)]");
}

// Complex rotary embeddings (Llama reference code, torchtitan): the real view's trailing
// (re, im) pair is one Whole index, every other dim passes through.
TEST(NodeRuleTest, ComplexViewsKeepTheRealImaginaryPairWhole) {
  EXPECT_EQ(rule_str("aten::view_as_complex", {f32({2, 16, 4, 8, 2})}, {c64({2, 16, 4, 8})}),
            "_0 _1 _2 _3 K -> _0 _1 _2 _3  [_0=2, _1=16, _2=4, _3=8, K=2 whole]");
  EXPECT_EQ(rule_str("aten::view_as_real", {c64({2, 16, 4, 8})}, {f32({2, 16, 4, 8, 2})}),
            "_0 _1 _2 _3 -> _0 _1 _2 _3 K  [_0=2, _1=16, _2=4, _3=8, K=2 whole]");
  EXPECT_EQ(inferred("aten::view_as_complex", {f32({2, 16, 4, 8, 2})}, {c64({2, 16, 4, 8})}),
            (std::vector<Shape>{{2, 16, 4, 8}}));
  // The complex product with the broadcast frequencies is an ordinary elementwise op.
  EXPECT_EQ(rule_str("aten::mul.Tensor", {c64({2, 16, 4, 8}), c64({1, 16, 1, 8})}, {c64({2, 16, 4, 8})}),
            "d0 d1 d2 d3, 1 d1 1 d3 -> d0 d1 d2 d3  [d0=2, d1=16, d2=4, d3=8]");
}

TEST(NodeRuleTest, SoftmaxNeedsItsDimWhole) {
  const auto rule = rule_of(
      one_node("aten::softmax.int", {f32({2, 12, 16, 16})}, {f32({2, 12, 16, 16})}, {{"dim", std::int64_t{-1}}}));
  EXPECT_EQ(rule.str(), "d0 d1 d2 W0 -> d0 d1 d2 W0  [d0=2, d1=12, d2=16, W0=16 whole]");
  EXPECT_EQ(index_at(rule, rule.inputs[0][3]).kind, IndexKind::Whole);
  EXPECT_EQ(rule_str("aten::cumsum", {i64({2, 16})}, {i64({2, 16})}, {{"dim", std::int64_t{-1}}}),
            "d0 W0 -> d0 W0  [d0=2, W0=16 whole]");
  EXPECT_EQ(rule_str("aten::triu", {f32({4, 16, 16})}, {f32({4, 16, 16})}),
            "d0 W0 W1 -> d0 W0 W1  [d0=4, W0=16 whole, W1=16 whole]");
  // diff with a prepend of another size along the dim: that dim Whole in each operand.
  EXPECT_EQ(rule_str("aten::diff", {i64({2, 16}), i64({2, 1})}, {i64({2, 16})}, {{"dim", std::int64_t{-1}}}),
            "d0 W0, d0 1 -> d0 W0  [d0=2, W0=16 whole]");
}

TEST(NodeRuleTest, LayerNormNormalisedDimsWhole) {
  EXPECT_EQ(rule_str("aten::layer_norm", {f32({2, 16, 768}), f32({768}), f32({768})}, {f32({2, 16, 768})},
                     {{"normalized_shape", Ints{768}}}),
            "d0 d1 W0, W0, W0 -> d0 d1 W0  [d0=2, d1=16, W0=768 whole]");
  EXPECT_EQ(rule_str("aten::native_layer_norm", {f32({2, 8, 4}), f32({8, 4})},
                     {f32({2, 8, 4}), f32({2, 1, 1}), f32({2, 1, 1})}, {{"normalized_shape", Ints{8, 4}}}),
            "d0 W0 W1, W0 W1 -> d0 W0 W1, d0 1 1, d0 1 1  [d0=2, W0=8 whole, W1=4 whole]");
}

TEST(NodeRuleTest, Reductions) {
  EXPECT_EQ(
      rule_str("aten::sum.dim_IntList", {f32({2, 3, 4})}, {f32({2, 1, 4})}, {{"dim", Ints{1}}, {"keepdim", true}}),
      "d0 r0 d1 -> d0 1 d1  [d0=2, r0=3 reduced, d1=4]");
  EXPECT_EQ(rule_str("aten::mean.dim", {f32({2, 16, 128})}, {f32({2, 16, 1})}, {{"dim", Ints{-1}}, {"keepdim", true}}),
            "d0 d1 r0 -> d0 d1 1  [d0=2, d1=16, r0=128 reduced(mean)]");
  EXPECT_EQ(rule_str("aten::amax", {f32({2, 3})}, {f32({})}), "r0 r1 -> ()  [r0=2 reduced(max), r1=3 reduced(max)]");
  EXPECT_EQ(rule_str("aten::sum", {f32({2, 3})}, {f32({})}), "r0 r1 -> ()  [r0=2 reduced, r1=3 reduced]");
  EXPECT_EQ(rule_str("aten::var.correction", {f32({2, 3})}, {f32({2})}, {{"dim", Ints{1}}}),
            "d0 W0 -> d0  [d0=2, W0=3 whole]");
  EXPECT_EQ(rule_str("aten::max.dim", {f32({2, 3})}, {f32({2}), i64({2})}, {{"dim", std::int64_t{1}}}),
            "d0 W0 -> d0, d0  [d0=2, W0=3 whole]");
  EXPECT_EQ(inferred("aten::mean.dim", {f32({2, 3, 4})}, {f32({2})}, {{"dim", Ints{1, 2}}}), (std::vector<Shape>{{2}}));
}

// ---- indexing, joining, splitting ----------------------------------------------------

TEST(NodeRuleTest, EmbeddingVocabularyWhole) {
  const auto rule = rule_of(one_node("aten::embedding", {f32({1000, 768}), i64({2, 16})}, {f32({2, 16, 768})}));
  EXPECT_EQ(rule.str(), "V e, _0 _1 -> _0 _1 e  [V=1000 whole, e=768, _0=2, _1=16]");
}

TEST(NodeRuleTest, SplitIsMultiOutputAndStrided) {
  // GPT-2's fused q|k|v: equal parts make the input dim (P c), so c is splittable (strided).
  const auto rule = rule_of(one_node("aten::split.Tensor", {f32({2, 16, 2304})},
                                     {f32({2, 16, 768}), f32({2, 16, 768}), f32({2, 16, 768})},
                                     {{"split_size", std::int64_t{768}}, {"dim", std::int64_t{2}}}));
  EXPECT_EQ(rule.str(), "d0 d1 (P c) -> d0 d1 c, d0 d1 c, d0 d1 c  [d0=2, d1=16, P=3 whole, c=768]");
  ASSERT_EQ(rule.outputs.size(), 3u);
  // Uneven parts: the split dim is Whole, each part its own.
  EXPECT_EQ(rule_str("aten::split.Tensor", {f32({2, 10})}, {f32({2, 4}), f32({2, 4}), f32({2, 2})},
                     {{"split_size", std::int64_t{4}}, {"dim", std::int64_t{1}}}),
            "d0 W0 -> d0 W1, d0 W2, d0 W3  [d0=2, W0=10 whole, W1=4 whole, W2=4 whole, W3=2 whole]");
  EXPECT_EQ(inferred("aten::split.Tensor", {f32({2, 10})}, {f32({2, 4}), f32({2, 4}), f32({2, 2})},
                     {{"split_size", std::int64_t{4}}, {"dim", std::int64_t{1}}}),
            (std::vector<Shape>{{2, 4}, {2, 4}, {2, 2}}));
  EXPECT_EQ(rule_str("aten::chunk", {f32({6, 4})}, {f32({3, 4}), f32({3, 4})}, {{"chunks", std::int64_t{2}}}),
            "(P c) d0 -> c d0, c d0  [d0=4, P=2 whole, c=3]");
  EXPECT_EQ(rule_str("aten::unbind.int", {f32({3, 4})}, {f32({4}), f32({4}), f32({4})}),
            "P d0 -> d0, d0, d0  [d0=4, P=3 whole]");
  EXPECT_EQ(
      rule_str("aten::split_with_sizes", {f32({5, 2})}, {f32({2, 2}), f32({3, 2})}, {{"split_sizes", Ints{2, 3}}}),
      "W0 d0 -> W1 d0, W2 d0  [d0=2, W0=5 whole, W1=2 whole, W2=3 whole]");
}

TEST(NodeRuleTest, CatAndStack) {
  EXPECT_EQ(
      rule_str("aten::cat", {f32({1, 16, 16}), f32({1, 16, 16})}, {f32({1, 16, 32})}, {{"dim", std::int64_t{-1}}}),
      "d0 d1 c, d0 d1 c -> d0 d1 (P c)  [d0=1, d1=16, P=2 whole, c=16]");
  EXPECT_EQ(rule_str("aten::cat", {f32({2, 3}), f32({1, 3})}, {f32({3, 3})}),
            "W1 d0, 1 d0 -> W0 d0  [d0=3, W0=3 whole, W1=2 whole]");
  EXPECT_EQ(inferred("aten::cat", {f32({2, 3}), f32({1, 3})}, {f32({3, 3})}), (std::vector<Shape>{{3, 3}}));
  EXPECT_EQ(rule_str("aten::stack", {f32({2, 3}), f32({2, 3})}, {f32({2, 2, 3})}, {{"dim", std::int64_t{1}}}),
            "d0 d1, d0 d1 -> d0 P d1  [d0=2, d1=3, P=2 whole]");
}

TEST(NodeRuleTest, SliceSelectAndPad) {
  EXPECT_EQ(rule_str("aten::slice.Tensor", {i64({2, 16})}, {i64({2, 1})},
                     {{"dim", std::int64_t{1}}, {"start", std::int64_t{0}}, {"end", std::int64_t{1}}}),
            "d0 W0 -> d0 1  [d0=2, W0=16 whole]");
  // A full-range slice (exports emit them) is the identity on that dim: still splittable.
  EXPECT_EQ(
      rule_str(
          "aten::slice.Tensor", {f32({2, 16})}, {f32({2, 16})},
          {{"dim", std::int64_t{0}}, {"start", std::int64_t{0}}, {"end", std::numeric_limits<std::int64_t>::max()}}),
      "d0 d1 -> d0 d1  [d0=2, d1=16]");
  EXPECT_EQ(inferred("aten::slice.Tensor", {f32({10, 4})}, {f32({3, 4})},
                     {{"start", std::int64_t{-7}}, {"end", std::int64_t{9}}, {"step", std::int64_t{2}}}),
            (std::vector<Shape>{{3, 4}}));
  EXPECT_EQ(rule_str("aten::select.int", {f32({2, 3, 4})}, {f32({2, 4})},
                     {{"dim", std::int64_t{1}}, {"index", std::int64_t{0}}}),
            "d0 W0 d1 -> d0 d1  [d0=2, W0=3 whole, d1=4]");
  EXPECT_EQ(
      rule_str("aten::pad", {i64({2, 16})}, {i64({2, 17})}, {{"pad", Ints{0, 1}}, {"mode", std::string("constant")}}),
      "d0 W0 -> d0 W1  [d0=2, W0=16 whole, W1=17 whole]");
  EXPECT_EQ(inferred("aten::pad", {i64({2, 16})}, {i64({2, 17})}, {{"pad", Ints{0, 1}}}),
            (std::vector<Shape>{{2, 17}}));
}

TEST(NodeRuleTest, GatherIndexSelectAndAdvancedIndexing) {
  EXPECT_EQ(rule_str("aten::gather", {i64({1, 512}), i64({1, 16})}, {i64({1, 16})}, {{"dim", std::int64_t{1}}}),
            "d0 W0, d0 d1 -> d0 d1  [d0=1, d1=16, W0=512 whole]");
  EXPECT_EQ(rule_str("aten::index_select", {f32({10, 4}), i64({3})}, {f32({3, 4})}, {{"dim", std::int64_t{0}}}),
            "W0 d0, k -> k d0  [k=3, W0=10 whole, d0=4]");
  // GPT-2's mask building: self[batch_idx, pos_idx] with broadcasting index tensors.
  EXPECT_EQ(rule_str("aten::index.Tensor", {i64({2, 16}), i64({2, 1, 1, 1}), i64({1, 1, 16, 1})}, {i64({2, 1, 16, 1})}),
            "W0 W1, i0 i1 1 i3, 1 i1 i2 i3 -> i0 i1 i2 i3  [i0=2, i1=1, i2=16, i3=1, W0=2 whole, W1=16 whole]");
  // x[:, idx] (the None omitted): the run of indexed dims starts at 1.
  EXPECT_EQ(rule_str("aten::index.Tensor", {f32({4, 10, 3}), i64({5})}, {f32({4, 5, 3})}),
            "d0 W0 d1, i0 -> d0 i0 d1  [i0=5, d0=4, W0=10 whole, d1=3]");
}

// The index list's Nones are recorded as indices_present; they, not the output shape, say
// which dims are indexed, so the shape check (which infers the output from the inputs)
// gets Falcon's fused_qkv[..., [-2], :] right: indexing dim 2, not dim 0.
TEST(NodeRuleTest, AdvancedIndexingAfterEllipsisIndexesTheRightDim) {
  const ir::Attributes falcon{{"indices_present", Ints{0, 0, 1}}};
  EXPECT_EQ(rule_str("aten::index.Tensor", {f32({4, 16, 6, 16}), i64({1})}, {f32({4, 16, 1, 16})}, falcon),
            "d0 d1 W0 d2, i0 -> d0 d1 i0 d2  [i0=1, d0=4, d1=16, W0=6 whole, d2=16]");
  EXPECT_EQ(inferred("aten::index.Tensor", {f32({4, 16, 6, 16}), i64({1})}, {f32({4, 16, 1, 16})}, falcon),
            (std::vector<Shape>{{4, 16, 1, 16}}));
  // Falcon's new decoder architecture: qkv[:, :, :, [-2]] on [b, s, groups, q + 2, d].
  EXPECT_EQ(inferred("aten::index.Tensor", {f32({4, 16, 2, 4, 16}), i64({1})}, {f32({4, 16, 2, 1, 16})},
                     {{"indices_present", Ints{0, 0, 0, 1}}}),
            (std::vector<Shape>{{4, 16, 2, 1, 16}}));
  // Index tensors apart (x[i, :, j]): their broadcast dims go first, as numpy puts them.
  EXPECT_EQ(rule_str("aten::index.Tensor", {f32({5, 6, 7}), i64({3}), i64({3})}, {f32({3, 6})},
                     {{"indices_present", Ints{1, 0, 1}}}),
            "W0 d0 W1, i0, i0 -> i0 d0  [i0=3, W0=5 whole, d0=6, W1=7 whole]");
  EXPECT_EQ(inferred("aten::index.Tensor", {f32({5, 6, 7}), i64({3}), i64({3})}, {f32({3, 6})},
                     {{"indices_present", Ints{1, 0, 1}}}),
            (std::vector<Shape>{{3, 6}}));
  // A count of present entries that disagrees with the operands: no rule to trust.
  EXPECT_EQ(rule_str("aten::index.Tensor", {f32({5, 6}), i64({3})}, {f32({5, 3})}, {{"indices_present", Ints{1, 1}}}),
            "W0 W1, W2 -> W3 W4  [W0=5 whole, W1=6 whole, W2=3 whole, W3=5 whole, W4=3 whole]");
  // index_put: x[:, idx] = v writes dim 1, so dim 0 stays splittable.
  EXPECT_EQ(rule_str("aten::index_put", {f32({4, 10, 3}), i64({5}), f32({4, 5, 3})}, {f32({4, 10, 3})},
                     {{"indices_present", Ints{0, 1}}}),
            "d0 W0 d1, W1, W2 W3 W4 -> d0 W0 d1  [d0=4, W0=10 whole, d1=3, W1=5 whole, W2=4 whole, W3=5 whole, "
            "W4=3 whole]");
}

// ---- convolution, pooling, normalisation ------------------------------------------------

TEST(NodeRuleTest, Conv2dChannelsAndWindows) {
  const auto rule =
      rule_of(one_node("aten::conv2d", {f32({4, 3, 32, 32}), f32({16, 3, 3, 3}), f32({16})}, {f32({4, 16, 30, 30})}));
  EXPECT_EQ(rule.str(),
            "n c W0 W1, o c W2 W3, o -> n o W4 W5  [n=4, c=3 reduced, o=16, W0=32 whole, W1=32 whole, W2=3 whole, "
            "W3=3 whole, W4=30 whole, W5=30 whole]");
  // Groups are a Spatial major factor of both channel dims.
  EXPECT_EQ(rule_str("aten::conv2d", {f32({4, 8, 8, 8}), f32({16, 4, 1, 1})}, {f32({4, 16, 8, 8})},
                     {{"groups", std::int64_t{2}}}),
            "n (g c) W0 W1, (g o) c 1 1 -> n (g o) W2 W3  [n=4, g=2, c=4 reduced, o=8, W0=8 whole, W1=8 whole, "
            "W2=8 whole, W3=8 whole]");
  EXPECT_FALSE(inferred("aten::conv2d", {f32({4, 3, 32, 32}), f32({16, 3, 3, 3})}, {f32({4, 16, 30, 30})}));
}

TEST(NodeRuleTest, PoolingAndBatchNorm) {
  EXPECT_EQ(rule_str("aten::max_pool2d", {f32({4, 16, 32, 32})}, {f32({4, 16, 16, 16})}, {{"kernel_size", Ints{2, 2}}}),
            "d0 d1 W0 W1 -> d0 d1 W2 W3  [d0=4, d1=16, W0=32 whole, W1=32 whole, W2=16 whole, W3=16 whole]");
  EXPECT_EQ(
      rule_str("aten::adaptive_avg_pool2d", {f32({4, 32, 3, 3})}, {f32({4, 32, 1, 1})}, {{"output_size", Ints{1, 1}}}),
      "d0 d1 W0 W1 -> d0 d1 1 1  [d0=4, d1=32, W0=3 whole, W1=3 whole]");
  // Training: the batch is reduced over like the spatial dims (per-channel statistics).
  EXPECT_EQ(rule_str("aten::batch_norm", {f32({4, 16, 8, 8}), f32({16}), f32({16}), f32({16}), f32({16})},
                     {f32({4, 16, 8, 8})}, {{"training", true}}),
            "W0 d0 W1 W2, d0, d0, d0, d0 -> W0 d0 W1 W2  [W0=4 whole, d0=16, W1=8 whole, W2=8 whole]");
  EXPECT_EQ(rule_str("aten::batch_norm", {f32({4, 16, 8, 8}), f32({16}), f32({16}), f32({16}), f32({16})},
                     {f32({4, 16, 8, 8})}, {{"training", false}}),
            "d0 d1 W0 W1, d1, d1, d1, d1 -> d0 d1 W0 W1  [d0=4, d1=16, W0=8 whole, W1=8 whole]");
}

// ---- attention and losses ------------------------------------------------------------------

TEST(NodeRuleTest, ScaledDotProductAttention) {
  const auto rule =
      rule_of(one_node("aten::scaled_dot_product_attention",
                       {f32({2, 12, 16, 64}), f32({2, 12, 20, 64}), f32({2, 12, 20, 32}), boolean({2, 1, 16, 20})},
                       {f32({2, 12, 16, 32})}, {{"scale", 0.125}}));
  EXPECT_EQ(rule.str(),
            "b h s D, b h T D, b h T e, b 1 s T -> b h s e  [b=2, h=12, s=16, D=64 whole, T=20 whole, e=32]");
  EXPECT_FALSE(rule.indices[2].ring);  // cross-attention: 16 queries over 20 keys
  // A [s, t] mask broadcasts over batch and heads. Masked self-attention shares s between the
  // query, key and value rows, split only by ring attention; the mask's columns keep T.
  const auto masked = rule_of(one_node("aten::scaled_dot_product_attention",
                                       {f32({2, 4, 8, 16}), f32({2, 4, 8, 16}), f32({2, 4, 8, 16}), boolean({8, 8})},
                                       {f32({2, 4, 8, 16})}));
  EXPECT_EQ(masked.str(), "b h s D, b h s D, b h s e, s T -> b h s e  [b=2, h=4, s=8 whole, D=16 whole, T=8 whole, e=16]");
  EXPECT_TRUE(masked.indices[2].ring);
  EXPECT_FALSE(masked.indices[4].ring);
  // Grouped-query attention: q heads are (g r), k/v heads g, so kv groups stay splittable.
  EXPECT_EQ(
      rule_str("aten::scaled_dot_product_attention", {f32({2, 8, 16, 64}), f32({2, 2, 16, 64}), f32({2, 2, 16, 64})},
               {f32({2, 8, 16, 64})}, {{"enable_gqa", true}}),
      "b (g r) s D, b g T D, b g T e -> b (g r) s e  [b=2, g=2, r=4, s=16, D=64 whole, T=16 whole, e=64]");
  // is_causal: the mask is by position within the call, so a local shard of s would mask by
  // its local rows; s is whole, the query, key and value rows' one index, for ring attention.
  const auto causal = rule_of(one_node("aten::scaled_dot_product_attention",
                                       {f32({2, 4, 8, 16}), f32({2, 4, 8, 16}), f32({2, 4, 8, 16})},
                                       {f32({2, 4, 8, 16})}, {{"is_causal", true}}));
  EXPECT_EQ(causal.str(), "b h s D, b h s D, b h s e -> b h s e  [b=2, h=4, s=8 whole, D=16 whole, e=16]");
  EXPECT_TRUE(causal.indices[2].ring);
  EXPECT_EQ(inferred("aten::scaled_dot_product_attention",
                     {f32({2, 4, 8, 16}), f32({2, 4, 10, 16}), f32({2, 4, 10, 32})}, {f32({2, 4, 8, 32})}),
            (std::vector<Shape>{{2, 4, 8, 32}}));
  // Multi-query attention (Falcon-7B): one k/v head broadcast against the query heads, so
  // the heads stay splittable and each shard reads the k/v head whole.
  EXPECT_EQ(rule_str("aten::scaled_dot_product_attention",
                     {f32({4, 4, 16, 16}), f32({4, 1, 16, 16}), f32({4, 1, 16, 16}), boolean({4, 1, 16, 16})},
                     {f32({4, 4, 16, 16})}),
            "b h s D, b 1 s D, b 1 s e, b 1 s T -> b h s e  [b=4, h=4, s=16 whole, D=16 whole, T=16 whole, e=16]");
}

TEST(NodeRuleTest, CrossEntropyReducesTheBatch) {
  EXPECT_EQ(rule_str("aten::cross_entropy_loss", {f32({32, 1000}), i64({32})}, {f32({})}),
            "n C, n -> ()  [n=32 reduced(mean), C=1000 whole]");
  EXPECT_EQ(
      rule_str("aten::cross_entropy_loss", {f32({32, 1000}), i64({32})}, {f32({32})}, {{"reduction", std::int64_t{0}}}),
      "n C, n -> n  [n=32, C=1000 whole]");
  EXPECT_EQ(rule_str("aten::cross_entropy_loss", {f32({4, 10, 7}), i64({4, 7}), f32({10})}, {f32({})},
                     {{"reduction", std::int64_t{2}}}),
            "n C d2, n d2, C -> ()  [n=4 reduced, C=10 whole, d2=7 reduced]");
  EXPECT_EQ(rule_str("aten::mse_loss", {f32({4, 3}), f32({4, 3})}, {f32({})}),
            "r0 r1, r0 r1 -> ()  [r0=4 reduced(mean), r1=3 reduced(mean)]");
}

TEST(NodeRuleTest, WritesIntoAViewInFunctionalForm) {
  // out[:, t] = src: the written dim is addressed (Whole), the others are shared with src.
  EXPECT_EQ(rule_str("aten::select_scatter", {f32({4, 3, 8}), f32({4, 8})}, {f32({4, 3, 8})},
                     {{"dim", std::int64_t{1}}, {"index", std::int64_t{2}}}),
            "d0 W0 d1, d0 d1 -> d0 W0 d1  [d0=4, W0=3 whole, d1=8]");
  EXPECT_EQ(rule_str("aten::slice_scatter", {f32({4, 6}), f32({4, 2})}, {f32({4, 6})},
                     {{"dim", std::int64_t{1}}, {"start", std::int64_t{2}}, {"end", std::int64_t{4}}}),
            "d0 W0, d0 W1 -> d0 W0  [d0=4, W0=6 whole, W1=2 whole]");
  EXPECT_EQ(rule_str("aten::copy", {f32({4, 6}), f32({4, 6})}, {f32({4, 6})}), "d0 d1, d0 d1 -> d0 d1  [d0=4, d1=6]");
}

TEST(NodeRuleTest, AMeanOverClassIndicesIsCountedByItsTargets) {
  // Class-index targets: the mean divides by the weight of the targets not ignored, which
  // the data decides (a -100 label counts nothing).
  DimRule plain = rule_of(one_node("aten::cross_entropy_loss", {f32({32, 10}), i64({32})}, {f32({})}));
  ASSERT_TRUE(plain.counted_mean.has_value());
  EXPECT_EQ(plain.counted_mean->target, 1);
  EXPECT_EQ(plain.counted_mean->weight, -1);
  DimRule weighted = rule_of(one_node("aten::nll_loss_nd", {f32({4, 10, 7}), i64({4, 7}), f32({10})}, {f32({})}));
  ASSERT_TRUE(weighted.counted_mean.has_value());
  EXPECT_EQ(weighted.counted_mean->weight, 2);
  // A sum, no reduction, or class probabilities (a mean over the rows: a fixed count) is not.
  EXPECT_FALSE(rule_of(one_node("aten::cross_entropy_loss", {f32({32, 10}), i64({32})}, {f32({})},
                                {{"reduction", std::int64_t{2}}}))
                   .counted_mean);
  EXPECT_FALSE(rule_of(one_node("aten::cross_entropy_loss", {f32({32, 10}), i64({32})}, {f32({32})},
                                {{"reduction", std::int64_t{0}}}))
                   .counted_mean);
  EXPECT_FALSE(rule_of(one_node("aten::cross_entropy_loss", {f32({32, 10}), f32({32, 10})}, {f32({})})).counted_mean);
  EXPECT_FALSE(rule_of(one_node("aten::mse_loss", {f32({4, 3}), f32({4, 3})}, {f32({})})).counted_mean);
}

// ---- creation, casts, metadata ---------------------------------------------------------------

TEST(NodeRuleTest, CreationOps) {
  EXPECT_EQ(rule_str("aten::arange", {}, {i64({16})}, {{"end", std::int64_t{16}}}), " -> d0  [d0=16]");
  EXPECT_EQ(inferred("aten::arange.start_step", {}, {i64({5})},
                     {{"start", std::int64_t{1}}, {"end", 10.0}, {"step", std::int64_t{2}}}),
            (std::vector<Shape>{{5}}));
  EXPECT_EQ(inferred("aten::full", {}, {f32({2, 3})}, {{"size", Ints{2, 3}}, {"fill_value", 1.0}}),
            (std::vector<Shape>{{2, 3}}));
  // new_ones reads its input for dtype and device only.
  EXPECT_EQ(rule_str("aten::new_ones", {i64({1, 16})}, {boolean({})}, {{"size", Ints{}}}),
            "m0.0 m0.1 -> ()  [m0.0=1, m0.1=16]");
  EXPECT_EQ(rule_str("aten::ones_like", {f32({2, 3})}, {f32({2, 3})}), "_0 _1 -> _0 _1  [_0=2, _1=3]");
}

TEST(NodeRuleTest, CastsAndMetadataOnlyOps) {
  EXPECT_EQ(rule_str("aten::to.dtype", {f32({2, 3})}, {ir::TensorType{ir::DType::BF16, {2, 3}, {}}},
                     {{"dtype", std::string("bf16")}}),
            "_0 _1 -> _0 _1  [_0=2, _1=3]");
  EXPECT_EQ(rule_str("aten::type_as", {f32({2, 3}), i64({7})}, {i64({2, 3})}),
            "_0 _1, m1.0 -> _0 _1  [_0=2, _1=3, m1.0=7]");
  // An op with no outputs.
  EXPECT_EQ(rule_str("aten::_assert_tensor_metadata", {f32({2, 3})}, {}), "m0.0 m0.1 ->   [m0.0=2, m0.1=3]");
}

// ---- errors and unknown ops -----------------------------------------------------------------

TEST(NodeRuleTest, ContradictoryShapesNameTheNode) {
  auto g = one_node("aten::mm", {f32({2, 3}), f32({4, 5})}, {f32({2, 5})}, {}, "encoder.fc");
  try {
    dim_rule_for(OpTable::builtin(), g.graph, g.node());
    FAIL() << "expected a ValidationError";
  } catch (const support::ValidationError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("aten::mm"), std::string::npos) << what;
    EXPECT_NE(what.find("'out0'"), std::string::npos) << what;
    EXPECT_NE(what.find("encoder.fc"), std::string::npos) << what;
    EXPECT_NE(what.find("input 1 dim 0 is 4 but index k is 3"), std::string::npos) << what;
    EXPECT_NE(what.find("f32[4,5]"), std::string::npos) << what;
  }
  // More ways to contradict a rule.
  EXPECT_THROW(rule_str("aten::mm", {f32({2, 3})}, {f32({2, 5})}), support::ValidationError);  // operand count
  EXPECT_THROW(rule_str("aten::mm", {f32({2, 3, 1}), f32({3, 5})}, {f32({2, 5})}), support::ValidationError);  // rank
  EXPECT_THROW(rule_str("aten::mm", {f32({2, 3}), f32({3, 5})}, {f32({2, 6})}), support::ValidationError);     // output
  EXPECT_THROW(rule_str("aten::view", {f32({2, 8, 768})}, {f32({2, 8, 12, 32})}, {{"size", Ints{2, 8, 12, 32}}}),
               support::ValidationError);  // element count
  EXPECT_THROW(rule_str("aten::softmax.int", {f32({2, 3})}, {f32({2, 3})}, {{"dim", std::int64_t{2}}}),
               support::ValidationError);  // dim out of range
  EXPECT_THROW(rule_str("aten::softmax.int", {f32({2, 3})}, {f32({2, 3})}), support::ValidationError);  // missing dim
  EXPECT_THROW(rule_str("aten::split.Tensor", {f32({6})}, {f32({3}), f32({3})},
                        {{"split_size", std::int64_t{3}}, {"dim", std::string("x")}}),
               support::ValidationError);  // malformed attribute
}

TEST(NodeRuleTest, UnknownOpHasNoRule) {
  auto g = one_node("mylib::fused_thing", {f32({2, 3})}, {f32({2, 3})});
  EXPECT_FALSE(dim_rule_for(OpTable::builtin(), g.graph, g.node()));
  EXPECT_FALSE(infer_output_shapes(OpTable::builtin(), g.graph, g.node()));
}

TEST(NodeRuleTest, InstantiateWithoutAGraph) {
  const auto* spec = OpTable::builtin().find("aten::mm");
  const ir::TensorType a = f32({4, 8}), b = f32({8, 2});
  RuleOperands operands;
  operands.inputs = {&a, &b};
  operands.outputs_known = false;
  operands.output_count = 1;
  const auto rule = instantiate_rule(*spec, operands, "mm on rank 0");
  ASSERT_TRUE(rule);
  EXPECT_EQ(rule->shape_of(rule->outputs[0]), (Shape{4, 2}));
}

}  // namespace
}  // namespace shardwise::ops
