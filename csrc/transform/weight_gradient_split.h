// Where a pipeline stage's backward splits into its input-gradient part (B) and its
// weight-gradient part (W), so that a zero-bubble schedule (csrc/schedule/schedules.h,
// ZB-H1) can run W later (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024).
//
// Input: one stage's graph (transform/stage_split.h: its boundary values are
// shardwise::recv outputs, its sends shardwise::send nodes). Every value falls in one class:
//  - activation: an input, a received value, or made from one (its gradient flows on to the
//    stage's inputs, and is B's work);
//  - weight: made from parameters (and buffers or constants) only: t(w), w.to(bf16), a
//    gathered shard, an embedding of constant positions;
//  - constant: neither (buffers, constants, arange).
// A weight value read by a node whose output is an activation is a *boundary*: the runtime
// cuts the weight's gradient path there for B (the read takes a fresh leaf in its place) and
// W makes the weight gradient from the gradient B left at that node's output. A weight value
// the stage sends (or returns) is a *weight output*: its gradient, received from the next
// stage, goes straight to the weights in W. Everything else of backward is B's.
//
// Exact by construction: B computes every activation gradient as the fused backward does
// (the boundary leaves take no gradient in it); W sums, per boundary, the node's product with
// the gradient at its output, which is the fused backward's weight-side term.
//
// Worked example: %t = aten::t(%w); %y = aten::mm(%x, %t); %z = aten::add.Tensor(%y, %b):
// boundaries mm input 1 (%t) and add input 1 (%b); %t is a weight value read by nothing else.
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
#include <string>
#include <vector>

#include "ir/graph.h"

namespace shardwise::transform {

struct WeightBoundary {
  std::string node;          // the reading node's first output
  std::vector<int> inputs;   // its input positions that read a weight value
};

struct WeightGradientSplit {
  std::vector<WeightBoundary> boundaries;   // in node order
  std::vector<std::string> weight_outputs;  // sent or returned weight values, in graph order
};

WeightGradientSplit weight_gradient_split(const ir::Graph& stage);

// The pass: marks `stage_rank_graph`'s boundaries in place (ids kept; a second run changes
// nothing).
void mark_weight_cuts(ir::Graph& stage_rank_graph);

// A marked node's weight operands (its boundary's inputs); empty for a node without the mark.
std::vector<std::int64_t> weight_cut_operands(const ir::Node& node);

// A send the pass marked: the value it sends is a weight output.
bool sends_weight_output(const ir::Node& node);

}  // namespace shardwise::transform
