// Forward FLOPs of a graph, per node, from the op table's FLOPs kinds (ops/op_table.h;
// the constants are listed in ops/op_table_builtin.cc). A multiply-add counts 2.
//
//   contraction (mm, bmm, linear, addmm, matmul, baddbmm, einsum)
//        2 x the product of every index size of the node's dimension rule, plus one per
//        output element for an additive operand (a bias)
//   convolution   2 x output elements x weight elements per output channel (per input
//                 element for a transposed convolution; the smaller count of the two)
//   attention     2*B*s*t*d + 2*B*s*t*e for QK^T and PV, plus 5 per score for the softmax
//   pointwise     1 per output element; reductions, norms, pooling: a constant per input element
//   views, copies, indexing, creation, and ops the table does not know: 0
//
// matmul_total sums the multiply-adds of contractions, convolutions and attention's two
// products only (no bias, no softmax): the number an MFU calculation uses. For GPT-2 with
// batch B, sequence S, hidden h, vocabulary V, L layers:
//   matmul_total = L * (2*B*S*(3h*h + h*h + 8h*h) + 2*2*B*S*S*h) + 2*B*S*h*V
//
// Throws support::ValidationError (from ops::dim_rule_for) when a contraction node's shapes
// contradict its rule.
#pragma once

#include <cstdint>
#include <vector>

#include "ir/graph.h"
#include "ops/op_table.h"

namespace shardwise::analysis {

struct NodeFlops {
  std::int64_t total = 0;
  std::int64_t matmul = 0;  // the part that is matrix multiply-adds

  friend bool operator==(const NodeFlops&, const NodeFlops&) = default;
};

struct FlopsReport {
  std::vector<std::int64_t> per_node;  // indexed by NodeId
  std::int64_t total = 0;
  std::int64_t matmul_total = 0;
};

NodeFlops node_flops(const ops::OpTable& table, const ir::Graph& graph, const ir::Node& node);

FlopsReport forward_flops(const ops::OpTable& table, const ir::Graph& graph);

}  // namespace shardwise::analysis
