#include "transform/dead_code.h"

#include <gtest/gtest.h>

#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"

namespace shardwise::transform {
namespace {

using ir::parse_graph;
using ir::print_graph;

TEST(DeadCodeTest, RemovesUnusedNodesAndKeepsLeaves) {
  ir::Graph g = parse_graph(R"(graph(%x: f32[b2,4], %unused_input: f32[3]) {
  %w: f32[4,4] parameter
  %unused_param: f32[7] parameter
  %dead1: f32[b2,4] = aten::neg(%x)
  %h: f32[b2,4] = aten::mm(%x, %w) @fc
  %dead2: f32[b2,4] = aten::exp(%dead1)
  %stats: f32[4] buffer
  %y: f32[b2,4] = aten::relu(%h)
  %dead3: f32[b2,4] = aten::add.Tensor(%dead2, %y)
  return (%y)
})");
  EXPECT_TRUE(eliminate_dead_code(g));
  EXPECT_EQ(print_graph(g), R"(graph(%x: f32[b2,4], %unused_input: f32[3]) {
  %w: f32[4,4] parameter
  %unused_param: f32[7] parameter
  %h: f32[b2,4] = aten::mm(%x, %w) @fc
  %stats: f32[4] buffer
  %y: f32[b2,4] = aten::relu(%h)
  return (%y)
}
)");
  // Ids are dense again and the graph is well formed.
  EXPECT_NO_THROW(ir::verify_graph(g));
  EXPECT_EQ(g.values().size(), 7u);
  EXPECT_EQ(*g.find_value("y"), 6);
  EXPECT_EQ(g.outputs(), std::vector<ir::ValueId>{6});
  EXPECT_EQ(g.node(1).inputs, std::vector<ir::ValueId>{4});
  // A second run finds nothing and leaves the graph as it is.
  const ir::Graph before = g;
  EXPECT_FALSE(eliminate_dead_code(g));
  EXPECT_EQ(g, before);
}

TEST(DeadCodeTest, InPlaceUpdatesOfStateStayThoughNothingReadsThem) {
  // Batch norm's `num_batches_tracked += 1`: an in-place op on a buffer. An in-place op on an
  // activation, or an out-of-place one on the buffer, is dead when unread.
  ir::Graph g = parse_graph(R"(graph(%x: f32[b2,4]) {
  %count: i64[] buffer
  %tracked: i64[] = aten::add_.Tensor(%count, %count)
  %h: f32[b2,4] = aten::relu(%x)
  %dead1: f32[b2,4] = aten::add_.Tensor(%h, %h)
  %dead2: i64[] = aten::add.Tensor(%count, %count)
  %dead3: f32[b2,4] = aten::__and__.Tensor(%x, %x)
  return (%h)
})");
  EXPECT_TRUE(eliminate_dead_code(g));
  EXPECT_EQ(print_graph(g), R"(graph(%x: f32[b2,4]) {
  %count: i64[] buffer
  %tracked: i64[] = aten::add_.Tensor(%count, %count)
  %h: f32[b2,4] = aten::relu(%x)
  return (%h)
}
)");
}

TEST(DeadCodeTest, MultiOutputNodeStaysWhenOneOutputIsUsed) {
  ir::Graph g = parse_graph(R"(graph(%x: f32[4,8]) {
  %a: f32[4,4], %b: f32[4,4] = aten::split.Tensor(%x) {dim=1, split_size=4}
  %c: f32[4,4] = aten::relu(%b)
  return (%c)
})");
  const ir::Graph before = g;
  EXPECT_FALSE(eliminate_dead_code(g));
  EXPECT_EQ(g, before);
}

TEST(DeadCodeTest, NoOutputsMeansEveryNodeIsDead) {
  ir::Graph g = parse_graph(R"(graph(%x: f32[2]) {
  %p: f32[2] parameter
  %a: f32[2] = aten::add.Tensor(%x, %p)
  debug::print(%a)
  return ()
})");
  EXPECT_TRUE(eliminate_dead_code(g));
  EXPECT_EQ(print_graph(g), "graph(%x: f32[2]) {\n  %p: f32[2] parameter\n  return ()\n}\n");
}

TEST(DeadCodeTest, KeepsOrderWhenInputsComeAfterParameters) {
  ir::Graph g = parse_graph(R"(graph(%x: f32[2]) {
  %p: f32[2] parameter
  %x: f32[2] input
  %dead: f32[2] = aten::neg(%p)
  %q: f32[2] buffer
  %y: f32[2] = aten::add.Tensor(%x, %q)
  return (%y, %x)
})");
  EXPECT_TRUE(eliminate_dead_code(g));
  EXPECT_EQ(print_graph(g), R"(graph(%x: f32[2]) {
  %p: f32[2] parameter
  %x: f32[2] input
  %q: f32[2] buffer
  %y: f32[2] = aten::add.Tensor(%x, %q)
  return (%y, %x)
}
)");
  EXPECT_NO_THROW(ir::verify_graph(g));
  EXPECT_EQ(g.inputs(), std::vector<ir::ValueId>{1});
}

TEST(DeadCodeTest, EmptyGraph) {
  ir::Graph g;
  EXPECT_FALSE(eliminate_dead_code(g));
}

}  // namespace
}  // namespace shardwise::transform
