// The ways one node can run across one mesh axis, derived from its dimension rule alone
// (ops/dim_rule.h): no op is special-cased here, so sharding the batch, the sequence, the
// hidden size, the heads or the vocabulary all come out of the same loop.
//
// A strategy splits at most one index of the rule across the axis' n ranks (index -1:
// every operand replicated, the node computed whole on every rank). For a split index i:
//
//   i Spatial     operands carrying i  -> Shard(dim, groups), their gradients the same
//                 inputs not carrying i -> Replicate, gradient Partial(sum) (every rank
//                                          contributes to it: Megatron's `f`, the data-
//                                          parallel weight gradient)
//                 outputs not carrying i -> Replicate (metadata-only reads)
//   i Reduced     operands carrying i  -> Shard(dim, groups), gradients the same
//   (Sum, Mean)   inputs not carrying i -> Partial(reduction) (an additive operand such as
//                                          addmm's bias is added once), gradient Replicate
//                 outputs -> Partial(reduction)
//   i Whole with  operands carrying i  -> Shard, gradients the same; the other inputs ->
//   statistics>0  Replicate, gradient Replicate; outputs not carrying i -> Replicate. The
//                 node all-reduces `statistics_elements` elements (see Statistics below).
//   i Whole with  operands carrying i  -> Shard, gradients the same; the addressing operand
//   lookup        (the ids) -> Replicate; outputs not carrying i -> Partial(sum): each rank
//                 looks up the addresses in its range, zeros elsewhere (the vocabulary-
//                 parallel embedding, from the rule).
//   i Whole with  the query, key and value rows and the output's -> Shard, gradients the
//   ring          same (ring attention passes the key and value blocks around the axis): in
//                 equal blocks only, and on one axis (local_rule clears the mark).
//   i Whole without statistics, lookup or ring, Reduced with Max / Min, size 1: never split.
//
// Dims and groups: the dim of an operand carrying i is listed as indices major to minor
// (DimIndices); the Shard's groups = (product of the sizes of the indices major to i in
// that dim) x the strategy's `groups`. So a view [b,s,768] -> [b,s,12,64] split on the heads
// index (major) gives the input Shard(2) and on the head_dim index (minor) Shard(2, 12); the
// input of an equal three-way split [.., 2304] -> 3 x [.., 768] split on the part index c gives
// Shard(2, 3): the strided fused-QKV shard.
//
// Strided variants: a strategy with groups g > 1 views index i itself as [g, size/g] and
// splits the minor part. They are offered only for the (index size, g) pairs in
// StrategyOptions::strided (search/spmd_builder.h collects them from the equal splits and
// concatenations of the graph: a tensor of size N later cut into g equal parts), so the
// producer of a fused QKV can match its consumer's strided need without a reshard.
//
// Divisibility: a strided split needs size(i) % (n x g) == 0. A contiguous split of an index
// that n does not divide (GPT-2's 50257-word vocabulary on 8 ranks) is uneven, as DTensor
// and torch.chunk cut: the first size % n ranks hold one more than the rest, recorded as
// the shard's ratios (Shard(0)[6283/50257, ..., 6282/50257]); not where an operand carries
// i under a major index (that would be a strided uneven shard), and only where every rank
// gets at least 8 elements (the largest share within 1/8 of the mean). The largest share
// bounds time and memory (held_fraction). Every split needs size(i) >= n.
//
// Statistics (ops::Index::statistics): a Whole index that a normalisation reduces over
// (softmax's dim, layer norm's normalised dims, cross entropy's classes) may be split when
// the rule says how many per-row statistics (max and sum for softmax) the op must combine
// across ranks: statistics_elements = statistics x the product of the sizes of every other
// index of the rule that an output carries (the rows), all-reduced in forward and again in
// backward. This is Megatron's vocabulary-parallel cross entropy, from the rule.
//
// Partial passthrough (partial_strategy): a linear op (ops::OpSpec::linear: views, copies,
// cats, splits) may run on Partial(sum) inputs and give Partial(sum) outputs, so the
// reduction of a row-parallel product can wait until after a reshape and meet its reader
// as an all-reduce, a reduce-scatter to whatever shard the reader wants, or nothing. The
// search offers it next to the rule's strategies for linear nodes; it is not one of them
// (the rule cannot say an op is linear).
//
// Order: replicate first, then by index id, then by groups ascending; strategies whose
// placements are all equal to an earlier one are dropped. Deterministic.
//
// Worked example: aten::mm "m k, k n -> m n [m=32, k=768 reduced, n=2304]" on 8 ranks, no
// strided pairs:
//   0 replicate            inputs R, R              grads R, R           outputs R
//   1 split m              inputs S(0), R           grads S(0), P(sum)   outputs S(0)
//   2 split k              inputs S(1), S(0)        grads S(1), S(0)     outputs P(sum)
//   3 split n              inputs R, S(1)           grads P(sum), S(1)   outputs S(1)
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ops/dim_rule.h"
#include "search/placement.h"

namespace shardwise::search {

struct Strategy {
  int index = -1;           // rule index split across the axis; -1 = replicate
  std::int64_t groups = 1;  // strided variant (see the header comment)
  std::vector<Placement> inputs;       // required placement of each tensor input (node order)
  std::vector<Placement> input_grads;  // placement of the gradient the backward gives each input
  std::vector<Placement> outputs;      // placement of each output
  std::int64_t statistics_elements = 0;  // all-reduced in forward and in backward (Whole split)
  bool partial = false;                  // partial passthrough (index -1, see the header)
  // Index `index` split with the index its rule marks to travel with it (ops::Index::dispatch:
  // a mixture of experts' tokens with its experts): the operands carrying either are Shard,
  // the tokens reach their experts' ranks by all-to-all. Equal blocks of both only.
  bool dispatch = false;

  // "replicate", "split k", "split n g3", "dispatch t"; the index label comes from the rule.
  std::string str(const ops::DimRule& rule) const;

  friend bool operator==(const Strategy&, const Strategy&) = default;
};

struct StrategyOptions {
  // (index size, groups) pairs for which strided variants are offered.
  std::vector<std::pair<std::int64_t, std::int64_t>> strided;
};

// Every legal strategy of a node with `rule` on an axis of `axis_size` ranks (>= 1; with 1,
// only replicate). Throws support::ValidationError on axis_size < 1.
//
// On a mesh of several axes, `rule` is the rule as every other axis' split leaves it
// (local_rule): it decides what may split and by how much. `layout` (default: `rule`) is the
// rule as only the axes *outer* to this one leave it (same indices, operands): the Shards'
// groups (the sizes of the indices major to the split one) come from it, because a
// ShardingSpec nests axis 0 outermost (placement.h, transform/local_shard.h): this axis cuts
// what its outer axes left, before any inner axis cuts. An inner axis' split of a major index
// does not move this axis' blocks. Example: [b=2, s=16, h] -> [32, h] (dim 0 = b s), the
// tensor axis 0 splitting s, the data axis 1 splitting b: axis 0 holds s-block k of *both*
// sequences, Shard(0, 2), not Shard(0) (the rows of one sequence), which is what `rule`, with
// b already cut to 1 by axis 1, would say.
std::vector<Strategy> enumerate_strategies(const ops::DimRule& rule, int axis_size,
                                           const StrategyOptions& options = {},
                                           const ops::DimRule* layout = nullptr);

// Each of n ranks' share of an index of `size` >= n split as evenly as whole elements allow:
// the first size % n ranks hold ceil(size / n), the others floor. Empty when n divides size.
std::vector<double> uneven_ratios(std::int64_t size, int n);

// Partial passthrough for a linear op with this rule: inputs and outputs Partial(sum), the
// inputs' gradients Replicate (the gradient of a sum reaches every term whole).
Strategy partial_strategy(const ops::DimRule& rule);

// The rule as seen by one rank after `strategy` on an axis of axis_size ranks: the split
// index's size divided by axis_size (how the next mesh axis sees the node). An uneven split
// leaves the largest share, marked Index::uneven so that no other axis splits it again.
ops::DimRule local_rule(const ops::DimRule& rule, const Strategy& strategy, int axis_size);

}  // namespace shardwise::search
