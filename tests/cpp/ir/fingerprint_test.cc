#include "ir/fingerprint.h"

#include <gtest/gtest.h>

#include "ir/parser.h"
#include "support/fnv1a.h"

namespace shardwise::ir {
namespace {

constexpr const char* kMlp = R"(graph(%x: f32[b8,16]) {
  %w: f32[32,16] parameter
  %h: f32[b8,32] = aten::linear(%x, %w) @fc
  %y: f32[b8,32] = aten::relu(%h)
  return (%y)
})";

TEST(GraphFingerprint, ShapesDoNotCountNamesOpsAndDataflowDo) {
  const std::string base = graph_fingerprint(parse_graph(kMlp));
  EXPECT_EQ(base.size(), 16u);
  // A wider copy at another batch (a plan searched on it applies here).
  EXPECT_EQ(base, graph_fingerprint(parse_graph(R"(graph(%x: f32[b2,64]) {
  %w: f32[128,64] parameter
  %h: f32[b2,128] = aten::linear(%x, %w) @fc
  %y: f32[b2,128] = aten::relu(%h)
  return (%y)
})")));
  // The same names on another op, another operand, or another role.
  EXPECT_NE(base, graph_fingerprint(parse_graph(R"(graph(%x: f32[b8,16]) {
  %w: f32[32,16] parameter
  %h: f32[b8,32] = aten::linear(%x, %w) @fc
  %y: f32[b8,32] = aten::gelu(%h)
  return (%y)
})")));
  EXPECT_NE(base, graph_fingerprint(parse_graph(R"(graph(%x: f32[b8,16]) {
  %w: f32[32,16] buffer
  %h: f32[b8,32] = aten::linear(%x, %w) @fc
  %y: f32[b8,32] = aten::relu(%h)
  return (%y)
})")));
  EXPECT_NE(base, graph_fingerprint(parse_graph(R"(graph(%x: f32[b8,32]) {
  %w: f32[32,16] parameter
  %h: f32[b8,32] = aten::linear(%x, %w) @fc
  %y: f32[b8,32] = aten::relu(%x)
  return (%y)
})")));
}

TEST(GraphFingerprint, ReadersSeeThroughCasts) {
  // Llama's RMSNorm and residual in a float64 model: the casts are real and the residual add
  // reads the block's input. In a float32 model `x.to(float32)` returns x itself and a capture
  // names the cast as the add's operand: the same model, the same plan, one fingerprint.
  const std::string f64 = graph_fingerprint(parse_graph(R"(graph(%x: f64[b8,16]) {
  %c: f32[b8,16] = aten::to.dtype(%x) {dtype="torch.float32"}
  %n: f32[b8,16] = aten::mul.Tensor(%c, %c)
  %y: f64[b8,16] = aten::to.dtype(%n) {dtype="torch.float64"}
  %r: f64[b8,16] = aten::add.Tensor(%x, %y)
  return (%r)
})"));
  const std::string f32 = graph_fingerprint(parse_graph(R"(graph(%x: f32[b8,16]) {
  %c: f32[b8,16] = aten::to.dtype(%x) {dtype="torch.float32"}
  %n: f32[b8,16] = aten::mul.Tensor(%c, %c)
  %y: f32[b8,16] = aten::to.dtype(%n) {dtype="torch.float32"}
  %r: f32[b8,16] = aten::add.Tensor(%c, %y)
  return (%r)
})"));
  EXPECT_EQ(f64, f32);
  // Reading another value than the cast's source is another graph.
  EXPECT_NE(f64, graph_fingerprint(parse_graph(R"(graph(%x: f64[b8,16]) {
  %c: f32[b8,16] = aten::to.dtype(%x) {dtype="torch.float32"}
  %n: f32[b8,16] = aten::mul.Tensor(%c, %c)
  %y: f64[b8,16] = aten::to.dtype(%n) {dtype="torch.float64"}
  %r: f64[b8,16] = aten::add.Tensor(%n, %y)
  return (%r)
})")));
}

TEST(Fnv1a, ContinuesWhereItStopped) {
  EXPECT_EQ(support::fnv1a64(""), support::kFnv1aOffsetBasis);
  EXPECT_EQ(support::fnv1a64("b", support::fnv1a64("a")), support::fnv1a64("ab"));
  EXPECT_NE(support::fnv1a64("ab"), support::fnv1a64("ba"));
}

}  // namespace
}  // namespace shardwise::ir
