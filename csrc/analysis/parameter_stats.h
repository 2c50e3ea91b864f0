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

// The precision a plan for this graph is priced in when nothing says otherwise (a plan's
// "precision": "f32", "bf16" or "f16"): the floating dtype holding most parameter elements
// (most floating activation elements for a graph without parameters), as the model trains.
// f64 is priced as "f32": the device catalogue has no f64 rate (on CPUs f64 runs at about
// half the f32 rate, so an f64 plan is predicted fast). No floating value: "f32".
//   a graph of bf16 weights (a GPT built in bf16)          -> "bf16"
//   an f32 model captured as torch holds it                -> "f32"
const char* training_precision(const ir::Graph& graph);

}  // namespace shardwise::analysis
