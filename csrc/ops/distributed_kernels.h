// The one table of the runtime's distributed kernels: the splits that are neither local nor
// a fallback. An index that is Whole for the local rule (ops/dim_rule.h) can still be split
// where the runtime has a kernel that combines the ranks' parts:
//  - lookup: a table split over its rows (the vocabulary-parallel embedding: each rank looks
//    up its rows, the partial sums are reduced): aten::embedding;
//  - statistics: a normalised dim split, the per-row statistics all-reduced (Megatron's
//    vocabulary-parallel cross entropy): aten::cross_entropy_loss without class weights.
// The rewrite emits the kernel for these nodes (transform/spmd_rewrite.h) and runs other
// splits of a Whole index whole. Not yet: the search still offers and prices every statistics
// split (compute / n plus the statistics' all-reduce), including those with no kernel here:
// softmax and layer norm over a split dim, and training batch norm over the batch, which
// every data-parallel CNN plan splits. Making the search read this table first needs a batch
// norm kernel (its statistics all-reduced over the batch axis, SyncBatchNorm's): without one
// the search, told the truth, moves ResNet's plans off data parallelism (tried; see
// test_spmd_cnn.py).
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
