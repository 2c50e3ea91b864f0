// What selective recomputation keeps (plan::Recompute::Selective): in a recomputed block, the
// outputs of its products with a weight and of its fused attention, cached in forward and
// read back when backward runs the block's forward again; every other op (norms, activations,
// residual adds, dropout with its mask drawn again, an unfused attention core) runs twice.
// torchtitan's op-level policy, with Megatron-LM's choice for the attention core: the
// expensive ops run once and the cheap ones twice.
//
// The runtime's policy (runtime/recompute.py) saves the dispatcher ops of
// selective_recompute_saved_ops(); the planner prices the graph's nodes that run as them:
//   aten::linear, aten::mm, aten::addmm          (a linear; addmm / mm at the dispatcher, or
//                                                _scaled_mm in an fp8 plan: analysis/fp8_linears.h)
//   aten::matmul of x [..., k] by a matrix [k, n]  (folded into one mm at the dispatcher)
//   the fused attention kernels (flash, memory-efficient, cuDNN, and scaled_dot_product_attention,
//   which dispatches to one of them); not the math kernel, whose bmm and softmax run twice.
// Not kept: bmm / baddbmm and a matmul of two batched operands (an unfused Q K^T or P V).
#pragma once

#include <string_view>
#include <vector>

#include "ir/graph.h"

namespace shardwise::analysis {

// The dispatcher ops whose outputs the runtime keeps ("aten::mm", ...), in a fixed order.
const std::vector<std::string_view>& selective_recompute_saved_ops();

// Indexed by NodeId: does selective recomputation keep this node's outputs (rules above)?
std::vector<bool> kept_by_selective_recompute(const ir::Graph& graph);

}  // namespace shardwise::analysis
