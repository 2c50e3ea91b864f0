// Structural checks of a Graph: the invariants of ir/graph.h that the printer, the
// parser, JSON and every pass rely on. Shape rules of ops are not checked here (the
// ops layer does that); this is only about the graph being well formed.
//
// Checked, with a ValidationError naming the node (id, op, module path) or value:
//  - ids are dense and equal to the position in values() / nodes();
//  - names are non-empty and unique (and find_value agrees);
//  - roles are coherent: an activation has a producer node that lists it at its
//    output_index; a leaf (input / parameter / buffer / constant) has no producer;
//  - a node's outputs are activations it produces, created right after each other,
//    after the outputs of every earlier node (creation order = node order);
//  - a node's operands exist and are defined before the node (topological order);
//  - inputs() is exactly the Input-role values, in id order; graph outputs exist;
//  - tensor types: batch_dim within [0, rank), no negative sizes;
//  - ops and attribute names are non-empty.
//
// Worked example:
//   Graph g = parse_graph(text);
//   g.mutable_type(x).batch_dim = 5;     // x is f32[2,16]
//   verify_graph(g);  // throws: "value 0 %x: batch_dim 5 is out of range for f32[2,16] (rank 2)"
#pragma once

#include <vector>

#include "ir/graph.h"

namespace shardwise::ir {

void verify_graph(const Graph& graph);

// The same checks on the four parts a Graph is made of. Graph's own API cannot build
// most broken graphs, so this is what the tests (and any raw deserializer) use to
// check parts before they become a Graph. verify_graph(g) ==
// verify_graph_parts(g.values(), g.nodes(), g.inputs(), g.outputs()) + the name index.
void verify_graph_parts(const std::vector<Value>& values, const std::vector<Node>& nodes,
                        const std::vector<ValueId>& inputs, const std::vector<ValueId>& outputs);

}  // namespace shardwise::ir
