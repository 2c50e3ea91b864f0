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
#include "ops/distributed_kernels.h"
#include "ops/experts.h"
#include "ops/op_table.h"
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

// Interleaved 1F1B's chunks per rank priced at p stages of `layers`: 2 and 4 (3, 6 and 8 too
// when thorough), every v up to 8 that cuts the layers into p x v equal chunks, as
// Megatron-LM's virtual pipeline does (Llama 3 70B's 80 layers on 8 stages: v = 5, its published
// configuration, which {2, 4} never priced), and a layer a chunk (v = layers / p), the most a
// pipeline can interleave, above 8 too (the 70B's v = 10 with ZeRO-1: 2.7-2.9% faster than
// v = 5; the v in between are not priced, which keeps a 126-layer search's candidates few).
// At least a layer a chunk.
std::vector<int> interleaved_chunks(std::int64_t p, std::int64_t layers, bool thorough) {
  std::vector<int> out = thorough ? std::vector<int>{2, 3, 4, 6, 8} : std::vector<int>{2, 4};
  for (int v = 2; v <= 8; ++v)
    if (layers % (p * v) == 0 && std::ranges::find(out, v) == out.end()) out.push_back(v);
  if (layers % p == 0 && layers / p > 8) out.push_back(static_cast<int>(layers / p));
  std::erase_if(out, [&](int v) { return p * v > layers; });
  std::ranges::sort(out);
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
  // Each rank's chunks at its own share of the slowest device's time (stage_times), as the
  // evaluator prices an uneven pipeline's bubble (cost/pipeline_transfers.h, uneven_bubble_scale).
  const auto& times = plan.predicted->stage_times;
  if (times.size() == static_cast<std::size_t>(plan.pipeline)) {
    const double slowest = std::ranges::max(times);
    schedule::PipelineSchedule placement;  // where each chunk runs: no lists needed
    placement.ranks = plan.pipeline;
    placement.v_shape = plan::v_shaped(plan.schedule);
    for (int g = 0; g < chunks && slowest > 0; ++g) {
      const double share = times[static_cast<std::size_t>(placement.rank_of_stage(g))] / slowest;
      const auto c = static_cast<std::size_t>(g);
      costs.forward[c] *= share, costs.backward[c] *= share;
      if (!costs.weight.empty()) costs.weight[c] *= share;
    }
  }
  costs.boundary_bytes.assign(static_cast<std::size_t>(chunks - 1), b.at("pipeline_transfer"));
  costs.transfer = schedule::periodic_bandwidth(network.durations, network.bandwidth_scale);
  // The gradient synchronisation and optimizer step follow the flush, as the evaluator has
  // them (added by after_flush), not overlapped with the last backwards as the simulator could.
  return costs;
}

// What follows a pipeline's flush as the evaluator has it: the exposed gradient
// synchronisation, the optimizer step, ZeRO's parameter broadcast and the tied weights'
// all-reduce (keys only when > 0).
double after_flush_seconds(const plan::Plan& plan) {
  const auto& b = plan.predicted->breakdown;
  double out = b.at("data_parallel") + b.at("optimizer");
  for (const char* key : {"zero_broadcast", "shared_weight_sync"})
    if (const auto it = b.find(key); it != b.end()) out += it->second;
  return out;
}

// What no schedule shortens: the bottleneck device's compute and tensor-parallel time and
// what follows the flush (a simulated step's floor).
double fixed_seconds(const plan::Plan& plan) {
  const auto& b = plan.predicted->breakdown;
  return b.at("compute") + b.at("tensor_parallel") + after_flush_seconds(plan);
}

// The step of a pipeline the simulator timed: its flush, then what follows it.
double after_flush(const plan::Plan& plan, double pipeline_seconds) {
  return pipeline_seconds + after_flush_seconds(plan);
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
  const int p = plan.pipeline, block = plan.stage_data() * plan.tensor;
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

// The sequence length of the graph's attention when every attention can run as a ring (the
// ring kernel, self-attention, one length: cost/plan_cost.h's context parallelism), else 0.
std::int64_t ring_sequence(const ir::Graph& graph) {
  std::int64_t sequence = 0;
  for (const ir::Node& node : graph.nodes()) {
    if (node.op != "aten::scaled_dot_product_attention") continue;
    const std::int64_t rows = ops::ring_rows(graph, node);
    if (rows == 0 || (sequence != 0 && sequence != rows)) return 0;
    sequence = rows;
  }
  return sequence;
}

// `step` among the ten best steps so far (ascending).
void record_best(std::vector<double>& ten_best, double step) {
  ten_best.insert(std::upper_bound(ten_best.begin(), ten_best.end(), step), step);
  if (ten_best.size() > 10) ten_best.pop_back();
}

void log_choice(const JointPlanResult& result, bool thorough) {
  const plan::Plan& p = result.plan;
  support::log(support::LogLevel::Info,
               fmt::format("joint planner ({}): {} combinations, {} stage layouts searched, in {:.2f} s; chose "
                           "t{} p{} d{}{}, micro-batch {}, {}{}{}{}", thorough ? "thorough" : "fast", result.evaluated,
                           result.stage_layout_searches, result.search_seconds,
                           p.tensor, p.pipeline, p.data, p.context > 1 ? fmt::format(" c{}", p.context) : std::string(),
                           p.micro_batch, plan::schedule_name(p.schedule),
                           p.virtual_stages > 1 ? fmt::format(" (v={})", p.virtual_stages)
                           : p.schedule == plan::Schedule::KFKB ? fmt::format(" (k={})", p.kfkb_k)
                                                                : std::string(),
                           result.searched_layout ? ", its stages' layout searched" : "",
                           result.fits ? "" : " (fits under none: the one needing the least memory)"));
}

// One run of the joint planner: the state its passes share, each pass a method, run in the
// order plan_joint states.
class JointPlanner {
 public:
  JointPlanner(const ir::Graph& graph, const cost::Cluster& cluster, const cost::CostModel& model,
               const JointPlanOptions& options)
      : graph_(graph),
        cluster_(cluster),
        model_(model),
        options_(options),
        // The graph's layers and tensor-parallel groups, found once for every candidate.
        structure_(cost::find_layer_structure(graph)),
        // A heterogeneous cluster: each stage priced on its own devices and against their
        // memory (plan_cost.h), its layers sized to their speed (layer_balance.h's device_scale).
        mixed_(cluster.device_types().size() > 1),
        thorough_(options.level == SearchLevel::Thorough) {
    if (!structure_.layers)
      throw ValidationError("joint planner: the graph has no repeated layers to cut into pipeline stages");
    layers_ = static_cast<std::int64_t>(structure_.num_layers());
    // A graph that couples its batch's rows keeps them in one micro-batch (micro_batch_check.h).
    one_micro_batch_ = options.micro_batch_semantics == plan::MicroBatchSemantics::Exact &&
                       analysis::batch_coupling(ops::OpTable::builtin(), graph).coupled();
    for (const cost::Node& node : cluster.nodes()) per_node_ = std::max(per_node_, node.device_count());
    if (options.context_parallel) ring_sequence_ = ring_sequence(graph);
    if (options.expert_parallel)
      for (const ir::Node& node : graph.nodes())
        if (const std::int64_t e = ops::expert_count(graph, node); e > 0) expert_counts_.push_back(e);
    // (mixed: the smallest device's, for what has no stage to hold it against: kFkB's groups)
    double capacity = std::numeric_limits<double>::infinity();
    for (const cost::DeviceType& type : cluster.device_types())
      capacity = std::min(capacity, static_cast<double>(type.memory_bytes));
    result_.memory_limit = capacity * options.memory_fraction;
    least_memory_.memory_per_rank = std::numeric_limits<double>::infinity();
  }

  // Every combination of degrees priced under Megatron's layout: without ZeRO, then with it
  // where asked: every combination (thorough, or when nothing fits without), else each one
  // that did not fit without it. ZeRO-1 shards the optimizer state and adds the owners'
  // broadcast: it can only pay where the combination needs the memory (a plan without
  // recomputation that fits only so: Llama 3 8B on 8 H100s, t 1 p 2 d 4).
  void price_the_space() {
    enumerate(false);
    const std::vector<bool> fitted = price_space();
    if (!options_.allow_zero) return;
    std::vector<plan::Plan> space;
    if (thorough_ || fitting_.empty()) {
      space_.clear();
      enumerate(true);
      space = std::move(space_);
    } else {
      for (std::size_t i = 0; i < space_.size(); ++i) {
        const plan::Plan& p = space_[i];
        if (fitted[i] || p.data * p.context <= 1 || !p.stage_meshes.empty()) continue;
        space.push_back(p);
        space.back().zero_stage = 1;
      }
    }
    space_ = std::move(space);
    price_space();
  }
  void reprice_with_stage_layouts();
  void time_on_the_network();
  void search() {
    price_the_space();
    reprice_with_stage_layouts();
    time_on_the_network();
  }
  // The fastest fitting candidate, or fitting none the one needing the least memory (nullptr:
  // none could be priced).
  const JointCandidate* best();
  JointPlanResult choose(std::chrono::steady_clock::time_point start,
                         const std::optional<JointCandidate>& without_context);

 private:
  void enumerate(bool with_zero);
  void enumerate_uniform(std::int64_t t, bool with_zero);
  void enumerate_degrees(std::int64_t t, std::int64_t p, std::int64_t d, std::int64_t c, bool with_zero);
  void enumerate_stage_meshes(std::int64_t t);
  plan::Plan candidate_of(std::int64_t micro_batch, plan::Schedule schedule, plan::Recompute recompute) const;
  bool fits(const cost::PlanCost& cost) const {  // homogeneous: one capacity; mixed: each stage its own
    return mixed_ ? cost.memory_use <= options_.memory_fraction : cost.memory_per_rank <= result_.memory_limit;
  }
  // Whether the candidate's stages, laid out over their d x t ranks as completion searches
  // them (complete_stage_sharding), could fit where Megatron's layout does not: no layout of
  // d x t ranks holds less than 1/(d t) of the replicated stage, nor Megatron's more.
  bool may_fit_completed(const plan::Plan& candidate, const cost::PlanCost& cost) const {
    if (mixed_ || candidate.pipeline == 1 || candidate.context > 1 || !candidate.stage_meshes.empty()) return false;
    return cost.memory_per_rank <= candidate.stage_data() * candidate.tensor * result_.memory_limit;
  }
  void complete_the_best();
  std::optional<cost::PlanCost> price(const plan::Plan& candidate);
  void price_balanced(const plan::Plan& candidate);
  std::vector<bool> price_space();
  static StageLayoutKey family_of(const StageLayoutKey& key);
  const std::optional<StageLayout>* search_layout(const StageLayoutKey& key, const plan::Plan& plan);
  void reprice(std::size_t i);
  const cost::StageLayoutPrices* searched_prices(const plan::Plan& plan) const;
  void group_into_kfkb(JointCandidate& c, const schedule::SimulationCosts& costs, std::vector<double>& ten_best,
                       std::vector<JointCandidate>& kfkb_plans);
  void explain_splits(const JointCandidate& chosen, const std::optional<JointCandidate>& without_context);

  const ir::Graph& graph_;
  const cost::Cluster& cluster_;
  const cost::CostModel& model_;
  const JointPlanOptions& options_;
  const cost::LayerStructure structure_;
  const bool mixed_;
  const bool thorough_;
  std::int64_t layers_ = 0;
  bool one_micro_batch_ = false;
  int per_node_ = 0;
  // The sequence every attention runs as a ring over (ring_sequence): 0 = no context
  // parallelism (no attention, one without a ring kernel, or options.context_parallel off).
  std::int64_t ring_sequence_ = 0;
  // The expert count of each mixture of experts' experts op: a candidate splits them over its
  // stages' data ranks (plan.expert) where that many divide every one.
  std::vector<std::int64_t> expert_counts_;
  JointPlanResult result_;
  std::vector<plan::Plan> space_;
  std::vector<JointCandidate> fitting_;
  // Plans within 1.5 x the memory under Megatron's layout: their searched layout may fit
  // (sequence parallelism saves activations: GPT 8 x 2048 at t 8, 1.54 GB against 1.10 GB);
  // the stage layouts' pass takes them.
  std::vector<JointCandidate> near_fitting_;
  std::vector<JointCandidate> fits_only_completed_;  // may_fit_completed, beyond near_fitting_
  JointCandidate least_memory_;
  std::map<StageLayoutKey, std::optional<StageLayout>> layouts_;
  // A layout found for one plan serves every plan with its (t, micro-batch, recomputation or
  // none): the memory shares and the kind of recomputation only matter where memory binds (a
  // layout's prices are the same under both: cost::PartPrice), so a plan that does not fit
  // under another plan's layout gets a search of its own. Keyed by that family (shares -1).
  std::map<StageLayoutKey, const std::optional<StageLayout>*> shared_;
};

void JointPlanner::enumerate(bool with_zero) {
  const int world = cluster_.world_size();
  for (std::int64_t t : divisors(world)) {
    // A tensor group lives inside one node: t divides the node's devices, so every group of
    // t consecutive ranks stays on NVLink (the cost model prices the group of ranks 0..t-1;
    // with t = 6 on 8-GPU nodes, half the groups would cross the network at 11x the cost).
    if (t > per_node_ || per_node_ % t != 0) continue;
    // Each rank of a tensor group holds whole heads (Megatron-LM asserts the same).
    if (structure_.attention_heads > 0 && structure_.attention_heads % t != 0) continue;
    enumerate_uniform(t, with_zero);
    if (!with_zero) enumerate_stage_meshes(t);
  }
}

void JointPlanner::enumerate_uniform(std::int64_t t, bool with_zero) {
  const int world = cluster_.world_size();
  for (std::int64_t p : divisors(world / t)) {
    if (p > layers_) continue;
    const std::int64_t n = world / (t * p);
    if (options_.global_batch % n == 0) enumerate_degrees(t, p, n, 1, with_zero);
    // The same ranks splitting each row's sequence instead (plan.h's context: data 1 beside it).
    if (n > 1 && ring_sequence_ > 0 && ring_sequence_ % n == 0) enumerate_degrees(t, p, 1, n, with_zero);
  }
}

void JointPlanner::enumerate_degrees(std::int64_t t, std::int64_t p, std::int64_t d, std::int64_t c,
                                     bool with_zero) {
  for (std::int64_t b : divisors(options_.global_batch / d)) {
    if (one_micro_batch_ ? b * d != options_.global_batch
                         : (thorough_ ? b > options_.max_micro_batch : (b != 1 && b != 2 && b != 4)))
      continue;
    const std::int64_t m = options_.global_batch / (d * b);
    std::vector<std::pair<plan::Schedule, int>> schedules = {{plan::Schedule::OneFOneB, 1}};
    if (p > 1 && m % p == 0) {
      for (int v : interleaved_chunks(p, layers_, thorough_)) schedules.emplace_back(plan::Schedule::Interleaved1F1B, v);
    }
    // ZB-H1, ZB-V and DualPipeV without recomputation only: the runtime does not split a recomputed
    // block's backward (plan.h), so where memory needs recomputation they are no candidates.
    if (p > 1) schedules.emplace_back(plan::Schedule::ZeroBubbleH1, 1);
    if (p > 1 && 2 * p <= layers_) schedules.emplace_back(plan::Schedule::ZeroBubbleV, 2);
    // DualPipeV: ZB-V's price (it reaches ZB-V's bound), one chunk more held; at least
    // a micro-batch per stage.
    if (p > 1 && 2 * p <= layers_ && m >= 2 * p) schedules.emplace_back(plan::Schedule::DualPipeV, 2);
    for (const auto& [schedule, v] : schedules)
      for (plan::Recompute recompute : kRecomputeChoices)
        for (int zero : with_zero ? std::vector<int>{1} : std::vector<int>{0}) {
          if (plan::splits_backward(schedule) && recompute != plan::Recompute::None) continue;
          if (zero == 1 && d * c == 1) continue;  // nothing to shard it over
          plan::Plan candidate = candidate_of(b, schedule, recompute);
          candidate.data = static_cast<int>(d);
          candidate.context = static_cast<int>(c);
          candidate.tensor = static_cast<int>(t);
          candidate.pipeline = static_cast<int>(p);
          candidate.virtual_stages = v;
          candidate.zero_stage = d * c > 1 ? zero : 0;
          // The same plan with its experts split over each stage's data ranks (plan.expert).
          const std::int64_t n = d * c;
          const bool experts_split =
              n > 1 && !expert_counts_.empty() &&
              std::all_of(expert_counts_.begin(), expert_counts_.end(), [&](std::int64_t e) { return e % n == 0; });
          if (experts_split) {
            plan::Plan split = candidate;
            split.expert = static_cast<int>(n);
            space_.push_back(std::move(split));
          }
          space_.push_back(std::move(candidate));
        }
  }
}

// A candidate of the search's batch in micro-batches of `micro_batch` rows, run by `schedule`
// with `recompute`, in the options' run settings and expert split: what every candidate
// shares; the caller sets its degrees.
plan::Plan JointPlanner::candidate_of(std::int64_t micro_batch, plan::Schedule schedule,
                                      plan::Recompute recompute) const {
  plan::Plan candidate;
  static_cast<plan::RunSettings&>(candidate) = options_;
  candidate.global_batch = options_.global_batch;
  candidate.micro_batch = micro_batch;
  candidate.schedule = schedule;
  candidate.recompute = recompute;
  candidate.split_experts = options_.expert_parallel;
  return candidate;
}

// Two stages on sub-meshes of their own widths (plan.stage_meshes, Alpa's inter-op stages): a
// data widths a and n - a (n = world / t), a != n - a, each splitting a micro-batch of rows a
// multiple of both. Small jobs only (n <= 16): where a stage of one more or one fewer data
// rank is a real step, not noise.
void JointPlanner::enumerate_stage_meshes(std::int64_t t) {
  const std::int64_t n = cluster_.world_size() / t;
  if (n < 3 || n > 16 || layers_ < 2) return;
  for (std::int64_t a = 1; a < n; ++a) {
    if (2 * a == n) continue;  // the plain plan
    const std::int64_t unit = std::lcm(a, n - a);
    for (std::int64_t k : {1, 2, 4}) {
      const std::int64_t rows = unit * k;
      if (options_.global_batch % rows != 0) continue;
      if (one_micro_batch_ ? rows != options_.global_batch
                           : rows / std::max(a, n - a) > (thorough_ ? options_.max_micro_batch : 4))
        continue;
      for (plan::Schedule schedule : {plan::Schedule::OneFOneB, plan::Schedule::ZeroBubbleH1})
        for (plan::Recompute recompute : kRecomputeChoices) {
          if (plan::splits_backward(schedule) && recompute != plan::Recompute::None) continue;
          plan::Plan candidate = candidate_of(rows, schedule, recompute);
          candidate.pipeline = 2;
          candidate.stage_meshes = {{static_cast<int>(a), static_cast<int>(t)},
                                    {static_cast<int>(n - a), static_cast<int>(t)}};
          space_.push_back(std::move(candidate));
        }
    }
  }
}

std::optional<cost::PlanCost> JointPlanner::price(const plan::Plan& candidate) {
  try {
    cost::PlanCost cost = cost::evaluate(structure_, graph_, cluster_, candidate, model_);
    ++result_.evaluated;
    JointCandidate c{cost::with_prediction(candidate, cost), cost.step_time, cost.memory_per_rank, fits(cost)};
    if (c.fits) {
      fitting_.push_back(std::move(c));
      return cost;
    }
    if (options_.stage_layouts && (mixed_ ? cost.memory_use <= 1.5 * options_.memory_fraction
                                          : c.memory_per_rank <= 1.5 * result_.memory_limit))
      near_fitting_.push_back(c);
    else if (may_fit_completed(candidate, cost))
      fits_only_completed_.push_back(c);
    if (c.memory_per_rank < least_memory_.memory_per_rank) least_memory_ = std::move(c);
    return cost;
  } catch (const ValidationError&) {
    return std::nullopt;  // a combination the evaluator rejects (layers the stages cannot split)
  }
}

// The plan, and the same plan with its layers split by time rather than count
// (layer_balance.h): the last stage's LM head or the first stage's embedding take a share of
// its layers; on a mixed cluster the faster stages take more. (ZB-V's V puts the LM head
// beside the embedding, on the first device.)
void JointPlanner::price_balanced(const plan::Plan& candidate) {
  std::optional<cost::PlanCost> even = price(candidate);
  if (!even || candidate.pipeline == 1) return;
  const bool v_shape = plan::v_shaped(candidate.schedule);
  std::vector<int> balanced = cost::balance_layers({.layers = static_cast<int>(layers_),
                                                    .pipeline = candidate.pipeline,
                                                    .virtual_stages = candidate.virtual_stages,
                                                    .layer = even->layer_time,
                                                    .first = even->first_stage_extra,
                                                    .last = even->last_stage_extra,
                                                    .v_shape = v_shape,
                                                    .device_scale = even->stage_scale});
  const int p = candidate.pipeline;
  if (balanced.empty() ||
      cost::layers_per_device(balanced, p, v_shape) ==
          cost::layers_per_device(cost::even_layers(static_cast<int>(layers_), p * candidate.virtual_stages), p,
                                  v_shape))
    return;
  plan::Plan uneven = candidate;
  uneven.layers_per_stage = std::move(balanced);
  price(uneven);
}

// Prices every combination of space_; returns, for each, whether any of its variants (its
// layers balanced by time, its stage orders) fit.
std::vector<bool> JointPlanner::price_space() {
  if (support::log_enabled(support::LogLevel::Info))
    support::log(support::LogLevel::Info, fmt::format("joint planner ({}): pricing {} combinations",
                                                      thorough_ ? "thorough" : "fast", space_.size()));
  std::vector<bool> fitted(space_.size(), false);
  for (std::size_t i = 0; i < space_.size(); ++i) {
    if (options_.progress && i % 64 == 0) options_.progress(static_cast<int>(i), static_cast<int>(space_.size()));
    const std::size_t fitting_before = fitting_.size();
    price_balanced(space_[i]);
    if (mixed_ && space_[i].pipeline > 1 && space_[i].stage_meshes.empty()) {
      // Which stage runs on which block of ranks (plan.stage_groups): every order of the
      // blocks' device kinds (the first stage holds the most micro-batches, the last the LM
      // head), each kind's blocks in rank order.
      for (const std::vector<int>& order : stage_orders(cluster_, space_[i])) {
        plan::Plan ordered = space_[i];
        ordered.stage_groups = order;
        price_balanced(ordered);
      }
    }
    fitted[i] = fitting_.size() > fitting_before;
  }
  // The pass is done: a progress bar ends full (a second, finer pass starts its own count).
  if (options_.progress) options_.progress(static_cast<int>(space_.size()), static_cast<int>(space_.size()));
  return fitted;
}

StageLayoutKey JointPlanner::family_of(const StageLayoutKey& key) {
  const int recomputed = std::get<2>(key) == static_cast<int>(plan::Recompute::None)
                             ? static_cast<int>(plan::Recompute::None)
                             : static_cast<int>(plan::Recompute::Full);
  return StageLayoutKey{std::get<0>(key), std::get<1>(key), recomputed, -1, -1};
}

// The stage layout of `key`: found before, or searched now within the budget (nullptr
// beyond it). One search per StageLayoutKey.
const std::optional<StageLayout>* JointPlanner::search_layout(const StageLayoutKey& key, const plan::Plan& plan) {
  if (auto found = layouts_.find(key); found != layouts_.end()) return &found->second;
  if (static_cast<int>(layouts_.size()) >= (thorough_ ? 48 : 12)) return nullptr;
  ++result_.stage_layout_searches;
  const auto* layout = &layouts_.emplace(key, search_stage_layout(graph_, structure_, cluster_, model_, plan,
                                                                  {options_.level, options_.memory_fraction}))
                            .first->second;
  shared_.emplace(family_of(key), layout);
  return layout;
}

// Candidate i priced again under its stages' searched layout: its family's where that fits,
// else its own.
void JointPlanner::reprice(std::size_t i) {
  JointCandidate& c = fitting_[i];
  if (c.plan.tensor == 1) return;  // nothing to lay out: Megatron's prices are the graph's
  // A stage layout is searched at whole rows on {1, t}: a context-parallel plan keeps the
  // evaluator's ring prices (the runtime's layout of {c, t} is the SPMD search's ring).
  if (c.plan.context > 1) return;
  const StageLayoutKey key = stage_layout_key(structure_, c.plan);
  auto priced = [&](const std::optional<StageLayout>* layout) -> std::optional<JointCandidate> {
    if (layout == nullptr || !*layout) return std::nullopt;
    plan::Plan plain = c.plan;
    plain.predicted.reset();
    try {
      const cost::PlanCost cost = cost::evaluate(structure_, graph_, cluster_, plain, model_, {}, &(*layout)->prices);
      ++result_.evaluated;
      return JointCandidate{cost::with_prediction(std::move(plain), cost), cost.step_time, cost.memory_per_rank,
                            fits(cost), true};
    } catch (const ValidationError&) {
      return std::nullopt;
    }
  };
  const auto family_layout = shared_.find(family_of(key));
  const bool own = layouts_.contains(key) || family_layout == shared_.end();
  std::optional<JointCandidate> found = priced(own ? search_layout(key, c.plan) : family_layout->second);
  if (!own && (!found || !found->fits)) found = priced(search_layout(key, c.plan));
  if (found) c = std::move(*found);
}

// The candidates priced again with the layout the SPMD search finds for their stages' t ranks
// (stage_layout.h), the layout parallelize() runs, instead of Megatron's. Lazily: the best not
// yet re-priced is re-priced until the ten best all are (or the searches run out), with the
// best of every tensor degree first, so a degree Megatron's layout prices badly (a graph it
// cannot split) has its chance.
void JointPlanner::reprice_with_stage_layouts() {
  if (!options_.stage_layouts) return;
  fitting_.insert(fitting_.end(), std::make_move_iterator(near_fitting_.begin()),
                  std::make_move_iterator(near_fitting_.end()));
  std::vector<bool> checked(fitting_.size(), false);
  auto by_step = [&](std::size_t a, std::size_t b) { return fitting_[a].step_time < fitting_[b].step_time; };
  std::vector<std::size_t> order(fitting_.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), by_step);
  std::map<int, std::size_t> best_of_degree;
  for (std::size_t i : order)
    if (fitting_[i].fits) best_of_degree.emplace(fitting_[i].plan.tensor, i);
  for (const auto& [t, i] : best_of_degree) {
    checked[i] = true;
    reprice(i);
  }
  for (;;) {
    // The best not yet re-priced, fitting or near it, ahead of the tenth best re-priced one.
    std::stable_sort(order.begin(), order.end(), by_step);
    std::size_t seen = 0, next = order.size();
    for (std::size_t i : order) {
      if (!checked[i]) {
        next = i;
        break;
      }
      if (fitting_[i].fits && ++seen == 10) break;
    }
    if (next == order.size()) break;
    checked[next] = true;
    reprice(next);
  }
  std::erase_if(fitting_, [](const JointCandidate& c) { return !c.fits; });
}

// The searched stage layout's prices of `plan`'s family, where one was searched: its own,
// else its family's.
const cost::StageLayoutPrices* JointPlanner::searched_prices(const plan::Plan& plan) const {
  if (plan.context > 1) return nullptr;  // (reprice: not searched at a sequence block)
  const StageLayoutKey key = stage_layout_key(structure_, plan);
  const std::optional<StageLayout>* found = nullptr;
  if (auto own = layouts_.find(key); own != layouts_.end()) {
    found = &own->second;
  } else if (auto family = shared_.find(family_of(key)); family != shared_.end()) {
    found = family->second;
  }
  return found != nullptr && *found ? &(*found)->prices : nullptr;
}

// Every pipelined plan timed on the varying network; 1F1B plans also as kFkB with the adaptive
// k (the header says how). A simulated step is never shorter than the plan's compute,
// tensor-parallel, gradient and optimizer parts, so a plan whose parts alone reach the tenth
// best step so far cannot enter the ten best: it is dropped unsimulated (in the evaluator's
// order, the best come first).
void JointPlanner::time_on_the_network() {
  if (!options_.network) return;
  std::stable_sort(fitting_.begin(), fitting_.end(),
                   [](const JointCandidate& a, const JointCandidate& b) { return a.step_time < b.step_time; });
  std::vector<double> ten_best;  // ascending
  for (const JointCandidate& c : fitting_)
    if (c.plan.pipeline == 1) record_best(ten_best, c.step_time);
  std::vector<JointCandidate> kfkb_plans;
  for (JointCandidate& c : fitting_) {
    if (c.plan.pipeline == 1) continue;
    if (ten_best.size() == 10 && fixed_seconds(c.plan) >= ten_best.back()) {
      c.fits = false;  // dropped below
      continue;
    }
    const schedule::SimulationCosts costs = simulation_costs(c.plan, *options_.network);
    if (c.plan.schedule != plan::Schedule::OneFOneB) {
      const double step = after_flush(c.plan, schedule::simulate(cost::pipeline_schedule(c.plan), costs).step_time);
      c.plan = retimed(std::move(c.plan), step);
      c.step_time = c.plan.predicted->step_time;
      record_best(ten_best, c.step_time);
      continue;
    }
    group_into_kfkb(c, costs, ten_best, kfkb_plans);
  }
  std::erase_if(fitting_, [](const JointCandidate& c) { return !c.fits; });
  fitting_.insert(fitting_.end(), std::make_move_iterator(kfkb_plans.begin()),
                  std::make_move_iterator(kfkb_plans.end()));
}

// A 1F1B candidate timed on the network, and its kFkB twin with the adaptive k where a k > 1
// fits and is faster (added to `kfkb_plans`).
void JointPlanner::group_into_kfkb(JointCandidate& c, const schedule::SimulationCosts& costs,
                                   std::vector<double>& ten_best, std::vector<JointCandidate>& kfkb_plans) {
  const double activations = c.plan.predicted->memory_breakdown.at("activations");
  const double in_flight = std::min<double>(static_cast<double>(c.plan.num_micro_batches()), c.plan.pipeline);
  schedule::AdaptiveKfkbInput input{.ranks = c.plan.pipeline,
                                    .micro_batches = static_cast<int>(c.plan.num_micro_batches()),
                                    .costs = costs,
                                    .memory_per_micro_batch = activations / in_flight,
                                    // (a hair of slack: 1F1B itself fits, rounding aside)
                                    .memory_limit = result_.memory_limit * (1 + 1e-9) -
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
  record_best(ten_best, c.step_time);
  if (choice.k == 1) return;
  plan::Plan grouped = c.plan;
  grouped.schedule = plan::Schedule::KFKB;
  grouped.kfkb_k = choice.k;
  // Its 1F1B twin's stage layout, if searched: its own, else its family's.
  const cost::StageLayoutPrices* layout = c.searched_layout ? searched_prices(c.plan) : nullptr;
  try {
    const cost::PlanCost cost = cost::evaluate(structure_, graph_, cluster_, grouped, model_, {}, layout);
    ++result_.evaluated;
    if (!fits(cost)) return;
    plan::Plan priced = cost::with_prediction(grouped, cost);
    const double step = after_flush(priced, choice.step_time);
    priced = retimed(std::move(priced), step);
    record_best(ten_best, priced.predicted->step_time);
    kfkb_plans.push_back({priced, priced.predicted->step_time, cost.memory_per_rank, true, layout != nullptr});
  } catch (const ValidationError&) {
  }
}

const JointCandidate* JointPlanner::best() {
  // Stable: ties keep the enumeration order (smaller t, p, b first).
  std::stable_sort(fitting_.begin(), fitting_.end(),
                   [](const JointCandidate& a, const JointCandidate& b) { return a.step_time < b.step_time; });
  if (!fitting_.empty()) return &fitting_.front();
  return std::isfinite(least_memory_.memory_per_rank) ? &least_memory_ : nullptr;
}

constexpr std::size_t kCompletedFitting = 3;
// Four (two until 2026-12-05): with ZeRO-1's twins priced by the fast search, Llama 3 70B at
// batch 128 on 64 H100s has t4 p8 d2 v5 with ZeRO-1 (the published layout; 71.0 GB completed)
// among the four, not the two, that may fit only completed with the least memory.
constexpr std::size_t kCompletedBeyond = 4;
// How much faster than Megatron's layout prices it a completed plan may be: completion
// brought Llama 3 70B's t4 p8 d2 v5 from 12.9 s to 12.3 s (1.05x; sequence parallelism's
// elementwise ops split t ways). One observation, not a bound.
constexpr double kCompletedGain = 1.1;

// The best few candidates completed as the runtime runs them (complete_plan: the stage's
// {d, t} layout searched beside the {1, t} one they were priced with, the better kept) and
// priced so: the kCompletedFitting fastest fitting ones, and kCompletedBeyond of those that
// may fit only under such a layout (may_fit_completed). Llama 3 70B's t4 p8 d2 v5 on 64 H100s is
// 130.8 GB under Megatron's layout, 91.9 GB under its {1, t} one, 77.9 GB completed.
void JointPlanner::complete_the_best() {
  if (mixed_ || options_.network) return;
  best();  // sorts fitting_
  // A candidate priced as completed (the price the plan gets read back with), or unchanged
  // where completion lays out nothing.
  auto completed = [&](JointCandidate& c) {
    if (c.plan.pipeline == 1 || c.plan.context > 1) return;
    try {
      plan::Plan done = complete_plan(graph_, cluster_, c.plan, options_.level, options_.memory_fraction, &model_).plan;
      if (!done.stage_sharding || !done.predicted) return;
      const double step = done.predicted->step_time, memory = done.predicted->memory_per_rank;
      c = {std::move(done), step, memory, memory <= result_.memory_limit, true};
    } catch (const ValidationError&) {
    }
  };
  for (std::size_t i = 0; i < std::min(kCompletedFitting, fitting_.size()); ++i) completed(fitting_[i]);
  // Beyond: those Megatron's layout prices within kCompletedGain of the best fitting step,
  // the least memory first.
  double best_step = std::numeric_limits<double>::infinity();
  for (const JointCandidate& c : fitting_)
    if (c.fits) best_step = std::min(best_step, c.step_time);
  std::erase_if(fits_only_completed_,
                [&](const JointCandidate& c) { return c.step_time > kCompletedGain * best_step; });
  std::stable_sort(fits_only_completed_.begin(), fits_only_completed_.end(),
                   [](const JointCandidate& a, const JointCandidate& b) {
                     return a.memory_per_rank < b.memory_per_rank;
                   });
  for (std::size_t i = 0; i < std::min(kCompletedBeyond, fits_only_completed_.size()); ++i) {
    completed(fits_only_completed_[i]);
    fitting_.push_back(std::move(fits_only_completed_[i]));
  }
  std::erase_if(fitting_, [](const JointCandidate& c) { return !c.fits; });
}

// The fastest fitting candidate (or, fitting none, the one needing the least memory), with
// the reasons for its splits, made complete so the runtime searches nothing (stage_layout.h):
// a pipelined plan whose stages' layout it writes is priced again with that layout
// (search/plan_price.h), so the figure recorded is the one the plan gets read back.
JointPlanResult JointPlanner::choose(std::chrono::steady_clock::time_point start,
                                     const std::optional<JointCandidate>& without_context) {
  complete_the_best();
  if (const JointCandidate* chosen = best()) explain_splits(*chosen, without_context);
  if (!fitting_.empty()) {
    result_.plan = fitting_.front().plan;
    result_.searched_layout = fitting_.front().searched_layout;
    result_.fits = true;
    fitting_.resize(std::min<std::size_t>(fitting_.size(), 10));
    result_.best = std::move(fitting_);
  } else if (std::isfinite(least_memory_.memory_per_rank)) {
    result_.plan = least_memory_.plan;
  } else {
    throw ValidationError("joint planner: no combination of degrees could be evaluated for this graph and cluster");
  }
  result_.plan =
      complete_plan(graph_, cluster_, result_.plan, options_.level, options_.memory_fraction, &model_).plan;
  result_.search_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (support::log_enabled(support::LogLevel::Info)) log_choice(result_, thorough_);
  return std::move(result_);
}

// The chosen plan's splits, each beside the plan without it (SplitReason).
void JointPlanner::explain_splits(const JointCandidate& priced, const std::optional<JointCandidate>& without_context) {
  const plan::Plan& chosen = priced.plan;
  if (chosen.context > 1) result_.split_reasons.push_back({"context", priced, without_context});
  const bool may_split_experts = chosen.split_experts && (chosen.expert > 1 || chosen.tensor > 1);
  if (expert_counts_.empty() || !may_split_experts || !chosen.stage_meshes.empty()) return;
  plan::Plan whole = chosen;
  whole.expert = 1;
  whole.split_experts = false;
  whole.predicted.reset();
  try {
    // Priced as the chosen plan was: under its stages' searched layout (searched again with
    // every expert whole; not kept, the layouts' key does not tell the two apart) or under
    // the evaluator's own.
    std::optional<StageLayout> layout;
    if (priced.searched_layout) {
      layout = search_stage_layout(graph_, structure_, cluster_, model_, whole,
                                   {options_.level, options_.memory_fraction});
      ++result_.stage_layout_searches;
      if (!layout) return;  // (no layout found: no reason given)
    }
    const cost::PlanCost kept =
        cost::evaluate(structure_, graph_, cluster_, whole, model_, {}, layout ? &layout->prices : nullptr);
    ++result_.evaluated;
    result_.split_reasons.push_back(
        {"experts", priced,
         JointCandidate{cost::with_prediction(whole, kept), kept.step_time, kept.memory_per_rank, fits(kept),
                        layout.has_value()}});
  } catch (const ValidationError&) {
    // (a plan the evaluator cannot price without the split: no reason given)
  }
}

}  // namespace

JointPlanResult plan_joint(const ir::Graph& graph, const cost::Cluster& cluster, const cost::CostModel& model,
                           const JointPlanOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  if (options.global_batch < 1)
    throw ValidationError(fmt::format("joint planner: global batch {} < 1", options.global_batch));
  if (options.network) check_network(*options.network);
  JointPlanner planner(graph, cluster, model, options);
  planner.search();
  // A plan that splits each row's sequence is chosen over the best plan that does not: the
  // search with context parallelism off (its candidates are cheaper to price: no ring), for
  // the report's reason (SplitReason). That search spends its whole budget on plans without
  // the split and may find a faster one than the first search did (Llama 3 405B at 8,192
  // tokens on 8,192 H100s: 15.2 s against the split's 15.4 s): then that plan is the choice.
  std::optional<JointCandidate> without_context;
  if (const JointCandidate* chosen = planner.best(); chosen != nullptr && chosen->plan.context > 1) {
    JointPlanOptions off = options;
    off.context_parallel = false;
    off.progress = nullptr;
    JointPlanner unsplit(graph, cluster, model, off);
    unsplit.search();
    if (const JointCandidate* found = unsplit.best()) {
      if (found->fits && (!chosen->fits || found->step_time < chosen->step_time)) return unsplit.choose(start, {});
      without_context = *found;
    }
  }
  return planner.choose(start, without_context);
}

}  // namespace shardwise::search
