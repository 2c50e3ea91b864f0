// The rewrite of a searched plan into one rank's program: for every node, the placements its
// operands must have, the collectives that bring each operand there (forward) and bring its
// gradient back (backward), how the node runs, and every value's local shape on the rank.
// The runtime (python/shardwise/runtime/lower.py) lowers the program into a torch.fx.GraphModule;
// the core never sees a tensor or a process group.
//
// Input: the single-device graph and the plan's sharding section (plan/plan.h: placements of
// every value, a strategy text per node and mesh axis). The strategies are resolved back into
// search::Strategy values from each node's dimension rule (resolve_strategies), so the
// program uses exactly the placements the search priced.
//
// How a node runs (NodeMode):
//  - Local: every rank runs the op on its local operands (shape arguments rewritten to local
//    shapes by the runtime): a split spatial or reduced index, a partial pass-through, or
//    replication.
//  - Lookup: an index split with `lookup` (embedding's vocabulary) on the axes in
//    lookup_axes: each rank looks up the ids in its rows, zero elsewhere, giving a Partial
//    sum. Only for ops in RewriteOptions::lookup_ops (those the runtime has a kernel for).
//  - Statistics: a normalised dim split (an index with statistics) on one axis, for ops in
//    RewriteOptions::statistics_ops: each rank runs the runtime's kernel (`kernel`, from
//    ops/distributed_kernels.h) on its slice and all-reduces the per-row statistics over
//    statistics_axis (cross entropy over a vocabulary-parallel LM head's logits: row max, sum
//    of exponentials, target logit; layer norm over a split hidden dim: mean and variance;
//    training batch norm over a split batch: SyncBatchNorm). A loss with class weights has
//    no such kernel and runs whole. Self-attention's sequence split as a ring (Index::ring)
//    runs the same way: `shardwise::ring_attention` over the query rows' dim, its key and
//    value blocks passed around statistics_axis (runtime/ring_attention.py).
//  - Whole: every operand gathered, the op run on whole tensors, the outputs replicated
//    (readers then cut what they need). The fallback that keeps every plan correct: a split
//    with statistics the runtime has no distributed kernel for (a weighted loss, a second
//    statistics axis, a strided vocabulary), a lookup outside lookup_ops, an op with no tensor operand
//    whose output is split (arange's values depend on the block), and the nodes named in
//    RewriteOptions::whole_nodes (the ranks' union: a node another rank runs whole), and a
//    seeded random op whose draws on a block cannot be one device's (ops/random_draws.h:
//    any but a dropout's mask or a *_like op's values; a *_like op on a Partial operand).
//    An op with no shape rule takes only the replicate strategy (strategy_from_text), so its
//    operands and outputs are whole and its call needs no local check.
//
// Gradients: every value's local gradient is kept in one canonical placement: its forward
// placement with Partial read as Replicate (search::gradient_placement; for Partial(mean), the
// Replicate gradient over the axis size: each rank's value counts 1/n). An edge whose reader
// gives its gradient in another placement (a column-parallel product gives a Partial
// gradient of its replicated input: Megatron's `f`) converts it in backward. Parameters are
// the exception: a Replicate parameter on an axis where every reader gives a Partial(sum)
// gradient keeps that gradient Partial and lists the axis in `reduce_axes`: the engine
// reduces it after backward, in buckets (data parallelism's gradient all-reduce).
//
// Graph outputs are made Replicate on every rank (the loss is returned whole everywhere).
//
// Heterogeneous plans: the search records uneven batch shares only on the graph's inputs
// (S(0)[0.6,0.4]); the rewrite gives every Shard of a value's batch dim on that axis the same
// ratios, so the whole batch flows unevenly, and scales the Partial(mean) results of a
// batch-mean split by the rank's share (OutputRewrite::scale).
//
// Errors (support::ValidationError naming the node, value and axis): a plan whose mesh has a
// different number of axes than its placements, a value or node the plan does not place, a
// strategy text that is not legal for the node's rule, a rank outside the mesh.
#pragma once

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ops/distributed_kernels.h"
#include "plan/plan.h"
#include "search/parameter_collectives.h"
#include "search/placement.h"
#include "search/strategy.h"
#include "transform/reshard_actions.h"

namespace shardwise::transform {

enum class NodeMode : std::uint8_t { Local, Lookup, Whole, Statistics };
std::string_view node_mode_name(NodeMode mode);  // "local", "lookup", "whole", "statistics"

struct RewriteOptions {
  std::set<std::string> lookup_ops = ops::lookup_kernel_ops();
  // Ops whose split normalised dim the runtime combines with a kernel of its own (all-reducing
  // the per-row statistics) instead of gathering the operand (python/shardwise/runtime/kernels.py).
  std::set<std::string> statistics_ops = ops::statistics_kernel_ops();
  std::set<std::string> whole_nodes;  // by the name of the node's first output
  // The plan was made for other batch shapes (the last, shorter batch; another sequence
  // length): a node whose strategy does not split its sizes here is replicated on that axis,
  // and an input whose placement does not divide its shape is replicated there. Parameters
  // keep their placements, so the engine's shards serve this program too.
  bool adapt_to_shapes = false;
  // Micro-batches per step (a pipelined plan's, plan::Plan::num_micro_batches): a counted
  // mean's rows are a share of the step's count, as they are of the mesh's (CountedRewrite).
  std::int64_t micro_batches = 1;
  // The plan runs its FP8 linears (analysis/fp8_linears.h) in float8: the rank graph marks each
  // with the mesh axes its amaxes are a max over (rank_graph.h; transform/fp8_axes.h).
  bool fp8 = false;
};

// One operand of a node (or a graph output): where its value arrives from and what it needs.
struct OperandRewrite {
  std::string value;
  search::ShardingSpec produced;  // the value's placement as its producer leaves it
  search::ShardingSpec required;  // what the reader needs
  std::vector<std::int64_t> local_shape;  // at `required`, on this rank
  std::vector<ReshardAction> forward;     // produced -> required
  std::vector<ReshardAction> backward;    // reader's gradient -> the value's canonical one
  bool gradient = false;                  // the value carries a gradient
  // A parameter gathered for this read (forward steps with a collective), outside a recomputed block: the
  // runtime releases the gathered weight after the read and runs the forward steps again
  // when backward needs it (search/parameter_collectives.h).
  bool regather = false;
  // The weight of an FP8 linear (a plan in fp8), gathered for this read, whose backward reads it
  // (x takes a gradient): the call saves the float8 copy of W^T for backward in its place, so
  // the weight is released and not gathered again (regather is false; transform/fp8_axes.h).
  bool float8_saved = false;
  // Where a parameter's forward gather runs (search/parameter_collectives.h): BesideForward
  // when the runtime prefetches it (its forward steps are then one all-gather), else Exposed.
  search::ParameterOverlap gather = search::ParameterOverlap::Exposed;
  // Where a parameter's gradient step at this read runs (search/parameter_collectives.h,
  // gradient_scatter_overlap): BesideBackward when it is one reduce-scatter the runtime
  // issues asynchronously and waits for at the next one, else Exposed.
  search::ParameterOverlap scatter = search::ParameterOverlap::Exposed;
  // The unit groups of a parameter's grouped collectives (search/parameter_collectives.h:
  // one flattened collective per unit, axis and dtype), numbered in node order over the
  // program, -1 where the collective runs alone: `gather_group` for a prefetched gather
  // (and its gather again for backward), `scatter_group` for a reduce-scatter beside backward.
  int gather_group = -1;
  int scatter_group = -1;
};

// The operand's forward steps move data between ranks (an all-gather, all-to-all or
// all-reduce): for a parameter, a weight held sharded and gathered for this read.
bool gathered_for_read(const OperandRewrite& op);

struct OutputRewrite {
  std::string value;
  search::ShardingSpec produced;
  std::vector<std::int64_t> local_shape;
  // Multiply the rank's output by this (uneven batch shares: a mean over the rank's rows
  // counts ratio x n in the mean over the axis' ranks, so Partial(mean) stays exact).
  double scale = 1.0;
};

// A loss whose mean divides by a count of its targets (ops/dim_rule.h: CountedMean). Each
// rank runs the op with reduction sum over its rows and multiplies by shares / G, G the count
// of the whole batch (every rank holds the global batch, so every rank computes G alone, with
// no collective): the outputs' Partial(mean) over `shares` ranks then averages to the one-device
// mean, whatever each rank counts. `shares` is the product of the sizes of the mesh axes that
// split the loss' rows, times the step's micro-batches (RewriteOptions::micro_batches: G is the
// whole step's count); 1: neither. With shares > 1 the node's reduction attribute is sum (2),
// which the runtime's call reads like any attribute. The output's uneven-share scale stays 1: G
// already weighs each rank's rows.
struct CountedRewrite {
  std::int64_t shares = 1;
  int target = -1;  // input positions, as in ops::CountedMean
  int weight = -1;
};

struct NodeRewrite {
  ir::NodeId node = -1;
  std::string op;
  NodeMode mode = NodeMode::Local;
  std::vector<int> lookup_axes;  // Lookup: the axes whose split is the lookup
  int statistics_axis = -1;      // Statistics: the axis whose split the kernel combines,
  int statistics_dim = -1;       // the dim of input 0 it splits,
  std::string kernel;            // and the kernel (ops/distributed_kernels.h: shardwise::...)
  // Lookup and Statistics: this rank's block [kernel_start, kernel_stop) of the split dim
  // (the table's rows; input 0's statistics_dim), from local_shard of input 0's required
  // placement. The one derivation: the rank graph's start / stop attributes and the runtime's
  // kernel call both read it.
  std::int64_t kernel_start = 0, kernel_stop = 0;
  std::optional<CountedRewrite> counted;
  // Recomputation (plan::Sharding::recompute): the instance of the repeated blocks this node
  // belongs to, run as one checkpointed region (its forward recomputed in backward, its
  // collectives with it); -1 outside them or without recomputation.
  int recompute_block = -1;
  // Selective recomputation: the node's outputs are kept from the forward, not made again
  // (analysis/selective_recompute.h); the runtime's policy keeps its op's outputs.
  bool recompute_keeps = false;
  std::vector<OperandRewrite> inputs;
  std::vector<OutputRewrite> outputs;
  // A seeded random op on a block or a Partial operand (ops/random_draws.h, Mask or Like):
  // the rank draws the whole operand's values as one device draws them and keeps its block.
  bool one_device_random = false;
  // The node's attributes on this rank: a local node's shape arguments (size, sizes, shape: a
  // list equal to the whole output shape, -1 kept; split_size(s) along the split dim) become
  // its local output's; other attributes, and other modes' nodes, as captured.
  ir::Attributes attrs;
};

// A leaf (parameter, buffer, constant, input) as the rank holds it.
struct LeafRewrite {
  std::string value;
  search::ShardingSpec placement;
  std::vector<std::int64_t> local_shape;
  search::ShardingSpec gradient;  // canonical gradient placement (parameters)
  std::vector<int> reduce_axes;   // axes the engine reduces the gradient over after backward
};

// Receives the program in graph order: every leaf, then every node, then every output.
class RewriteBuilder {
 public:
  virtual ~RewriteBuilder() = default;
  virtual void leaf(const LeafRewrite& leaf) = 0;
  virtual void node(const NodeRewrite& node) = 0;
  virtual void output(const OperandRewrite& output) = 0;
};

// The strategies of a sharding, [node][axis] (nodes without outputs: replicated).
std::vector<std::vector<search::Strategy>> resolve_strategies(const ir::Graph& graph, const plan::Sharding& sharding,
                                                              bool adapt_to_shapes = false);

// Heterogeneous plans: the search records uneven batch shares on the graph's inputs only.
// input_batch_ratios: per mesh axis, the ratios of an input's Shard of its batch dim
// (`placement_of` gives an input's placement, or null); spread_batch_ratios: `spec` (of `v`)
// with them given to a Shard of its batch dim that has none of its own. The one rule the
// rewrite and job_rank_graph.h apply.
std::vector<std::vector<double>> input_batch_ratios(
    const ir::Graph& graph, std::size_t axes,
    const std::function<const search::ShardingSpec*(const ir::Value&)>& placement_of);
void spread_batch_ratios(search::ShardingSpec& spec, const ir::Value& v,
                         const std::vector<std::vector<double>>& batch_ratios);

void rewrite_spmd(const ir::Graph& graph, const plan::Sharding& sharding, int rank, const RewriteOptions& options,
                  RewriteBuilder& builder);

// The program as plain data (a RewriteBuilder that records).
struct RankProgram {
  std::vector<int> mesh;
  int rank = 0;
  std::vector<LeafRewrite> leaves;
  std::vector<NodeRewrite> nodes;
  std::vector<OperandRewrite> outputs;
};
RankProgram rank_program(const ir::Graph& graph, const plan::Sharding& sharding, int rank,
                         const RewriteOptions& options = {});

}  // namespace shardwise::transform
