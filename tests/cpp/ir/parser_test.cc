#include "ir/parser.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>

#include "ir/printer.h"
#include "support/error.h"

namespace shardwise::ir {
namespace {

constexpr const char* kSpecExample = R"(graph(%input_ids: i64[b2,8], %labels: i64[b2,8]) {
  %transformer.wte.weight: f32[128,64] parameter
  %running_mean: f32[8] buffer
  %c_const_0: f32[] constant
  %embedding: f32[b2,8,64] = aten::embedding(%transformer.wte.weight, %input_ids) {padding_idx=-1, scale_grad_by_freq=false, sparse=false} @transformer.wte
  %split.0: f32[2,8,32], %split.1: f32[2,8,32] = aten::split.Tensor(%embedding) {dim=2, split_size=32} @transformer.h.0.attn
  %arange: i64[8] = aten::arange()
  return (%split.1, %arange)
}
)";

TEST(ParserTest, ParsesSpecExample) {
  const Graph g = parse_graph(kSpecExample);
  ASSERT_EQ(g.values().size(), 9u);
  ASSERT_EQ(g.nodes().size(), 3u);
  EXPECT_EQ(g.inputs(), (std::vector<ValueId>{0, 1}));
  EXPECT_EQ(g.value(2).name, "transformer.wte.weight");
  EXPECT_EQ(g.value(2).role, ValueRole::Parameter);
  EXPECT_EQ(g.value(3).role, ValueRole::Buffer);
  EXPECT_EQ(g.value(4).role, ValueRole::Constant);
  EXPECT_EQ(g.value(4).type, (TensorType{DType::F32, {}, {}}));
  EXPECT_EQ(g.value(0).type, (TensorType{DType::I64, {2, 8}, 0}));

  const Node& emb = g.node(0);
  EXPECT_EQ(emb.op, "aten::embedding");
  EXPECT_EQ(emb.inputs, (std::vector<ValueId>{2, 0}));
  EXPECT_EQ(emb.module_path, "transformer.wte");
  EXPECT_EQ(emb.attrs.at("padding_idx"), AttrValue{std::int64_t{-1}});
  EXPECT_EQ(emb.attrs.at("sparse"), AttrValue{false});

  const Node& split = g.node(1);
  EXPECT_EQ(split.outputs, (std::vector<ValueId>{6, 7}));
  EXPECT_EQ(g.value(7).output_index, 1);
  EXPECT_EQ(g.value(7).producer, 1);
  EXPECT_EQ(g.node(2).inputs.size(), 0u);
  EXPECT_EQ(g.node(2).module_path, "");
  EXPECT_EQ(g.outputs(), (std::vector<ValueId>{7, 8}));

  EXPECT_EQ(print_graph(g), kSpecExample);
}

TEST(ParserTest, CommentsAndWhitespaceAreFree) {
  const Graph g = parse_graph(R"(
# leading comment
// another one
graph( %x : f32[ b2 , 16 ] )   # trailing comment
{
    // a comment line inside the body
  %w: f32[4,16]
      parameter
  %y: f32[b2,4] =
     aten::linear(%x,%w)   {   approximate = "x#y//z" }   @fc   // '#' inside a string is not a comment
  # before return
  return(%y)
}  // after the graph
# the very end)");
  EXPECT_EQ(print_graph(g),
            "graph(%x: f32[b2,16]) {\n"
            "  %w: f32[4,16] parameter\n"
            "  %y: f32[b2,4] = aten::linear(%x, %w) {approximate=\"x#y//z\"} @fc\n"
            "  return (%y)\n"
            "}\n");
}

TEST(ParserTest, ParsesEveryAttributeForm) {
  const Graph g = parse_graph(R"(graph() {
  %t: f32[] = test::attrs() {i=-42, big=9223372036854775807, small=-9223372036854775808, d=0.125, e=1e+300, f=-2.5E-3, pinf=inf, ninf=-inf, qnan=nan, s="tab\t \"q\" \\ \u00e9 \ud83d\ude00 \/", yes=true, no=false, nothing=none, il=[1, -2, 3], dl=[1.5,-2.0], mixed=[1, 2.5], special=[inf, -inf, 1.0], empty=[], "quoted key"=1}
  return (%t)
})");
  const Attributes& a = g.node(0).attrs;
  EXPECT_EQ(a.at("i"), AttrValue{std::int64_t{-42}});
  EXPECT_EQ(a.at("big"), AttrValue{std::numeric_limits<std::int64_t>::max()});
  EXPECT_EQ(a.at("small"), AttrValue{std::numeric_limits<std::int64_t>::min()});
  EXPECT_EQ(a.at("d"), AttrValue{0.125});
  EXPECT_EQ(a.at("e"), AttrValue{1e300});
  EXPECT_EQ(a.at("f"), AttrValue{-2.5e-3});
  EXPECT_EQ(a.at("pinf"), AttrValue{std::numeric_limits<double>::infinity()});
  EXPECT_EQ(a.at("ninf"), AttrValue{-std::numeric_limits<double>::infinity()});
  ASSERT_TRUE(std::holds_alternative<double>(a.at("qnan")));
  EXPECT_TRUE(std::isnan(std::get<double>(a.at("qnan"))));
  EXPECT_EQ(a.at("s"), AttrValue{std::string("tab\t \"q\" \\ \xc3\xa9 \xf0\x9f\x98\x80 /")});
  EXPECT_EQ(a.at("yes"), AttrValue{true});
  EXPECT_EQ(a.at("no"), AttrValue{false});
  EXPECT_EQ(a.at("nothing"), AttrValue{NoneAttr{}});
  EXPECT_EQ(a.at("il"), AttrValue{(std::vector<std::int64_t>{1, -2, 3})});
  EXPECT_EQ(a.at("dl"), AttrValue{(std::vector<double>{1.5, -2.0})});
  EXPECT_EQ(a.at("mixed"), AttrValue{(std::vector<double>{1.0, 2.5})});
  EXPECT_EQ(a.at("special"), AttrValue{(std::vector<double>{std::numeric_limits<double>::infinity(),
                                                             -std::numeric_limits<double>::infinity(), 1.0})});
  EXPECT_EQ(a.at("empty"), AttrValue{std::vector<std::int64_t>{}});
  EXPECT_EQ(a.at("quoted key"), AttrValue{std::int64_t{1}});

  // Printing and parsing again changes nothing (NaN aside, compared as text).
  const std::string once = print_graph(g);
  EXPECT_EQ(print_graph(parse_graph(once)), once);
}

TEST(ParserTest, DoublesRoundTripExactly) {
  const double values[] = {0.1, 1.0 / 3.0, 1e-320 /* subnormal */, 123456789.123456789, -0.0, 5e-324, 1.7976931348623157e308};
  for (double d : values) {
    Graph g;
    g.add_node("t::d", {}, {{"t", TensorType{}}}, {{"v", d}});
    const Graph back = parse_graph(print_graph(g));
    EXPECT_EQ(std::get<double>(back.node(0).attrs.at("v")), d) << print_graph(g);
    EXPECT_EQ(std::signbit(std::get<double>(back.node(0).attrs.at("v"))), std::signbit(d));
  }
}

TEST(ParserTest, QuotedNamesOpsAndModules) {
  const Graph g = parse_graph(R"(graph(%"a b": f32[2]) {
  %"c\"d": f32[2] = "weird op"(%"a b") @"blocks[0]"
  %e: f32[2] = aten::relu(%"c\"d") @""
  return (%"c\"d", %e)
})");
  EXPECT_EQ(g.value(0).name, "a b");
  EXPECT_EQ(g.value(1).name, "c\"d");
  EXPECT_EQ(g.node(0).op, "weird op");
  EXPECT_EQ(g.node(0).module_path, "blocks[0]");
  EXPECT_EQ(g.node(1).module_path, "");
}

TEST(ParserTest, EveryDtypeParses) {
  for (const char* dtype : {"f64", "f32", "f16", "bf16", "f8e4m3", "f8e5m2", "i64", "i32", "i16", "i8", "u8", "bool",
                            "c64", "c128"}) {
    const std::string text = std::string("graph(%x: ") + dtype + "[b1,2]) {\n  return (%x)\n}\n";
    const Graph g = parse_graph(text);
    EXPECT_EQ(dtype_name(g.value(0).type.dtype), dtype);
    EXPECT_EQ(print_graph(g), text);
  }
}

// ---- malformed input ------------------------------------------------------------

struct BadCase {
  const char* name;
  const char* text;
  int line;
  int column;
  const char* what;  // a substring of the message
};

class ParserErrorTest : public testing::TestWithParam<BadCase> {};

TEST_P(ParserErrorTest, ThrowsParseErrorWithPosition) {
  const BadCase& c = GetParam();
  try {
    parse_graph(c.text);
    FAIL() << "no error for:\n" << c.text;
  } catch (const support::ParseError& e) {
    const std::string msg = e.what();
    const std::string where = "line " + std::to_string(c.line) + ", column " + std::to_string(c.column) + ": ";
    EXPECT_EQ(msg.rfind(where, 0), 0u) << msg;
    EXPECT_NE(msg.find(c.what), std::string::npos) << msg;
  }
}

const BadCase kBadCases[] = {
    {"empty", "", 1, 1, "expected 'graph'"},
    {"not_a_graph", "func(%x: f32[2]) {}", 1, 1, "expected 'graph'"},
    {"unknown_dtype", "graph(%x: f33[2]) {\n  return (%x)\n}", 1, 11, "unknown dtype 'f33'"},
    {"missing_dtype", "graph(%x: [2]) {\n  return (%x)\n}", 1, 11, "expected a tensor type"},
    {"bad_dim", "graph(%x: f32[2,x]) {\n  return (%x)\n}", 1, 17, "expected a dimension size"},
    {"dim_overflow", "graph(%x: f32[99999999999999999999]) {\n  return (%x)\n}", 1, 15, "out of range"},
    {"dim_junk", "graph(%x: f32[2 3]) {\n  return (%x)\n}", 1, 17, "expected ',' or ']'"},
    {"two_batch_dims", "graph(%x: f32[b2,b3]) {\n  return (%x)\n}", 1, 18, "only one batch dimension"},
    {"missing_colon", "graph(%x f32[2]) {\n  return (%x)\n}", 1, 10, "expected ':'"},
    {"undefined_value", "graph(%x: f32[2]) {\n  %y: f32[2] = aten::relu(%z)\n  return (%y)\n}", 2, 27,
     "undefined value %z"},
    {"use_before_def", "graph(%x: f32[2]) {\n  %y: f32[2] = aten::add(%x, %w)\n  %w: f32[2] parameter\n  return (%y)\n}",
     2, 30, "used before its definition at line 3, column 3"},
    {"self_use", "graph() {\n  %y: f32[2] = aten::relu(%y)\n  return (%y)\n}", 2, 27, "used before its definition"},
    {"undefined_output", "graph(%x: f32[2]) {\n  return (%nope)\n}", 2, 11, "undefined value %nope"},
    {"duplicate_name", "graph(%x: f32[2]) {\n  %w: f32[2] parameter\n  %w: f32[3] buffer\n  return (%x)\n}", 3, 3,
     "duplicate value name %w (first declared at line 2, column 3)"},
    {"duplicate_output", "graph(%x: f32[2]) {\n  %x: f32[2] = aten::relu(%x)\n  return (%x)\n}", 2, 3,
     "duplicate value name %x"},
    {"missing_open_brace", "graph(%x: f32[2])\n  return (%x)\n}", 2, 3, "expected '{'"},
    {"missing_close_brace", "graph(%x: f32[2]) {\n  return (%x)\n", 3, 1, "expected '}'"},
    {"missing_return", "graph(%x: f32[2]) {\n  %w: f32[2] parameter\n}", 3, 1, "expected 'return"},
    {"eof_in_body", "graph(%x: f32[2]) {\n  %w: f32[2] parameter\n", 3, 1, "unexpected end of input"},
    {"trailing_junk", "graph() {\n  return ()\n} extra", 3, 3, "after the end of the graph"},
    {"second_graph", "graph() {\n  return ()\n}\ngraph() {\n  return ()\n}", 4, 1, "after the end of the graph"},
    {"unknown_role", "graph() {\n  %w: f32[2] weight\n  return ()\n}", 2, 14, "expected a role"},
    {"activation_role", "graph() {\n  %w: f32[2] activation\n  return ()\n}", 2, 14, "defined by a node line"},
    {"bad_number", "graph() {\n  %a: f32[] = t::x() {d=1x}\n  return ()\n}", 2, 25, "bad number '1x'"},
    {"bad_double", "graph() {\n  %a: f32[] = t::x() {d=1.2.3}\n  return ()\n}", 2, 25, "bad number '1.2.3'"},
    {"int_overflow", "graph() {\n  %a: f32[] = t::x() {d=9223372036854775808}\n  return ()\n}", 2, 25, "out of range"},
    {"double_overflow", "graph() {\n  %a: f32[] = t::x() {d=1e999}\n  return ()\n}", 2, 25, "out of range"},
    {"hex_number", "graph() {\n  %a: f32[] = t::x() {d=0x10}\n  return ()\n}", 2, 25, "bad number"},
    {"infinity_word", "graph() {\n  %a: f32[] = t::x() {d=-infinity}\n  return ()\n}", 2, 25, "bad number"},
    {"unknown_attr_word", "graph() {\n  %a: f32[] = t::x() {d=maybe}\n  return ()\n}", 2, 25,
     "unknown attribute value 'maybe'"},
    {"duplicate_attr", "graph() {\n  %a: f32[] = t::x() {d=1, d=2}\n  return ()\n}", 2, 28, "duplicate attribute 'd'"},
    {"attr_missing_eq", "graph() {\n  %a: f32[] = t::x() {d 1}\n  return ()\n}", 2, 25, "expected '='"},
    {"attr_unclosed", "graph() {\n  %a: f32[] = t::x() {d=1\n  return ()\n}", 3, 3, "expected ',' or '}'"},
    {"list_of_strings", "graph() {\n  %a: f32[] = t::x() {d=[1, \"a\"]}\n  return ()\n}", 2, 29, "expected a number"},
    {"list_unclosed", "graph() {\n  %a: f32[] = t::x() {d=[1, 2}\n  return ()\n}", 2, 30, "expected ']'"},
    {"unterminated_string", "graph() {\n  %a: f32[] = t::x() {s=\"abc}\n  return ()\n}", 2, 25, "unterminated string"},
    {"unterminated_at_eof", "graph() {\n  %a: f32[] = t::x() {s=\"abc", 2, 25, "unterminated string"},
    {"bad_escape", "graph() {\n  %a: f32[] = t::x() {s=\"\\q\"}\n  return ()\n}", 2, 26, "unknown escape"},
    {"short_unicode", "graph() {\n  %a: f32[] = t::x() {s=\"\\u12\"}\n  return ()\n}", 2, 26, "four hex digits"},
    {"lone_surrogate", "graph() {\n  %a: f32[] = t::x() {s=\"\\ud800x\"}\n  return ()\n}", 2, 26, "surrogate"},
    {"empty_name", "graph(%: f32[2]) {\n  return ()\n}", 1, 7, "expected a value name"},
    {"empty_quoted_name", "graph(%\"\": f32[2]) {\n  return ()\n}", 1, 7, "empty value name"},
    {"missing_op", "graph() {\n  %a: f32[] = (%a)\n  return ()\n}", 2, 15, "expected an op name"},
    {"missing_operands", "graph() {\n  %a: f32[] = aten::x\n  return ()\n}", 3, 3, "expected '('"},
    {"operand_not_value", "graph(%x: f32[2]) {\n  %a: f32[2] = aten::relu(x)\n  return ()\n}", 2, 27,
     "expected a value"},
    {"stray_character", "graph() {\n  $\n  return ()\n}", 2, 3, "expected a statement"},
    {"missing_module", "graph() {\n  %a: f32[] = aten::x() @\n  return ()\n}", 2, 26, "expected a module path"},
    {"input_not_in_header", "graph() {\n  %x: f32[2] input\n  return ()\n}", 2, 3, "not listed in the graph header"},
    {"input_type_mismatch", "graph(%x: f32[2]) {\n  %x: f32[3] input\n  return ()\n}", 2, 3,
     "declared as f32[3] here but as f32[2]"},
    {"input_out_of_order", "graph(%x: f32[2], %y: f32[2]) {\n  %x: f32[2] input\n  return ()\n}", 2, 3,
     "out of order"},
    {"input_redeclared_twice", "graph(%x: f32[2]) {\n  %x: f32[2] input\n  %x: f32[2] input\n  return ()\n}", 3, 3,
     "out of order"},
};

INSTANTIATE_TEST_SUITE_P(Malformed, ParserErrorTest, testing::ValuesIn(kBadCases),
                         [](const testing::TestParamInfo<BadCase>& info) { return std::string(info.param.name); });

// A NUL inside the text must not end it early: string_view carries the length.
TEST(ParserTest, NulByteIsAnErrorNotTheEnd) {
  constexpr char kTrailing[] = "graph() {\n  return ()\n}\0junk";
  const std::string trailing(kTrailing, sizeof(kTrailing) - 1);
  EXPECT_THROW(parse_graph(trailing), support::ParseError);
  constexpr char kInside[] = "graph() {\n  \0 return ()\n}";
  const std::string inside(kInside, sizeof(kInside) - 1);
  try {
    parse_graph(inside);
    FAIL() << "no error";
  } catch (const support::ParseError& e) {
    EXPECT_STREQ(e.what(), "line 2, column 3: expected a statement ('%name: type ...', an op, or 'return'), found byte 0x00");
  }
}

// Every prefix and many random corruptions of a valid text either parse or throw
// ParseError: nothing else escapes, nothing crashes or hangs.
void expect_parse_or_parse_error(const std::string& text) {
  try {
    const Graph g = parse_graph(text);
    const std::string printed = print_graph(g);  // whatever parsed prints and parses back
    EXPECT_EQ(print_graph(parse_graph(printed)), printed);
  } catch (const support::ParseError&) {
  } catch (const std::exception& e) {
    ADD_FAILURE() << "unexpected exception " << e.what() << " for:\n" << text;
  }
}

TEST(ParserTest, SurvivesTruncationAndCorruption) {
  const std::string base = std::string(kSpecExample) +
                           "// trailer\n";  // comments after the graph are fine
  for (std::size_t n = 0; n <= base.size(); ++n) expect_parse_or_parse_error(base.substr(0, n));

  std::mt19937 rng(12345);
  const std::string alphabet = "%:[](){},=@\"\\#/b0123456789-.eE xif\n\t\x01\xff";
  for (int iter = 0; iter < 3000; ++iter) {
    std::string text = base;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const std::size_t pos = rng() % text.size();
      switch (rng() % 3) {
        case 0: text[pos] = alphabet[rng() % alphabet.size()]; break;
        case 1: text.erase(pos, 1 + rng() % 8); break;
        default: text.insert(pos, 1, alphabet[rng() % alphabet.size()]);
      }
      if (text.empty()) text = "g";
    }
    expect_parse_or_parse_error(text);
  }
}

TEST(ParserTest, DeepOrLongInputIsNotATrap) {
  // The parser never recurses on input structure; nested brackets are just errors.
  expect_parse_or_parse_error("graph() {\n  %a: f32[] = t::x() {d=" + std::string(200000, '[') + "}\n  return ()\n}");
  expect_parse_or_parse_error("graph(%x: f32[" + std::string(100000, '1') + "]) {\n  return ()\n}");
  std::string many = "graph(%x: f32[2]) {\n";
  std::string last = "x";
  for (int i = 0; i < 20000; ++i) {
    const std::string next = "v" + std::to_string(i);
    many += "  %" + next + ": f32[2] = aten::relu(%" + last + ")\n";
    last = next;
  }
  many += "  return (%" + last + ")\n}\n";
  const Graph g = parse_graph(many);
  EXPECT_EQ(g.nodes().size(), 20000u);
  EXPECT_EQ(print_graph(g), many);
}

}  // namespace
}  // namespace shardwise::ir
