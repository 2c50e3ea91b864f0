// What an SPMD search candidate (ShardingModel) derives once from its graph, cluster and
// options, before any decision: the device that sets the pace, the batch the capture traced
// against the plan's, every node's rule at the global batch, what autograd saves, where
// gradients flow, the repeated blocks folded, the parameter units and the edges. Nothing here
// changes with the decisions, so the copies of a model the search makes share one.
#pragma once

#include <optional>
#include <vector>

#include "analysis/fp8_linears.h"
#include "cost/cluster.h"
#include "cost/memory_cost.h"
#include "cost/op_cost.h"
#include "ir/graph.h"
#include "ops/dim_rule.h"
#include "search/block_folding.h"
#include "search/sharding_edges.h"
#include "search/strategy.h"

namespace shardwise::search {

struct ShardingModelOptions;

// The first group of mesh axis `axis`: rank 0 and the ranks one step along the axis from it
// (every group along an axis is alike in a cluster description).
std::vector<int> axis_ranks(const std::vector<int>& mesh, int axis);

struct ShardingFacts {
  // Throws ValidationError where the mesh's ranks are not the cluster's, the cluster lacks the
  // options' precision, or a graph captured at batch 1 is searched at more rows (nothing
  // could split its batch) unless options.require_batch_index is false.
  ShardingFacts(const ir::Graph& graph, const cost::Cluster& cluster, const cost::CostModel& model,
                const ShardingModelOptions& options);

  // The whole tensor's bytes at the global batch, in the model states' precision for
  // floating values.
  double value_bytes(ir::ValueId value) const;
  // Its elements at the search's batch (value_bytes without the dtype).
  double value_elements(ir::ValueId value) const;

  const ir::Graph& graph;
  const cost::Cluster& cluster;
  const cost::CostModel& model;
  const cost::DeviceType* device = nullptr;  // the slowest: sets the pace
  // Per mesh axis: n x the slowest device's speed / the summed speed of the axis' group (1 on
  // a homogeneous axis): ShardingModel::balanced_compute_factor.
  std::vector<double> axis_balance;
  std::vector<std::vector<double>> axis_speed_shares;  // per axis: each rank's speed / the sum (empty: even)
  double batch_scale = 1;     // the global batch / the capture's
  bool batch_traced = false;  // the capture's batch > 1: activations carry their batch dims
  double float_bytes = 2;  // an element of the model states' precision
  // A floating value's bytes per byte of its dtype (value_bytes): 1 when the plan trains in
  // the graph's own precision (a bf16 graph's float32 upcasts, a loss' log-probabilities, are
  // float32 as they run); the ratio of the two where it prices a graph in another (a float32
  // capture planned in bf16: 0.5), no value wider than its dtype or the plan's.
  double float_scale = 1;
  // Indexed by NodeId: the node as an FP8 linear where the plan's precision is fp8 (analysis/
  // fp8_linears.h), found once; empty for other precisions.
  std::vector<std::optional<analysis::Fp8Linear>> fp8_linears;
  // Where the plan is compiled (options.compile): which values its fused kernels keep in
  // registers (analysis/compiled_fusion.h), found once; empty otherwise.
  analysis::FusedValues compiled;
  cost::MemoryConstants memory;  // options.memory, or the precision's (cost/memory_cost.h)

  std::vector<std::optional<ops::DimRule>> rules;  // per node, at the global batch (rules_at_batch)
  std::vector<bool> requires_grad;                 // per value
  std::vector<bool> from_state;                    // per value: made from the model's state alone (state_values.h)
  std::vector<double> reads;                       // per value: (node, input) reads
  std::vector<double> saved;                       // per value: the share autograd keeps (saved_for_backward.h)
  BlockFolding folding;
  ParameterUnits units;
  StrategyOptions strided;  // strided_sizes
  EdgeGroups edges;
};

}  // namespace shardwise::search
