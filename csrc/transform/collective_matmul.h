// Collective matmul as a pass over a rank graph (rank_graph.h): the tensor-parallel
// collectives that run inside their contractions, as rings (Wang et al., ASPLOS 2023;
// torchtitan's async tensor parallelism). The pass reads only the rank graph: the resharding
// step nodes the rewrite emitted and the contractions that read or give their values. It is
// switched on by the plan's sharding.collective_matmul (rank_passes.h), which the search
// priced the same collectives by (search/parameter_collectives.h, MatmulCollective).
//
// What it marks, each collective's ring beside (n-1)/n of its contraction's products:
//  - Gather: a local contraction (linear, mm, addmm; search::collective_matmul_input) whose
//    activation operand is read through one region (rank_graph.h) of one even all-gather
//    along a row dim of the contraction (search::collective_matmul_rows), and one
//    reduce-scatter along the same axis and dim in backward or none (a value without a
//    gradient), each an exposed collective; the operand of no parameter; the contraction the
//    region's first reader (in node order: later readers read the value the ring assembled).
//    The contraction gets {shardwise.gather_matmul=i}, the region's collectives
//    {overlap="matmul"}.
//  - Scatter: a local contraction, not already a Gather, whose output is read by one region
//    of one even reduce-scatter along a row dim forward and one all-gather along it (or none)
//    backward, read by one operand of one node and not a graph output. The contraction gets
//    {shardwise.matmul_scatter=i} (i: its activation operand, whose rows the ring cuts), the
//    region's collectives {overlap="matmul"}.
// Local: a node with shardwise.whole, or a kernel of the core's (shardwise::*), runs another
// call; so does a contraction async_gradients.h marked (its operand's gradient all-reduced in
// its own backward), which keeps its collectives. The pass only sets attributes: node and
// value ids are kept. Run again, it changes nothing (a collective already marked is not
// exposed).
//
// The runtime's emitter (python/shardwise/runtime/collective_matmul.py, RingEmitter) reads
// the marks off the rank IR it lowers: the call's two attributes, and the steps' overlap of
// each operand's region (the binding's rank_ir_operands, which knows no feature).
// operand_ring and scatter_ring read them back here (the tests').
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include "ir/graph.h"
#include "search/parameter_collectives.h"
#include "transform/reshard_actions.h"

namespace shardwise::transform {

// The pass: marks the rings of `rank_graph` in place.
void fuse_collective_matmuls(ir::Graph& rank_graph);

// How a marked rank graph runs `reader`'s operand: Gather, the reader's own ring gathers it;
// Scatter, the ring of the contraction that produced it scattered it; None, as its step nodes
// say (or no steps).
search::MatmulCollective operand_ring(const ir::Graph& rank_graph, const ir::Node& reader, std::size_t operand);

// A contraction marked {shardwise.matmul_scatter=i}: the steps its ring runs on its output,
// forward and backward (in the order their gradient runs them: rank_graph.h's emission order
// reversed). std::nullopt for a node without the mark.
struct RingSteps {
  std::vector<ReshardAction> forward, backward;
};
std::optional<RingSteps> scatter_ring(const ir::Graph& rank_graph, const ir::Node& node);

}  // namespace shardwise::transform
