// The bytes one rank of an SPMD search candidate holds: its share of every parameter's
// weights, gradients and optimizer state, of the activations autograd saves, of the
// checkpoints a recomputation keeps, and the transients (weights gathered for a read, fp8
// cast copies). Per choice, a candidate of one axis beside the other axes' decisions (what
// ShardingModel::solve_axis' problem charges each choice), and summed over the decisions
// (what ShardingModel::evaluate reports).
//
// A rank holds a value's share over every axis: the product of each axis' held fraction
// (placement.h, held_fraction; the largest block where uneven). ZeRO (LeafChoice::zero)
// divides a parameter's optimizer state further by its axis' size; its weights and gradient
// stay as sharded as its placement. Saved activations count what autograd keeps of each
// output (analysis/saved_for_backward.h), a folded node once per instance (once in all where
// its block is recomputed), the outputs selective recomputation keeps whole.
#pragma once

#include <vector>

#include "cost/memory_cost.h"
#include "ir/graph.h"
#include "search/sharding_decisions.h"
#include "search/strategy.h"

namespace shardwise::search {

struct ShardingFacts;
struct ShardingModelOptions;

// The fractions of a leaf a rank holds: of its values, and of its gradient and optimizer
// state (ZeRO shards the state further).
struct LeafShares {
  double held = 1;
  double state_held = 1;
};

// What a step holds beside its weights and optimizer state at the moment it holds the most
// (ShardingMemory::step_peak): saved activations and checkpoints, the parameters' gradients
// made so far, and the transient of that moment (one node's backward gradients in flight, or
// an fp8 plan's forward casts).
struct StepPeak {
  double saved = 0;
  double gradients = 0;
  double working = 0;
  double casts = 0;

  double total() const { return saved + gradients + working + casts; }
};

class ShardingMemory {
 public:
  ShardingMemory(const ShardingFacts& facts, const ShardingDecisions& decisions, const ShardingModelOptions& options)
      : facts_(facts), decisions_(decisions), options_(options) {}

  // Per choice: `choice` on `axis` (-1: none replaced), the other axes as decided.
  // The node's saved outputs, each output's kept share as the recomputation leaves it.
  double node_memory(ir::NodeId node, int axis, const Strategy& choice) const;
  // The same, with each output's kept share given: whole (selective recomputation keeps it),
  // or what autograd saves of it.
  double output_memory(ir::NodeId node, int axis, const Strategy& choice, bool whole) const;
  LeafShares leaf_held(ir::ValueId leaf, int axis, const LeafChoice& choice) const;
  double leaf_memory(ir::ValueId leaf, int axis, const LeafChoice& choice) const;
  cost::ModelStateBytes leaf_memory_by_kind(ir::ValueId leaf, int axis, const LeafChoice& choice) const;

  // Over the decisions. Parameter states by kind: weights (and non-trainable leaves),
  // gradients, optimizer state.
  cost::ModelStateBytes parameter_bytes_by_kind() const;
  // The checkpoints a recomputation keeps (block_folding.h), 0 without one.
  double recompute_checkpoint_bytes() const;
  // Saved activations and the checkpoints, and the float8 copies of gathered weights below.
  double activation_bytes() const;
  // An FP8 linear whose weight is gathered for its read (held sharded, read beyond the rank's
  // share) and whose x takes a gradient saves the float8 copy of W^T for its backward in place
  // of W, which is released and not gathered again (transform/fp8_axes.h): 1 byte an element
  // of the weight as read; 0 for any other node. Priced in the tally, not in each axis' choice.
  double float8_weight_bytes(ir::NodeId node) const;
  // What a backward holds beyond the saved activations: the largest, over the nodes, of the
  // gradients one node's backward holds at once, those of its outputs (read) and of its
  // inputs (made), for the values a gradient reaches, as this rank holds them. In a language
  // model it is the loss' cross-entropy over the vocabulary: its log-probabilities' float32
  // gradient and its input's, 2 x tokens x vocabulary x 4 bytes (GPT-2's 3.1 GiB at 8 x 1,024
  // tokens: a third of the peak an H200 measured, which the saved tensors alone left out).
  // ShardingModel::evaluate adds what of it exceeds the parameters' gradients: at that peak
  // (a one-micro-batch step's first backward nodes) no parameter has a gradient yet. An FP8
  // linear's also holds its dY and W^T casts (cost::fp8_backward_working_bytes).
  double backward_working_bytes() const;
  // One node's, at this rank's shares (not scaled by activation_memory_scale).
  double node_backward_working_bytes(ir::NodeId node) const;
  // The step's peak by liveness over the program, node order being program order. The
  // forward ends holding every saved activation (a recomputed block: its checkpoint only), the
  // moment an fp8 plan's casts are priced at. The backward then runs the nodes in reverse: at
  // each, the saved activations of the nodes not yet run backward, a recomputed block's
  // rebuilt set from its first node backward to its last (its checkpoint until then), the
  // gradients of the parameters whose readers have all run backward (zero_grad leaves none
  // before), and the node's own gradients in flight (node_backward_working_bytes). The step
  // ends holding every gradient. A saved value is freed with its producer's backward (its
  // readers' run first: an upper bound). `activation_scale` multiplies what scales with the
  // batch (saved, working, casts): a rank's uneven share. Replaces the sum of every saved
  // activation, one recomputed block and every gradient, which no moment holds at once: a
  // recomputed GPT-2's loss holds its log-probabilities and their gradients before any layer
  // is rebuilt (benchmarks/fidelity.py: 1.27x the measured peak).
  StepPeak step_peak(double activation_scale = 1) const;
  // The weights readers gather beyond the rank's stored share (FSDP-style: held only while
  // their unit runs): the two largest units' (one gathered, the next prefetched), part of the
  // peak, not of the sum.
  double gathered_parameter_bytes() const;
  // An fp8 plan's forward cast copies (runtime/fp8.py's quantize): the most an FP8 linear's
  // casts of x and W hold at once, as the rank reads them (cost::fp8_cast_transient_bytes); 0
  // for other precisions. Transient beside the backward's working set (evaluate takes the
  // larger of the two); the backward's casts are in backward_working_bytes.
  double fp8_cast_bytes() const;

 private:
  // Per node (every instance, as its representative is decided): the bytes its outputs keep
  // for the backward (a recomputed node's: what its block's backward rebuilds), each saved
  // value at the largest share any reader of it holds.
  std::vector<double> saved_by_node() const;
  // The share of operand `index` (an output where `output`) of `node` this rank holds.
  double operand_share(ir::NodeId node, std::size_t index, bool output) const;
  const ShardingFacts& facts_;
  const ShardingDecisions& decisions_;
  const ShardingModelOptions& options_;
};

}  // namespace shardwise::search
