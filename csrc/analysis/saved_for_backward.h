// What autograd keeps for the backward: the bytes of each value's storage that stay alive
// from the forward to the backward, as eager autograd saves them.
//
// A node records an autograd node only when one of its inputs requires a gradient
// (parameters, and what is computed from them). It then saves, by op:
//   products (mul, div, mm, bmm, matmul, linear, addmm, baddbmm)  each operand whose partner
//                                           requires a gradient (x W: x for dW, W for dx)
//   output-saving ops (tanh, sigmoid, exp, rsqrt, sqrt, relu, softmax, log_softmax)  the output
//   cross_entropy_loss                      its log_softmax, one tensor the size of the input
//   dropout that draws                      a one-byte mask per output element
//   shape and sum ops (view, transpose, cat, split, add, sub, neg, sum, mean, to, ...)  nothing
//   scaled_dot_product_attention and its kernels  their inputs and outputs (a fused kernel's
//                                           log-sum-exp, the math kernel's probabilities)
//   embedding                               its indices
//   any other op                            every input (gelu, silu, pow, layer_norm, ...)
// A saved view keeps its base alive: the bytes are charged to the value at the root of the
// view chain (a transpose of a split of a projection keeps the whole projection), once.
//
// Worked example (x an input f32[8,64], W a parameter f32[64,64]):
//   y = linear(x, W)   saves x (for dW) and W (a parameter: not an activation)
//   t = tanh(y)        saves t
//   z = add(t, x)      saves nothing
// saved_bytes: x 2048 (an Input: charged, though no node produces it), y 0, t 2048, z 0.
#pragma once

#include <cstdint>
#include <vector>

#include "ir/graph.h"

namespace shardwise::analysis {

// Indexed by ValueId: the bytes of that value autograd keeps for the backward: its own bytes
// when anything keeps it or a view of it, plus a drawing dropout's mask on the dropout's
// output; 0 for values nothing keeps, views (charged to their base), and parameters, buffers
// and constants (model state, not activations).
std::vector<std::int64_t> saved_for_backward(const ir::Graph& graph);

// Indexed by ValueId: the value at the root of its view chain (itself unless a view op made it:
// view, reshape, transpose, a same-dtype to, ...), the one a kept view is charged to.
std::vector<ir::ValueId> view_roots(const ir::Graph& graph);

// Indexed by NodeId: the saved bytes of the node's outputs (the activations it holds).
std::vector<std::int64_t> saved_bytes_by_node(const ir::Graph& graph);

// Both, from one walk of the graph:
//  - bytes: saved_for_backward's;
//  - saves_by_node: indexed by NodeId, whether the node's autograd node saves any tensor for
//    the backward (a weight too, or a dropout's mask). torch.utils.checkpoint stops a
//    recomputed forward at the last node of the segment that does (its early stop: every
//    saved tensor is then rebuilt), so the nodes after it, and the collectives before them,
//    do not run again in backward.
struct SavedTensors {
  std::vector<std::int64_t> bytes;
  std::vector<bool> saves_by_node;
};
SavedTensors saved_tensors(const ir::Graph& graph);

}  // namespace shardwise::analysis
