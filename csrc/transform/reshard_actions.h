// The collectives and local steps that turn a value placed `from` into the same value placed
// `to` on a device mesh (one placement per axis, outermost first): what the rewrite inserts
// on an edge whose producer and reader disagree, in forward and, for the gradient, backward.
//
// One axis at a time (n ranks, this rank's coordinate k on it), on the rank's local tensor:
//   R -> S(d,g)       Slice: keep block k of each of the g groups of dim d (no traffic)
//   R -> P(sum)       ZeroOthers: coordinate 0 keeps the value, the others hold zeros
//   R -> P(mean)      nothing (the mean of equal copies is the value)
//   S(d,g) -> R       AllGather along d (strided: the g groups gathered each in place)
//   S(d) -> S(e)      AllToAll (split e, concatenate d): contiguous shards only
//   S -> P            AllGather, then as from R
//   P(sum) -> R       AllReduce sum;            P(mean) -> R: AllReduce mean
//   P(sum) -> S(d,g)  ReduceScatter along d;    P(mean) -> S: AllReduce mean, then Slice
//   P(sum) <-> P(mean) Scale by 1/n or n
//
// Several axes (DTensor's nesting: a dim sharded on several axes is cut by the outer axis
// first, then each inner axis cuts what is left, transform/local_shard.h): phase 1 walks the
// axes innermost first and undoes what must change — gathers shards, reduces partial sums —
// and phase 2 walks them outermost first and cuts the new shards. An inner axis that shards
// a dim an outer axis changes is undone first and cut again after it, even when its own
// placement stays: its blocks would otherwise lie in the wrong places. A step that needs no
// such detour takes the direct collective (a reduce-scatter, an all-to-all).
//
// Worked example (mesh {2, 4}):
//   reshard_actions({R, P(sum)}, {R, S(1)})   -> {ReduceScatter axis 1 dim 1}
//   reshard_actions({S(0), S(0)}, {R, S(0)})  -> {AllGather axis 1 dim 0, AllGather axis 0
//                                                 dim 0, Slice axis 1 dim 0}
//   reshard_actions({S(0), R}, {S(0), R})     -> {}
//
// Uneven shards (ratios, heterogeneous clusters) are cut locally (Slice with the ratios) and
// gathered (AllGather with the ratios: the blocks differ in length); they never take the
// direct all-to-all or reduce-scatter. ValidationError on a strided uneven shard and when the
// two specs have different lengths.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "search/placement.h"

namespace shardwise::transform {

enum class ReshardKind : std::uint8_t { AllGather, ReduceScatter, AllReduce, AllToAll, Slice, ZeroOthers, Scale };

// "all_gather", "reduce_scatter", "all_reduce", "all_to_all", "slice", "zero_others", "scale".
std::string_view reshard_kind_name(ReshardKind kind);

struct ReshardAction {
  ReshardKind kind = ReshardKind::AllGather;
  int axis = 0;               // mesh axis whose group runs it
  int dim = -1;               // AllGather / ReduceScatter / Slice: the tensor dim; AllToAll: split dim
  std::int64_t groups = 1;    // strided shards: the dim viewed as [groups, size / groups]
  int concat_dim = -1;        // AllToAll: the dim whose shards are concatenated (the old shard dim)
  std::string reduce = "sum";  // AllReduce: "sum" or "mean"
  int scale_power = 0;         // Scale: multiply by (axis size)^scale_power (+1 or -1)
  std::vector<double> ratios;  // Slice / AllGather: uneven shares per rank of the axis (empty = even)

  std::string str() const;  // "all_gather(axis 1, dim 0, g3)"
  friend bool operator==(const ReshardAction&, const ReshardAction&) = default;
};

std::vector<ReshardAction> reshard_actions(const search::ShardingSpec& from, const search::ShardingSpec& to);

}  // namespace shardwise::transform
