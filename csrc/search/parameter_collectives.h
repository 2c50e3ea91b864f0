// How the runtime runs a parameter's collectives, and so how the search prices them: one
// rule, read by the rewrite (which marks each collective of the rank program with it,
// transform/rank_graph.h) and by the sharding model (search/sharding_model.cc), so the plan
// and the run cannot disagree about what hides beside compute.
//
//  - A parameter held sharded and read whole (ZeRO-3 / FSDP) is gathered for its read in
//    forward: prefetched one read ahead, beside the forward, where forward_gather_overlap
//    says so, else blocking at the read: exposed. After the read the gathered weight is released (not kept
//    for backward) and gathered again, blocking, when backward reads it (backward_reads):
//    exposed. In a recomputed block the recomputed forward gathers it again instead, and
//    backward uses that copy (python/shardwise/runtime/lower.py, Regather).
//  - A gradient reduced to a replicated parameter is all-reduced in the engine's buckets as
//    backward finishes them (runtime/buckets.py, DDP's overlap): beside backward.
//  - A gradient reduced to a shard (ZeRO-3's reduce-scatter) runs at its read's backward
//    step, blocking: exposed.
//  - A collective on an activation or an activation's gradient (a tensor-parallel
//    all-reduce, a sequence-parallel gather, an all-to-all) runs where its reader or its
//    producer's backward needs it, blocking: exposed (activation_collective_overlap).
//    Decomposing one into chunks beside its matmul is issue 21's (asynchronous tensor
//    parallelism); until the runtime does it, the search does not price it.
// Beside-compute seconds cost the overlap interference (cost/constants.h) up to the compute
// they hide under; exposed seconds cost in full.
#pragma once

#include <cstdint>
#include <string_view>

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
// formulas)? Not an additive operand of a contraction (a bias: its gradient is a sum of the
// output's), nor a lookup's table (embedding's backward reads the ids). A gathered parameter
// backward does not read is not gathered again for it.
bool backward_reads(const ops::DimRule& rule, std::size_t operand);

// The reduction of a parameter's gradient to `canonical`, its gradient placement.
ParameterOverlap gradient_reduction_overlap(const Placement& canonical);

// Every collective of a value that is not a parameter, forward or backward.
ParameterOverlap activation_collective_overlap();

}  // namespace shardwise::search
