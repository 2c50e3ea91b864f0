// Where an FP8 linear's scales need other ranks (analysis/fp8_linears.h): a rowwise scale is
// the amax of one row of x or W over the contraction dim, so a node whose contraction dim is
// split over a mesh axis takes the max of its amaxes over that axis' ranks first. Forward
// contracts over K (split by a row-parallel weight), backward's dx over N (split by a
// column-parallel one); the batch, the sequence and W's other dim need nothing.
//
// An operand that arrives as a Partial sum cannot be scaled: its rows are not the values one
// device scales (float8 rounds each rank's part, not the sum). Such a node is refused, naming
// the node and the axis; the rewrite reduces operands of a linear before it in the plans the
// search makes.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "ir/graph.h"
#include "transform/spmd_rewrite.h"

namespace shardwise::transform {

struct Fp8Axes {
  std::vector<int> k_axes;  // mesh axes splitting K: the forward's amaxes are a max over them
  std::vector<int> n_axes;  // mesh axes splitting N: the backward's
};

// The node's FP8 axes on this rank's program, or nullopt where the node is no FP8 linear.
// Throws ValidationError for a Partial operand (above).
std::optional<Fp8Axes> fp8_axes(const ir::Graph& graph, const NodeRewrite& node);

// The rank graph's marks of an FP8 linear (rank_graph.h, where RewriteOptions::fp8 is set):
// its call carries both, the axes above.
inline constexpr std::string_view kFp8KAxesAttr = "shardwise.fp8_k_axes";
inline constexpr std::string_view kFp8NAxesAttr = "shardwise.fp8_n_axes";

// The axes a rank graph's call is marked with, or nullopt where it is not marked.
std::optional<Fp8Axes> marked_fp8_axes(const ir::Node& call);

}  // namespace shardwise::transform
