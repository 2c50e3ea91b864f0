// One rank's graph as a job runs it: every node that any rank of the plan's mesh runs whole
// is run whole on every rank.
//
// rank_graph (rank_graph.h) decides per rank which nodes run whole: a split with no
// distributed kernel, or a local call that its op's shape rule refuses on the rank's block.
// A node whole on one rank and split on another makes the two issue different collectives,
// and the job hangs at the first. So a job's rank graph runs whole the union over the mesh,
// taken to a fixed point (a node run whole changes what its readers receive on every rank).
//
// The union is taken over a few ranks, not all of them (every rank builds its own graph, at
// every parallelize: one graph per rank of a 1,024-rank mesh on each rank would cost CPU in
// proportion to the world). The rewrite (spmd_rewrite.cc) reads a rank's coordinates only
// through the bounds of its blocks:
//   - the local shapes, which differ between coordinates of an axis only where a placement
//     has uneven ratios on it (local_shard.h: an even split that does not divide is an error);
//   - an arange's block start, whose local form is exact at every start (arange_block: the
//     end sits half a step past the last value), so it never runs whole on one rank alone;
//   - a vocabulary kernel's [start, stop) and an uneven mean's scale, attributes that never
//     decide whether a node runs whole.
// So ranks that hold blocks of the same sizes of every value decide alike, and one rank per
// class stands for all (whole_node_ranks), `rank` itself standing for its own. The classes
// differ only along mesh axes where some placement has uneven ratios; along one, coordinates
// are told apart by the sizes of the blocks they hold (a heterogeneous data axis of many
// ranks has few distinct shares). A plan with no uneven ratios builds one graph: its own.
//
// Errors: rank_graph's, naming the rank whose rewrite failed; every rank raises the same one,
// since every rank builds the same representatives' graphs.
#pragma once

#include <vector>

#include "plan/plan.h"
#include "transform/rank_graph.h"

namespace shardwise::transform {

// The ranks whose rewrites decide, for the whole mesh, which nodes run whole: one per class of
// ranks holding blocks of the same sizes of every value of `global` (its placement, with the
// inputs' uneven batch shares spread over Shards of its batch dim, as spmd_rewrite does).
// Along one axis with ratios the coordinates are grouped by those sizes; along several, every
// combination is kept. `rank` stands for its class. Sorted.
std::vector<int> whole_node_ranks(const ir::Graph& global, const plan::Sharding& sharding, int rank);

// The rank graph `rank` runs: the union of the nodes run whole taken to its fixed point, then
// the feature passes the plan switches on (rank_passes.h).
RankGraph job_rank_graph(const ir::Graph& global, const plan::Sharding& sharding, int rank,
                         const RewriteOptions& options = {});

}  // namespace shardwise::transform
