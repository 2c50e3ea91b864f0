// Asynchronous activation gradients as a pass over a rank graph (rank_graph.h): the
// all-reduce of a column-parallel contraction's input gradient run beside the contraction's
// weight gradient, as Megatron-LM's asynchronous tensor-parallel all-reduce does. The pass
// reads only the rank graph (the resharding step nodes the rewrite emitted and the nodes that
// read them) and decides by the rule the search prices the same collective by
// (search::activation_gradient_overlap, parameter_collectives.h), so the plan's price and the
// program agree by construction.
//
// What it marks: a local contraction (aten::linear, aten::addmm, aten::mm; not run whole, not
// a kernel of the core's) whose input operand is read through a region (rank_graph.h) of no
// forward step and one exposed all-reduce (sum) backward, the region's source not a parameter
// and read by this one operand alone, and whose weight operand is a floating parameter's
// region (its gradient is the product the all-reduce hides under). The contraction gets
// {shardwise.async_gradient=i}, the all-reduce {overlap="backward"}.
//
// It runs on every rank graph (no plan option: the runtime always can), before
// collective-matmul (rank_passes.h). It only sets attributes: node and value ids are kept. Run
// again, it changes nothing (a marked all-reduce is not exposed).
//
// The runtime runs the mark (python/shardwise/runtime/async_gradients.py): the contraction's
// backward split, its input gradient's all-reduce started before the weight gradient's product
// and waited after it; its emitter (AsyncGradientEmitter there) reads the mark off the call.
// The collective-matmul pass reads it with async_gradient_operand.
#pragma once

#include <cstdint>

#include "ir/graph.h"

namespace shardwise::transform {

// The pass: marks the asynchronous gradients of `rank_graph` in place.
void overlap_activation_gradients(ir::Graph& rank_graph);

// The operand of `node` whose gradient's all-reduce runs beside its weight gradient (the
// pass's {shardwise.async_gradient=i}), or -1.
std::int64_t async_gradient_operand(const ir::Node& node);

}  // namespace shardwise::transform
