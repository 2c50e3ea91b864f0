// Which tensor-parallel collectives of a rank program run as collective matmuls
// (search/parameter_collectives.h, MatmulCollective; plans with collective_matmul): the
// rewrite's marks, which the rank graph prints (rank_graph.h: overlap="matmul" on the
// collective, shardwise.gather_matmul / shardwise.matmul_scatter on the contraction) and the
// runtime runs (python/shardwise/runtime/collective_matmul.py).
//
//  - Gather: the first reader (in node order) of an activation whose operand's steps are one
//    even, contiguous all-gather along a row dim of its contraction forward, and one
//    reduce-scatter along the same dim or none backward. Later readers of the same gathered
//    value (the same steps) read the value the ring assembled.
//  - Scatter: a contraction whose output's only reader's operand steps are one even,
//    contiguous reduce-scatter along a row dim forward, and one all-gather along it or none
//    backward. Not a node whose input is already a Gather (one ring per contraction).
// Only local nodes (NodeMode::Local): a statistics or whole node runs another call.
#pragma once

#include <vector>

#include "ir/graph.h"
#include "transform/spmd_rewrite.h"

namespace shardwise::transform {

// Marks `rewrites` (by node id, as rewrite_spmd makes them) in place: OperandRewrite::matmul
// and NodeRewrite::matmul_scatter_forward / _backward.
void mark_collective_matmuls(const ir::Graph& graph, std::vector<NodeRewrite>& rewrites);

}  // namespace shardwise::transform
