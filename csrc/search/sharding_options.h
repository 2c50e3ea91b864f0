// What one SPMD search candidate is searched and priced under: its mesh, batch, precision and
// memory limit, and how the runtime runs its collectives. Read by ShardingModel (search/
// sharding_model.h) and by the parts that price its decisions (sharding_facts.h,
// sharding_strategies.h, sharding_edges.h, sharding_memory.h).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "cost/cluster.h"
#include "cost/constants.h"
#include "cost/memory_cost.h"
#include "plan/plan.h"
#include "search/spmd_problem.h"

namespace shardwise::search {

// What a layout search is asked (SpmdSearchOptions) and each of its candidates' models is
// built with (ShardingModelOptions) alike: both derive from it, and a candidate copies it from
// the search whole, so that no copy forgets a field.
struct LayoutSettings {
  cost::Precision precision = cost::Precision::BF16;
  // The ranks run compiled programs (plan::Plan::compile): memory-bound ops priced fused
  // (analysis/compiled_fusion.h, cost/op_cost.h).
  bool compile = false;
  bool allow_zero = true;  // ZeRO choices (optimizer states, gradients, weights over an axis)
  int beam_width = kBeamWidth;  // search/spmd_problem.h
  // The graph standing for a pipeline stage's share of it (search/stage_layout.h): a rank
  // holds this fraction of the parameter states and of the saved activations of the whole
  // graph at one micro-batch (1F1B's first stage: 1/p of the layers, ~p micro-batches in
  // flight). Memory only; times are the whole graph's.
  double parameter_memory_scale = 1;
  double activation_memory_scale = 1;
  // Tensor-parallel collective matmuls (search/parameter_collectives.h, MatmulCollective;
  // plan::Sharding::collective_matmul): an activation's one all-gather into a contraction's
  // rows, or a contraction's Partial output's one reduce-scatter, hidden under (n-1)/n of
  // the contraction's products at the interference price, forward and backward.
  bool collective_matmul = false;
  // A mixture of experts' experts split over an axis (expert parallelism: the experts op's
  // summed index, shardwise_moe::experts); false: every rank holds every expert of a layer.
  bool expert_parallel = true;
  // The share of a step's once-a-step work this graph pays: the parameters' gradient
  // reductions, the optimizer step and ZeRO's broadcasts run once a step, after every
  // micro-batch. 1: the graph is the whole step; 1/m: it is one of the m micro-batches a
  // stage runs in a step (a stage layout searched at one micro-batch, search/stage_layout.cc).
  // Charged in full per micro-batch, a layout that gathers a mixture of experts' tokens over
  // the data axis (no gradient reduction of its experts there) looked cheaper than splitting
  // them, at DeepSeek-V3's 1,920 micro-batches a step by two orders of magnitude.
  double step_share = 1;
  // Where the experts split on the first mesh axis is the plan's, not the search's: true, split
  // there (plan.expert over a stage's data axis); false, not there (plan.expert 1, which the
  // joint planner priced without it); none: the search's choice.
  std::optional<bool> experts_on_first_axis;
};

struct ShardingModelOptions : LayoutSettings {
  std::vector<int> mesh;  // axis sizes, outermost first
  std::int64_t global_batch = 1;
  double memory_limit = 0;  // bytes per rank
  plan::Recompute recompute = plan::Recompute::None;
  std::optional<cost::MemoryConstants> memory;  // model states per parameter; none: the precision's
  // Parameter collectives (gradient reduction, ZeRO/FSDP weight gathers) run beside compute:
  // the gathers beside the forward, the gradient reductions beside the backward. One
  // second of them hidden that way still costs overlap_interference seconds (the cost
  // model's constant, cost/constants.h: NCCL kernels share SMs and HBM with the GEMMs); the
  // rest is exposed.
  double overlap_interference = cost::kOverlapInterference;
  // Parameter collectives run in buckets (the runtime's gradient buckets, cost/constants.h;
  // FSDP gathers a unit at a time): a parameter smaller than a bucket pays its share of one
  // collective's latency, not a whole one (a layer norm's 4 KB gradient is not a 42 us all-reduce).
  double bucket_bytes = static_cast<double>(cost::kGradientBucketBytes);
  // Fraction of HBM bandwidth the optimizer step reaches (cost/constants.h).
  double optimizer_memory_efficiency = cost::kOptimizerMemoryEfficiency;
  // Mesh axes on which the batch may be split (empty: every axis). A mesh the user gives as
  // {data, tensor} keeps the batch off its tensor axis: no strategy there shards a value
  // along its batch dim (tensor parallelism splits weights, heads and sequences, not rows).
  std::vector<bool> batch_axes;
  // Ring attention (context parallelism: Index::ring, ops/distributed_kernels.h) offered
  // where the kernel runs; false: self-attention's sequence is never split.
  bool ring_attention = true;
  // Activation-gradient all-reduces beside their reader's weight gradient
  // (plan::Sharding::async_gradients, transform/async_gradients.h); false: exposed.
  bool async_gradients = true;
  // A graph captured at batch 1 searched at more rows throws (nothing could split its batch)
  // unless false: a stage layout prices its tensor axis, which need not split the batch.
  bool require_batch_index = true;
  // The per-axis problems price a resharding that readers of one value share once (solve_axis'
  // hubs), as evaluate() and the runtime do; false: once per reader edge (coarser, and a
  // smaller problem for the fast solver's beam). search_decisions descends without them and
  // polishes with them (spmd_search.cc says why).
  bool shared_reshardings = true;
  // Where solve_axis' fast solver looks its answers up and keeps them (search/spmd_problem.h,
  // FastSolveMemo; one search shares one across its candidates); none: every problem solved.
  FastSolveMemo* solve_memo = nullptr;
};

}  // namespace shardwise::search
