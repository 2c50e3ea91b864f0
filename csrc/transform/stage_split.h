// A graph cut into pipeline stages: one graph per stage, in the same IR, whose boundary
// values are shardwise::recv and shardwise::send nodes.
//
// Input: a graph and the stage of each of its nodes (search/stage_assignment.h; stages are
// contiguous in node order, so every value flows forward). Stage g's graph holds:
//  - the leaves its nodes read: parameters, buffers, constants, and the graph inputs (the
//    micro-batch: every stage that reads an input receives it from the data loader, not
//    from the stage before);
//  - `%v = shardwise::recv() {from=g-1, stage=g}` for every activation made before stage g
//    and read at g or later (forwarding, as search/stage_partition.h prices it: a value a
//    later stage reads passes through the stages between, each receiving and sending it);
//  - its nodes, unchanged;
//  - `shardwise::send(%v) {to=g+1, stage=g}` for every value stage g+1 receives, after the
//    nodes, in the order stage g+1 receives them (the order of the values in the graph);
//  - the graph's outputs, on the last stage only (the others return nothing: they send).
// Backward runs the other way: a recv's gradient is sent back to the stage that sent it.
//
// Worked example: %a = f(%x), %b = g(%a), %c = h(%a, %b): a skip from f to h. Nodes f, g, h
// in stages 0, 1, 2: stage 0 sends %a; stage 1 receives %a, runs g and sends %a (forwarded)
// and %b; stage 2 receives %a and %b and runs h.
//
// Errors (support::ValidationError): stage_of_node of another length than the graph's
// nodes, a stage out of [0, stages), or stages that decrease along the node order.
#pragma once

#include <set>
#include <vector>

#include "ir/graph.h"

namespace shardwise::transform {

std::vector<ir::Graph> split_stages(const ir::Graph& graph, const std::vector<int>& stage_of_node, int stages);

// The same cut where a node may run on several stages (stage_rank_graph.h: a resharding
// region read on two stages), each of which copies it; a value made by such a node is never
// received (every stage that reads it makes its own). No check of the stages' order.
std::vector<ir::Graph> split_stages_of(const ir::Graph& graph, const std::vector<std::set<int>>& stages_of_node,
                                       int stages);

}  // namespace shardwise::transform
