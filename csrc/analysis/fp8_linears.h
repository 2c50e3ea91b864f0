// Which nodes run as FP8 linears when a plan's precision is "fp8" (torchao's Float8 training
// with rowwise scales and the weight gradient in high precision, "rowwise_with_gw_hp"):
//
//   aten::linear(x [..., K], W [N, K], bias?)
//   aten::addmm(bias, x [M, K], W [K, N])     alpha = beta = 1 (transformers' Conv1D)
//   aten::mm(x [M, K], W [K, N])
//
// where W is a parameter of the graph (a linear layer's weight, not an activation), x and W
// are float32 or bfloat16, and K and N are multiples of 16 (what torch._scaled_mm needs on
// CUDA; the same rule everywhere, so a plan's FP8 layers do not depend on where it runs).
// Every other node (norms, attention, the rest of the matmuls) computes in the model's dtype.
//
// How such a node computes (python/shardwise/runtime/fp8.py): forward y = x W^T as
// torch._scaled_mm of x scaled per row over K and W per output row over K, both cast to
// float8_e4m3fn; backward dx = dy W as _scaled_mm of dy scaled per row over N and W per
// column over N; dW = dy^T x in the model's dtype. Each scale is a power of two, from the
// amax of its row or column: nothing depends on how the rows (batch, sequence) are split, so
// data, sequence and pipeline parallelism compute the numbers one device computes. A split K
// (a row-parallel weight) makes the forward's amaxes a max over that split's ranks, a split
// N (column-parallel) the backward's: fp8_amax_axes says which mesh axes those are.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "ir/graph.h"

namespace shardwise::analysis {

struct Fp8Linear {
  std::size_t input = 0;   // operand index of x
  std::size_t weight = 0;  // operand index of W
  int weight_k_dim = 1;    // W's contraction dim: 1 for linear's [N, K], 0 for addmm's / mm's [K, N]
  std::int64_t k = 0, n = 0;
};

// The node as an FP8 linear (rules above), or nullopt when it computes in the model's dtype.
std::optional<Fp8Linear> fp8_linear(const ir::Graph& graph, const ir::Node& node);

// How many of the graph's nodes are FP8 linears.
std::size_t count_fp8_linears(const ir::Graph& graph);

}  // namespace shardwise::analysis
