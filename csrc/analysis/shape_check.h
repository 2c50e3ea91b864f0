// Checks every node's shapes against its op's dimension rule: the operands must fit the
// rule (ops::dim_rule_for), and where the rule and attributes determine the outputs
// (ops::infer_output_shapes) the node's outputs must be those shapes. Nodes of unknown ops
// are skipped (see unknown_ops.h).
//
// Throws support::ValidationError at the first inconsistency, naming the op, the output
// value, the module path and the sizes, e.g.
//   aten::view node 'view_3' (module 'transformer.h.0.attn'): output 0 'view_3' is [2,16,12,32]
//   but its input and attributes give [2,16,12,64]
#pragma once

#include "ir/graph.h"
#include "ops/op_table.h"

namespace shardwise::analysis {

void check_shapes(const ops::OpTable& table, const ir::Graph& graph);

}  // namespace shardwise::analysis
