// Which elements of a tensor one rank holds under a plan's placements: the per-rank slicing
// that parameter materialisation (each rank builds only its own shards) and the rewrite
// both need.
//
// A tensor of `shape` placed `placements` (one per mesh axis, outermost first; the text
// forms of search/placement.h) on a mesh of `mesh` sizes: rank r's coordinate on axis a is
// (r / stride(a)) % mesh[a], stride(a) = product of the sizes of the axes inside a (the
// layout of search_spmd's meshes: the innermost axis holds consecutive ranks). Along each
// dim the rank holds an ordered set of indices, built by applying the axes outermost
// first, each to what the axes before it left (DTensor's order for a dim sharded on
// several mesh axes):
//   R, P(...)        the set unchanged (a Partial value is full-size on every rank)
//   S(d)             the set cut into n equal consecutive blocks, block k = coordinate
//   S(d,gG)          the set viewed as G groups of equal length, each cut into n blocks;
//                    block k of every group, groups in order (strided: a fused QKV weight's
//                    q, k and v parts for the same heads)
//   S(d)[ratios]     uneven consecutive blocks: rank k gets round(cumulative ratio x
//                    length) boundaries (the last block ends at the length)
// Indices are kept as runs [start, stop) in increasing order of the local layout.
//
// Worked example: shape [4, 6], placements {S(1,g3), S(0)} on mesh {2, 2}; rank 3 has
// coordinates (1, 1): dim 1 keeps {1, 3, 5} (block 1 of each pair), dim 0 keeps {2, 3}.
//   local_shard({4, 6}, {"S(1,g3)", "S(0)"}, {2, 2}, 3).dims == {{{2, 4}}, {{1, 2}, {3, 4}, {5, 6}}}
//
// Errors (support::ValidationError naming the placement, dim and sizes): a placement list
// whose length is not the mesh's, a shard dim out of range, a set that does not split into
// equal blocks (or groups), ratios whose count is not the axis size, a rank out of range.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace shardwise::transform {

using IndexRun = std::pair<std::int64_t, std::int64_t>;  // [start, stop)

struct LocalShard {
  std::vector<std::vector<IndexRun>> dims;  // per dim of the tensor: the indices held
  std::vector<std::int64_t> shape;          // local shape (the runs' total lengths)
  bool partial = false;                     // some axis holds a Partial value
};

LocalShard local_shard(const std::vector<std::int64_t>& shape, const std::vector<std::string>& placements,
                       const std::vector<int>& mesh, int rank);

// Block k of n of a dim of `length` elements, as [begin, end): with no ratios, n equal
// consecutive blocks (an error when n does not divide the length); with one ratio per rank,
// the boundaries llround(cumulative ratio x length) (halves away from zero), the last block
// ending at the length. The one rule for block bounds: local_shard uses it, and so does the
// runtime's slice step (python/shardwise/runtime/reshard.py, through _C.block_bounds), so the
// shard a rank is given and the one it slices out are the same rows.
std::pair<std::int64_t, std::int64_t> block_bounds(std::int64_t length, int n, int k,
                                                   const std::vector<double>& ratios);

}  // namespace shardwise::transform
