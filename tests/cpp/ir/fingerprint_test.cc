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

TEST(Fnv1a, ContinuesWhereItStopped) {
  EXPECT_EQ(support::fnv1a64(""), support::kFnv1aOffsetBasis);
  EXPECT_EQ(support::fnv1a64("b", support::fnv1a64("a")), support::fnv1a64("ab"));
  EXPECT_NE(support::fnv1a64("ab"), support::fnv1a64("ba"));
}

}  // namespace
}  // namespace shardwise::ir
