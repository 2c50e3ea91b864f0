// The dimension rule of one op instance, as plain data.
//
// A rule names the iteration indices of an op and says, for every dimension of every
// tensor operand, which indices that dimension factorises into (major to minor). Each
// index has a kind that tells the sharding search what splitting it means:
//
//   Spatial  the computation is independent along the index: split the index and every
//            operand dimension that carries it is split the same way. An index that no
//            output carries but some input does only occurs on operands the op reads for
//            metadata (type, device, shape): splitting it changes nothing.
//   Reduced  carried by inputs only and summed over (contracted): splitting it leaves each
//            rank with a partial result of every output, combined by `reduction`
//            (DTensor's Partial(sum) for a matmul, Partial(avg) for a mean, ...).
//   Whole    the op needs the index entire (softmax's dim, layer norm's normalised dims,
//            convolution windows, the cat dim): it must not be split as it is. A Whole index
//            that a normalisation reduces over has `statistics` > 0: how many per-row
//            statistics (softmax: max and sum) the op combines when the index is split, so
//            the search may split it and all-reduce those (search/strategy.h); 0 = the index
//            cannot be split at all. A Whole index whose positions another operand's values
//            address (embedding's vocabulary, index_select's dim) has `lookup`: split, each
//            rank looks up the addresses in its range and writes zeros for the rest, so the
//            outputs are Partial(sum) (Megatron's vocabulary-parallel embedding).
//
// DimIndices lists the indices of one tensor dimension, major to minor. An empty list is a
// size-1 dimension tied to no index (a broadcast operand, a keepdim reduction, a view that
// adds or drops a unit dimension).
//
// Worked example: aten::mm on f32[32,768] x f32[768,2304] -> f32[32,2304]:
//   indices  0:m=32 Spatial, 1:k=768 Reduced(sum), 2:n=2304 Spatial
//   inputs   {{0},{1}}, {{1},{2}}
//   outputs  {{0},{2}}
//   str()    "m k, k n -> m n  [m=32, k=768 reduced, n=2304]"
// and aten::view f32[2,8,768] -> f32[2,8,12,64] factorises input dim 2 into (heads, d):
//   indices  0:i0=2, 1:i1=8, 2:i2=12, 3:i3=64 (all Spatial)
//   inputs   {{0},{1},{2,3}}     outputs {{0},{1},{2},{3}}
// so splitting index 2 (the heads) splits input dim 2 by its major factor and output dim 2.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace shardwise::ops {

enum class IndexKind : std::uint8_t { Spatial, Reduced, Whole };
std::string_view index_kind_name(IndexKind kind);  // "spatial", "reduced", "whole"

// How the per-rank results of a split Reduced index combine into the true result.
enum class Reduction : std::uint8_t { Sum, Mean, Max, Min };
std::string_view reduction_name(Reduction reduction);  // "sum", "mean", "max", "min"

struct Index {
  std::string label;  // unique within its rule; for people reading a dump only
  std::int64_t size = 1;
  IndexKind kind = IndexKind::Spatial;
  Reduction reduction = Reduction::Sum;  // meaningful for Reduced indices only
  // A Whole index that a normalisation reduces over: how many per-row statistics (softmax:
  // max and sum) the op combines when the index is split; 0 = the index cannot be split at
  // all. Not part of str(): the op table's rule text says it.
  int statistics = 0;
  // A Whole index addressed by the values of another operand (see above). Not part of str().
  bool lookup = false;
  // A Whole index of self-attention's sequence, carried by the query, key and value rows and
  // the output's: split only by ring attention (the key and value blocks passed around the
  // axis' ranks, ops/distributed_kernels.h), on one axis, in equal blocks. Not part of str().
  bool ring = false;
  // A Spatial index (a mixture of experts' tokens) whose split may carry the index `dispatch`
  // (its experts) on the same axis: each rank holds its block of both, and its tokens travel
  // to their experts' ranks and back by all-to-all (ops/distributed_kernels.h's dispatch
  // kernel). -1: none. Not part of str().
  int dispatch = -1;
  // Split unevenly by another mesh axis (search::local_rule): its size is the largest
  // rank's share, and the shares differ, so no further axis may split it. Not part of str().
  bool uneven = false;

  friend bool operator==(const Index&, const Index&) = default;
};

using DimIndices = std::vector<int>;          // indices of one tensor dim, major to minor
using OperandDims = std::vector<DimIndices>;  // one entry per dim of one tensor operand

// A loss whose mean divides by a count the data decides: nll_loss and cross entropy over
// class-index targets divide their sum by the total weight of the targets that are not
// ignore_index (the class weight of each, or 1), so a batch whose labels are padded with -100
// counts only its real tokens. Each rank's own mean over its share is then not a share of the
// mean (the ranks count different numbers of tokens, some none at all). The rule still says
// Reduced(mean), so the search prices and places it as any mean (Partial(mean)); the rewrite
// marks such a node counted (transform/spmd_rewrite.h) and the runtime computes each rank's
// share as its sum times shares / (the count of the whole batch), which averages to the
// one-device mean exactly.
struct CountedMean {
  int target = -1;  // the input position of the class-index targets
  int weight = -1;  // of the class weights, -1 when there are none

  friend bool operator==(const CountedMean&, const CountedMean&) = default;
};

// A Whole index of input 0 whose positions another input's values give: self[idx] reads
// self's `index` at the positions input `operand` holds (aten::index.Tensor). The batch
// analysis follows a batch dim read at the rows' own positions (an arange over the batch:
// transformers' padding masks) as the rows themselves (analysis/batch_coupling.h).
struct Addressing {
  int operand = -1;
  int index = -1;

  friend bool operator==(const Addressing&, const Addressing&) = default;
};

struct DimRule {
  std::vector<Index> indices;
  std::vector<OperandDims> inputs;   // one per tensor input of the node, in node order
  std::vector<OperandDims> outputs;  // one per output of the node
  std::optional<CountedMean> counted_mean;  // see CountedMean; not part of str()
  std::vector<Addressing> addressed;        // see Addressing; not part of str()
  // Inputs that are a term added to the op's sum over its Reduced indices (addmm's bias,
  // linear's, a convolution's), not a factor of every term of it. The difference shows when a
  // Reduced index the input does not carry is split: an added term must enter the ranks'
  // partial sums once (Partial), while a factor multiplies each rank's partial sum
  // (replicated; a mixture of experts' tokens against the experts a rank holds, an einsum's
  // third operand). Every input not listed is a factor. Not part of str().
  std::vector<int> added;

  // Id of the index with this label, or -1.
  int find(std::string_view label) const;
  // Whether input `input` is an added term (see `added`).
  bool is_added(std::size_t input) const;
  // Whether the op reads input `input` for its metadata only (type, device, shape:
  // new_empty's self, view_as' second operand): it has indices, every one Spatial and carried
  // by no output. Its placement changes nothing: any shard of it serves.
  bool reads_metadata_only(std::size_t input) const;
  // Product of the sizes of the indices (1 for an empty list): the size the dim must have.
  std::int64_t dims_size(const DimIndices& dims) const;
  // Shape implied for one operand.
  std::vector<std::int64_t> shape_of(const OperandDims& operand) const;
  // One line, see the worked example above.
  std::string str() const;

  friend bool operator==(const DimRule&, const DimRule&) = default;
};

// Throws support::ValidationError if the rule is malformed: an index id out of range, a
// repeated or empty label, an index used twice in one operand, an index used nowhere, or a
// Reduced index in an output.
void check_structure(const DimRule& rule);

}  // namespace shardwise::ops
