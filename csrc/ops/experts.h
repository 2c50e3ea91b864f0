// A mixture of experts' experts as one op, shardwise_moe::experts (python/shardwise/_moe_experts.py):
// hidden [t, H], top-k index and weights [t, K], the stacked expert weights gate_up [E, 2I, H]
// and down [E, H, I], expert ids [E]. What expert parallelism splits (the experts, E) and what
// its pricing counts (the stacked weights, the tokens dispatched), read in one place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "ir/graph.h"
#include "ops/dim_rule.h"

namespace shardwise::ops {

bool is_experts(const ir::Node& node);
bool is_experts_op(std::string_view op);  // "shardwise_moe::experts", with or without an overload

// The bytes of a rank's routed rows when it holds `token_share` of an experts op's tokens:
// each token's K rows, a row its hidden vector, its routing weight and its expert id (8
// bytes each). What one all-to-all of the dispatch moves (search/sharding_model.cc,
// cost/plan_cost.cc price it alike).
double routed_bytes(const ir::Graph& graph, const ir::Node& node, double token_share);

// Whether input `input` of `node` is a stacked expert weight (an experts op's inputs 3 and 4).
bool is_expert_weight(const ir::Node& node, std::size_t input);

// The number of experts of an experts op (its gate_up weight's dim 0), else 0.
std::int64_t expert_count(const ir::Graph& graph, const ir::Node& node);

// Marks an experts op's rule: its tokens' index may carry its experts' (Index::dispatch).
// The rule's token index is the hidden input's dim 0, the experts' the gate_up weight's.
void mark_dispatch(DimRule& rule);

}  // namespace shardwise::ops
