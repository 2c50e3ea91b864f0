// The one table of the runtime's distributed kernels: the splits that are neither local nor
// a fallback. An index that is Whole for the local rule (ops/dim_rule.h) can still be split
// where the runtime has a kernel that combines the ranks' parts:
//  - lookup: a table split over its rows (the vocabulary-parallel embedding: each rank looks
//    up its rows, the partial sums are reduced): aten::embedding;
//  - statistics: a normalised dim split, the per-row statistics all-reduced (Megatron's
//    vocabulary-parallel cross entropy): aten::cross_entropy_loss without class weights.
// The search offers such a split only where this table says the runtime has the kernel
// (search/sharding_model.cc), so it prices nothing the run does not do; the rewrite emits the
// kernel for the same nodes (transform/spmd_rewrite.h). Softmax and layer norm over a split
// dim have no kernel yet: the search does not split them, and a hand-written plan that does
// runs them whole.
#pragma once

#include <set>
#include <string>

#include "ir/graph.h"

namespace shardwise::ops {

const std::set<std::string>& lookup_kernel_ops();      // {"aten::embedding"}
const std::set<std::string>& statistics_kernel_ops();  // {"aten::cross_entropy_loss"}

// `node`'s op is in `ops` and the kernel covers its operands (cross entropy: no class weights).
bool has_statistics_kernel(const ir::Node& node, const std::set<std::string>& ops = statistics_kernel_ops());

}  // namespace shardwise::ops
