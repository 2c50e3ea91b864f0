// The edges of an SPMD search candidate, producer -> reader, and what the resharding along
// one costs on one mesh axis: the collectives that turn the producer's placement into the one
// the reader's strategy wants (search/resharding.h), forward and again where the run repeats
// it, and the gradient's back, each weighed by where the runtime runs it
// (search/parameter_collectives.h). ShardingModel prices its per-axis problems' edges and
// tallies its evaluation's collectives with it.
#pragma once

#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "ir/graph.h"
#include "search/block_folding.h"
#include "search/parameter_collectives.h"
#include "search/placement.h"
#include "search/sharding_decisions.h"

namespace shardwise::search {

struct ShardingFacts;
struct ShardingModelOptions;

// An edge between representatives (block_folding.h): every instance's (value, reader, operand)
// folds into the edge of its representatives.
struct EdgeKey {
  int producer;  // problem-level identity: representative node (or leaf value) producing it
  bool producer_is_leaf;
  int consumer;  // representative consumer node
  int operand;   // input position at the consumer
  auto operator<=>(const EdgeKey&) const = default;
};
struct EdgeGroup {
  ir::ValueId value = -1;  // the first instance's value (for bytes and names)
  double count = 0;        // instances
};
using EdgeGroups = std::map<EdgeKey, EdgeGroup>;

// Every (value, reader, operand) of the graph, grouped by their representatives; not an
// operand its reader reads for metadata only (DimRule::reads_metadata_only: no resharding,
// whatever its placement).
EdgeGroups group_edges(const ir::Graph& graph, const BlockFolding& folding,
                       const std::vector<std::optional<ops::DimRule>>& rules);

// The units of grouped parameter collectives (parameter_collectives.h, parameter_units).
struct ParameterUnits {
  std::vector<int> of_node;  // per node
  // Per (unit, matrix): the elements of the parameters of that rank class the unit reads
  // (EdgePricer::parameter_latency_share's peers).
  std::map<std::pair<int, bool>, double> elements;
  // The first unit that reads a parameter: its gather is issued at the program's start and
  // waited for at once, with no earlier forward compute to run beside (-1: none reads one).
  int first_reading = -1;
};
ParameterUnits count_parameter_units(const ir::Graph& graph);

// A parameter collective's unit group on an axis: (unit of the reader, kind, dtype); kind 0 a
// prefetched gather, 1 a reduce-scatter beside backward.
using UnitGroupKey = std::tuple<int, int, int>;

class EdgePricer {
 public:
  EdgePricer(const ShardingFacts& facts, const ShardingDecisions& decisions, const ShardingModelOptions& options)
      : facts_(facts), decisions_(decisions), options_(options) {}

  // Seconds of the edge's collectives on `axis` with `produced` -> `wanted` and the reader's
  // `gradient` there, the other axes as decided. `hidden_weight`: what a second of a
  // parameter collective that runs beside compute costs (ShardingModel::solve_axis'
  // parameter_weight); exposed ones cost 1.
  double edge_seconds(int axis, ir::ValueId value, int consumer, int operand, const Placement& produced,
                      const Placement& wanted, const Placement& gradient, double hidden_weight = 1.0) const;
  // How often the forward resharding of `value` into `consumer` runs per step: once for an
  // activation; for a parameter, again for the backward where backward reads it (a gathered
  // weight is released after its read, FSDP / ZeRO-3), or, in a recomputed block, for the
  // recomputed forward, whose copy backward uses.
  int forward_passes(ir::ValueId value, int consumer, int operand) const;
  // An activation computed from the model's state alone (ShardingFacts::from_state), held
  // `produced` Replicate, whose reader gives `gradient` Partial(sum): the rewrite reduces that
  // gradient where it reaches the parameters, with theirs, in the buckets (an approximation
  // where another reader gives it otherwise: the rewrite then reduces it on the way, exposed);
  // priced as a replicated parameter's gradient of the activation's bytes.
  bool reduced_with_parameters(ir::ValueId value, const Placement& produced, const Placement& gradient) const;
  // Where the backward steps of activation `value` into `consumer`'s `operand` run, with
  // `produced` -> `wanted` and `gradient` on `axis` and the other axes as decided
  // (activation_gradient_overlap, parameter_collectives.h).
  ParameterOverlap activation_gradient_at(int axis, ir::ValueId value, int consumer, int operand,
                                          const Placement& produced, const Placement& wanted,
                                          const Placement& gradient) const;
  // The collective matmul the runtime runs an edge's collectives in on `axis` (None: none,
  // or the option is off): transform/collective_matmul.h's conditions on this axis, every
  // other axis needing no step. Gather: the reader is the contraction; Scatter: the value's
  // producer is.
  MatmulCollective matmul_collective_at(int axis, ir::ValueId value, int consumer, int operand,
                                        const Placement& produced, const Placement& wanted,
                                        const Placement& gradient) const;
  // Where the reduction of parameter `value`'s gradient at `consumer`'s `operand` runs, held
  // `produced` with the reader's `gradient` on `axis` and the other axes as decided: in the
  // buckets when it is replicated on `axis` (gradient_reduction_overlap), else
  // gradient_scatter_overlap over every axis (parameter_collectives.h).
  ParameterOverlap parameter_gradient_at(int axis, ir::ValueId value, int consumer, int operand,
                                         const Placement& produced, const Placement& gradient) const;
  // Where the forward gather of parameter `value` into `consumer`'s `operand` runs, with
  // `produced` -> `wanted` on `axis` and the other axes as decided (parameter_collectives.h).
  ParameterOverlap gather_overlap(int axis, ir::ValueId value, int consumer, int operand, const Placement& produced,
                                  const Placement& wanted) const;
  // Resharding `bytes` (the rank's part of the tensor) of `value` from -> to on `axis`, paying
  // `latency_share` of the collective's latency (1: issued alone).
  double reshard_seconds(int axis, ir::ValueId value, const Placement& from, const Placement& to, double bytes,
                         double latency_share = 1.0) const;
  // The share of one collective's latency a collective of parameter `value` at `consumer`
  // pays, as the runtime issues it (parameter_collectives.h): a prefetched gather (and its
  // gather again for backward) or a reduce-scatter beside backward, its share by elements of
  // its unit's flattened collective; a replicated gradient's reduction, its share of a bucket
  // of `bucket_bytes` (`bytes`: the rank's part); any other, all of it. Which of the unit's
  // parameters join the group is the plan's (unit_group_elements counts the groups the
  // decisions make); the solver, pricing one edge at a time, takes as peers the unit's
  // parameters of the same rank class, vectors with vectors and matrices with matrices: a
  // plan that gathers a unit's matrices (ZeRO-3) gathers its vectors too, while one that
  // splits the matrices (tensor parallelism) may still gather the vectors (sequence-parallel
  // norms) alone.
  double parameter_latency_share(ir::ValueId value, int consumer, ParameterOverlap overlap, bool replicated_gradient,
                                 double bytes) const;
  // The share of a reader's gradient reduction that reader pays: a leaf replicated on the
  // axis and read by n nodes (a tied embedding, a shared weight) adds its n Partial(sum)
  // gradients locally and reduces them once, so each such reader pays 1/n (exact when every
  // reader's gradient is Partial, the common case; an approximation of a hyper-edge
  // otherwise). A leaf sharded on the axis is reduce-scattered at each read: 1 each.
  double gradient_share(ir::ValueId value, const Placement& produced, const Placement& gradient) const;
  // The gradient a read hands its leaf's reduction: `gradient`, except a whole one (Replicate)
  // of a parameter replicated on the axis and read by several nodes, which is Partial(sum): the
  // rewrite reduces such a leaf's summed gradient once in the buckets where any read's is
  // Partial, the whole reads' added on one rank (transform/spmd_rewrite.cc, reduced_whole), so
  // each read pays its 1/n like the others. Where every read's is whole nothing is reduced, which
  // this prices as one reduction (one edge cannot see the others; such a plan computes every
  // read of the weight on every rank of the axis).
  Placement reduced_gradient(ir::ValueId value, const Placement& produced, const Placement& gradient) const;
  // `p` as the runtime holds it on `axis`: on an axis over devices of different speeds, a
  // split of the value's batch dim takes uneven shares (the balance LP's, known only after
  // the search; priced here at the devices' speed shares), and uneven blocks move by
  // all-gather and cut, never all-to-all (resharding.h). Pricing them even would price an
  // all-to-all the run never issues.
  Placement as_run(int axis, ir::ValueId value, const Placement& p) const;

  UnitGroupKey unit_group_key(int consumer, ir::ValueId value, int kind) const;
  // The unit groups the decisions make on `axis` (parameter_collectives.h): one flattened
  // collective per UnitGroupKey, whose latency its members share by elements; the elements
  // of each.
  std::map<UnitGroupKey, double> unit_group_elements(int axis) const;

 private:
  const ShardingFacts& facts_;
  const ShardingDecisions& decisions_;
  const ShardingModelOptions& options_;
};

}  // namespace shardwise::search
