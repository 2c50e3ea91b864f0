// Which pipeline stage runs each node of a graph: the decision a pipeline plan's stage cut
// makes. It lives in search, next to the partitioner it calls, because it is a search over
// cut positions priced by the graph's FLOPs; transform/stage_split.h then rewrites the graph
// into the stages' programs.
//
//  - layers_per_stage empty, and at least one layer per stage: the layers split evenly
//    (cost::even_layers, the first layers % stages stages one more), as below; the evaluator
//    prices that split and the stage layout search lays it out (plan.h: "balanced").
//  - layers_per_stage empty, fewer layers than stages: balanced by forward FLOPs
//    (stage_partition.h), cut at repeated-block boundaries when the graph has at least
//    stages - 1 of them, else anywhere.
//  - layers_per_stage given (a plan's split): stage k starts at the first node of its first
//    layer (the largest group of repeated blocks, analysis/repeated_blocks.h); nodes before
//    the layers go with the first stage, nodes after them with the last.
//
// Worked example: a 4-layer transformer, 2 stages, layers_per_stage {1, 3}: stage 1 starts
// at the first node of layer 1; the embedding is in stage 0, the head and loss in stage 1.
//
// Errors (support::ValidationError): stages < 1; layers_per_stage with another count than
// `stages`, an entry < 1, or a sum other than the graph's number of layers.
#pragma once

#include <vector>

#include "ir/graph.h"

namespace shardwise::search {

struct StageAssignment {
  std::vector<int> stage_of_node;  // per node, non-decreasing
  std::vector<double> stage_cost;  // forward FLOPs (+1 per node) per stage
};

StageAssignment assign_stages(const ir::Graph& graph, int stages, const std::vector<int>& layers_per_stage = {});

}  // namespace shardwise::search
