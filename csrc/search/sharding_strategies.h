// Which strategies each node and which choices each leaf may take on one mesh axis of an SPMD
// search candidate, the other axes as decided: the choices of ShardingModel::solve_axis'
// problem, and the strategies ShardingModel::adopt reads a plan's texts against.
//
// A node's strategies are its rule's (search/strategy.h, enumerate_strategies) at the global
// batch, as the other axes' splits leave it, less those the runtime would not run as priced:
// an uneven split of the batch (only the balance LP sets uneven shares), a split of the batch
// on an axis that may not carry it (ShardingModelOptions::batch_axes), a split of a Whole
// index the runtime has no distributed kernel for; plus partial passthrough for a linear op on
// floating values. A leaf is whole, split as one of its readers wants it (where the blocks its
// other axes cut allow), or, a trainable parameter, whole with its optimizer state sharded
// (ZeRO-1).
#pragma once

#include <optional>
#include <vector>

#include "ir/graph.h"
#include "ops/dim_rule.h"
#include "search/placement.h"
#include "search/sharding_decisions.h"
#include "search/strategy.h"

namespace shardwise::search {

struct ShardingFacts;
struct ShardingModelOptions;

// Per node, its rule at the global batch: its operands' batch dims scaled by `batch_scale`
// (global batch / the capture's), the rule built anew so that a graph captured at batch 1
// still gets a batch index to split. nullopt where no rule can be built: the node runs
// replicated.
std::vector<std::optional<ops::DimRule>> rules_at_batch(const ir::Graph& graph, double batch_scale);

// The strided variants the rules call for (StrategyOptions::strided): a tensor of size P x c
// that an equal P-way split or concatenation (a Whole major factor) cuts apart.
StrategyOptions strided_sizes(const std::vector<std::optional<ops::DimRule>>& rules);

// Every operand of the node replicated, every gradient too.
Strategy replicate_strategy(const ir::Node& node);

// One axis' choices of the representative nodes and leaves (the others' stay empty).
struct AxisChoices {
  std::vector<std::vector<Strategy>> strategies;      // per node
  std::vector<std::vector<LeafChoice>> leaf_choices;  // per leaf that a node reads
  std::vector<double> leaf_instances;                 // per leaf: the leaves folded into it
};

class StrategyEnumerator {
 public:
  StrategyEnumerator(const ShardingFacts& facts, const ShardingDecisions& decisions,
                     const ShardingModelOptions& options)
      : facts_(facts), decisions_(decisions), options_(options) {}

  // The node's rule as the other axes' current splits leave it: every other axis
  // (`outer_only` false: what may split, sizes for costs), or only the axes outer to `axis`
  // (true: where this axis' blocks lie, enumerate_strategies' `layout`).
  ops::DimRule rule_except(ir::NodeId node, int axis, bool outer_only = false) const;
  std::vector<Strategy> node_strategies(ir::NodeId node, int axis) const;
  // Can the leaf be held as `want` on `axis` with its other axes' current placements? A
  // reader asks for its own split on one axis only; the leaf's own dim may already be cut by
  // another axis into blocks `want` does not divide (a [2, h] table S(0) on both axes of a
  // 2 x 2 mesh), which no rank could hold (transform/local_shard.h).
  bool leaf_placement_fits(ir::ValueId leaf, int axis, const Placement& want) const;
  AxisChoices axis_choices(int axis) const;

 private:
  const ShardingFacts& facts_;
  const ShardingDecisions& decisions_;
  const ShardingModelOptions& options_;
};

}  // namespace shardwise::search
