#include "ir/verifier.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "ir/parser.h"
#include "support/error.h"

namespace shardwise::ir {
namespace {

// values: 0 %x (input), 1 %fc.weight (parameter), 2 %h (node 0), 3 %y (input),
//         4 %a, 5 %b (node 1, two outputs), 6 %s (node 2)
constexpr const char* kGood = R"(graph(%x: f32[b2,16], %y: f32[b2,2]) {
  %fc.weight: f32[4,16] parameter
  %h: f32[b2,4] = aten::linear(%x, %fc.weight) @fc
  %y: f32[b2,2] input
  %a: f32[b2,2], %b: f32[b2,2] = aten::split.Tensor(%h) {dim=1, split_size=2} @blocks.0
  %s: f32[b2,2] = aten::add.Tensor(%a, %y)
  return (%s, %b)
})";

struct Parts {
  std::vector<Value> values;
  std::vector<Node> nodes;
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;
};

Parts good_parts() {
  const Graph g = parse_graph(kGood);
  return Parts{g.values(), g.nodes(), g.inputs(), g.outputs()};
}

// Applies `corrupt` to good parts and expects a ValidationError containing `what`.
void expect_violation(const std::function<void(Parts&)>& corrupt, const std::string& what) {
  Parts p = good_parts();
  corrupt(p);
  try {
    verify_graph_parts(p.values, p.nodes, p.inputs, p.outputs);
    ADD_FAILURE() << "no error; expected: " << what;
  } catch (const support::ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << "message: " << e.what() << "\nexpected: " << what;
  }
}

TEST(VerifierTest, AcceptsWellFormedGraphs) {
  EXPECT_NO_THROW(verify_graph(parse_graph(kGood)));
  EXPECT_NO_THROW(verify_graph(Graph{}));
  const Parts p = good_parts();
  EXPECT_NO_THROW(verify_graph_parts(p.values, p.nodes, p.inputs, p.outputs));
}

TEST(VerifierTest, BatchDimOutOfRange) {
  Graph g = parse_graph(kGood);
  g.mutable_type(0).batch_dim = 2;
  try {
    verify_graph(g);
    FAIL() << "no error";
  } catch (const support::ValidationError& e) {
    EXPECT_STREQ(e.what(), "value 0 %x: batch_dim 2 is out of range for f32[2,16] (rank 2)");
  }
  g.mutable_type(0).batch_dim = -1;
  EXPECT_THROW(verify_graph(g), support::ValidationError);
}

TEST(VerifierTest, NegativeDimension) {
  Graph g = parse_graph(kGood);
  g.mutable_type(6).shape[1] = -1;
  EXPECT_THROW(verify_graph(g), support::ValidationError);
  expect_violation([](Parts& p) { p.values[1].type.shape[0] = -4; }, "value 1 %fc.weight: dimension 0 of f32[-4,16] is negative");
}

TEST(VerifierTest, ValueIdsMustBeDense) {
  expect_violation([](Parts& p) { p.values[3].id = 7; }, "value 3 %y: has id 7 at position 3");
}

TEST(VerifierTest, NamesMustBeNonEmptyAndUnique) {
  expect_violation([](Parts& p) { p.values[2].name.clear(); }, "has an empty name");
  expect_violation([](Parts& p) { p.values[5].name = "a"; }, "value 5 %a: duplicates the name of value 4");
}

TEST(VerifierTest, ActivationsNeedAProducer) {
  expect_violation([](Parts& p) { p.values[2].producer.reset(); }, "value 2 %h: is an activation without a producer node");
  expect_violation([](Parts& p) { p.values[2].producer = 9; }, "value 2 %h: has producer node 9, which does not exist");
}

TEST(VerifierTest, LeavesHaveNoProducer) {
  expect_violation([](Parts& p) { p.values[1].producer = 0; }, "value 1 %fc.weight: is a leaf (parameter) but has producer node 0");
  expect_violation([](Parts& p) { p.values[1].output_index = 1; }, "is a leaf (parameter) but has output_index 1");
}

TEST(VerifierTest, ProducerAndOutputsAgree) {
  // The value claims node 1 output 1, but node 1 lists value 5 there.
  expect_violation([](Parts& p) { p.values[4].output_index = 1; },
                   "node 1 (aten::split.Tensor) at module 'blocks.0': output 0 is value 4 %a, whose producer is node 1 output 1");
  // The node lists a leaf as its output.
  expect_violation([](Parts& p) { p.nodes[2].outputs[0] = 3; },
                   "node 2 (aten::add.Tensor) at the root module: output 0 is value 3 %y, a leaf (input) rather than an activation");
  // A value nobody lists.
  expect_violation(
      [](Parts& p) {
        p.nodes[1].outputs.pop_back();
      },
      "value 5 %b: names node 1 output 1 as its producer, but that node does not list it");
  expect_violation([](Parts& p) { p.nodes[0].outputs[0] = 42; }, "output 0 is value id 42, which does not exist");
}

TEST(VerifierTest, OutputsAreConsecutiveAndInNodeOrder) {
  // Swap which node produces which value: node order no longer matches creation order.
  expect_violation(
      [](Parts& p) {
        std::swap(p.nodes[0].outputs, p.nodes[2].outputs);
        p.values[2].producer = 2;
        p.values[6].producer = 0;
      },
      "node 1 (aten::split.Tensor) at module 'blocks.0': output 0 has id 4: outputs must be consecutive ids");
}

TEST(VerifierTest, NodeIdsOpsAndAttributes) {
  expect_violation([](Parts& p) { p.nodes[1].id = 0; }, "node 1 (aten::split.Tensor) at module 'blocks.0': has id 0 at position 1");
  expect_violation([](Parts& p) { p.nodes[2].op.clear(); }, "node 2 () at the root module: has an empty op name");
  expect_violation([](Parts& p) { p.nodes[1].attrs[""] = std::int64_t{1}; }, "has an attribute with an empty name");
}

TEST(VerifierTest, OperandsExistAndComeFirst) {
  expect_violation([](Parts& p) { p.nodes[0].inputs[1] = -1; },
                   "node 0 (aten::linear) at module 'fc': operand 1 is value id -1, which does not exist");
  // Node 0 reads %s, produced by node 2.
  expect_violation([](Parts& p) { p.nodes[0].inputs[0] = 6; },
                   "node 0 (aten::linear) at module 'fc': operand 0 is value 6 %s (produced by node 2), which is "
                   "defined after the node");
  // Node 0 reads the input %y, created after node 0.
  expect_violation([](Parts& p) { p.nodes[0].inputs[0] = 3; }, "operand 0 is value 3 %y, which is defined after the node");
  // A node reading its own output.
  expect_violation([](Parts& p) { p.nodes[2].inputs[0] = 6; }, "node 2 (aten::add.Tensor) at the root module: operand 0 is value 6 %s");
}

TEST(VerifierTest, GraphInputsListTheInputValuesInOrder) {
  expect_violation([](Parts& p) { std::swap(p.inputs[0], p.inputs[1]); }, "value 0 %x: is an input but is not graph input 0");
  expect_violation([](Parts& p) { p.inputs.pop_back(); }, "value 3 %y: is an input but is not graph input 1");
  expect_violation([](Parts& p) { p.inputs.push_back(1); },
                   "graph inputs: input 2 is value 1 %fc.weight, which is a parameter rather than an input");
  expect_violation([](Parts& p) { p.inputs.push_back(99); }, "graph inputs: input 2 is value id 99, which does not exist");
}

TEST(VerifierTest, GraphOutputsExist) {
  expect_violation([](Parts& p) { p.outputs[1] = 7; }, "graph outputs: output 1 is value id 7, which does not exist");
}

TEST(VerifierTest, ZeroOutputNodesAreCheckedToo) {
  const Graph g = parse_graph(R"(graph(%x: f32[2]) {
  debug::print(%x)
  %w: f32[2] parameter
  %y: f32[2] = aten::mul.Tensor(%x, %w)
  debug::print(%y, %w)
  return (%y)
})");
  EXPECT_NO_THROW(verify_graph(g));
  Parts p{g.values(), g.nodes(), g.inputs(), g.outputs()};
  p.nodes[0].inputs[0] = 2;  // %y, produced by the next node
  EXPECT_THROW(verify_graph_parts(p.values, p.nodes, p.inputs, p.outputs), support::ValidationError);
}

}  // namespace
}  // namespace shardwise::ir
