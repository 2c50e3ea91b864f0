// The weight-gradient-split pass: where a pipeline stage's backward splits into its
// input-gradient part (B) and its weight-gradient part (W) for a zero-bubble schedule
// (csrc/schedule/schedules.h), marked on the stage's rank graph. Which nodes are the
// boundaries, and why the split is exact: analysis/weight_gradient_split.h.
//
// As a pass (mark_weight_cuts, "weight-gradient-split"): run on each pipeline stage's rank
// graph (stage_rank_graph.h) when the job's schedule splits backward (a zero-bubble schedule),
// it marks each boundary node {shardwise.weight_cut=[i, ...]} and each send of a weight output
// {shardwise.weight_output=true}, which the runtime's lowering reads off the stage's IR
// (python/shardwise/runtime/weight_split.py; the module's weight_outputs). A weight value the
// stage returns is the last stage's, whose backward starts at the loss: it takes no mark. On
// a rank graph a gathered or zeroed parameter (a resharding step of a weight) is a weight
// value too, so the cut falls at the reader's operand, where the lowering reads it resharded
// (tests/golden/weight_cut_pass.ir).
#pragma once

#include <cstdint>
#include <vector>

#include "analysis/weight_gradient_split.h"
#include "ir/graph.h"

namespace shardwise::transform {

// The pass: marks `stage_rank_graph`'s boundaries in place (ids kept; a second run changes
// nothing).
void mark_weight_cuts(ir::Graph& stage_rank_graph);

// A marked node's weight operands (its boundary's inputs); empty for a node without the mark.
std::vector<std::int64_t> weight_cut_operands(const ir::Node& node);

// A send the pass marked: the value it sends is a weight output.
bool sends_weight_output(const ir::Node& node);

}  // namespace shardwise::transform
