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
// The transform that marks these boundaries on a stage's rank graph is
// transform/weight_gradient_split.h; the memory the split holds is priced from
// weight_gradient_held_bytes below (cost/plan_cost.cc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace shardwise::analysis {

struct WeightBoundary {
  std::string node;          // the reading node's first output
  std::vector<int> inputs;   // its input positions that read a weight value
};

struct WeightGradientSplit {
  std::vector<WeightBoundary> boundaries;   // in node order
  std::vector<std::string> weight_outputs;  // sent or returned weight values, in graph order
};

WeightGradientSplit weight_gradient_split(const ir::Graph& stage);

// What a split backward holds from a micro-batch's B to its W, by NodeId: the bytes of the
// gradients B leaves at each boundary node's outputs (runtime/weight_split.py keeps them for
// W's weight-side products), at the graph's shapes; 0 for every other node. Counted: the
// node's floating outputs that something reads (an output nobody reads gets no gradient). A
// gradient autograd passes on unchanged is one tensor, counted once: an add.Tensor boundary
// (an activation plus a weight value, a bias or a position embedding) whose activation
// operand has its shape hands its output's gradient to that operand as is, so where that
// operand is itself a boundary's output, the add holds nothing of its own.
// (the add's output gradient is one tensor with its operand's only while the add is that
// operand's one reader: a second reader's gradient is summed into a new one.)
// Worked example (kEmbedThenLinear in tests/cpp/transform/weight_gradient_split_test.cc, its
// batch 2: f32[2,4,8] is 256 bytes): tok = embedding(wte, ids) 256; h = add(tok, pe) 0 (tok's
// gradient, passed on); y = matmul(h, t(w)) 256; z = add(y, b) 0 (y's); in all 512 a
// micro-batch, against the 1,024 of the four boundaries' outputs.
std::vector<std::int64_t> weight_gradient_held_bytes(const ir::Graph& graph);

}  // namespace shardwise::analysis
