// Turning one placement into another along one mesh axis: which collective it takes and
// how long that is.
//
// `tensor_bytes` is the size of the whole tensor along this axis (already divided by the
// shards of the other mesh axes). The collective and its `bytes` argument, in the units of
// cost/collective_cost.h (the whole buffer of the call), for an axis of n ranks:
//
//   from \ to      R                      S(d,g)                      P
//   R              -                      local slice                 local (rank 0 keeps it,
//                                                                     the others zero it)
//   S(d,g)         AllGather(B)           - if equal, else AllToAll   AllGather(B)
//                                         (B / n) between contiguous  (then local)
//                                         even shards of two dims,
//                                         else AllGather(B) and a cut
//   P(red)         AllReduce(B)           ReduceScatter(B)            - if the same reduction
//                                                                     or sum <-> mean (a local
//                                                                     rescale), else AllReduce(B)
//
// Priced as the rewrite runs them (transform/reshard_actions.h, asserted in
// tests/cpp/search/resharding_test.cc): the all-to-all is for contiguous even shards of two
// dims only, so S -> S' with either side uneven (ratios) or strided (g > 1), or on the same
// dim, is AllGather(B) and a local cut; the reduce-scatter is for a sum into an even shard,
// so P(mean) -> S and P -> uneven S are AllReduce(B) and a cut. Gathers of uneven blocks are
// priced as even ones of the same bytes (a ring moves the largest share; the difference is
// second order). A Shard whose ratios agree with the other's within 1e-9 is the same data:
// nothing to do.
//
// Worked example (8 ranks on one DGX A100 node, a bf16 [2048, 4096] tensor, B = 16 MiB):
//   reshard_step(P(sum), S(0), B, 8)  -> {ReduceScatter, 16 MiB}
//   reshard_step(S(0), S(1), B, 8)    -> {AllToAll, 2 MiB}
//   reshard_step(R, S(1), B, 8)       -> nullopt (local)
//   reshard_time(model, cluster, ranks 0..7, P(sum), R, B)
//     = model.collective_time(cluster, AllReduce, ranks, B, Auto)
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "cost/cluster.h"
#include "cost/collective_cost.h"
#include "cost/op_cost.h"
#include "search/placement.h"

namespace shardwise::search {

struct ReshardStep {
  cost::CollectiveKind kind = cost::CollectiveKind::AllGather;
  std::int64_t bytes = 0;  // the collective's `bytes` argument (collective_cost.h)

  friend bool operator==(const ReshardStep&, const ReshardStep&) = default;
};

// nullopt when the change is local (no traffic). Throws support::ValidationError on
// axis_size < 1 or tensor_bytes < 0.
std::optional<ReshardStep> reshard_step(const Placement& from, const Placement& to, std::int64_t tensor_bytes,
                                        int axis_size);

// Seconds for reshard_step on the ranks of one axis group (0 when local).
double reshard_time(const cost::CostModel& model, const cost::Cluster& cluster, std::span<const int> axis_ranks,
                    const Placement& from, const Placement& to, std::int64_t tensor_bytes);

}  // namespace shardwise::search
