// Which values the model's state alone makes: parameters, buffers and constants, and what
// one-output ATen ops that draw nothing compute from them alone (a learned position
// embedding, wpe(arange(T)): arange reads nothing), in the dtype of the floating state it
// reads (a cast from float64 to float32 makes a value of its own). A rank that holds such a value
// Replicate holds the same tensor as every other rank of the axis, whatever the batch.
// One definition for the two readers: the rewrite, which keeps such a value's Partial(sum)
// gradient Partial down to its parameters (transform/spmd_rewrite.cc,
// defer_replicated_reductions), and the search, which prices that reduction with the
// parameters' (search/sharding_edges.h, reduced_with_parameters).
#pragma once

#include <vector>

#include "ir/graph.h"

namespace shardwise::analysis {

// Per value id: true where the value is the model's state or made from it alone.
std::vector<bool> state_values(const ir::Graph& graph);

}  // namespace shardwise::analysis
