#include "ir/printer.h"

#include <gtest/gtest.h>

#include <limits>

#include "ir/parser.h"

namespace shardwise::ir {
namespace {

TensorType f32(std::vector<std::int64_t> shape, std::optional<int> batch = std::nullopt) {
  return TensorType{DType::F32, std::move(shape), batch};
}

// The example of the format's specification, built through the Graph API (so this
// test does not depend on the parser).
Graph spec_example() {
  Graph g;
  auto ids = g.add_value("input_ids", TensorType{DType::I64, {2, 8}, 0}, ValueRole::Input);
  g.add_value("labels", TensorType{DType::I64, {2, 8}, 0}, ValueRole::Input);
  auto wte = g.add_value("transformer.wte.weight", f32({128, 64}), ValueRole::Parameter);
  g.add_value("running_mean", f32({8}), ValueRole::Buffer);
  g.add_value("c_const_0", f32({}), ValueRole::Constant);
  auto emb = g.add_node("aten::embedding", {wte, ids}, {{"embedding", f32({2, 8, 64}, 0)}},
                        {{"padding_idx", std::int64_t{-1}}, {"scale_grad_by_freq", false}, {"sparse", false}},
                        "transformer.wte");
  auto split = g.add_node("aten::split.Tensor", {g.node(emb).outputs[0]},
                          {{"split.0", f32({2, 8, 32})}, {"split.1", f32({2, 8, 32})}},
                          {{"split_size", std::int64_t{32}}, {"dim", std::int64_t{2}}}, "transformer.h.0.attn");
  auto arange = g.add_node("aten::arange", {}, {{"arange", TensorType{DType::I64, {8}, {}}}});
  g.set_outputs({g.node(split).outputs[1], g.node(arange).outputs[0]});
  return g;
}

TEST(PrinterTest, PrintsSpecExampleExactly) {
  EXPECT_EQ(print_graph(spec_example()),
            "graph(%input_ids: i64[b2,8], %labels: i64[b2,8]) {\n"
            "  %transformer.wte.weight: f32[128,64] parameter\n"
            "  %running_mean: f32[8] buffer\n"
            "  %c_const_0: f32[] constant\n"
            "  %embedding: f32[b2,8,64] = aten::embedding(%transformer.wte.weight, %input_ids) "
            "{padding_idx=-1, scale_grad_by_freq=false, sparse=false} @transformer.wte\n"
            "  %split.0: f32[2,8,32], %split.1: f32[2,8,32] = aten::split.Tensor(%embedding) "
            "{dim=2, split_size=32} @transformer.h.0.attn\n"
            "  %arange: i64[8] = aten::arange()\n"
            "  return (%split.1, %arange)\n"
            "}\n");
}

TEST(PrinterTest, EmptyGraph) { EXPECT_EQ(print_graph(Graph{}), "graph() {\n  return ()\n}\n"); }

TEST(PrinterTest, InterleavesLeavesAndNodesInIdOrder) {
  Graph g;
  auto x = g.add_value("x", f32({4}), ValueRole::Input);
  auto a = g.add_node("aten::relu", {x}, {{"a", f32({4})}});
  auto w = g.add_value("w", f32({4}), ValueRole::Parameter);  // created after the node
  auto b = g.add_node("aten::mul.Tensor", {g.node(a).outputs[0], w}, {{"b", f32({4})}});
  g.set_outputs({g.node(b).outputs[0]});
  EXPECT_EQ(print_graph(g),
            "graph(%x: f32[4]) {\n"
            "  %a: f32[4] = aten::relu(%x)\n"
            "  %w: f32[4] parameter\n"
            "  %b: f32[4] = aten::mul.Tensor(%a, %w)\n"
            "  return (%b)\n"
            "}\n");
  EXPECT_EQ(parse_graph(print_graph(g)), g);
}

TEST(PrinterTest, QuotesNamesThatAreNotBare) {
  Graph g;
  auto x = g.add_value("my input", f32({2}), ValueRole::Input);
  g.add_value("tab\there\x01", f32({2}), ValueRole::Parameter);
  auto n = g.add_node("return", {x}, {{"out-1.ok_", f32({2})}}, {{"weird-key", true}, {"ok_key.1", false}},
                      "layers/0 (block)");
  g.add_node("my op", {x}, {});
  g.set_outputs({g.node(n).outputs[0]});
  const std::string text = print_graph(g);
  EXPECT_EQ(text,
            "graph(%\"my input\": f32[2]) {\n"
            "  %\"tab\\there\\u0001\": f32[2] parameter\n"
            "  %out-1.ok_: f32[2] = \"return\"(%\"my input\") {ok_key.1=false, \"weird-key\"=true} "
            "@\"layers/0 (block)\"\n"
            "  \"my op\"(%\"my input\")\n"
            "  return (%out-1.ok_)\n"
            "}\n");
  EXPECT_EQ(parse_graph(text), g);
}

TEST(PrinterTest, InputsAfterParametersGetABodyLine) {
  // torch.export creates parameter placeholders before the user inputs.
  Graph g;
  auto w = g.add_value("fc.weight", f32({4, 16}), ValueRole::Parameter);
  auto x = g.add_value("x", f32({2, 16}, 0), ValueRole::Input);
  auto y = g.add_value("y", f32({2, 4}, 0), ValueRole::Input);
  auto n = g.add_node("aten::linear", {x, w}, {{"linear", f32({2, 4}, 0)}}, {}, "fc");
  auto s = g.add_node("aten::add.Tensor", {g.node(n).outputs[0], y}, {{"sum", f32({2, 4}, 0)}});
  g.set_outputs({g.node(s).outputs[0]});
  const std::string text = print_graph(g);
  EXPECT_EQ(text,
            "graph(%x: f32[b2,16], %y: f32[b2,4]) {\n"
            "  %fc.weight: f32[4,16] parameter\n"
            "  %x: f32[b2,16] input\n"
            "  %y: f32[b2,4] input\n"
            "  %linear: f32[b2,4] = aten::linear(%x, %fc.weight) @fc\n"
            "  %sum: f32[b2,4] = aten::add.Tensor(%linear, %y)\n"
            "  return (%sum)\n"
            "}\n");
  const Graph back = parse_graph(text);
  EXPECT_EQ(back, g);
  EXPECT_EQ(print_graph(back), text);
}

TEST(PrinterTest, NodesWithoutOutputsKeepTheirPlace) {
  Graph g;
  auto x = g.add_value("x", f32({2}), ValueRole::Input);
  g.add_node("debug::print", {x}, {});  // node 0, no outputs
  auto a = g.add_node("aten::relu", {x}, {{"a", f32({2})}});
  g.add_node("debug::print", {g.node(a).outputs[0]}, {}, {{"tag", std::string("after relu")}});
  g.set_outputs({g.node(a).outputs[0]});
  const std::string text = print_graph(g);
  EXPECT_EQ(text,
            "graph(%x: f32[2]) {\n"
            "  debug::print(%x)\n"
            "  %a: f32[2] = aten::relu(%x)\n"
            "  debug::print(%a) {tag=\"after relu\"}\n"
            "  return (%a)\n"
            "}\n");
  EXPECT_EQ(parse_graph(text), g);
}

TEST(PrinterTest, AttributeValuesUseAttrStr) {
  Graph g;
  g.add_node("test::attrs", {}, {{"t", f32({})}},
             {{"i", std::int64_t{-3}},
              {"d", 2.0},
              {"e", 1e-30},
              {"inf", -std::numeric_limits<double>::infinity()},
              {"s", std::string("a \"q\"\n")},
              {"b", true},
              {"n", NoneAttr{}},
              {"il", std::vector<std::int64_t>{2, -1}},
              {"dl", std::vector<double>{0.5, 3.0}},
              {"empty", std::vector<std::int64_t>{}}});
  EXPECT_EQ(print_node(g, 0),
            "%t: f32[] = test::attrs() {b=true, d=2.0, dl=[0.5,3.0], e=1e-30, empty=[], i=-3, il=[2,-1], inf=-inf, "
            "n=none, s=\"a \\\"q\\\"\\n\"}");
  EXPECT_EQ(parse_graph(print_graph(g)), g);
}

TEST(PrinterTest, ValueRefAndQuoteString) {
  EXPECT_EQ(value_ref("transformer.h.0.attn.c_attn.weight"), "%transformer.h.0.attn.c_attn.weight");
  EXPECT_EQ(value_ref("a b"), "%\"a b\"");
  EXPECT_EQ(value_ref("x[0]"), "%\"x[0]\"");
  EXPECT_EQ(quote_string("\"\\\r\b\f\x7f"), "\"\\\"\\\\\\r\\b\\f\\u007f\"");
  EXPECT_EQ(quote_string("caf\xc3\xa9"), "\"caf\xc3\xa9\"");  // UTF-8 passes through
}

// The printer's and the parser's escapes come from one table: each letter maps back.
TEST(PrinterTest, EscapeLettersMapBackToTheirCharacters) {
  for (int i = 0; i < 128; ++i) {
    const auto c = static_cast<char>(i);
    if (const std::optional<char> letter = escape_letter(c)) EXPECT_EQ(unescaped_char(*letter), c);
  }
  EXPECT_EQ(escape_letter('\n'), 'n');
  EXPECT_EQ(escape_letter('a'), std::nullopt);
  EXPECT_EQ(unescaped_char('u'), std::nullopt);  // \uXXXX is read apart
}

}  // namespace
}  // namespace shardwise::ir
