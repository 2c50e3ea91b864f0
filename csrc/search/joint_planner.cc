#include "search/joint_planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <optional>

#include "analysis/batch_coupling.h"
#include "cost/layer_balance.h"
#include "cost/layer_structure.h"
#include "cost/pipeline_transfers.h"
#include "schedule/adaptive_kfkb.h"
#include "schedule/simulator.h"
#include "search/stage_layout.h"
#include "support/error.h"
#include "support/log.h"

namespace shardwise::search {
namespace {

// Recomputation choices, in the order a tie keeps: none, then the one that runs less again.
constexpr plan::Recompute kRecomputeChoices[] = {plan::Recompute::None, plan::Recompute::Selective,
                                                 plan::Recompute::Full};

using support::ValidationError;

std::vector<std::int64_t> divisors(std::int64_t n) {
  std::vector<std::int64_t> out;
  for (std::int64_t k = 1; k <= n; ++k)
    if (n % k == 0) out.push_back(k);
  return out;
}

void check_network(const NetworkCondition& network) {
  const auto& durations = network.durations;
  const auto& scale = network.bandwidth_scale;
  if (durations.empty() || durations.size() != scale.size())
    throw ValidationError(fmt::format("joint planner: a network condition needs as many durations as bandwidth "
                                      "scales, at least one (got {} and {})", durations.size(), scale.size()));
  for (std::size_t j = 0; j < durations.size(); ++j)
    if (!(durations[j] > 0) || !(scale[j] > 0) || !std::isfinite(durations[j]) || !std::isfinite(scale[j]))
      throw ValidationError(fmt::format("joint planner: network segment {} lasts {} s at {} x the bandwidth; both "
                                        "must be finite and > 0", j, durations[j], scale[j]));
}

// The simulator's costs of a costed pipelined plan (the header's "varying network"). A send's
// "bytes" are its seconds at the cluster's bandwidth, so the network's scales are its rates.
schedule::SimulationCosts simulation_costs(const plan::Plan& plan, const NetworkCondition& network) {
  const auto& b = plan.predicted->breakdown;
  const int chunks = plan.pipeline * plan.virtual_stages;
  const double m = static_cast<double>(plan.num_micro_batches());
  schedule::SimulationCosts costs = cost::micro_batch_costs(plan.schedule, chunks, plan.virtual_stages,
                                                            (b.at("compute") + b.at("tensor_parallel")) / m);
  costs.boundary_bytes.assign(static_cast<std::size_t>(chunks - 1), b.at("pipeline_transfer"));
  costs.transfer = schedule::periodic_bandwidth(network.durations, network.bandwidth_scale);
  // The gradient synchronisation and optimizer step follow the flush, as the evaluator has
  // them (added by after_flush), not overlapped with the last backwards as the simulator could.
  return costs;
}

// What no schedule shortens: the bottleneck device's compute and tensor-parallel time, the
// exposed gradient synchronisation and the optimizer step (a simulated step's floor).
double fixed_seconds(const plan::Plan& plan) {
  const auto& b = plan.predicted->breakdown;
  return b.at("compute") + b.at("tensor_parallel") + b.at("data_parallel") + b.at("optimizer");
}

// The step of a pipeline the simulator timed: its flush, then the evaluator's exposed
// gradient synchronisation and optimizer step.
double after_flush(const plan::Plan& plan, double pipeline_seconds) {
  const auto& b = plan.predicted->breakdown;
  return pipeline_seconds + b.at("data_parallel") + b.at("optimizer");
}

// The plan with its predicted step time replaced by `step_time` (simulated): the compute,
// tensor-parallel, gradient and optimizer parts stay; what is left is the bubble (at most the
// evaluator's) and exposed transfers.
plan::Plan retimed(plan::Plan plan, double step_time) {
  const double rest = std::max(0.0, step_time - fixed_seconds(plan));
  plan::Predicted& predicted = *plan.predicted;
  auto& b = predicted.breakdown;
  b["pipeline_bubble"] = std::min(b["pipeline_bubble"], rest);
  b["pipeline_p2p"] = rest - b["pipeline_bubble"];
  predicted.tflops_per_device *= predicted.step_time / step_time;
  predicted.megatron_tflops_per_device *= predicted.step_time / step_time;
  predicted.step_time = step_time;
  return plan;
}

// The orders of a plan's rank blocks other than the identity that put a different device
// kind at some stage (plan.stage_groups), for a mixed cluster: every distinct sequence of the
// blocks' kinds (a block's kind: its ranks' slowest type), a kind's blocks taken in rank
// order. At most 120 sequences (p <= 5, or few kinds); beyond that the kinds fastest first
// and slowest first.
std::vector<std::vector<int>> stage_orders(const cost::Cluster& cluster, const plan::Plan& plan) {
  const int p = plan.pipeline, block = plan.data * plan.tensor;
  const auto precision = cost::parse_precision(plan.precision);
  std::vector<std::pair<double, std::string>> kinds;  // per block: (speed, name)
  for (int g = 0; g < p; ++g) {
    const cost::DeviceType& slowest = cluster.slowest_device(g * block, block, *precision);
    kinds.emplace_back(slowest.peak_flops.at(*precision), slowest.name);
  }
  auto blocks_for = [&](const std::vector<std::pair<double, std::string>>& sequence) {
    std::vector<int> order;
    std::vector<bool> used(static_cast<std::size_t>(p), false);
    for (const auto& kind : sequence)
      for (int g = 0; g < p; ++g)
        if (!used[static_cast<std::size_t>(g)] && kinds[static_cast<std::size_t>(g)] == kind) {
          used[static_cast<std::size_t>(g)] = true;
          order.push_back(g);
          break;
        }
    return order;
  };
  std::vector<std::pair<double, std::string>> sequence = kinds;
  std::sort(sequence.begin(), sequence.end());
  std::vector<std::vector<int>> sequences;
  int count = 0;
  do {
    if (++count > 120) break;
    sequences.push_back(blocks_for(sequence));
  } while (std::next_permutation(sequence.begin(), sequence.end()));
  if (count > 120) {
    sequences.clear();
    std::sort(sequence.begin(), sequence.end());
    sequences.push_back(blocks_for(sequence));
    std::reverse(sequence.begin(), sequence.end());
    sequences.push_back(blocks_for(sequence));
  }
  std::vector<int> identity(static_cast<std::size_t>(p));
  std::iota(identity.begin(), identity.end(), 0);
  std::erase_if(sequences, [&](const std::vector<int>& order) { return order == identity; });
  return sequences;
}

}  // namespace

JointPlanResult plan_joint(const ir::Graph& graph, const cost::Cluster& cluster, const cost::CostModel& model,
                           const JointPlanOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  if (options.global_batch < 1)
    throw ValidationError(fmt::format("joint planner: global batch {} < 1", options.global_batch));
  // A heterogeneous cluster: each stage priced on its own devices and against their memory
  // (plan_cost.h), its layers sized to their speed (layer_balance.h's device_scale).
  const bool mixed = cluster.device_types().size() > 1;
  if (options.network) check_network(*options.network);
  // The graph's layers and tensor-parallel groups, found once for every candidate.
  const cost::LayerStructure structure = cost::find_layer_structure(graph);
  if (!structure.layers)
    throw ValidationError("joint planner: the graph has no repeated layers to cut into pipeline stages");
  const auto layers = static_cast<std::int64_t>(structure.num_layers());
  // A graph that couples its batch's rows keeps them in one micro-batch (micro_batch_check.h).
  const bool one_micro_batch = options.micro_batch_semantics == plan::MicroBatchSemantics::Exact &&
                               analysis::batch_coupling(ops::OpTable::builtin(), graph).coupled();
  const int world = cluster.world_size();
  int per_node = 0;
  for (const cost::Node& node : cluster.nodes()) per_node = std::max(per_node, node.device_count());
  JointPlanResult result;
  // (mixed: the smallest device's, for what has no stage to hold it against: kFkB's groups)
  double capacity = std::numeric_limits<double>::infinity();
  for (const cost::DeviceType& type : cluster.device_types())
    capacity = std::min(capacity, static_cast<double>(type.memory_bytes));
  result.memory_limit = capacity * options.memory_fraction;
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
          if (one_micro_batch ? b * d != options.global_batch
                              : (thorough ? b > options.max_micro_batch : (b != 1 && b != 2 && b != 4)))
            continue;
          const std::int64_t m = options.global_batch / (d * b);
          std::vector<std::pair<plan::Schedule, int>> schedules = {{plan::Schedule::OneFOneB, 1}};
          if (p > 1 && m % p == 0) {
            const std::vector<int> vs = thorough ? std::vector<int>{2, 3, 4, 6, 8} : std::vector<int>{2, 4};
            for (int v : vs)
              if (p * v <= layers) schedules.emplace_back(plan::Schedule::Interleaved1F1B, v);
          }
          // ZB-H1, ZB-V and DualPipeV without recomputation only: the runtime does not split a recomputed
          // block's backward (plan.h), so where memory needs recomputation they are no candidates.
          if (p > 1) schedules.emplace_back(plan::Schedule::ZeroBubbleH1, 1);
          if (p > 1 && 2 * p <= layers) schedules.emplace_back(plan::Schedule::ZeroBubbleV, 2);
          // DualPipeV: ZB-V's price (it reaches ZB-V's bound), one chunk more held; at least
          // a micro-batch per stage.
          if (p > 1 && 2 * p <= layers && m >= 2 * p) schedules.emplace_back(plan::Schedule::DualPipeV, 2);
          for (const auto& [schedule, v] : schedules)
            for (plan::Recompute recompute : kRecomputeChoices)
              for (int zero : with_zero ? std::vector<int>{1} : std::vector<int>{0}) {
                if (plan::splits_backward(schedule) && recompute != plan::Recompute::None) continue;
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
                candidate.micro_batch_semantics = options.micro_batch_semantics;
                if (zero == 1 && d == 1) continue;  // nothing to shard it over
                space.push_back(std::move(candidate));
              }
        }
      }
      // Two stages on sub-meshes of their own widths (plan.stage_meshes, Alpa's inter-op
      // stages): a data widths a and n - a (n = world / t), a != n - a, each splitting a
      // micro-batch of rows a multiple of both. Small jobs only (n <= 16): where a stage of
      // one more or one fewer data rank is a real step, not noise.
      const std::int64_t n = world / t;
      if (with_zero || n < 3 || n > 16 || layers < 2) continue;
      for (std::int64_t a = 1; a < n; ++a) {
        if (2 * a == n) continue;  // the plain plan
        const std::int64_t unit = std::lcm(a, n - a);
        for (std::int64_t k : {1, 2, 4}) {
          const std::int64_t rows = unit * k;
          if (options.global_batch % rows != 0) continue;
          if (one_micro_batch ? rows != options.global_batch
                              : rows / std::max(a, n - a) > (thorough ? options.max_micro_batch : 4))
            continue;
          for (plan::Schedule schedule : {plan::Schedule::OneFOneB, plan::Schedule::ZeroBubbleH1})
            for (plan::Recompute recompute : kRecomputeChoices) {
              if (plan::splits_backward(schedule) && recompute != plan::Recompute::None) continue;
              plan::Plan candidate;
              candidate.pipeline = 2;
              candidate.global_batch = options.global_batch;
              candidate.micro_batch = rows;
              candidate.schedule = schedule;
              candidate.recompute = recompute;
              candidate.precision = options.precision;
              candidate.micro_batch_semantics = options.micro_batch_semantics;
              candidate.stage_meshes = {{static_cast<int>(a), static_cast<int>(t)},
                                        {static_cast<int>(n - a), static_cast<int>(t)}};
              space.push_back(std::move(candidate));
            }
        }
      }
    }
  };

  std::vector<JointCandidate> fitting;
  // Plans within 1.5 x the memory under Megatron's layout: their searched layout may fit
  // (sequence parallelism saves activations: GPT 8 x 2048 at t 8, 1.54 GB against 1.10 GB);
  // the stage layouts' pass takes them.
  std::vector<JointCandidate> near_fitting;
  JointCandidate least_memory;
  least_memory.memory_per_rank = std::numeric_limits<double>::infinity();
  // Homogeneous: the bytes against the one capacity; mixed: each stage against its own.
  auto fits = [&](const cost::PlanCost& cost) {
    return mixed ? cost.memory_use <= options.memory_fraction : cost.memory_per_rank <= result.memory_limit;
  };
  auto evaluate_space = [&] {
    if (support::log_enabled(support::LogLevel::Info))
      support::log(support::LogLevel::Info, fmt::format("joint planner ({}): pricing {} combinations",
                                                        thorough ? "thorough" : "fast", space.size()));
    auto price = [&](const plan::Plan& candidate) -> std::optional<cost::PlanCost> {
      try {
        cost::PlanCost cost = cost::evaluate(structure, graph, cluster, candidate, model);
        ++result.evaluated;
        JointCandidate c{cost::with_prediction(candidate, cost), cost.step_time, cost.memory_per_rank,
                         fits(cost)};
        if (c.fits) {
          fitting.push_back(std::move(c));
          return cost;
        }
        if (options.stage_layouts && (mixed ? cost.memory_use <= 1.5 * options.memory_fraction
                                            : c.memory_per_rank <= 1.5 * result.memory_limit))
          near_fitting.push_back(c);
        if (c.memory_per_rank < least_memory.memory_per_rank) least_memory = std::move(c);
        return cost;
      } catch (const ValidationError&) {
        return std::nullopt;  // a combination the evaluator rejects (layers the stages cannot split)
      }
    };
    // The plan, and the same plan with its layers split by time rather than count
    // (layer_balance.h): the last stage's LM head or the first stage's embedding take a share of
    // its layers; on a mixed cluster the faster stages take more. (ZB-V's V puts the LM head
    // beside the embedding, on the first device.)
    auto price_balanced = [&](const plan::Plan& candidate) {
      std::optional<cost::PlanCost> even = price(candidate);
      if (!even || candidate.pipeline == 1) return;
      const bool v_shape = plan::v_shaped(candidate.schedule);
      std::vector<int> balanced = cost::balance_layers({.layers = static_cast<int>(layers),
                                                        .pipeline = candidate.pipeline,
                                                        .virtual_stages = candidate.virtual_stages,
                                                        .layer = even->layer_time,
                                                        .first = even->first_stage_extra,
                                                        .last = even->last_stage_extra,
                                                        .v_shape = v_shape,
                                                        .device_scale = even->stage_scale});
      const int p = candidate.pipeline;
      if (balanced.empty() || cost::layers_per_device(balanced, p, v_shape) ==
                                  cost::layers_per_device(cost::even_layers(static_cast<int>(layers),
                                                                            p * candidate.virtual_stages),
                                                          p, v_shape))
        return;
      plan::Plan uneven = candidate;
      uneven.layers_per_stage = std::move(balanced);
      price(uneven);
    };
    for (std::size_t i = 0; i < space.size(); ++i) {
      if (options.progress && i % 64 == 0) options.progress(static_cast<int>(i), static_cast<int>(space.size()));
      price_balanced(space[i]);
      if (!mixed || space[i].pipeline == 1 || !space[i].stage_meshes.empty()) continue;
      // Which stage runs on which block of ranks (plan.stage_groups): every order of the
      // blocks' device kinds (the first stage holds the most micro-batches, the last the LM
      // head), each kind's blocks in rank order.
      for (const std::vector<int>& order : stage_orders(cluster, space[i])) {
        plan::Plan ordered = space[i];
        ordered.stage_groups = order;
        price_balanced(ordered);
      }
    }
    // The pass is done: a progress bar ends full (a second, finer pass starts its own count).
    if (options.progress) options.progress(static_cast<int>(space.size()), static_cast<int>(space.size()));
  };
  add_all(false);
  evaluate_space();
  if (options.allow_zero && (thorough || fitting.empty())) {
    space.clear();
    add_all(true);
    evaluate_space();
  }
  std::map<StageLayoutKey, std::optional<StageLayout>> layouts;
  // A layout found for one plan serves every plan with its (t, micro-batch, recomputation or
  // none): the memory shares and the kind of recomputation only matter where memory binds (a
  // layout's prices are the same under both: cost::PartPrice), so a plan that does not fit
  // under another plan's layout gets a search of its own. Keyed by that family (shares -1).
  std::map<StageLayoutKey, const std::optional<StageLayout>*> shared;
  auto family_of = [](const StageLayoutKey& key) {
    const int recomputed = std::get<2>(key) == static_cast<int>(plan::Recompute::None)
                               ? static_cast<int>(plan::Recompute::None)
                               : static_cast<int>(plan::Recompute::Full);
    return StageLayoutKey{std::get<0>(key), std::get<1>(key), recomputed, -1, -1};
  };
  if (options.stage_layouts) {
    // The candidates priced again with the layout the SPMD search finds for their stages' t
    // ranks (stage_layout.h), the layout parallelize() runs, instead of Megatron's. Lazily: the
    // best not yet re-priced is re-priced until the ten best all are (or the searches run out),
    // with the best of every tensor degree first, so a degree Megatron's layout prices badly
    // (a graph it cannot split) has its chance. One search per StageLayoutKey.
    const int budget = thorough ? 48 : 12;
    fitting.insert(fitting.end(), std::make_move_iterator(near_fitting.begin()),
                   std::make_move_iterator(near_fitting.end()));
    std::vector<bool> checked(fitting.size(), false);
    auto by_step = [&](std::size_t a, std::size_t b) { return fitting[a].step_time < fitting[b].step_time; };
    auto search = [&](const StageLayoutKey& key, const plan::Plan& plan) -> const std::optional<StageLayout>* {
      if (auto found = layouts.find(key); found != layouts.end()) return &found->second;
      if (static_cast<int>(layouts.size()) >= budget) return nullptr;
      ++result.stage_layout_searches;
      const auto* layout = &layouts.emplace(key, search_stage_layout(graph, structure, cluster, model, plan,
                                                                     {options.level, options.memory_fraction}))
                                .first->second;
      shared.emplace(family_of(key), layout);
      return layout;
    };
    auto reprice = [&](std::size_t i) {
      checked[i] = true;
      JointCandidate& c = fitting[i];
      if (c.plan.tensor == 1) return;  // nothing to lay out: Megatron's prices are the graph's
      const StageLayoutKey key = stage_layout_key(structure, c.plan);
      const StageLayoutKey family = family_of(key);
      auto priced = [&](const std::optional<StageLayout>* layout) -> std::optional<JointCandidate> {
        if (layout == nullptr || !*layout) return std::nullopt;
        plan::Plan plain = c.plan;
        plain.predicted.reset();
        try {
          const cost::PlanCost cost =
              cost::evaluate(structure, graph, cluster, plain, model, {}, &(*layout)->prices);
          ++result.evaluated;
          return JointCandidate{cost::with_prediction(std::move(plain), cost), cost.step_time, cost.memory_per_rank,
                                fits(cost), true};
        } catch (const ValidationError&) {
          return std::nullopt;
        }
      };
      const auto family_layout = shared.find(family);
      const bool own = layouts.contains(key) || family_layout == shared.end();
      std::optional<JointCandidate> found = priced(own ? search(key, c.plan) : family_layout->second);
      if (!own && (!found || !found->fits)) found = priced(search(key, c.plan));
      if (found) c = std::move(*found);
    };
    std::vector<std::size_t> order(fitting.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), by_step);
    std::map<int, std::size_t> best_of_degree;
    for (std::size_t i : order)
      if (fitting[i].fits) best_of_degree.emplace(fitting[i].plan.tensor, i);
    for (const auto& [t, i] : best_of_degree) reprice(i);
    for (;;) {
      // The best not yet re-priced, fitting or near it, ahead of the tenth best re-priced one.
      std::stable_sort(order.begin(), order.end(), by_step);
      std::size_t seen = 0, next = order.size();
      for (std::size_t i : order) {
        if (!checked[i]) {
          next = i;
          break;
        }
        if (fitting[i].fits && ++seen == 10) break;
      }
      if (next == order.size()) break;
      reprice(next);
    }
    std::erase_if(fitting, [](const JointCandidate& c) { return !c.fits; });
  }
  if (options.network) {
    // Every pipelined plan timed on the varying network; 1F1B plans also as kFkB with the
    // adaptive k (the header says how). A simulated step is never shorter than the plan's
    // compute, tensor-parallel, gradient and optimizer parts, so a plan whose parts alone
    // reach the tenth best step so far cannot enter the ten best: it is dropped unsimulated
    // (in the evaluator's order, the best come first).
    std::stable_sort(fitting.begin(), fitting.end(),
                     [](const JointCandidate& a, const JointCandidate& b) { return a.step_time < b.step_time; });
    std::vector<double> ten_best;  // ascending
    auto record = [&](double step) {
      ten_best.insert(std::upper_bound(ten_best.begin(), ten_best.end(), step), step);
      if (ten_best.size() > 10) ten_best.pop_back();
    };
    auto out_of_reach = [&](const plan::Plan& plan) {
      return ten_best.size() == 10 && fixed_seconds(plan) >= ten_best.back();
    };
    for (const JointCandidate& c : fitting)
      if (c.plan.pipeline == 1) record(c.step_time);
    std::vector<JointCandidate> kfkb_plans;
    for (JointCandidate& c : fitting) {
      if (c.plan.pipeline == 1) continue;
      if (out_of_reach(c.plan)) {
        c.fits = false;  // dropped below
        continue;
      }
      const schedule::SimulationCosts costs = simulation_costs(c.plan, *options.network);
      if (c.plan.schedule != plan::Schedule::OneFOneB) {
        const double step = after_flush(c.plan, schedule::simulate(cost::pipeline_schedule(c.plan), costs).step_time);
        c.plan = retimed(std::move(c.plan), step);
        c.step_time = c.plan.predicted->step_time;
        record(c.step_time);
        continue;
      }
      const double activations = c.plan.predicted->memory_breakdown.at("activations");
      const double in_flight = std::min<double>(static_cast<double>(c.plan.num_micro_batches()), c.plan.pipeline);
      schedule::AdaptiveKfkbInput input{.ranks = c.plan.pipeline,
                                        .micro_batches = static_cast<int>(c.plan.num_micro_batches()),
                                        .costs = costs,
                                        .memory_per_micro_batch = activations / in_flight,
                                        // (a hair of slack: 1F1B itself fits, rounding aside)
                                        .memory_limit = result.memory_limit * (1 + 1e-9) -
                                                        (c.memory_per_rank - activations)};
      std::erase_if(input.candidates, [&](int k) { return k > input.micro_batches; });
      schedule::AdaptiveChoice choice;  // k = 1, not simulated, when choose_k finds no k fits
      try {
        choice = schedule::choose_k(input);
      } catch (const ValidationError&) {
      }
      const auto one = std::find_if(choice.candidates.begin(), choice.candidates.end(),
                                    [](const schedule::AdaptiveCandidate& k) { return k.k == 1; });
      const double one_f_one_b =
          after_flush(c.plan, one != choice.candidates.end() && one->fits
                                  ? one->step_time
                                  : schedule::simulate(cost::pipeline_schedule(c.plan), costs).step_time);
      c.plan = retimed(std::move(c.plan), one_f_one_b);
      c.step_time = c.plan.predicted->step_time;
      record(c.step_time);
      if (choice.k == 1) continue;
      plan::Plan grouped = c.plan;
      grouped.schedule = plan::Schedule::KFKB;
      grouped.kfkb_k = choice.k;
      const cost::StageLayoutPrices* layout = nullptr;  // its 1F1B twin's, if searched: its own, else its family's
      if (c.searched_layout) {
        const StageLayoutKey key = stage_layout_key(structure, c.plan);
        const std::optional<StageLayout>* found = nullptr;
        if (auto own = layouts.find(key); own != layouts.end()) {
          found = &own->second;
        } else if (auto family = shared.find(family_of(key)); family != shared.end()) {
          found = family->second;
        }
        if (found != nullptr && *found) layout = &(*found)->prices;
      }
      try {
        const cost::PlanCost cost = cost::evaluate(structure, graph, cluster, grouped, model, {}, layout);
        ++result.evaluated;
        if (!fits(cost)) continue;
        plan::Plan priced = cost::with_prediction(grouped, cost);
        const double step = after_flush(priced, choice.step_time);
        priced = retimed(std::move(priced), step);
        record(priced.predicted->step_time);
        kfkb_plans.push_back({priced, priced.predicted->step_time, cost.memory_per_rank, true, layout != nullptr});
      } catch (const ValidationError&) {
      }
    }
    std::erase_if(fitting, [](const JointCandidate& c) { return !c.fits; });
    fitting.insert(fitting.end(), std::make_move_iterator(kfkb_plans.begin()),
                   std::make_move_iterator(kfkb_plans.end()));
  }
  // Stable: ties keep the enumeration order (smaller t, p, b first).
  std::stable_sort(fitting.begin(), fitting.end(),
                   [](const JointCandidate& a, const JointCandidate& b) { return a.step_time < b.step_time; });
  if (!fitting.empty()) {
    result.plan = fitting.front().plan;
    result.searched_layout = fitting.front().searched_layout;
    result.fits = true;
    fitting.resize(std::min<std::size_t>(fitting.size(), 10));
    result.best = std::move(fitting);
  } else if (std::isfinite(least_memory.memory_per_rank)) {
    result.plan = least_memory.plan;
  } else {
    throw ValidationError("joint planner: no combination of degrees could be evaluated for this graph and cluster");
  }
  // The chosen plan complete, so the runtime searches nothing (stage_layout.h).
  // A pipelined plan whose stages' layout it writes is priced again with that layout
  // (search/plan_price.h): the figure recorded is the one the plan gets read back.
  result.plan = complete_plan(graph, cluster, result.plan, options.level, options.memory_fraction, &model).plan;
  result.search_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (support::log_enabled(support::LogLevel::Info)) {
    const plan::Plan& p = result.plan;
    support::log(support::LogLevel::Info,
                 fmt::format("joint planner ({}): {} combinations, {} stage layouts searched, in {:.2f} s; chose "
                             "t{} p{} d{}, micro-batch {}, {}{}{}{}", thorough ? "thorough" : "fast", result.evaluated,
                             result.stage_layout_searches, result.search_seconds,
                             p.tensor, p.pipeline, p.data, p.micro_batch, plan::schedule_name(p.schedule),
                             p.virtual_stages > 1 ? fmt::format(" (v={})", p.virtual_stages)
                             : p.schedule == plan::Schedule::KFKB ? fmt::format(" (k={})", p.kfkb_k)
                                                                  : std::string(),
                             result.searched_layout ? ", its stages' layout searched" : "",
                             result.fits ? "" : " (fits under none: the one needing the least memory)"));
  }
  return result;
}

}  // namespace shardwise::search
