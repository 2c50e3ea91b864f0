// Batch-dimension propagation: from the batch_dim already set on some values (the graph's
// inputs, by the importer or the user), mark the batch dim of every value it reaches through
// the ops' dimension rules.
//
// For each node in order: the batch index is the index of the first batch-marked input's
// batch dim (its major factor when the dim is a group, so a [b*s, h] view of [b, s, h] keeps
// b). Every output dim whose major factor is that index becomes the output's batch dim. A
// batch index a node reduces (a mean loss) or makes size 1 goes no further; a value that
// already has a batch_dim keeps it; unknown ops stop the propagation. Then a tensor made from
// a size (a "create(...)" rule: new_empty, zeros, full) that a batched node reads with that
// node's batch index on a dim of the batch's size takes that dim as its batch dim (and the
// propagation runs again from it): DeepSeek-V3's attention builds its keys in a new_empty.
//
// Worked example: %x: f32[b2,16,768] -> linear -> f32[2,16,3072] -> view [32,3072]
//   marks the linear's output dim 0 and the view's output dim 0 (the group (b s) has b major).
//
// Returns whether any value changed. Throws support::ValidationError (from dim_rule_for) on
// a node whose shapes contradict its rule.
#pragma once

#include <cstdint>

#include "ir/graph.h"
#include "ops/op_table.h"

namespace shardwise::analysis {

bool propagate_batch_dim(const ops::OpTable& table, ir::Graph& graph);

// The batch size the graph was built at: the size of the batch dim of its first input that
// has one; 0 when no input has a batch dim.
std::int64_t input_batch(const ir::Graph& graph);

}  // namespace shardwise::analysis
