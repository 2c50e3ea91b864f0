// Bytes each node produces: the sum of its outputs' sizes (a node with no outputs: 0).
// The memory a node's results hold until their last use; liveness is another pass.
//
// Worked example: aten::split of f32[2,16,2304] into three f32[2,16,768] -> 3 * 98,304 bytes.
#pragma once

#include <cstdint>
#include <vector>

#include "ir/graph.h"

namespace shardwise::analysis {

// Indexed by NodeId.
std::vector<std::int64_t> activation_bytes(const ir::Graph& graph);

}  // namespace shardwise::analysis
