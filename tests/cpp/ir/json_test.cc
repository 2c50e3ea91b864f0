#include "ir/json.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "ir/parser.h"
#include "ir/printer.h"
#include "support/error.h"

namespace shardwise::ir {
namespace {

using nlohmann::json;

// Inputs after a parameter, a leaf after a node, a zero-output node, quoted names,
// every attribute kind: everything the id merge and the attr encoding must keep.
constexpr const char* kTricky = R"(graph(%x: f32[b2,16], %"odd name": i64[b2]) {
  %fc.weight: f32[4,16] parameter
  %x: f32[b2,16] input
  %h: f32[b2,4] = aten::linear(%x, %fc.weight) @fc
  %"odd name": i64[b2] input
  %scale: f32[] constant
  debug::print(%h)
  %a: f32[b2,2], %b: f32[b2,2] = aten::split.Tensor(%h) {dim=1, split_size=2} @"blocks[0]"
  %running: f32[2] buffer
  %t: f32[b2,2] = test::attrs(%a, %scale, %running) {b=true, d=0.5, dl=[1.0,2.5], e=1e-30, i=-1, il=[2,8], minf=-inf, n=none, pinf=inf, s="tanh \"q\" \u00e9", sl=[inf,-inf,1.5], z=[]}
  return (%t, %b, %"odd name")
})";

TEST(JsonTest, RoundTripKeepsTheGraphExactly) {
  const Graph g = parse_graph(kTricky);
  EXPECT_EQ(graph_from_json(graph_to_json(g)), g);
  EXPECT_EQ(graph_from_json_string(graph_to_json_string(g)), g);
  EXPECT_EQ(graph_from_json_string(graph_to_json_string(g, 2)), g);
  EXPECT_EQ(print_graph(graph_from_json_string(graph_to_json_string(g))), print_graph(g));
}

TEST(JsonTest, NanSurvivesAsText) {
  Graph g;
  g.add_node("t::nan", {}, {{"t", TensorType{}}},
             {{"v", std::numeric_limits<double>::quiet_NaN()},
              {"l", std::vector<double>{std::numeric_limits<double>::quiet_NaN(), 1.0}}});
  const json j = graph_to_json(g);
  EXPECT_EQ(j["nodes"][0]["attrs"]["v"], (json{{"float", "nan"}}));
  const Graph back = graph_from_json(j);
  EXPECT_TRUE(std::isnan(std::get<double>(back.node(0).attrs.at("v"))));
  EXPECT_EQ(print_graph(back), print_graph(g));
}

TEST(JsonTest, WritesTheSchema) {
  const Graph g = parse_graph(R"(graph(%x: f32[b2,16]) {
  %fc.weight: f32[4,16] parameter
  %linear: f32[b2,4] = aten::linear(%x, %fc.weight) {approximate="tanh", dtype=none, scale=0.5, size=[2,8]} @fc
  return (%linear)
})");
  const json expected = json::parse(R"({
    "format": "shardwise.graph", "version": 1,
    "values": [
      {"id": 0, "name": "x", "dtype": "f32", "shape": [2,16], "batch_dim": 0, "role": "input"},
      {"id": 1, "name": "fc.weight", "dtype": "f32", "shape": [4,16], "batch_dim": null, "role": "parameter"}],
    "nodes": [
      {"op": "aten::linear", "inputs": ["x", "fc.weight"],
       "outputs": [{"name": "linear", "dtype": "f32", "shape": [2,4], "batch_dim": 0}],
       "attrs": {"approximate": "tanh", "dtype": null, "scale": 0.5, "size": [2,8]},
       "module": "fc"}],
    "outputs": ["linear"]})");
  EXPECT_EQ(graph_to_json(g), expected);
  // Doubles stay doubles in the text (2.0 is not written as 2).
  Graph d;
  d.add_node("t::d", {}, {{"t", TensorType{}}}, {{"v", 2.0}, {"l", std::vector<double>{1.0}}});
  EXPECT_EQ(graph_to_json_string(d).find("\"v\":2.0") != std::string::npos, true) << graph_to_json_string(d);
  EXPECT_EQ(graph_from_json_string(graph_to_json_string(d)), d);
}

TEST(JsonTest, ReadsHandWrittenJsonWithoutIds) {
  // The shape the Python importer writes: leaves first, optional fields left out.
  const Graph g = graph_from_json_string(R"({
    "format": "shardwise.graph", "version": 1,
    "values": [
      {"name": "fc.weight", "dtype": "f32", "shape": [4,16], "role": "parameter"},
      {"name": "x", "dtype": "f32", "shape": [2,16], "batch_dim": 0, "role": "input"}],
    "nodes": [
      {"op": "aten::linear", "inputs": ["x", "fc.weight"],
       "outputs": [{"name": "linear", "dtype": "f32", "shape": [2,4], "batch_dim": 0}],
       "attrs": {"dim": -1, "scale": 0.5, "approximate": "tanh", "size": [2,8], "flag": true, "dtype": null,
                 "mixed": [1, 2.5], "empty": []},
       "module": "fc", "stack_trace": "ignored"},
      {"op": "aten::relu", "inputs": ["linear"], "outputs": [{"name": "relu", "dtype": "f32", "shape": [2,4]}]}],
    "outputs": ["relu"]})");
  EXPECT_EQ(print_graph(g),
            "graph(%x: f32[b2,16]) {\n"
            "  %fc.weight: f32[4,16] parameter\n"
            "  %x: f32[b2,16] input\n"
            "  %linear: f32[b2,4] = aten::linear(%x, %fc.weight) {approximate=\"tanh\", dim=-1, dtype=none, "
            "empty=[], flag=true, mixed=[1.0,2.5], scale=0.5, size=[2,8]} @fc\n"
            "  %relu: f32[2,4] = aten::relu(%linear)\n"
            "  return (%relu)\n"
            "}\n");
}

// ---- bad input ------------------------------------------------------------------

json good_json() { return graph_to_json(parse_graph(kTricky)); }

void expect_parse_error(const json& j, const std::string& what) {
  try {
    graph_from_json(j);
    ADD_FAILURE() << "no error; expected: " << what;
  } catch (const support::ParseError& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << "message: " << e.what() << "\nexpected: " << what;
  }
}

TEST(JsonTest, RejectsMalformedText) {
  for (const char* text : {"", "{", "{\"format\": }", "[1, 2", "nul", "{\"a\": 1} trailing", "\xff"}) {
    try {
      graph_from_json_string(text);
      ADD_FAILURE() << "no error for " << text;
    } catch (const support::ParseError& e) {
      EXPECT_EQ(std::string(e.what()).rfind("invalid JSON: ", 0), 0u) << e.what();
    }
  }
  // Deep nesting is a parse error or a schema error, never a stack overflow.
  EXPECT_THROW(graph_from_json_string(std::string(100000, '[') + std::string(100000, ']')), support::ParseError);
}

TEST(JsonTest, RejectsBadEnvelope) {
  expect_parse_error(json::array(), "graph: expected an object, found array");
  json j = good_json();
  j.erase("format");
  expect_parse_error(j, "graph: missing \"format\"");
  j = good_json();
  j["format"] = "onnx";
  expect_parse_error(j, "format: expected \"shardwise.graph\", found \"onnx\"");
  j = good_json();
  j["version"] = 2;
  expect_parse_error(j, "version: unsupported version 2");
  j = good_json();
  j["nodes"] = json::object();
  expect_parse_error(j, "nodes: expected an array, found object");
}

TEST(JsonTest, RejectsBadValues) {
  json j = good_json();
  j["values"][1]["dtype"] = "f33";
  expect_parse_error(j, "values[1].dtype: unknown dtype \"f33\"");
  j = good_json();
  j["values"][0]["shape"][1] = 1.5;
  expect_parse_error(j, "values[0].shape[1]: expected an integer, found number");
  j = good_json();
  j["values"][0]["shape"][0] = 18446744073709551615ull;
  expect_parse_error(j, "values[0].shape[0]: integer 18446744073709551615 is out of range");
  j = good_json();
  j["values"][1]["batch_dim"] = 2;
  expect_parse_error(j, "values[1].batch_dim: batch_dim 2 is out of range for rank 2");
  j = good_json();
  j["values"][0]["role"] = "activation";
  expect_parse_error(j, "values[0].role: unknown leaf role \"activation\"");
  j = good_json();
  j["values"][2].erase("name");
  expect_parse_error(j, "values[2]: missing \"name\"");
  j = good_json();
  j["values"][2]["name"] = "x";
  expect_parse_error(j, "values[2]: duplicate value name 'x'");
  j = good_json();
  j["values"][3].erase("id");
  expect_parse_error(j, "values[3]: \"id\" must be given on every value entry or on none");
  j = good_json();
  j["values"][3]["id"] = 2;
  expect_parse_error(j, "values[3].id: id 2 does not fit: 4 values (leaves and node outputs before it) come first");
}

TEST(JsonTest, RejectsBadNodes) {
  json j = good_json();
  j["nodes"][0]["inputs"][1] = "nope";
  expect_parse_error(j, "nodes[0].inputs[1]: undefined value 'nope'");
  j = good_json();
  j["nodes"][0]["inputs"][0] = 3;
  expect_parse_error(j, "nodes[0].inputs[0]: expected a string, found number");
  j = good_json();
  j["nodes"][2]["outputs"][1]["name"] = "h";
  expect_parse_error(j, "nodes[2]: node 2 (aten::split.Tensor) at module 'blocks[0]': output name 'h' is taken");
  j = good_json();
  j["nodes"][0].erase("op");
  expect_parse_error(j, "nodes[0]: missing \"op\"");
  j = good_json();
  j["nodes"][0]["op"] = "";
  expect_parse_error(j, "nodes[0].op: empty op name");
  j = good_json();
  j["nodes"][3]["attrs"]["obj"] = json{{"a", 1}};
  expect_parse_error(j, "nodes[3].attrs.obj: unsupported attribute value of JSON type object");
  j = good_json();
  j["nodes"][3]["attrs"]["il"] = json::array({1, "two"});
  expect_parse_error(j, "nodes[3].attrs.il[1]: a list attribute holds numbers only, found string");
  j = good_json();
  j["nodes"][3]["attrs"]["il"] = json::array({json::array({1})});
  expect_parse_error(j, "nodes[3].attrs.il[0]: a list attribute holds numbers only, found array");
  j = good_json();
  j["nodes"][3]["attrs"]["f"] = json{{"float", "infinity"}};
  expect_parse_error(j, "nodes[3].attrs.f: unknown special float \"infinity\"");
  j = good_json();
  j["nodes"][3]["module"] = 7;
  expect_parse_error(j, "nodes[3].module: expected a string, found number");
  j = good_json();
  j["outputs"][0] = "missing";
  expect_parse_error(j, "outputs[0]: undefined value 'missing'");
}

TEST(JsonTest, RejectsTwoOutputsOfOneNodeWithTheSameName) {
  // Found by fuzzing (tests/fuzz/graph_json_fuzz.cc): the graph was read with two values
  // named "a", and print_graph's text then failed to parse ("duplicate value name %a").
  json j = good_json();
  j["nodes"][2]["outputs"][1]["name"] = "a";
  expect_parse_error(j, "nodes[2]: node 2 (aten::split.Tensor) at module 'blocks[0]': output name 'a' is taken");
}

TEST(JsonTest, InvalidUtf8IsAnErrorWhenWriting) {
  Graph g;
  g.add_value("bad\xff", TensorType{}, ValueRole::Input);
  EXPECT_THROW(graph_to_json_string(g), support::Error);
}

}  // namespace
}  // namespace shardwise::ir
