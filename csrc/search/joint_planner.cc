#include "search/joint_planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>

#include "cost/layer_balance.h"
#include "cost/layer_structure.h"
#include "support/error.h"
#include "support/log.h"

namespace shardwise::search {
namespace {

using support::ValidationError;

std::vector<std::int64_t> divisors(std::int64_t n) {
  std::vector<std::int64_t> out;
  for (std::int64_t k = 1; k <= n; ++k)
    if (n % k == 0) out.push_back(k);
  return out;
}

}  // namespace

JointPlanResult plan_joint(const ir::Graph& graph, const cost::Cluster& cluster, const cost::CostModel& model,
                           const JointPlanOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  if (options.global_batch < 1)
    throw ValidationError(fmt::format("joint planner: global batch {} < 1", options.global_batch));
  if (cluster.device_types().size() != 1)
    throw ValidationError("joint planner: a heterogeneous cluster; use the SPMD search (uneven batch shares)");
  // The graph's layers and tensor-parallel groups, found once for every candidate.
  const cost::LayerStructure structure = cost::find_layer_structure(graph);
  if (!structure.layers)
    throw ValidationError("joint planner: the graph has no repeated layers to cut into pipeline stages");
  const auto layers = static_cast<std::int64_t>(structure.num_layers());
  const int world = cluster.world_size();
  int per_node = 0;
  for (const cost::Node& node : cluster.nodes()) per_node = std::max(per_node, node.device_count());
  JointPlanResult result;
  result.memory_limit = static_cast<double>(cluster.device_types().front().memory_bytes) * options.memory_fraction;
  const bool thorough = options.level == SearchLevel::Thorough;

  std::vector<plan::Plan> space;
  auto add_all = [&](bool with_zero) {
    for (std::int64_t t : divisors(world)) {
      // A tensor group lives inside one node: t divides the node's devices, so every group of
      // t consecutive ranks stays on NVLink (the cost model prices the group of ranks 0..t-1;
      // with t = 6 on 8-GPU nodes, half the groups would cross the network at 11x the cost).
      if (t > per_node || per_node % t != 0) continue;
      // Each rank of a tensor group holds whole heads (Megatron-LM asserts the same).
      if (structure.attention_heads > 0 && structure.attention_heads % t != 0) continue;
      for (std::int64_t p : divisors(world / t)) {
        if (p > layers) continue;
        const std::int64_t d = world / (t * p);
        if (options.global_batch % d != 0) continue;
        for (std::int64_t b : divisors(options.global_batch / d)) {
          if (thorough ? b > options.max_micro_batch : (b != 1 && b != 2 && b != 4)) continue;
          const std::int64_t m = options.global_batch / (d * b);
          std::vector<std::pair<plan::Schedule, int>> schedules = {{plan::Schedule::OneFOneB, 1}};
          if (p > 1 && m % p == 0) {
            const std::vector<int> vs = thorough ? std::vector<int>{2, 3, 4, 6, 8} : std::vector<int>{2, 4};
            for (int v : vs)
              if (p * v <= layers) schedules.emplace_back(plan::Schedule::Interleaved1F1B, v);
          }
          for (const auto& [schedule, v] : schedules)
            for (plan::Recompute recompute : {plan::Recompute::None, plan::Recompute::Full})
              for (int zero : with_zero ? std::vector<int>{1} : std::vector<int>{0}) {
                plan::Plan candidate;
                candidate.data = static_cast<int>(d);
                candidate.tensor = static_cast<int>(t);
                candidate.pipeline = static_cast<int>(p);
                candidate.global_batch = options.global_batch;
                candidate.micro_batch = b;
                candidate.schedule = schedule;
                candidate.virtual_stages = v;
                candidate.recompute = recompute;
                candidate.zero_stage = d > 1 ? zero : 0;
                candidate.precision = options.precision;
                if (zero == 1 && d == 1) continue;  // nothing to shard it over
                space.push_back(std::move(candidate));
              }
        }
      }
    }
  };

  std::vector<JointCandidate> fitting;
  JointCandidate least_memory;
  least_memory.memory_per_rank = std::numeric_limits<double>::infinity();
  auto evaluate_space = [&] {
    if (support::log_enabled(support::LogLevel::Info))
      support::log(support::LogLevel::Info, fmt::format("joint planner ({}): pricing {} combinations",
                                                        thorough ? "thorough" : "fast", space.size()));
    auto price = [&](const plan::Plan& candidate) -> std::optional<cost::PlanCost> {
      try {
        cost::PlanCost cost = cost::evaluate(structure, graph, cluster, candidate, model);
        ++result.evaluated;
        JointCandidate c{cost::with_prediction(candidate, cost), cost.step_time, cost.memory_per_rank,
                         cost.memory_per_rank <= result.memory_limit};
        if (c.fits) {
          fitting.push_back(std::move(c));
        } else if (c.memory_per_rank < least_memory.memory_per_rank) {
          least_memory = std::move(c);
        }
        return cost;
      } catch (const ValidationError&) {
        return std::nullopt;  // a combination the evaluator rejects (layers the stages cannot split)
      }
    };
    for (std::size_t i = 0; i < space.size(); ++i) {
      if (options.progress && i % 64 == 0) options.progress(static_cast<int>(i), static_cast<int>(space.size()));
      std::optional<cost::PlanCost> even = price(space[i]);
      if (!even || space[i].pipeline == 1) continue;
      // The same plan with its layers split by time rather than count (layer_balance.h):
      // the last stage's LM head or the first stage's embedding take a share of its layers.
      std::vector<int> balanced = cost::balance_layers({.layers = static_cast<int>(layers),
                                                        .pipeline = space[i].pipeline,
                                                        .virtual_stages = space[i].virtual_stages,
                                                        .layer = even->layer_time,
                                                        .first = even->first_stage_extra,
                                                        .last = even->last_stage_extra});
      const int p = space[i].pipeline;
      if (balanced.empty() || cost::layers_per_device(balanced, p) ==
                                  cost::layers_per_device(cost::even_layers(static_cast<int>(layers),
                                                                            p * space[i].virtual_stages),
                                                          p))
        continue;
      plan::Plan uneven = space[i];
      uneven.layers_per_stage = std::move(balanced);
      price(uneven);
    }
    // The pass is done: a progress bar ends full (a second, finer pass starts its own count).
    if (options.progress) options.progress(static_cast<int>(space.size()), static_cast<int>(space.size()));
  };
  add_all(false);
  evaluate_space();
  if (thorough || fitting.empty()) {
    space.clear();
    add_all(true);
    evaluate_space();
  }
  // Stable: ties keep the enumeration order (smaller t, p, b first).
  std::stable_sort(fitting.begin(), fitting.end(),
                   [](const JointCandidate& a, const JointCandidate& b) { return a.step_time < b.step_time; });
  if (!fitting.empty()) {
    result.plan = fitting.front().plan;
    result.fits = true;
    fitting.resize(std::min<std::size_t>(fitting.size(), 10));
    result.best = std::move(fitting);
  } else if (std::isfinite(least_memory.memory_per_rank)) {
    result.plan = least_memory.plan;
  } else {
    throw ValidationError("joint planner: no combination of degrees could be evaluated for this graph and cluster");
  }
  result.search_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (support::log_enabled(support::LogLevel::Info)) {
    const plan::Plan& p = result.plan;
    support::log(support::LogLevel::Info,
                 fmt::format("joint planner ({}): {} combinations in {:.2f} s; chose t{} p{} d{}, micro-batch {}, "
                             "{}{}{}", thorough ? "thorough" : "fast", result.evaluated, result.search_seconds,
                             p.tensor, p.pipeline, p.data, p.micro_batch, plan::schedule_name(p.schedule),
                             p.virtual_stages > 1 ? fmt::format(" (v={})", p.virtual_stages) : std::string(),
                             result.fits ? "" : " (fits under none: the one needing the least memory)"));
  }
  return result;
}

}  // namespace shardwise::search
