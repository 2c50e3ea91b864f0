#include "ir/graph.h"

#include <gtest/gtest.h>

#include "support/error.h"

namespace shardwise::ir {
namespace {

TEST(GraphTest, BuildsLinearAndFindsUsers) {
  Graph g;
  auto x = g.add_value("x", TensorType{DType::F32, {2, 16}, 0}, ValueRole::Input);
  auto w = g.add_value("fc.weight", TensorType{DType::F32, {4, 16}, {}}, ValueRole::Parameter);
  auto n = g.add_node("aten::linear", {x, w}, {{"linear", TensorType{DType::F32, {2, 4}, 0}}}, {}, "fc");
  g.set_outputs({g.node(n).outputs[0]});
  EXPECT_EQ(g.inputs(), std::vector<ValueId>{x});
  EXPECT_EQ(g.users(w), std::vector<NodeId>{n});
  EXPECT_EQ(g.value(g.node(n).outputs[0]).producer, n);
  EXPECT_EQ(g.value(x).type.str(), "f32[b2,16]");
  EXPECT_EQ(*g.find_value("fc.weight"), w);
}

TEST(GraphTest, UsersByValueIsUsersOfEveryValue) {
  Graph g;
  auto x = g.add_value("x", TensorType{DType::F32, {4}, {}}, ValueRole::Input);
  auto a = g.node(g.add_node("aten::mul.Tensor", {x, x}, {{"a", TensorType{DType::F32, {4}, {}}}})).outputs[0];
  auto b = g.node(g.add_node("aten::neg", {x}, {{"b", TensorType{DType::F32, {4}, {}}}})).outputs[0];
  g.add_node("aten::add.Tensor", {a, b}, {{"c", TensorType{DType::F32, {4}, {}}}});
  const auto users = g.users_by_value();
  ASSERT_EQ(users.size(), g.values().size());
  for (const Value& v : g.values()) EXPECT_EQ(users[static_cast<std::size_t>(v.id)], g.users(v.id)) << v.name;
  EXPECT_EQ(users[static_cast<std::size_t>(x)], (std::vector<NodeId>{0, 1}));  // mul reads x twice: once
}

TEST(GraphTest, RejectsDuplicateNamesAndBadIds) {
  Graph g;
  g.add_value("x", TensorType{}, ValueRole::Input);
  EXPECT_THROW(g.add_value("x", TensorType{}, ValueRole::Parameter), support::ValidationError);
  EXPECT_THROW(g.add_node("aten::relu", {7}, {{"y", TensorType{}}}), support::ValidationError);
  EXPECT_THROW(g.add_value("z", TensorType{}, ValueRole::Activation), support::ValidationError);
  EXPECT_EQ(g.values().size(), 1u);  // nothing changed by the failed calls
}

TEST(GraphTest, RejectsTwoOutputsOfOneNodeWithTheSameName) {
  // Found by fuzzing the JSON reader (tests/fuzz/graph_json_fuzz.cc): add_node checked
  // output names against existing values only, so a split with two outputs "chunk.0"
  // gave a graph with a duplicate name whose printed text did not parse back.
  Graph g;
  auto x = g.add_value("x", TensorType{DType::F32, {4, 8}, 0}, ValueRole::Input);
  try {
    g.add_node("aten::split.Tensor", {x},
               {{"chunk.0", TensorType{DType::F32, {4, 4}, 0}}, {"chunk.0", TensorType{DType::F32, {4, 4}, 0}}});
    FAIL() << "no error";
  } catch (const support::ValidationError& e) {
    EXPECT_STREQ(e.what(), "node 0 (aten::split.Tensor) at module '': output name 'chunk.0' is taken");
  }
  EXPECT_EQ(g.values().size(), 1u);  // nothing added
  EXPECT_TRUE(g.nodes().empty());
}

TEST(AttributeTest, DoublesPrintAsDoubles) {
  EXPECT_EQ(attr_str(AttrValue{1.0}), "1.0");
  EXPECT_EQ(attr_str(AttrValue{std::int64_t{-1}}), "-1");
  EXPECT_EQ(attr_str(AttrValue{std::vector<std::int64_t>{2, 8}}), "[2,8]");
  EXPECT_EQ(attr_str(AttrValue{std::string("tanh")}), "\"tanh\"");
  EXPECT_EQ(attr_str(AttrValue{NoneAttr{}}), "none");
}

}  // namespace
}  // namespace shardwise::ir
