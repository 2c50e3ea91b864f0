// The one table of the runtime's distributed kernels: the splits that are neither local nor
// a fallback. An index that is Whole for the local rule (ops/dim_rule.h) can still be split
// where the runtime has a kernel that combines the ranks' parts:
//  - lookup: a table split over its rows (the vocabulary-parallel embedding: each rank looks
//    up its rows, the partial sums are reduced): aten::embedding;
//  - statistics: a normalised dim split, the per-row statistics all-reduced over the axis
//    that splits it (python/shardwise/runtime/kernels.py runs each):
//      aten::cross_entropy_loss          shardwise::vocab_cross_entropy  row max, sum of
//                                        exponentials, target logit (Megatron's loss)
//      aten::nll_loss, _nd, 2d           shardwise::vocab_nll_loss       the target's value
//      aten::softmax.int, _softmax       shardwise::split_softmax        row max, sum of exp
//      aten::log_softmax.int, _log_softmax shardwise::split_log_softmax  the same
//      aten::layer_norm                  shardwise::split_layer_norm     mean, then variance
//      aten::rms_norm                    shardwise::split_rms_norm       mean square
//      aten::batch_norm (training)       shardwise::sync_batch_norm      per-channel mean, then
//                                        variance, over the split batch or spatial dims
//                                        (SyncBatchNorm); the running statistics from them
//    Losses without class weights only (a weighted mean's denominator is not a row statistic).
//  - ring: self-attention's sequence split (Index::ring), the key and value blocks passed
//    around the axis' ranks, each block's partial output merged by its log-sum-exp
//    (python/shardwise/runtime/ring_attention.py; ring attention, Liu et al. 2023):
//      aten::scaled_dot_product_attention  shardwise::ring_attention  without dropout (its
//                                          draws would not be one device's)
//  - dispatch: a mixture of experts' tokens split with its experts (Index::dispatch), each
//    rank's tokens sent to their experts' ranks and the results back by all-to-all with
//    per-rank counts, dropless (python/shardwise/runtime/expert_dispatch.py):
//      shardwise_moe::experts              shardwise::experts_all_to_all
// The search offers and prices a statistics or lookup split only where this table has a
// kernel (search/sharding_strategies.cc), and the rewrite emits the kernel the table names
// (transform/spmd_rewrite.h, transform/rank_graph.h): the plan is what runs.
#pragma once

#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "ir/graph.h"

namespace shardwise::ops {

const std::set<std::string>& lookup_kernel_ops();      // {"aten::embedding"}
const std::set<std::string>& statistics_kernel_ops();  // every op of the statistics table above

// The runtime's kernel for `node` split over a statistics index ("shardwise::split_softmax"),
// or nullopt: its op is not in `ops`, or the kernel does not cover its operands (a loss with
// class weights).
std::optional<std::string_view> statistics_kernel(const ir::Node& node,
                                                  const std::set<std::string>& ops = statistics_kernel_ops());
bool has_statistics_kernel(const ir::Node& node, const std::set<std::string>& ops = statistics_kernel_ops());
bool is_statistics_kernel(std::string_view kernel);  // a name of the table's kernels (ring's too)

// The runtime's kernel for `node`'s sequence split over a ring ("shardwise::ring_attention"),
// or nullopt: not an attention the kernel runs (another op, dropout).
std::optional<std::string_view> ring_kernel(const ir::Node& node);

// The dispatch kernel's name (a node whose strategy dispatches its tokens runs it).
inline constexpr std::string_view kExpertsAllToAll = "shardwise::experts_all_to_all";

// The sequence length of `node` in `graph` when it runs as a ring (ring_kernel, and
// self-attention: queries and keys one sequence), else 0. What a context-parallel plan asks of
// every attention (cost/plan_cost.h, search/joint_planner.h).
std::int64_t ring_rows(const ir::Graph& graph, const ir::Node& node);

}  // namespace shardwise::ops
