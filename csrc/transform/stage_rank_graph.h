// A rank graph cut into pipeline stages, in the order the runtime runs them: the whole graph
// rewritten for the stage's sub-mesh (rank_graph.h, job_rank_graph.h), then cut by the stage
// of every node of the captured graph (search/stage_assignment.h). split_stages
// (stage_split.h) cuts the captured graph; this cuts the rank graph, which holds nodes the
// captured one does not (resharding steps, counted means, gradient reductions), so each is
// given a stage here:
//  - a rewritten node's call: its captured node's stage;
//  - a node that reads only what other nodes give (a counted mean, an uneven mean's scale):
//    the latest stage of its operands' producers;
//  - a resharding region (rank_graph.h: the step nodes of one operand's resharding): every
//    stage that reads it. A region read on two stages runs on each, as its own nodes: a stage
//    receives the value the region starts at, never a resharded one, and each stage's region
//    runs its own backward (the gradients the two readers leave are summed at the value, in
//    the stage that made it);
//  - a gradient reduction (shardwise::reduce_gradient): every stage that reads the parameter;
//  - a state write-back (shardwise::write_state, rank_graph.h): the stages of the call that
//    wrote the value (its steps, a region, follow it);
//  - the graph's outputs, and the regions that make them whole: the last stage.
// Stage g's graph holds, as split_stages': the leaves its nodes read, `shardwise::recv` for
// each value made on an earlier stage and read on g or later (forwarded), its nodes in the
// rank graph's order, then `shardwise::send` of each value stage g+1 receives, or, on the
// last stage, the graph's outputs.
//
// Errors (support::ValidationError): stage_of_node of another length than the captured
// graph's nodes, or a stage out of [0, stages).
#pragma once

#include <vector>

#include "ir/graph.h"
#include "transform/rank_graph.h"

namespace shardwise::transform {

std::vector<ir::Graph> cut_rank_graph(const RankGraph& rank, const ir::Graph& global,
                                      const std::vector<int>& stage_of_node, int stages);

}  // namespace shardwise::transform
