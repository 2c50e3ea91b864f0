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
  // The weight is a parameter gathered for this read (held sharded: ZeRO-3 / FSDP) and read by
  // the backward (OperandRewrite::float8_saved). The call then saves for backward the float8
  // copy of W^T that dx's product reads (with its column scales, cast in the forward from the
  // gathered W) instead of W, so backward gathers no W again (search/sharding_edges.h's
  // forward_passes prices one gather, search/sharding_memory.h the saved copy): 1 byte a
  // weight element held, where a regather would move 2 to 4 bytes of it again.
  bool float8_weight = false;
};

// The node's FP8 axes on this rank's program, or nullopt where the node is no FP8 linear.
// Throws ValidationError for a Partial operand (above).
std::optional<Fp8Axes> fp8_axes(const ir::Graph& graph, const NodeRewrite& node);

// The rank graph's marks of an FP8 linear (rank_graph.h, where RewriteOptions::fp8 is set):
// its call carries both, the axes above, and the third where float8_weight holds.
inline constexpr std::string_view kFp8KAxesAttr = "shardwise.fp8_k_axes";
inline constexpr std::string_view kFp8NAxesAttr = "shardwise.fp8_n_axes";
inline constexpr std::string_view kFp8Float8WeightAttr = "shardwise.fp8_saves_float8_weight";

// Operand `operand` of `node` is the weight of an FP8 linear in a plan run in fp8: the call
// saves a float8 copy of it for backward where it is gathered (Fp8Axes::float8_weight), so the
// rewrite releases no such weight to gather it again (OperandRewrite::regather).
bool saves_float8_weight(const ir::Graph& graph, const ir::Node& node, std::size_t operand, bool fp8);

// The axes a rank graph's call is marked with, or nullopt where it is not marked.
std::optional<Fp8Axes> marked_fp8_axes(const ir::Node& call);

}  // namespace shardwise::transform
