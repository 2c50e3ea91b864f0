// Ops of a graph the op table has no rule for. Such nodes are not an error: the search
// treats them as replicate-only. This pass lists them so a user sees what was not sharded
// and where.
//
// One entry per op, in order of first occurrence, with the module path of that first
// occurrence and the number of nodes using the op.
//
// Worked example: two aten::my_op nodes at "blocks.0.mix" and "blocks.1.mix"
//   -> {{"aten::my_op", "blocks.0.mix", 2}}
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"
#include "ops/op_table.h"

namespace shardwise::analysis {

struct UnknownOp {
  std::string op;
  std::string module_path;  // of the first node using it
  int count = 0;

  friend bool operator==(const UnknownOp&, const UnknownOp&) = default;
};

std::vector<UnknownOp> unknown_ops(const ops::OpTable& table, const ir::Graph& graph);

}  // namespace shardwise::analysis
