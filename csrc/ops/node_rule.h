// The dimension rule of one node of a graph, and the output shapes its rule implies.
//
// Contract:
//  - dim_rule_for returns nullopt for an op the table does not know (callers treat such a
//    node as replicate-only and report it; see analysis/unknown_ops.h). Otherwise the
//    rule has one entry per node input and output, and every operand dim has exactly the
//    size its indices multiply to (an empty index list: size 1).
//  - When the node's shapes contradict its rule (inner dims of a matmul differ, a view
//    changes the element count, an input does not broadcast) it throws
//    support::ValidationError naming the op, the node (its first output's name), the module
//    path and the disagreeing sizes, e.g.
//      aten::mm node 'mm' (module 'fc'): input 1 dim 0 is 4 but index k is 3
//        [inputs f32[2,3], f32[4,5]; outputs f32[2,5]]
//  - infer_output_shapes builds the rule from the inputs and attributes alone; nullopt when
//    the op is unknown or its rule cannot tell (a convolution's windows depend on stride and
//    padding, which the rule does not model).
//
// Worked example: aten::linear(%x: f32[2,16,768], %w: f32[3072,768]) -> f32[2,16,3072]
//   dim_rule_for(...)->str()  == "_0 _1 k, n k -> _0 _1 n  [_0=2, _1=16, k=768 reduced, n=3072]"
//   infer_output_shapes(...)  == {{2, 16, 3072}}
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "ir/graph.h"
#include "ops/dim_rule.h"
#include "ops/op_table.h"
#include "ops/rule_operands.h"

namespace shardwise::ops {

std::optional<DimRule> dim_rule_for(const OpTable& table, const ir::Graph& graph, const ir::Node& node);

std::optional<std::vector<Shape>> infer_output_shapes(const OpTable& table, const ir::Graph& graph,
                                                      const ir::Node& node);

// The same on bare operands, for callers without a graph (the transform's per-rank shapes,
// tests). `context` prefixes error messages ("aten::mm node 'mm' (module 'fc')").
std::optional<DimRule> instantiate_rule(const OpSpec& spec, const RuleOperands& operands, std::string_view context);

// "aten::mm node 'mm' (module 'fc')": how errors name a node.
std::string describe_node(const ir::Graph& graph, const ir::Node& node);

}  // namespace shardwise::ops
