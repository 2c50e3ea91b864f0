// Dead-code elimination: drops the nodes whose outputs do not reach a graph output.
//
// Contract:
//  - A node is live when one of its outputs is a graph output or an operand of a live
//    node; every other node is removed (a node without outputs is never live: the IR
//    is functional, a capture returns every effect it keeps).
//  - Leaf values (inputs, parameters, buffers, constants) always stay, used or not: a
//    parameter is module state the plan must still place, and inputs are the calling
//    convention.
//  - The graph is rebuilt: ids are renumbered densely in the old order, names, types,
//    attributes and module paths are kept.
//  - Returns whether anything was removed (false leaves the graph untouched).
//
// Worked example:
//   graph(%x: f32[4]) {
//     %a: f32[4] = aten::relu(%x)
//     %b: f32[4] = aten::neg(%x)        <- removed: %b reaches no output
//     return (%a)
//   }
#pragma once

#include "ir/graph.h"

namespace shardwise::transform {

bool eliminate_dead_code(ir::Graph& graph);

}  // namespace shardwise::transform
