#include "search/spmd_search.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <utility>

#include "search/hetero_balance.h"
#include "search/plan_price.h"
#include "search/sharding_model.h"
#include "support/error.h"
#include "support/log.h"

namespace shardwise::search {

namespace {

using support::ValidationError;

// {data, tensor} meshes: the tensor axis holds consecutive ranks, so it must fit in a node
// to ride the fastest links (any size on one node).
std::vector<std::vector<int>> candidate_meshes(const cost::Cluster& cluster) {
  const int world = cluster.world_size();
  int per_node = cluster.nodes().front().device_count();
  for (const auto& node : cluster.nodes()) per_node = std::min(per_node, node.device_count());
  std::vector<std::vector<int>> meshes;
  for (int t = 1; t <= world; ++t) {
    if (world % t != 0) continue;
    if (cluster.num_nodes() > 1 && per_node % t != 0) continue;
    meshes.push_back({world / t, t});
  }
  return meshes;
}

struct Outcome {
  ShardingEvaluation evaluation;
  plan::Sharding sharding;
  std::optional<BatchBalance> balance;
};

// Coordinate descent over the axes: one axis, the other, the first again. The first pass
// sees the other axis still replicated, so its memory limit is scaled by the other axis'
// size (that axis will shard something later). Three schedules, the best kept:
//  - inner first: the tensor axis, on the fastest links, picks its split with the whole
//    graph to choose from;
//  - outer first: the outer axis takes the dimension it splits best (the batch, for data
//    parallelism across nodes) before the inner axis can take it. Inner first only, a
//    tensor axis that splits the batch leaves a data axis of 128 nodes a batch of
//    1536 / 8 = 192 it cannot split (GPT-3 175B: 220 s a step);
//  - outer first from pure data parallelism with ZeRO-1, kept even when it does not fit:
//    the tensor axis then has to save the memory, which is how Megatron's layout comes
//    about. Solved freely, the outer axis' first pass fits by sharding the weights
//    FSDP-style across nodes, and the descent never leaves that: GPT-3 175B 59 s a step
//    against 24.9 s from this start.
//
// Parameter collectives hide under compute (ShardingModel::solve_axis' parameter_weight): the
// solver prices them at the interference constant first; when the result's collectives
// do not fit under its compute, the descent runs again pricing them whole.
struct DescentSchedule {
  bool outer_first = false;
  bool data_parallel_start = false;  // the first pass takes the data-parallel seed, no beam
};

// Runs one descent on a copy of `start` (every decision replicated): the rules, blocks and
// edges are built once per candidate, not once per descent.
std::unique_ptr<ShardingModel> descend(const ShardingModel& start, bool thorough, DescentSchedule schedule,
                                       double parameter_weight) {
  auto sm = std::make_unique<ShardingModel>(start);
  const std::vector<int>& mesh = start.mesh();
  const int axes = static_cast<int>(mesh.size());
  std::vector<int> order;
  for (int a = axes - 1; a >= 0; --a) order.push_back(a);
  if (schedule.outer_first) std::reverse(order.begin(), order.end());
  if (axes > 1) order.push_back(order.front());
  std::vector<bool> solved(static_cast<std::size_t>(axes), false);
  for (int axis : order) {
    double scale = 1;
    for (int b = 0; b < axes; ++b)
      if (b != axis && !solved[static_cast<std::size_t>(b)]) scale *= mesh[static_cast<std::size_t>(b)];
    const bool first = std::none_of(solved.begin(), solved.end(), [](bool done) { return done; });
    sm->solve_axis(axis, thorough, scale, parameter_weight, first && schedule.data_parallel_start);
    solved[static_cast<std::size_t>(axis)] = true;
  }
  return sm;
}

bool better_evaluation(const ShardingEvaluation& a, const ShardingEvaluation& b) {
  if (a.fits != b.fits) return a.fits;
  if (!a.fits) return a.memory_per_rank < b.memory_per_rank;
  return a.step_time < b.step_time;
}

}  // namespace

std::unique_ptr<ShardingModel> search_decisions(const ShardingModel& start, bool thorough,
                                                ShardingEvaluation* evaluation) {
  std::unique_ptr<ShardingModel> best_model;
  ShardingEvaluation best_evaluation;
  const std::vector<int>& mesh = start.mesh();
  const bool two_axes = std::count_if(mesh.begin(), mesh.end(), [](int size) { return size > 1; }) > 1;
  const std::vector<DescentSchedule> schedules =
      two_axes ? std::vector<DescentSchedule>{{false, false}, {true, false}, {true, true}}
               : std::vector<DescentSchedule>{{false, false}};
  // With collective matmuls the solver prices them hidden under their products at the
  // interference price, which evaluate() caps by those products: a layout it finds that way
  // can evaluate worse than one found without them, so both descents run, and each result is
  // evaluated as the runtime runs it (collective matmuls wherever the plan has them).
  const bool fused = start.options().collective_matmul;
  std::vector<ShardingModel> starts{start};
  if (fused) {
    starts.push_back(start);
    starts.back().set_collective_matmul(false);
  }
  for (ShardingModel& base : starts) base.set_shared_reshardings(false);  // the descents: see the polish below
  for (const ShardingModel& base : starts) {
    for (const DescentSchedule& schedule : schedules) {
      for (double weight : {start.options().overlap_interference, 1.0}) {
        auto sm = descend(base, thorough, schedule, weight);
        sm->set_collective_matmul(fused);
        ShardingEvaluation evaluation = sm->evaluate();
        const bool hidden = evaluation.parameter_sync_hidden;
        if (!best_model || better_evaluation(evaluation, best_evaluation)) {
          best_model = std::move(sm);
          best_evaluation = std::move(evaluation);
        }
        if (hidden) break;  // the interference price was the right one
      }
    }
  }
  // The polish: every axis solved once more from the best decisions, inner first, its
  // problem pricing a resharding that readers of one value share once, as evaluate() and the
  // runtime do (ShardingModelOptions::shared_reshardings). The descents price it per reader
  // edge: q, k and v reading one gathered norm output pay three gathers there, so GQA's
  // narrow k and v ran on the sequence with their weights gathered and an all-to-all each
  // into the heads, where Megatron's column-parallel k and v share q's gather (LLaMA with 8
  // of 16 heads on 8 A100s of 2 GiB: 2.59 -> 2.30 ms a step, test_spmd_search). With the
  // shared price in the descents themselves, the fast solver's beam, wider by the choices
  // the hubs add, settled worse elsewhere (GPT-3 175B on 128 x 8 A100s: 26.70 s against
  // 26.59 s; polished: 25.76 s). Kept only where it evaluates better.
  {
    // Parameter collectives priced as the best decisions run them: hidden under compute (the
    // interference price) or not (whole).
    const double weight = best_evaluation.parameter_sync_hidden ? start.options().overlap_interference : 1.0;
    auto polished = std::make_unique<ShardingModel>(*best_model);
    polished->set_shared_reshardings(true);
    for (int axis = static_cast<int>(mesh.size()) - 1; axis >= 0; --axis)
      polished->solve_axis(axis, thorough, 1.0, weight);
    polished->set_collective_matmul(fused);
    ShardingEvaluation polished_evaluation = polished->evaluate();
    if (better_evaluation(polished_evaluation, best_evaluation)) {
      best_model = std::move(polished);
      best_evaluation = std::move(polished_evaluation);
    }
  }
  if (evaluation != nullptr) *evaluation = std::move(best_evaluation);
  return best_model;
}

namespace {

Outcome run_candidate(const ir::Graph& graph, const cost::Cluster& cluster, const cost::CostModel& model,
                      const SpmdSearchOptions& options, const std::vector<int>& mesh, plan::Recompute recompute,
                      bool thorough,
                      double memory_limit, FastSolveMemo& memo) {
  ShardingModelOptions mo;
  static_cast<LayoutSettings&>(mo) = options;
  mo.mesh = mesh;
  mo.global_batch = options.global_batch;
  mo.memory_limit = memory_limit;
  mo.recompute = recompute;
  mo.ring_attention = options.context_parallel;
  mo.memory = options.memory ? options.memory : cost::state_dtype_memory(options.state_dtype);
  mo.overlap_interference = options.overlap_interference.value_or(cost::overlap_interference(cluster));
  mo.solve_memo = &memo;
  mo.optimizer_memory_efficiency = cost::PlanCostConstants{}.optimizer_memory_efficiency;
  if (options.mesh && !options.batch_on_tensor_axis && mesh.size() == 2) mo.batch_axes = {true, false};
  const ShardingModel start(graph, cluster, model, mo);
  Outcome out;
  std::unique_ptr<ShardingModel> best_model = search_decisions(start, thorough, &out.evaluation);
  ShardingModel& sm = *best_model;
  // Heterogeneous ranks along the batch axis: shares from the balance LP.
  const int axis = sm.batch_axis();
  if (cluster.heterogeneous() && axis >= 0) {
    // Every group along the axis is alike in the presets (a run of devices per node); the
    // first one stands for all.
    std::vector<int> ranks = sm.axis_ranks(axis);
    const double activations = sm.activation_bytes() + sm.backward_working_bytes();
    const double parameters = sm.parameter_bytes() + sm.gathered_parameter_bytes() + sm.fp8_cast_bytes();
    const double per_rank_batch = static_cast<double>(options.global_batch) / static_cast<double>(ranks.size());
    const double comm = out.evaluation.step_time - out.evaluation.breakdown.at("compute");
    std::vector<BalanceRank> balance;
    for (int r : ranks) {
      const cost::DeviceType& device = cluster.device_of(r);
      BalanceRank b;
      b.seconds_per_sample = sm.compute_seconds(device) / per_rank_batch;
      b.fixed_seconds = comm;
      b.memory_per_sample = activations / per_rank_batch;
      b.fixed_memory = parameters;
      b.memory_capacity = static_cast<double>(device.memory_bytes) * options.memory_fraction;
      balance.push_back(b);
    }
    BalanceResult result = balance_shares(balance, options.global_batch);
    if (result.feasible && result.step_time < result.even_step_time) {
      out.balance = BatchBalance{axis, ranks, result.ratios(), result.step_time, result.even_step_time,
                                 result.lp_step_time};
      sm.set_input_ratios(axis, result.ratios());
      // Priced as the plan is (ShardingModel::evaluate prices uneven shares as the LP does):
      // one evaluator for the search's figure and the plan's (search/plan_price.h).
      out.evaluation = sm.evaluate();
    }
  }
  add_plain_collectives(sm, out.evaluation);
  out.sharding = sm.sharding(thorough ? "thorough" : "fast");
  return out;
}

bool better(const Outcome& a, const Outcome& b) { return better_evaluation(a.evaluation, b.evaluation); }

}  // namespace

std::string_view search_level_name(SearchLevel level) { return level == SearchLevel::Fast ? "fast" : "thorough"; }

SearchLevel search_level_from_name(std::string_view name) {
  if (name == "fast") return SearchLevel::Fast;
  if (name == "thorough") return SearchLevel::Thorough;
  throw ValidationError(fmt::format("search level '{}' (known: fast, thorough)", name));
}

SpmdSearchResult search_spmd(const ir::Graph& graph, const cost::Cluster& cluster, const cost::CostModel& model,
                             const SpmdSearchOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  if (options.global_batch < 1)
    throw ValidationError(fmt::format("spmd search: global_batch {} must be >= 1", options.global_batch));
  if (graph.nodes().empty()) throw ValidationError("spmd search: the graph has no nodes");
  std::vector<std::vector<int>> meshes;
  if (options.mesh) {
    int world = 1;
    for (int size : *options.mesh) world *= size;
    if (options.mesh->size() != 2 || world != cluster.world_size())
      throw ValidationError(fmt::format("spmd search: mesh [{}] must be {{data, tensor}} with {} ranks",
                                        fmt::join(*options.mesh, ", "), cluster.world_size()));
    meshes.push_back(*options.mesh);
  } else {
    meshes = candidate_meshes(cluster);
  }
  double memory_limit = std::numeric_limits<double>::infinity();
  for (int r = 0; r < cluster.world_size(); ++r)
    memory_limit = std::min(memory_limit, static_cast<double>(cluster.device_of(r).memory_bytes));
  memory_limit *= options.memory_fraction;

  // Selective before full: on a tie the search keeps the one that runs less again.
  std::vector<plan::Recompute> recomputations = {plan::Recompute::None};
  if (options.recompute)
    recomputations = {*options.recompute};
  else if (options.allow_recompute)
    recomputations = {plan::Recompute::None, plan::Recompute::Selective, plan::Recompute::Full};
  std::vector<std::pair<std::vector<int>, plan::Recompute>> runs;
  for (plan::Recompute recompute : recomputations)
    for (const auto& mesh : meshes) runs.emplace_back(mesh, recompute);
  const std::vector<bool> levels =
      options.level == SearchLevel::Thorough ? std::vector<bool>{false, true} : std::vector<bool>{false};

  SpmdSearchResult result;
  // One memo for every candidate: a mesh with and without recomputation, and the descents of
  // each, often build the same axis problem (FastSolveMemo).
  FastSolveMemo memo;
  std::optional<Outcome> best;
  int done = 0;
  const int total = static_cast<int>(runs.size() * levels.size());
  for (const auto& [mesh, recompute] : runs) {
    for (bool thorough : levels) {
      Outcome outcome = run_candidate(graph, cluster, model, options, mesh, recompute, thorough, memory_limit, memo);
      result.candidates.push_back(
          {mesh, recompute, outcome.evaluation.fits, outcome.evaluation.step_time, outcome.evaluation.memory_per_rank});
      if (!best || better(outcome, *best)) best = std::move(outcome);
      if (options.progress) options.progress(++done, total);
    }
  }

  plan::Plan& plan = result.plan;
  const plan::Sharding& sharding = best->sharding;
  plan.data = sharding.mesh[0];
  plan.tensor = sharding.mesh[1];
  plan.pipeline = 1;
  plan.global_batch = options.global_batch;
  plan.micro_batch = options.global_batch;
  plan.recompute = sharding.recompute;
  plan.zero_stage = sharding.zero.empty() ? 0 : 1;  // the optimizer state's sharding: ZeRO-1
  plan.precision = std::string(cost::precision_name(options.precision));
  plan.state_dtype = options.state_dtype;
  plan.compile = options.compile;
  plan.sharding = sharding;
  plan.sharding->level = std::string(search_level_name(options.level));
  const ShardingEvaluation& e = best->evaluation;
  plan.predicted = sharding_prediction(e, cluster);
  plan::validate(plan, cluster.world_size());
  result.fits = e.fits;
  result.memory_limit = memory_limit;
  result.balance = best->balance;
  result.search_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.axis_problems_solved = memo.solved();
  result.axis_problems_reused = memo.reused();
  if (support::log_enabled(support::LogLevel::Info)) {
    support::log(support::LogLevel::Info,
                 fmt::format("spmd search ({}): {} candidates in {:.2f} s; chose mesh {} (data x tensor){}, "
                             "step {:.4g} s, {:.3g} GB per rank of {:.3g} GB{}",
                             options.level == SearchLevel::Thorough ? "thorough" : "fast", result.candidates.size(),
                             result.search_seconds, sharding.mesh,
                             sharding.recompute == plan::Recompute::None
                                 ? std::string()
                                 : fmt::format(", {} recompute", plan::recompute_name(sharding.recompute)),
                             e.step_time, e.memory_per_rank / 1e9, memory_limit / 1e9,
                             e.fits ? "" : " (fits under no candidate: the one needing the least memory)"));
  }
  return result;
}

}  // namespace shardwise::search
