// One rank's program as an ir::Graph: the rank program of a plan (spmd_rewrite.h) emitted in
// the same IR as the global graph, with local shapes and every collective an ordinary node.
// It prints and parses like any graph (ir/printer.h), the golden tests hold it
// (tests/golden/sharded_*.ir), and verify_rank_graph checks it against the plan.
//
// What the rank graph holds, from the global graph and a plan's sharding on rank r:
//  - Leaves: every leaf of the global graph, same name, role and dtype, its local shape under
//    the plan's placement (transform/local_shard.h).
//  - Resharding: an operand whose producer leaves it in another placement than its reader
//    needs is read through one node per step (reshard_actions.h), op `shardwise::<kind>`:
//      shardwise::all_gather      {axis, dim, groups?, ratios?, group}
//      shardwise::reduce_scatter  {axis, dim, groups?, group}
//      shardwise::all_reduce      {axis, reduce, group}
//      shardwise::all_to_all      {axis, dim (split), concat_dim, group}
//      shardwise::slice           {axis, dim, groups?, ratios?, group}   (local: no traffic)
//      shardwise::zero_others     {axis, group}                          (local)
//      shardwise::scale           {axis, power, group}                   (local: x n^power)
//    `group` is the ranks of r's group on that mesh axis, in coordinate order. The steps that
//    bring the reader's gradient back to the value's canonical gradient placement follow the
//    forward steps as nodes of the same ops with {pass="backward"}: identity in forward, and
//    in backward the gradient runs through them from the reader back, so the last one
//    emitted runs first. Forward and backward pairs are explicit because a collective's own
//    autograd presumes one gradient placement (all-gather's backward is a reduce-scatter only
//    when the gradient is Partial). The step nodes of one edge (each reading the previous)
//    are one autograd region: forward runs the forward steps, backward the backward steps,
//    and a lowering runs them as one function. Readers that need a value the same way share
//    one region (every step is linear, so its backward on the sum of their gradients is
//    exact). Their values are named `<value>.r<k>` (k-th resharding of the value) and
//    `<value>.r<k>.s<j>` for the steps inside.
//  - Ops, in the mode the rewrite chose:
//      local   the op on local operands, its shape attributes (size, sizes, shape: a list
//              equal to the whole output shape, -1 kept; split_size(s) along the split dim)
//              rewritten to the local output's; the outputs at their local shapes.
//      lookup  shardwise::embedding_lookup(table rows [start, stop), ids) {start, stop, and the
//              op's own attributes}: ids outside the rows look up zeros (a Partial sum).
//      statistics  the table's kernel (ops/distributed_kernels.h: shardwise::vocab_cross_entropy,
//              split_softmax, split_layer_norm, sync_batch_norm, ...) on the op's operands
//              {axis, dim, size, start, stop, and the op's own attributes}: input 0's dim `dim`
//              (whole size `size`) is split on mesh axis `axis`, this rank holding [start,
//              stop) of it; the statistics are all-reduced over the axis, so no rank gathers
//              the operand.
//      whole   the op on whole (gathered) operands, outputs whole, marked {shardwise.whole=true}:
//              the split the plan priced has no distributed kernel here, the local call
//              does not give the local shapes (the op's shape rule says so; see below), or
//              a seeded random op's draws on a block could not be one device's.
//    With recomputation (the plan's sharding.recompute), each node of the k-th instance of
//    the repeated blocks carries {shardwise.recompute=k}: the runtime runs each instance as
//    one checkpointed region, its forward (collectives included) run again in backward.
//    Selective recomputation also marks the nodes whose outputs are kept, not made again
//    ({shardwise.recompute_keeps=true}: analysis/selective_recompute.h).
//    Feature passes rewrite this graph after it is made (rank_passes.h): collective matmul
//    (transform/collective_matmul.h) marks a contraction that runs its operand i's gather as
//    a ring {shardwise.gather_matmul=i}, one that runs its output's reduce-scatter so
//    {shardwise.matmul_scatter=i}, and those collectives {overlap="matmul"}.
//    A dropout or a *_like op on a block or a Partial operand (NodeRewrite::one_device_random,
//    ops/random_draws.h) carries {shardwise.one_device_random=true}: the rank draws the whole
//    operand's mask or values, as one device draws them, and keeps its block.
//    Where the plan runs in fp8 (RewriteOptions::fp8), each FP8 linear (analysis/fp8_linears.h)
//    carries {shardwise.fp8_k_axes=[..], shardwise.fp8_n_axes=[..]}: the mesh axes its
//    forward's and its input gradient's amaxes are a max over (transform/fp8_axes.h); one
//    whose weight is gathered for its read also {shardwise.fp8_saves_float8_weight=true}: it
//    saves the float8 copy of W^T for backward, and its gather is not marked regather.
//    A counted mean split over ranks (CountedRewrite) runs with {reduction=2} (sum) into
//    `<out>.sum`, then `%out = shardwise::counted_mean(%out.sum, %out.count) {shares}`, where
//    `%out.count: i64[]` is an input of the rank graph: the count of the targets in the whole
//    global batch, which the engine counts before the step. A mean over an uneven batch
//    share is followed by aten::mul.Scalar {other=scale}, the op's output named `<out>.share`.
//  - State written in place: a call the capture marks {shardwise.writes=[i, ...]} (batch norm
//    in training writes its running statistics) writes the copy of each leaf operand it read.
//    After it, that copy goes back into the leaf: the steps from the placement the call read
//    to the leaf's (a channel block all-gathered), marked {write_back=true} (their own region:
//    the read's region does not continue into them), then
//    `shardwise::write_state(%leaf, %written)`, no outputs, in the call's recomputed block
//    ({shardwise.recompute=k}: written once, not again when backward runs the block). A
//    call that read the leaf itself has write_state(%leaf, %leaf). A Partial read is refused.
//  - Outputs: every graph output made whole (Replicate) through the same step nodes.
//  - Gradient reductions: a parameter whose gradient stays Partial(sum) on a mesh axis
//    (spmd_rewrite.h: reduce_axes) ends the graph with `shardwise::reduce_gradient(%p)
//    {axes, reduce="sum"}`, no outputs: the engine reduces it after backward, in buckets.
//
// Whole by shape: a local node whose op has a shape rule that, on the local operands and
// rewritten attributes, does not give the local output shapes (or refuses them) is run whole
// instead; rank_graph repeats the rewrite with those nodes in RewriteOptions::whole_nodes
// until none is left. RankGraph::whole lists every node run whole, for either reason.
//
// Errors: spmd_rewrite.h's (ValidationError naming node, value and axis).
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"
#include "plan/plan.h"
#include "transform/spmd_rewrite.h"

namespace shardwise::transform {

struct RankGraph {
  ir::Graph graph;
  std::vector<int> mesh;
  int rank = 0;
  std::vector<std::string> whole;  // nodes (by first output) run whole on gathered operands
  RankProgram program;             // the same program as data (spmd_rewrite.h), as the graph was made from it
  std::vector<ir::NodeId> nodes;   // program.nodes[i]'s call in graph (passes keep node ids)
};

RankGraph rank_graph(const ir::Graph& global, const plan::Sharding& sharding, int rank,
                     const RewriteOptions& options = {});

// The ranks of `rank`'s group on mesh axis `axis`, in coordinate order.
std::vector<std::int64_t> axis_group(const std::vector<int>& mesh, int axis, int rank);

// The resharding region an operand's steps belong to: readers whose operands have one key
// share one resharding (its nodes emitted once, by the first); the value, its forward and
// backward steps and how they run (regather, overlaps, unit groups), so two units reading
// one weight gather it each. The runtime's lowering reads the regions off the graph this
// makes (region_ending_at: readers of one region read the value its last step gives).
std::string resharding_region_key(const OperandRewrite& op);

// A resharding step node of a rank graph (shardwise::<kind> of one operand, with axis= and
// group=), and the step it runs, read back from its attributes (the inverse of the emission).
bool is_step_node(const ir::Node& node);
ReshardAction step_action(const ir::Node& step);
// The ops step nodes call ("shardwise::all_gather", ...), sorted.
std::vector<std::string> step_ops();
// A step of a state write-back (the steps before a shardwise::write_state: {write_back=true}).
bool is_write_back_step(const ir::Node& node);
// Where a collective step node runs, its overlap= mark ("exposed", "forward", "backward",
// "matmul": search/parameter_collectives.h); nullptr for a node without one.
const std::string* step_overlap(const ir::Node& step);

// A resharding region of a rank graph: the chain of step nodes, each reading the one before,
// from the value it starts at; its forward steps, then its backward ones in emission order
// (the reverse of OperandRewrite::backward's).
struct StepRegion {
  ir::ValueId source = -1;
  std::vector<ir::NodeId> forward, backward;
};
// The region whose last step gives `value` (no steps where its producer is not a step node).
StepRegion region_ending_at(const ir::Graph& rank_graph, ir::ValueId value);
// The value a region's last step gives (what its readers read).
ir::ValueId region_end(const ir::Graph& rank_graph, const StepRegion& region);
// Every region of a rank graph, in the order of their last steps.
std::vector<StepRegion> step_regions(const ir::Graph& rank_graph);

// Checks a rank graph against the global graph and the plan (ValidationError naming the rank,
// value and sizes at the first disagreement):
//  - every leaf of the global graph is there, with its role, dtype and the local shape of
//    its placement;
//  - every step node's output shape is what its collective makes of its input's on the mesh,
//    its group is `rank`'s on its axis, and a backward step is the identity shape; every
//    collective carries its overlap mark (search/parameter_collectives.h);
//  - every op with a shape rule gives its outputs' shapes from its operands and attributes;
//  - every activation of the global graph has the local shape of its placement in the plan,
//    or (a node marked shardwise.whole) its whole shape. Skipped for a plan with uneven
//    batch shares (the rewrite spreads the inputs' shares over the batch's activations).
void verify_rank_graph(const ir::Graph& local, const ir::Graph& global, const plan::Sharding& sharding, int rank);

}  // namespace shardwise::transform
