// Instantiating an einsum-like pattern (rule_text.h) on one node's operands.
//
// Index sizes come from the inputs' dims; a size-1 dim of a broadcasting operand ('~', or
// inside '...') ties to no index when the index is larger; a factor of a group "(hd)" gets
// the dim's size divided by its known factors; an index only outputs carry gets its size
// from the outputs (check mode) or stays unknown (infer mode: the result is nullopt).
// Ellipsis indices are labelled "_0", "_1", ... major to minor; metadata-only operands
// ('_') get Spatial indices "m<operand>.<dim>" that no output carries. Operands marked '+' are
// the rule's added terms (DimRule::added).
//
// Worked example: "...k,nk,+n?->...n" on f32[2,16,768], f32[3072,768], f32[3072]
//   indices _0=2, _1=16, k=768 reduced, n=3072;  inputs  (_0 _1 k), (n k), (n);
//   outputs (_0 _1 n)
//
// The result is not yet checked against every operand dim: dim_rule_for does that, so a
// contradiction (k=768 in one operand, 512 in another) surfaces there with the node's name.
#pragma once

#include <optional>

#include "ops/dim_rule.h"
#include "ops/rule_operands.h"
#include "ops/rule_text.h"

namespace shardwise::ops {

// Throws support::ValidationError when the operands cannot fit the pattern at all (wrong
// operand count or rank, a group dim its known factors do not divide).
std::optional<DimRule> instantiate_pattern(const EinsumPattern& pattern, const RuleOperands& operands);

}  // namespace shardwise::ops
