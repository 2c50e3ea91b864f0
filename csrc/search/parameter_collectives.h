// How the runtime runs a parameter's collectives, and so how the search prices them: one
// rule, read by the rewrite (which marks each collective of the rank program with it,
// transform/rank_graph.h) and by the sharding model (search/sharding_edges.cc), so the plan
// and the run cannot disagree about what hides beside compute.
//
//  - A parameter held sharded and read whole (ZeRO-3 / FSDP) is gathered for its read in
//    forward: prefetched a unit ahead (below), beside the forward, where forward_gather_overlap
//    says so, else blocking at the read: exposed. The first unit that reads a parameter is
//    gathered at the program's start and read at once: its gathers are priced exposed
//    (EdgePricer::gather_overlap; outside the repeated blocks, whose reader stands for every
//    layer), though the runtime issues them as prefetches. After the read the gathered weight is
//    released (not kept for backward) and gathered again, blocking, when backward reads it
//    (backward_reads): exposed. In a recomputed block the recomputed forward gathers it again instead, and
//    backward uses that copy (python/shardwise/runtime/lower.py, Regather).
//  - A gradient reduced to a replicated parameter is all-reduced in the engine's buckets as
//    backward finishes them (runtime/buckets.py, DDP's overlap): beside backward.
//  - A gradient reduced to a shard (ZeRO-3's reduce-scatter) at its read's backward step:
//    where gradient_scatter_overlap says so (one reduce-scatter of an even, contiguous shard
//    on one axis), held until its unit's last gradient is made, then issued asynchronously
//    with them and waited for when the next unit's is issued (or when backward ends), its
//    part added to the shard's gradient then (FSDP2's post-backward reduce-scatter,
//    runtime/parameter_gathers.py, DeferredScatters): beside backward; else blocking at the
//    read's backward step: exposed.
//  - A collective on an activation or an activation's gradient (a tensor-parallel
//    all-reduce, a sequence-parallel gather, an all-to-all) runs where its reader or its
//    producer's backward needs it, blocking: exposed (activation_collective_overlap).
//    One exception (activation_gradient_overlap): the all-reduce of an activation's
//    gradient into a contraction that also computes a trainable weight's gradient, the
//    activation's only read, with nothing in forward (the input of a column-parallel
//    linear). The runtime splits that node's backward: the activation's gradient first, its
//    all-reduce issued asynchronously, the weight's gradient computed while it runs
//    (Megatron-LM's asynchronous tensor-parallel all-reduce; runtime/async_gradients.py):
//    beside backward.
//  - Collective matmul (MatmulCollective, below), where the plan asks for it
//    (plan::Sharding::collective_matmul): a tensor-parallel all-gather into a contraction,
//    or a contraction's Partial output reduce-scattered, decomposed into the ring's blocks,
//    each block's product computed while the next block travels (runtime/collective_matmul.py):
//    beside the contraction's products, forward and backward.
//  - Units (FSDP2's): the prefetched gathers of the parameters one unit reads (parameter_units:
//    a transformer layer, or the run of nodes before, between or after the layers) on one
//    axis and in one dtype are one flattened all-gather, issued where the unit before is
//    waited for; their gathers again for backward, one flattened all-gather at the unit's
//    first unpack; their gradients' reduce-scatters beside backward, one flattened
//    reduce-scatter once the unit's last gradient is made. A unit's collective pays one
//    latency: each member its share, by elements (EdgePricer::parameter_latency_share).
//    A collective issued alone pays all of it.
// Beside-compute seconds cost the overlap interference (cost/constants.h) up to the compute
// they hide under; exposed seconds cost in full.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "ir/graph.h"
#include "ops/dim_rule.h"
#include "search/placement.h"

namespace shardwise::search {

enum class ParameterOverlap : std::uint8_t { Exposed, BesideForward, BesideBackward };
std::string_view parameter_overlap_name(ParameterOverlap overlap);  // "exposed", "forward", "backward"

// A parameter's forward gather for one read, from `held` to `wanted` (every mesh axis):
// beside the forward when the runtime prefetches it (issued asynchronously at the previous
// prefetched read, waited at this one: runtime/lower.py, Prefetch), which it does for one
// all-gather of an even, contiguous shard on one axis outside a recomputed block (a
// checkpointed region runs its gathers again in backward); else blocking at the read:
// exposed.
ParameterOverlap forward_gather_overlap(const ShardingSpec& held, const ShardingSpec& wanted, bool recomputed);

// The gather again for backward (the weight was released after its read): blocking when
// backward unpacks it: exposed.
ParameterOverlap regather_overlap();

// Does backward read operand `operand` of a node with `rule` (is it saved for the gradient
// formulas)? Not an added term of a contraction (a bias, DimRule::added: its gradient is
// a sum of the output's), nor a lookup's table (embedding's backward reads the ids), nor a contraction's
// factor whose fellow factors need no gradient (`needs_gradient`: per operand of the node,
// analysis/gradient_flow.h; the first linear of a model, whose input is data, reads only that
// input in backward). A gathered parameter backward does not read is not gathered again for it.
bool backward_reads(const ops::DimRule& rule, std::size_t operand, const std::vector<bool>& needs_gradient);

// The reduction of a parameter's gradient to `canonical`, its gradient placement.
ParameterOverlap gradient_reduction_overlap(const Placement& canonical);

// A parameter's gradient at one read, `gradient` (the reader's, every mesh axis) to
// `canonical` (the parameter's, every axis; Partial where the engine's buckets reduce it):
// beside backward when it is one reduce-scatter, Partial(sum) -> an even, contiguous Shard on
// one axis, with no other axis left Partial (a bucket's hook would reduce the gradient before
// the scatter's part is added) nor cutting the same dim; else exposed. The mirror of
// forward_gather_overlap.
ParameterOverlap gradient_scatter_overlap(const ShardingSpec& gradient, const ShardingSpec& canonical);

// The unit of each node (by node id) for its parameters' grouped collectives: the instance
// of the largest group of repeated blocks (analysis/repeated_blocks.h: a transformer's
// layers) the node belongs to; a node outside every instance belongs to the run of such
// nodes it sits in (the embeddings before the first layer, the final norm and head after
// the last). Numbered from 0 in node order.
std::vector<int> parameter_units(const ir::Graph& graph);

// Every collective of a value that is not a parameter, forward or backward, but for:
ParameterOverlap activation_collective_overlap();

// The backward steps of activation operand `operand` of a node of `op`. `one_all_reduce`:
// they are one all-reduce and the forward has no step; `only_read`: the node is the value's
// only reader (one operand); `trainable_weight[j]`: operand j is a parameter with a gradient.
// BesideBackward where `op` is one whose backward the runtime splits (linear, addmm, mm:
// runtime/async_gradients.py), `operand` is its input and its weight operand is such a
// parameter (its gradient is the product computed while the all-reduce runs); else Exposed.
ParameterOverlap activation_gradient_overlap(std::string_view op, std::size_t operand, bool one_all_reduce,
                                             bool only_read, const std::vector<bool>& trainable_weight);

// Tensor-parallel collective matmul (Wang et al., ASPLOS 2023; torchtitan's async TP): a
// collective on one mesh axis fused with the contraction beside it, run as a ring over the
// axis' ranks (runtime/collective_matmul.py) so that each block's product hides the next
// block's transfer; (n-1)/n of the products cover the collective (the first block's product
// runs before anything has arrived, or the last one after everything has left).
//  - Gather: operand `operand` of the reader, all-gathered along a dim that indexes the
//    contraction's rows (even blocks: contiguous, or strided where a sequence cut was
//    flattened with the batch, GPT-2's Conv1D view before its addmm), its gradient
//    reduce-scattered back along it (or none). Forward: each block arrives and is multiplied while the next travels;
//    backward: each block's input gradient is added into the ring's partial sums as they
//    pass, its weight gradient computed beside them. Readers that share the gathered value
//    (q, k and v of one norm) read the block the ring assembled: the first of them runs the
//    ring.
//  - Scatter: the contraction's Partial(sum) output reduce-scattered along a row dim, the
//    value's only read: forward runs the ring of partial sums; backward gathers the
//    output's gradient block by block, each block's products computed while the next travels.
enum class MatmulCollective : std::uint8_t { None, Gather, Scatter };
std::string_view matmul_collective_name(MatmulCollective kind);  // "none", "gather", "scatter"

// The activation operand of a contraction the runtime runs as a collective matmul (linear:
// 0, addmm: 1, mm: 0), or -1 for any other op, or an addmm whose bias is not a vector (its
// rows would need cutting too).
int collective_matmul_input(const ir::Graph& graph, const ir::Node& node);

// Does dim `dim` of the node's activation operand (and so of its output: a contraction keeps
// its rows) index the contraction's rows: any dim of linear's input but the last; dim 0 of
// mm's and addmm's? The dim a collective matmul may cut.
bool collective_matmul_rows(const ir::Graph& graph, const ir::Node& node, int dim);

}  // namespace shardwise::search
