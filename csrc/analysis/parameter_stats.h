// Parameter and buffer counts of a graph: elements and bytes over the Parameter-role and
// Buffer-role values. A tied weight (GPT-2's lm_head and wte) is one value, so it counts once.
//
// Worked example: a graph with parameters f32[4,16] and f32[4] and a buffer i64[]
//   -> {parameters 68, parameter_bytes 272, buffers 1, buffer_bytes 8}
#pragma once

#include <cstdint>

#include "ir/graph.h"

namespace shardwise::analysis {

struct ParameterStats {
  std::int64_t parameters = 0;  // elements
  std::int64_t parameter_bytes = 0;
  std::int64_t buffers = 0;  // elements
  std::int64_t buffer_bytes = 0;

  friend bool operator==(const ParameterStats&, const ParameterStats&) = default;
};

ParameterStats parameter_stats(const ir::Graph& graph);

}  // namespace shardwise::analysis
