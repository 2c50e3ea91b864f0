// Where one tensor lives along one axis of a device mesh: DTensor's placements, plus strided
// and uneven shards.
//
//   Replicate()        every rank of the axis holds the whole tensor
//   Shard(dim)         the axis' n ranks hold n contiguous blocks of `dim`, in rank order
//   Shard(dim, g)      strided: `dim` is viewed as [g, size/g] and the minor part is split,
//                      so rank r holds block r of each of the g groups. A fused QKV weight
//                      [h, 3h] placed Shard(1, 3) gives every rank q, k and v of the same
//                      heads, which is what the split into q, k, v after it needs.
//   Shard(dim)[ratios] uneven: rank r holds ratios[r] of `dim` (ratios sum to 1, one per
//                      rank of the axis); a heterogeneous cluster's batch shares
//                      (search/hetero_balance.h), and a dim the axis does not divide
//                      (GPT-2's 50257 words on 8 ranks: search/strategy.h)
//   Partial(reduction) every rank holds a full-size tensor; the true value is their sum
//                      (or mean, max, min): the result of splitting a contracted index
//
// A value with one Placement per mesh axis is a ShardingSpec (axis 0 outermost).
//
// Text form (str() writes it, parse_placement reads it back to an equal Placement):
//   "R"   "S(1)"   "S(2,g3)"   "S(0)[0.6,0.4]"   "S(2,g3)[0.5,0.5]"   "P(sum)"   "P(mean)"
// Ratios print with the shortest form that reads back to the same double ({:g} is not
// enough: fmt's default "{}" is).
//
// Worked example:
//   Placement p = Placement::shard(1, 3);
//   p.str();                                   // "S(1,g3)"
//   parse_placement("S(1,g3)") == p;           // true
//   spec_str({Placement::shard(0), Placement::replicate()});   // "[S(0), R]"
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ops/dim_rule.h"

namespace shardwise::search {

enum class PlacementKind : std::uint8_t { Replicate, Shard, Partial };

struct Placement {
  PlacementKind kind = PlacementKind::Replicate;
  int dim = -1;                 // Shard: the tensor dim split
  std::int64_t groups = 1;      // Shard: strided groups (1 = contiguous)
  std::vector<double> ratios;   // Shard: uneven shares per rank of the axis; empty = even
  ops::Reduction reduction = ops::Reduction::Sum;  // Partial

  static Placement replicate() { return {}; }
  static Placement shard(int dim, std::int64_t groups = 1) {
    Placement p;
    p.kind = PlacementKind::Shard;
    p.dim = dim;
    p.groups = groups;
    return p;
  }
  static Placement partial(ops::Reduction reduction = ops::Reduction::Sum) {
    Placement p;
    p.kind = PlacementKind::Partial;
    p.reduction = reduction;
    return p;
  }

  bool is_replicate() const { return kind == PlacementKind::Replicate; }
  bool is_shard() const { return kind == PlacementKind::Shard; }
  bool is_partial() const { return kind == PlacementKind::Partial; }

  std::string str() const;

  friend bool operator==(const Placement&, const Placement&) = default;
};

// One placement per mesh axis, axis 0 first.
using ShardingSpec = std::vector<Placement>;

// Inverse of Placement::str. Throws support::ParseError quoting the text on anything else
// (unknown letter, missing parenthesis, groups < 1, a negative dim, ratios that are not
// positive or do not sum to 1 within 1e-9, an unknown reduction name).
Placement parse_placement(std::string_view text);

// "[S(0), R]"; "[]" for an empty spec.
std::string spec_str(const ShardingSpec& spec);

// The placement the gradient of a value placed `forward` must have for its producer's
// backward: Partial -> Replicate (the backward of an all-reduce is the identity on a
// replicated gradient), anything else -> itself.
Placement gradient_placement(const Placement& forward);

// How many ranks' worth of the tensor one rank of an n-rank axis holds, as a fraction of
// the whole: Shard -> 1/n (even) or the largest ratio (uneven: the most loaded rank);
// Replicate and Partial -> 1.
double held_fraction(const Placement& placement, int axis_size);

}  // namespace shardwise::search
