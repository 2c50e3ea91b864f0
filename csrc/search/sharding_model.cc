#include "search/sharding_model.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <tuple>
#include <utility>

#include "analysis/flops.h"
#include "cost/collective_cost.h"
#include "cost/optimizer_cost.h"
#include "ir/fingerprint.h"
#include "ops/experts.h"
#include "ops/op_table.h"
#include "search/parameter_collectives.h"
#include "search/resharding.h"
#include "support/error.h"

namespace shardwise::search {

namespace {

using support::ValidationError;

bool is_leaf(const ir::Value& value) { return !value.producer.has_value(); }

double divisor(const Placement& placement, int axis_size) { return 1.0 / held_fraction(placement, axis_size); }

}  // namespace

ShardingModel::ShardingModel(const ir::Graph& graph, const cost::Cluster& cluster, const cost::CostModel& model,
                             ShardingModelOptions options)
    : graph_(graph),
      cluster_(cluster),
      model_(model),
      options_(std::move(options)),
      facts_(std::make_shared<const ShardingFacts>(graph, cluster, model, options_)),
      decisions_(graph, options_.mesh) {}

std::vector<int> ShardingModel::axis_ranks(int axis) const { return search::axis_ranks(options_.mesh, axis); }

double ShardingModel::held_fraction_of(ir::ValueId value, int first_axis) const {
  return decisions_.held_except(value, -1, first_axis);
}

double ShardingModel::activation_bytes() const { return memory().activation_bytes(); }

double ShardingModel::backward_working_bytes() const { return memory().backward_working_bytes(); }
double ShardingModel::node_backward_working_bytes(ir::NodeId node) const {
  return memory().node_backward_working_bytes(node);
}

double ShardingModel::parameter_bytes() const { return parameter_bytes_by_kind().total(); }

cost::ModelStateBytes ShardingModel::parameter_bytes_by_kind() const { return memory().parameter_bytes_by_kind(); }

double ShardingModel::gathered_parameter_bytes() const { return memory().gathered_parameter_bytes(); }

double ShardingModel::fp8_cast_bytes() const { return memory().fp8_cast_bytes(); }

double ShardingModel::node_compute(ir::NodeId node, int axis, const Strategy& choice,
                                   const cost::DeviceType& device) const {
  const cost::OpTime time = node_time(node, axis, choice, device);
  return time.forward + time.backward;
}

cost::OpTime ShardingModel::node_time(ir::NodeId node, int axis, const Strategy& choice,
                                      const cost::DeviceType& device) const {
  cost::OpTime time = base_time(node, axis, choice, device);
  time.backward += recompute_seconds(static_cast<std::size_t>(node), time);
  return time;
}

double ShardingModel::recompute_seconds(std::size_t node, const cost::OpTime& time) const {
  const BlockFolding& folding = this->folding();
  if (folding.recompute == plan::Recompute::Selective && folding.runs_again(node) && time.selective_extra >= 0)
    return time.selective_extra;
  return folding.reruns_forward(node) ? time.forward : 0.0;
}

bool ShardingModel::async_input_gradient(ir::NodeId node, int axis, const Strategy& choice,
                                         std::size_t input) const {
  // On any axis, as the decisions stand (the choice on `axis`): the rule the runtime's
  // async-gradient pass follows (EdgePricer::activation_gradient_at, transform/async_gradients.h).
  const EdgePricer pricer = edge_pricer();
  const ir::ValueId x = graph_.node(node).inputs[input];
  for (int b = 0; b < static_cast<int>(options_.mesh.size()); ++b) {
    if (options_.mesh[static_cast<std::size_t>(b)] <= 1) continue;
    const Strategy& s = decisions_.strategy_on(b, node, axis, choice);
    const Placement produced = decisions_.value_placement(b, x);
    if (pricer.activation_gradient_at(b, x, node, static_cast<int>(input), produced, s.inputs[input],
                                      s.input_grads[input]) == ParameterOverlap::BesideBackward)
      return true;
  }
  return false;
}

cost::OpTime ShardingModel::base_time(ir::NodeId node, int axis, const Strategy& choice,
                                      const cost::DeviceType& device) const {
  const ir::Node& n = graph_.node(node);
  cost::NodeContext context;
  context.batch_scale = facts_->batch_scale;
  context.operand_shards.assign(n.inputs.size() + n.outputs.size(), 1.0);
  for (int b = 0; b < static_cast<int>(options_.mesh.size()); ++b) {
    const Strategy& s = decisions_.strategy_on(b, node, axis, choice);
    const int size = options_.mesh[static_cast<std::size_t>(b)];
    for (std::size_t i = 0; i < n.inputs.size(); ++i) context.operand_shards[i] *= divisor(s.inputs[i], size);
    for (std::size_t o = 0; o < n.outputs.size(); ++o)
      context.operand_shards[n.inputs.size() + o] *= divisor(s.outputs[o], size);
    if (s.index >= 0) context.work_shards *= size;
  }
  // A ring's blocks are not the op at the rank's shapes (its rows see every block): the
  // whole node's time divided by the work shards, the slowest rank's share.
  if (options_.compile) {
    context.compiled = &facts_->compiled;
    if (!facts_->fp8_linears.empty())
      if (const auto& linear = facts_->fp8_linears[static_cast<std::size_t>(node)])
        context.async_input_gradient = async_input_gradient(node, axis, choice, linear->input);
  }
  const int ring = ring_axis(node, axis, choice);
  if (model_.wants_local_shapes() && ring < 0) context.local_shapes = local_shapes(node, axis, choice);
  cost::OpTime time = model_.node_time(graph_, n, device, options_.precision, context);
  if (ring >= 0) {
    const double factor = ring_compute_factor(node, ring);
    time.forward *= factor;
    time.backward *= factor;
  }
  return time;
}

int ShardingModel::ring_axis(ir::NodeId node, int axis, const Strategy& choice) const {
  const auto& rule = facts_->rules[static_cast<std::size_t>(node)];
  if (!rule) return -1;
  for (int b = 0; b < static_cast<int>(options_.mesh.size()); ++b) {
    const Strategy& s = decisions_.strategy_on(b, node, axis, choice);
    if (s.index >= 0 && !s.partial && rule->indices.at(static_cast<std::size_t>(s.index)).ring &&
        options_.mesh[static_cast<std::size_t>(b)] > 1)
      return b;
  }
  return -1;
}

double ShardingModel::ring_compute_factor(ir::NodeId node, int ring_axis) const {
  const ir::Attributes& attrs = graph_.node(node).attrs;
  const auto causal = attrs.find("is_causal");
  const bool* is_causal = causal == attrs.end() ? nullptr : std::get_if<bool>(&causal->second);
  if (is_causal == nullptr || !*is_causal) return 1.0;
  const double n = options_.mesh[static_cast<std::size_t>(ring_axis)];
  return (2 * n - 1) / n;
}

ShardingModel::RingHops ShardingModel::ring_hops(ir::NodeId node, int axis, const Strategy& choice) const {
  if (ring_axis(node, axis, choice) != axis) return {};
  const ir::Node& n = graph_.node(node);
  double bytes = 0;
  for (std::size_t i : {std::size_t{1}, std::size_t{2}}) {  // key and value
    double held = 1;
    for (int b = 0; b < static_cast<int>(options_.mesh.size()); ++b)
      held *= held_fraction(decisions_.strategy_on(b, node, axis, choice).inputs.at(i),
                            options_.mesh[static_cast<std::size_t>(b)]);
    bytes += facts_->value_bytes(n.inputs.at(i)) * held;
  }
  // The ring's slowest hop: between the axis' first and last rank, the widest pair it spans.
  const std::vector<int> ranks = axis_ranks(axis);
  const std::vector<int> pair = {ranks.front(), ranks.back()};
  auto hop = [&](double b) {
    return model_.collective_time(cluster_, cost::CollectiveKind::SendRecv, pair, static_cast<std::int64_t>(b),
                                  cost::Algorithm::Auto);
  };
  const double hops = static_cast<double>(ranks.size()) - 1;
  const double forward = node_time(node, axis, choice, *facts_->device).forward;
  return {bytes, std::max(0.0, hops * hop(bytes) - forward) + hops * hop(2 * bytes) + hop(bytes)};
}

ShardingModel::DispatchTraffic ShardingModel::dispatch_traffic(ir::NodeId node, int axis,
                                                              const Strategy& choice) const {
  if (!choice.dispatch || options_.mesh[static_cast<std::size_t>(axis)] <= 1) return {};
  double held = 1;  // of the tokens, on this rank
  for (int b = 0; b < static_cast<int>(options_.mesh.size()); ++b)
    held *= held_fraction(decisions_.strategy_on(b, node, axis, choice).inputs.at(0),
                          options_.mesh[static_cast<std::size_t>(b)]);
  const double bytes = ops::routed_bytes(graph_, graph_.node(node), facts_->batch_scale * held);
  const double one = model_.collective_time(cluster_, cost::CollectiveKind::AllToAll, axis_ranks(axis),
                                            static_cast<std::int64_t>(bytes), cost::Algorithm::Auto);
  return {bytes, 4 * one};
}

std::vector<std::vector<std::int64_t>> ShardingModel::local_shapes(ir::NodeId node, int axis,
                                                                   const Strategy& choice) const {
  const ir::Node& n = graph_.node(node);
  std::vector<std::vector<std::int64_t>> shapes = cost::batch_scaled_shapes(graph_, n, facts_->batch_scale);
  // Each axis' shard of a dim: the largest block (held_fraction, rounded up: rank 0's of
  // an even split, as transform/local_shard.h gives it; the most loaded rank's of an uneven one).
  auto shard = [](std::vector<std::int64_t>& shape, const Placement& p, int size) {
    if (!p.is_shard() || p.dim < 0 || p.dim >= static_cast<int>(shape.size())) return;
    std::int64_t& length = shape[static_cast<std::size_t>(p.dim)];
    const double share = held_fraction(p, size) * static_cast<double>(length);
    length = std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(share - 1e-9)));
  };
  for (int b = 0; b < static_cast<int>(options_.mesh.size()); ++b) {
    const Strategy& s = decisions_.strategy_on(b, node, axis, choice);
    const int size = options_.mesh[static_cast<std::size_t>(b)];
    for (std::size_t i = 0; i < n.inputs.size(); ++i) shard(shapes[i], s.inputs[i], size);
    for (std::size_t o = 0; o < n.outputs.size(); ++o) shard(shapes[n.inputs.size() + o], s.outputs[o], size);
  }
  return shapes;
}

double ShardingModel::balanced_compute_factor(ir::NodeId node, int axis, const Strategy& choice) const {
  const ir::Node& n = graph_.node(node);
  double factor = 1;
  for (int b = 0; b < static_cast<int>(options_.mesh.size()); ++b) {
    if (facts_->axis_balance[static_cast<std::size_t>(b)] >= 1.0) continue;
    const Strategy& s = decisions_.strategy_on(b, node, axis, choice);
    bool batch = false;
    for (std::size_t o = 0; o < n.outputs.size() && !batch; ++o) {
      const ir::TensorType& type = graph_.value(n.outputs[o]).type;
      batch = type.batch_dim && s.outputs[o].is_shard() && s.outputs[o].dim == *type.batch_dim;
    }
    if (batch) factor *= facts_->axis_balance[static_cast<std::size_t>(b)];
  }
  return factor;
}

double ShardingModel::optimizer_seconds(ir::ValueId leaf, int axis, const LeafChoice& choice) const {
  const ir::Value& v = graph_.value(leaf);
  if (v.role != ir::ValueRole::Parameter || !facts_->requires_grad[static_cast<std::size_t>(leaf)]) return 0;
  const double state_held = memory().leaf_held(leaf, axis, choice).state_held;
  return cost::optimizer_step_seconds(model_, static_cast<double>(v.type.numel()) * state_held,
                                      facts_->memory.bytes_per_parameter(), facts_->device->memory_bandwidth,
                                      options_.optimizer_memory_efficiency);
}

double ShardingModel::zero_broadcast_seconds(ir::ValueId leaf, int axis, const LeafChoice& choice) const {
  if (!choice.zero || axis < 0 || options_.mesh[static_cast<std::size_t>(axis)] <= 1) return 0;
  const double bytes = facts_->value_bytes(leaf) * decisions_.held_except(leaf, axis);
  const auto ranks = axis_ranks(axis);
  const double whole =
      model_.collective_time(cluster_, cost::CollectiveKind::Broadcast, ranks, static_cast<std::int64_t>(bytes),
                             cost::Algorithm::Auto);
  if (bytes >= options_.bucket_bytes) return whole;
  // Flattened with the other parameters of its owner (one broadcast per owner): its share of
  // the latency, as a gradient bucket's.
  const double latency =
      model_.collective_time(cluster_, cost::CollectiveKind::Broadcast, ranks, 1, cost::Algorithm::Auto);
  return whole - latency * (1.0 - bytes / options_.bucket_bytes);
}

double ShardingModel::statistics_seconds(int axis, const Strategy& choice) const {
  if (choice.statistics_elements <= 0) return 0;
  const auto ranks = axis_ranks(axis);
  // fp32 statistics, all-reduced in forward and again in backward.
  return 2 * model_.collective_time(cluster_, cost::CollectiveKind::AllReduce, ranks, choice.statistics_elements * 4,
                                    cost::Algorithm::Auto);
}

std::pair<double, bool> ShardingModel::fp8_amax_elements(ir::NodeId node, int axis, const Strategy& choice) const {
  if (facts_->fp8_linears.empty()) return {0, true};
  const ir::Node& n = graph_.node(node);
  const auto& linear = facts_->fp8_linears[static_cast<std::size_t>(node)];
  if (!linear || linear->weight >= choice.inputs.size()) return {0, true};
  const Placement& w = choice.inputs[linear->weight];
  if (!w.is_shard()) return {0, true};
  const bool k_split = w.dim == linear->weight_k_dim;
  // x's rows on this rank: its elements over K, split as the other axes read it.
  double rows = facts_->value_bytes(n.inputs[linear->input]) / facts_->float_bytes / static_cast<double>(linear->k);
  for (std::size_t b = 0; b < options_.mesh.size(); ++b)
    if (static_cast<int>(b) != axis)
      rows *=
          held_fraction(decisions_.nodes[b][static_cast<std::size_t>(node)].inputs[linear->input], options_.mesh[b]);
  // W's rows (N of them, whole where K is split) in forward, its columns (K, whole where N is) in backward.
  return {rows + static_cast<double>(k_split ? linear->n : linear->k), k_split};
}

double ShardingModel::fp8_amax_seconds(int axis, double elements) const {
  if (elements <= 0) return 0;
  return model_.collective_time(cluster_, cost::CollectiveKind::AllReduce, axis_ranks(axis),
                                static_cast<std::int64_t>(std::llround(elements * 4)), cost::Algorithm::Auto);
}

// Readers of one value that want it the same way share one resharding (tally(), as the
// runtime runs it: q, k and v read one gathered norm output). A pair cost cannot see that:
// priced per reader edge, Megatron's column-parallel k and v would each pay the gather q
// pays already. So the readers of a value (not a parameter, whose collectives are its
// own) that are two or more edges of the same count meet at a choice node of their own, a
// hub: its choice is the produced placement and the one resharding the readers share (or
// none); the producer -> hub edge holds the two placements equal and prices the shared
// resharding once; a reader that wants the shared placement pays nothing more, any other
// its own resharding from the produced placement (what the runtime runs). Never below
// tally()'s price; equal unless two readers share a resharding other than the hub's.
struct ShardingModel::Hub {
  ir::ValueId value = -1;
  double count = 0;
  std::vector<EdgeKey> readers;  // in ShardingFacts::edges order
  std::vector<Placement> produced;                             // per hub choice
  std::vector<std::optional<std::pair<Placement, Placement>>> shared;  // per hub choice: (wanted, gradient)
  std::vector<int> first_reader;  // per hub choice: the reader edge whose consumer prices the shared resharding
  std::vector<double> seconds;    // per hub choice: the shared resharding's (count x edge_seconds)
  int id = -1;                    // problem node
};

// solve_axis' state for one axis: the choices of every representative node and leaf, the
// hubs where readers share a resharding, and the problem made of them.
struct ShardingModel::AxisProblem : AxisChoices {
  AxisProblem(int axis, double parameter_weight, AxisChoices choices)
      : AxisChoices(std::move(choices)),
        axis(axis),
        parameter_weight(parameter_weight),
        node_id(strategies.size(), -1),
        leaf_id(leaf_choices.size(), -1) {}

  // The placements the producer of `key` may give `value`, one per producer choice.
  std::vector<Placement> produced_by(const EdgeKey& key, const ir::Value& value) const {
    std::vector<Placement> produced;
    if (key.producer_is_leaf) {
      for (const LeafChoice& c : leaf_choices[static_cast<std::size_t>(key.producer)]) produced.push_back(c.placement);
    } else {
      for (const Strategy& s : strategies[static_cast<std::size_t>(key.producer)])
        produced.push_back(s.outputs[static_cast<std::size_t>(value.output_index)]);
    }
    return produced;
  }
  int producer_id(const EdgeKey& key) const {
    return key.producer_is_leaf ? leaf_id[static_cast<std::size_t>(key.producer)]
                                : node_id[static_cast<std::size_t>(key.producer)];
  }
  // The edge between problem nodes a and b (made, zero, on first use), and whether its cost
  // matrix is indexed [b][a] (a > b) rather than [a][b].
  std::pair<ChoiceEdge*, bool> edge_between(int a, int b) {
    const bool flip = a > b;
    const std::pair<int, int> pair = flip ? std::make_pair(b, a) : std::make_pair(a, b);
    auto [it, added] = edge_at.emplace(pair, problem.edges.size());
    if (added) {
      ChoiceEdge e;
      e.a = pair.first;
      e.b = pair.second;
      e.cost.assign(problem.nodes[static_cast<std::size_t>(e.a)].cost.size() *
                        problem.nodes[static_cast<std::size_t>(e.b)].cost.size(),
                    0.0);
      problem.edges.push_back(std::move(e));
    }
    return {&problem.edges[it->second], flip};
  }
  // The hubs of `producer`'s values, as problem nodes right after it in the sweep order.
  void push_hubs(int producer, bool is_leaf, const ir::Graph& graph) {
    const auto it = hubs_after.find({producer, is_leaf});
    if (it == hubs_after.end()) return;
    for (std::size_t h : it->second) {
      ChoiceNode c;
      c.name = "shared " + graph.value(hubs[h].value).name;
      c.cost.assign(hubs[h].produced.size(), 0.0);
      c.memory.assign(hubs[h].produced.size(), 0.0);
      hubs[h].id = static_cast<int>(problem.nodes.size());
      problem.nodes.push_back(std::move(c));
    }
  }

  const int axis;
  const double parameter_weight;
  std::vector<Hub> hubs;
  std::set<EdgeKey> via_hub;  // reader edges priced through a hub
  std::map<std::pair<int, bool>, std::vector<std::size_t>> hubs_after;  // by producer
  SpmdProblem problem;
  std::vector<int> node_id, leaf_id;  // problem node of each representative node and leaf
  std::map<std::pair<int, int>, std::size_t> edge_at;
};

void ShardingModel::solve_axis(int axis, bool thorough, double memory_scale, double parameter_weight, bool seeds_only) {
  if (options_.mesh[static_cast<std::size_t>(axis)] <= 1) return;
  AxisProblem ap(axis, parameter_weight, strategy_enumerator().axis_choices(axis));
  if (options_.shared_reshardings) share_reshardings(ap);
  problem_nodes(ap);
  problem_edges(ap);
  // The gathered-weight peak is a max, not a sum over choices: the problem cannot price it,
  // so it keeps room for the peak the current decisions have (the descent's later passes see
  // the gathers its earlier ones chose).
  const ShardingMemory memory = this->memory();
  ap.problem.memory_limit = options_.memory_limit * memory_scale - memory.recompute_checkpoint_bytes() -
                            memory.gathered_parameter_bytes() - memory.fp8_cast_bytes();
  SpmdSolution solution = solve_fast(ap.problem, solver_seeds(ap, seeds_only));
  if (thorough && !seeds_only) {
    SpmdSolution exact = solve_ilp(ap.problem, IlpOptions{}, &solution);
    if ((exact.feasible && (!solution.feasible || exact.cost <= solution.cost)) ||
        (!exact.feasible && !solution.feasible && exact.memory < solution.memory))
      solution = std::move(exact);
  }
  adopt_solution(ap, solution);
}

// The hubs (Hub): the readers of a value, two or more edges of the same count,
// that could share a resharding that costs something.
void ShardingModel::share_reshardings(AxisProblem& ap) const {
  const EdgePricer pricer = edge_pricer();
  std::map<std::pair<ir::ValueId, double>, std::vector<EdgeKey>> readers_of;
  for (const auto& [key, group] : facts_->edges) {
    if (graph_.value(group.value).role == ir::ValueRole::Parameter) continue;
    if (!key.producer_is_leaf && key.producer == key.consumer) continue;  // a self-pair: the node's own cost
    if (key.producer_is_leaf ? ap.leaf_choices[static_cast<std::size_t>(key.producer)].empty()
                             : ap.strategies[static_cast<std::size_t>(key.producer)].empty())
      continue;
    if (ap.strategies[static_cast<std::size_t>(key.consumer)].empty()) continue;
    readers_of[{group.value, group.count}].push_back(key);
  }
  for (auto& [value_count, keys] : readers_of) {
    if (keys.size() < 2) continue;
    Hub hub;
    hub.value = value_count.first;
    hub.count = value_count.second;
    hub.readers = keys;
    std::vector<Placement> produced;
    for (const Placement& p : ap.produced_by(keys.front(), graph_.value(hub.value)))
      if (std::find(produced.begin(), produced.end(), p) == produced.end()) produced.push_back(p);
    // The placements two or more of the readers may want (only those can be shared).
    std::vector<std::pair<Placement, Placement>> targets;
    std::vector<int> target_reader, target_readers;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      std::vector<std::pair<Placement, Placement>> mine;
      for (const Strategy& st : ap.strategies[static_cast<std::size_t>(keys[i].consumer)]) {
        std::pair<Placement, Placement> t{st.inputs[static_cast<std::size_t>(keys[i].operand)],
                                          st.input_grads[static_cast<std::size_t>(keys[i].operand)]};
        if (std::find(mine.begin(), mine.end(), t) != mine.end()) continue;
        mine.push_back(t);
        const auto at = std::find(targets.begin(), targets.end(), t);
        if (at == targets.end()) {
          targets.push_back(std::move(t));
          target_reader.push_back(static_cast<int>(i));
          target_readers.push_back(1);
        } else {
          ++target_readers[static_cast<std::size_t>(at - targets.begin())];
        }
      }
    }
    // A choice per produced placement: nothing shared, or one of those placements whose
    // resharding costs something (a free one is as good as none).
    bool shares = false;
    for (const Placement& p : produced) {
      hub.produced.push_back(p);
      hub.shared.emplace_back(std::nullopt);
      hub.first_reader.push_back(-1);
      hub.seconds.push_back(0);
      for (std::size_t t = 0; t < targets.size(); ++t) {
        if (target_readers[t] < 2) continue;
        const EdgeKey& by = keys[static_cast<std::size_t>(target_reader[t])];
        const double seconds = hub.count * pricer.edge_seconds(ap.axis, hub.value, by.consumer, by.operand, p,
                                                               targets[t].first, targets[t].second,
                                                               ap.parameter_weight);
        if (!(seconds > 0) || !std::isfinite(seconds)) continue;
        hub.produced.push_back(p);
        hub.shared.emplace_back(targets[t]);
        hub.first_reader.push_back(target_reader[t]);
        hub.seconds.push_back(seconds);
        shares = true;
      }
    }
    if (!shares) continue;  // nothing the readers could share: their own edges
    for (const EdgeKey& k : keys) ap.via_hub.insert(k);
    ap.hubs.push_back(std::move(hub));
  }
  for (std::size_t h = 0; h < ap.hubs.size(); ++h)
    ap.hubs_after[{ap.hubs[h].readers.front().producer, ap.hubs[h].readers.front().producer_is_leaf}].push_back(h);
}

// Problem nodes, in sweep order: each node's unseen leaves, then the node (each followed by
// its values' hubs); their costs and memory per choice.
void ShardingModel::problem_nodes(AxisProblem& ap) const {
  const int axis = ap.axis;
  const ShardingMemory memory = this->memory();
  for (const ir::Node& node : graph_.nodes()) {
    for (ir::ValueId in : node.inputs) {
      ir::ValueId leaf = folding().rep_leaf[static_cast<std::size_t>(in)];
      if (leaf < 0 || ap.leaf_id[static_cast<std::size_t>(leaf)] >= 0) continue;
      const auto& choices = ap.leaf_choices[static_cast<std::size_t>(leaf)];
      ChoiceNode c;
      c.name = graph_.value(leaf).name;
      for (const LeafChoice& choice : choices) {
        // A tie-break, not a cost: with equal traffic (an all-reduce is a reduce-scatter and an
        // all-gather), keep the weight and its optimizer state whole.
        // A graph input is the other way round: each rank loads only its share of the batch,
        // so its placement follows what its readers split (R -> S is local, a tie otherwise).
        const ir::Value& value = graph_.value(leaf);
        const bool whole = !choice.zero && choice.placement.is_replicate();
        const double instances = ap.leaf_instances[static_cast<std::size_t>(leaf)];
        if (value.role == ir::ValueRole::Input) {
          c.cost.push_back(1e-15 * facts_->value_bytes(leaf) *
                           held_fraction(choice.placement, options_.mesh[static_cast<std::size_t>(axis)]));
        } else {
          c.cost.push_back((whole ? 0.0 : 1e-12 * static_cast<double>(value.type.numel())) +
                           instances * options_.step_share *
                               (optimizer_seconds(leaf, axis, choice) + zero_broadcast_seconds(leaf, axis, choice)));
        }
        c.memory.push_back(memory.leaf_memory(leaf, axis, choice) * instances);
      }
      ap.leaf_id[static_cast<std::size_t>(leaf)] = static_cast<int>(ap.problem.nodes.size());
      ap.problem.nodes.push_back(std::move(c));
      ap.push_hubs(static_cast<int>(leaf), true, graph_);
    }
    const auto u = static_cast<std::size_t>(node.id);
    if (!folding().represents_itself(u)) continue;
    ChoiceNode c;
    c.name = node.outputs.empty() ? node.op : graph_.value(node.outputs[0]).name;
    const double n = folding().instances[u];
    const double memory_count = folding().recomputed(u) ? 1.0 : n;
    for (const Strategy& s : ap.strategies[u]) {
      const double amax = fp8_amax_seconds(axis, fp8_amax_elements(node.id, axis, s).first);
      const double compute =
          node_compute(node.id, axis, s, *facts_->device) * balanced_compute_factor(node.id, axis, s);
      c.cost.push_back(n * (compute + statistics_seconds(axis, s) + amax + ring_hops(node.id, axis, s).seconds +
                            dispatch_traffic(node.id, axis, s).seconds));
      c.memory.push_back(memory_count * memory.node_memory(node.id, axis, s));
    }
    ap.node_id[u] = static_cast<int>(ap.problem.nodes.size());
    ap.problem.nodes.push_back(std::move(c));
    ap.push_hubs(static_cast<int>(u), false, graph_);
  }
}

// Edges, merged per pair of problem nodes; a self-pair (a block's output read by the next
// instance at a position folded into the same node) is a cost on that node's diagonal. Then
// the hubs' edges: producer -> hub (the placements equal, the shared resharding once) and hub
// -> each reader (nothing where it wants the shared placement, else its own resharding).
void ShardingModel::problem_edges(AxisProblem& ap) const {
  const EdgePricer pricer = edge_pricer();
  const int axis = ap.axis;
  const double parameter_weight = ap.parameter_weight;
  SpmdProblem& problem = ap.problem;
  for (const auto& [key, group] : facts_->edges) {
    const int pa = ap.producer_id(key);
    const int pb = ap.node_id[static_cast<std::size_t>(key.consumer)];
    if (pa < 0 || pb < 0 || ap.via_hub.contains(key)) continue;
    // Parameter traffic beside compute costs parameter_weight (see the header); edge_seconds
    // weighs each of its collectives by where the runtime runs it.
    const std::vector<Placement> produced = ap.produced_by(key, graph_.value(group.value));
    const auto& readers = ap.strategies[static_cast<std::size_t>(key.consumer)];
    const auto op = static_cast<std::size_t>(key.operand);
    if (pa == pb) {
      for (std::size_t s = 0; s < readers.size(); ++s)
        problem.nodes[static_cast<std::size_t>(pb)].cost[s] +=
            group.count * pricer.edge_seconds(axis, group.value, key.consumer, key.operand, produced[s],
                                              readers[s].inputs[op], readers[s].input_grads[op], parameter_weight);
      continue;
    }
    const auto [edge, flip] = ap.edge_between(pa, pb);
    ChoiceEdge& e = *edge;
    const std::size_t nb = problem.nodes[static_cast<std::size_t>(e.b)].cost.size();
    for (std::size_t p = 0; p < produced.size(); ++p)
      for (std::size_t r = 0; r < readers.size(); ++r) {
        double seconds = group.count * pricer.edge_seconds(axis, group.value, key.consumer, key.operand, produced[p],
                                                           readers[r].inputs[op], readers[r].input_grads[op],
                                                           parameter_weight);
        e.cost[flip ? r * nb + p : p * nb + r] += seconds;
      }
  }
  constexpr double kForbidden = std::numeric_limits<double>::infinity();
  for (const Hub& hub : ap.hubs) {
    const EdgeKey& first = hub.readers.front();
    const int pa = ap.producer_id(first);
    const std::vector<Placement> produced = ap.produced_by(first, graph_.value(hub.value));
    const std::size_t choices = hub.produced.size();
    {
      auto [e, flip] = ap.edge_between(pa, hub.id);
      const std::size_t nb = problem.nodes[static_cast<std::size_t>(e->b)].cost.size();
      for (std::size_t p = 0; p < produced.size(); ++p)
        for (std::size_t h = 0; h < choices; ++h) {
          e->cost[flip ? h * nb + p : p * nb + h] += produced[p] == hub.produced[h] ? hub.seconds[h] : kForbidden;
        }
    }
    for (const EdgeKey& key : hub.readers) {
      const int pb = ap.node_id[static_cast<std::size_t>(key.consumer)];
      const auto& readers = ap.strategies[static_cast<std::size_t>(key.consumer)];
      const auto op = static_cast<std::size_t>(key.operand);
      auto [e, flip] = ap.edge_between(hub.id, pb);
      const std::size_t nb = problem.nodes[static_cast<std::size_t>(e->b)].cost.size();
      for (std::size_t h = 0; h < choices; ++h)
        for (std::size_t r = 0; r < readers.size(); ++r) {
          const bool shares = hub.shared[h] && hub.shared[h]->first == readers[r].inputs[op] &&
                              hub.shared[h]->second == readers[r].input_grads[op];
          const double seconds =
              shares ? 0.0
                     : hub.count * pricer.edge_seconds(axis, hub.value, key.consumer, key.operand, hub.produced[h],
                                                       readers[r].inputs[op], readers[r].input_grads[op],
                                                       parameter_weight);
          e->cost[flip ? r * nb + h : h * nb + r] += seconds;
        }
    }
  }
}

// A hub's seed: the producer's placement in the seed, and the resharding most of the seed's
// readers that need one want (none when none does).
int ShardingModel::hub_seed(const AxisProblem& ap, const Hub& hub, const std::vector<int>& seed) const {
  const EdgePricer pricer = edge_pricer();
  const EdgeKey& first = hub.readers.front();
  const auto chosen = [&](int problem_node) {
    return static_cast<std::size_t>(seed[static_cast<std::size_t>(problem_node)]);
  };
  const auto producer = static_cast<std::size_t>(first.producer);
  const auto output = static_cast<std::size_t>(graph_.value(hub.value).output_index);
  const Placement p = first.producer_is_leaf ? ap.leaf_choices[producer][chosen(ap.leaf_id[producer])].placement
                                             : ap.strategies[producer][chosen(ap.node_id[producer])].outputs[output];
  std::vector<std::pair<std::pair<Placement, Placement>, int>> wanted;
  for (const EdgeKey& key : hub.readers) {
    const auto consumer = static_cast<std::size_t>(key.consumer);
    const Strategy& r = ap.strategies[consumer][chosen(ap.node_id[consumer])];
    const auto op = static_cast<std::size_t>(key.operand);
    if (pricer.edge_seconds(ap.axis, hub.value, key.consumer, key.operand, p, r.inputs[op], r.input_grads[op],
                            ap.parameter_weight) <= 0)
      continue;
    std::pair<Placement, Placement> t{r.inputs[op], r.input_grads[op]};
    auto it = std::find_if(wanted.begin(), wanted.end(), [&](const auto& w) { return w.first == t; });
    if (it == wanted.end()) wanted.emplace_back(std::move(t), 1);
    else ++it->second;
  }
  const auto most = std::max_element(wanted.begin(), wanted.end(),
                                     [](const auto& x, const auto& y) { return x.second < y.second; });
  int none = 0;
  for (std::size_t h = 0; h < hub.produced.size(); ++h) {
    if (hub.produced[h] != p) continue;
    if (!hub.shared[h]) none = static_cast<int>(h);
    if (most != wanted.end() && hub.shared[h] && *hub.shared[h] == most->first) return static_cast<int>(h);
  }
  return none;
}

// Seeds for the fast solver: this axis' current decisions (a pass never makes the axis
// worse), and pure data parallelism (every node splits the index its batch dim carries,
// parameters whole, inputs split on their batch dim).
FastOptions ShardingModel::solver_seeds(AxisProblem& ap, bool seeds_only) const {
  const auto a = static_cast<std::size_t>(ap.axis);
  FastOptions fast{options_.beam_width, {}};
  fast.memo = options_.solve_memo;
  std::vector<int> current(ap.problem.nodes.size(), 0), data_parallel(ap.problem.nodes.size(), 0);
  auto shards_batch = [&](ir::ValueId id, const Placement& p) {
    const ir::TensorType& type = graph_.value(id).type;
    return type.batch_dim && p.is_shard() && p.dim == *type.batch_dim && p.groups == 1 && p.ratios.empty();
  };
  for (std::size_t u = 0; u < graph_.nodes().size(); ++u) {
    if (ap.node_id[u] < 0) continue;
    const auto& options = ap.strategies[u];
    const ir::Node& node = graph_.node(static_cast<ir::NodeId>(u));
    // Data parallelism: the first strategy that splits an output's batch; where none does, the
    // first that splits an input's (a loss). Not one splitting only an input that it reads for
    // metadata (new_empty's): its output would be whole, computed on every rank.
    int output_batch = -1, input_batch = -1;
    for (std::size_t c = 0; c < options.size(); ++c) {
      if (options[c] == decisions_.nodes[a][u]) current[static_cast<std::size_t>(ap.node_id[u])] = static_cast<int>(c);
      for (std::size_t o = 0; o < node.outputs.size() && output_batch < 0; ++o)
        if (shards_batch(node.outputs[o], options[c].outputs[o])) output_batch = static_cast<int>(c);
      for (std::size_t i = 0; i < node.inputs.size() && input_batch < 0; ++i)
        if (shards_batch(node.inputs[i], options[c].inputs[i])) input_batch = static_cast<int>(c);
    }
    data_parallel[static_cast<std::size_t>(ap.node_id[u])] = std::max(0, output_batch >= 0 ? output_batch : input_batch);
  }
  for (std::size_t v = 0; v < graph_.values().size(); ++v) {
    if (ap.leaf_id[v] < 0) continue;
    const auto& options = ap.leaf_choices[v];
    for (std::size_t c = 0; c < options.size(); ++c) {
      if (options[c] == decisions_.leaves[a][v]) current[static_cast<std::size_t>(ap.leaf_id[v])] = static_cast<int>(c);
      int& dp = data_parallel[static_cast<std::size_t>(ap.leaf_id[v])];
      const ir::ValueRole role = graph_.value(static_cast<ir::ValueId>(v)).role;
      if (role == ir::ValueRole::Input && dp == 0 && !options[c].zero &&
          shards_batch(static_cast<ir::ValueId>(v), options[c].placement))
        dp = static_cast<int>(c);
      // Data parallelism as practised: whole weights, their optimizer state sharded (ZeRO-1),
      // when the parameter may be.
      if (role == ir::ValueRole::Parameter && options[c].zero && options[c].placement.is_replicate())
        dp = static_cast<int>(c);
    }
  }
  for (const Hub& hub : ap.hubs) {
    current[static_cast<std::size_t>(hub.id)] = hub_seed(ap, hub, current);
    data_parallel[static_cast<std::size_t>(hub.id)] = hub_seed(ap, hub, data_parallel);
  }
  fast.seeds_only = seeds_only;
  if (seeds_only)
    fast.seeds = {std::move(data_parallel)};
  else
    fast.seeds = {std::move(current), std::move(data_parallel)};
  return fast;
}

// The solution's choices become the axis' decisions, for every instance of a representative.
void ShardingModel::adopt_solution(const AxisProblem& ap, const SpmdSolution& solution) {
  const auto a = static_cast<std::size_t>(ap.axis);
  const auto num_nodes = graph_.nodes().size();
  const auto num_values = graph_.values().size();
  for (std::size_t u = 0; u < num_nodes; ++u) {
    if (ap.node_id[u] < 0) continue;
    decisions_.nodes[a][u] =
        ap.strategies[u][static_cast<std::size_t>(solution.choice[static_cast<std::size_t>(ap.node_id[u])])];
  }
  const BlockFolding& folding = this->folding();
  for (std::size_t u = 0; u < num_nodes; ++u)
    decisions_.nodes[a][u] = decisions_.nodes[a][static_cast<std::size_t>(folding.rep_node[u])];
  for (std::size_t v = 0; v < num_values; ++v) {
    if (ap.leaf_id[v] < 0) continue;
    decisions_.leaves[a][v] =
        ap.leaf_choices[v][static_cast<std::size_t>(solution.choice[static_cast<std::size_t>(ap.leaf_id[v])])];
  }
  for (std::size_t v = 0; v < num_values; ++v)
    if (folding.rep_leaf[v] >= 0)
      decisions_.leaves[a][v] = decisions_.leaves[a][static_cast<std::size_t>(folding.rep_leaf[v])];
}

double ShardingModel::compute_seconds(const cost::DeviceType& device) const {
  double seconds = 0;
  for (const ir::Node& node : graph_.nodes()) {
    const auto u = static_cast<std::size_t>(node.id);
    if (!folding().represents_itself(u)) continue;
    seconds += folding().instances[u] * node_compute(node.id, -1, decisions_.nodes[0][u], device);
  }
  return seconds;
}

ShardingModel::Tally ShardingModel::tally(int first_axis) const {
  const BlockFolding& folding = this->folding();
  Tally out;
  out.by_node.assign(graph_.nodes().size(), {});
  for (const ir::Node& node : graph_.nodes()) {
    const auto u = static_cast<std::size_t>(node.id);
    if (!folding.represents_itself(u)) continue;
    const cost::OpTime time = base_time(node.id, -1, decisions_.nodes[0][u], *facts_->device);
    const double recomputed = recompute_seconds(u, time);
    out.by_node[u].forward = folding.instances[u] * time.forward;
    out.by_node[u].backward = folding.instances[u] * time.backward;
    out.forward += folding.instances[u] * time.forward;
    out.backward += folding.instances[u] * (time.backward + recomputed);
  }
  for (int axis = first_axis; axis < static_cast<int>(options_.mesh.size()); ++axis) {
    if (options_.mesh[static_cast<std::size_t>(axis)] <= 1) continue;
    tally_statistics(axis, out);
    tally_reshardings(axis, out);
  }
  return out;
}

// The FP8 amax all-reduces and the statistics kernels' all-reduces on `axis`.
void ShardingModel::tally_statistics(int axis, Tally& out) const {
  const auto a = static_cast<std::size_t>(axis);
  const BlockFolding& folding = this->folding();
  for (const ir::Node& node : graph_.nodes()) {
    const auto u = static_cast<std::size_t>(node.id);
    if (!folding.represents_itself(u)) continue;
    const Strategy& s = decisions_.nodes[a][u];
    if (const auto [elements, forward] = fp8_amax_elements(node.id, axis, s); elements > 0) {
      const double amax = fp8_amax_seconds(axis, elements);
      out.statistics += folding.instances[u] * amax;
      out.by_node[u].collectives += folding.instances[u] * amax;
      out.collectives.push_back({"all_reduce", graph_.value(node.outputs[0]).name, axis,
                                 forward ? "forward" : "backward", elements * 4, folding.instances[u], amax});
    }
    if (const RingHops ring = ring_hops(node.id, axis, s); ring.seconds > 0) {
      out.statistics += folding.instances[u] * ring.seconds;
      out.by_node[u].collectives += folding.instances[u] * ring.seconds;
      const double hops = options_.mesh[a] - 1.0;
      out.collectives.push_back({"send_recv", graph_.value(node.outputs[0]).name, axis, "forward", hops * ring.block_bytes,
                                 folding.instances[u], 0.0});
      out.collectives.push_back({"send_recv", graph_.value(node.outputs[0]).name, axis, "backward",
                                 (2 * hops + 1) * ring.block_bytes, folding.instances[u], ring.seconds});
    }
    if (const DispatchTraffic dispatch = dispatch_traffic(node.id, axis, s); dispatch.seconds > 0) {
      out.statistics += folding.instances[u] * dispatch.seconds;
      out.by_node[u].collectives += folding.instances[u] * dispatch.seconds;
      for (const char* phase : {"forward", "backward"})
        out.collectives.push_back({"all_to_all", graph_.value(node.outputs[0]).name, axis, phase, 2 * dispatch.bytes,
                                   folding.instances[u], dispatch.seconds / 2});
    }
    const double seconds = statistics_seconds(axis, s);
    if (seconds <= 0) continue;
    out.statistics += folding.instances[u] * seconds;
    out.by_node[u].collectives += folding.instances[u] * seconds;
    for (const char* phase : {"forward", "backward"}) {
      out.collectives.push_back({"all_reduce", graph_.value(node.outputs[0]).name, axis, phase,
                                 static_cast<double>(s.statistics_elements * 4), folding.instances[u], seconds / 2});
    }
  }
}

// Every resharding the decisions make on `axis`, each where it runs: activations' (a
// resharding its readers share counted once), parameters' gathers (prefetched, gathered
// again) and gradient reductions, collective matmuls' beside their products.
void ShardingModel::tally_reshardings(int axis, Tally& out) const {
  const auto a = static_cast<std::size_t>(axis);
  const EdgePricer pricer = edge_pricer();
  std::map<UnitGroupKey, double> group_elements = pricer.unit_group_elements(axis);
  auto grouped_share = [&](int consumer, ir::ValueId value, int kind) {
    const double total = group_elements[pricer.unit_group_key(consumer, value, kind)];
    return total > 0 ? std::min(1.0, static_cast<double>(graph_.value(value).type.numel()) / total) : 1.0;
  };
  // Readers of one activation that want it the same way share one resharding, as the
  // runtime runs it (runtime/lower.py reuses the reshard, its backward sees the summed gradient):
  // q, k and v read one gathered norm output. The per-axis problems price it so through
  // their hubs (solve_axis, ShardingModelOptions::shared_reshardings), else per reader edge.
  std::set<std::string> shared;
  for (const auto& [key, group] : facts_->edges) {
    const ir::Value& value = graph_.value(group.value);
    const Strategy& reader = decisions_.nodes[a][static_cast<std::size_t>(key.consumer)];
    const auto op = static_cast<std::size_t>(key.operand);
    const Placement produced = decisions_.value_placement(axis, group.value);
    if (value.role != ir::ValueRole::Parameter &&
        !shared.insert(fmt::format("{} {} {} {}", group.value, reader.inputs[op].str(), reader.input_grads[op].str(),
                                   group.count))
             .second)
      continue;
    const double bytes = facts_->value_bytes(group.value) * decisions_.held_except(group.value, axis);
    NodePrice& price = out.by_node[static_cast<std::size_t>(key.consumer)];
    auto record = [&](const Placement& from, const Placement& to, const char* phase, double& into, double& by_node,
                      double share, double node_weight = 1.0, double latency_share = 1.0) {
      auto step = reshard_step(pricer.as_run(axis, group.value, from), pricer.as_run(axis, group.value, to),
                               static_cast<std::int64_t>(bytes), options_.mesh[a]);
      if (!step) return;
      double seconds = pricer.reshard_seconds(axis, group.value, from, to, bytes, latency_share);
      into += share * group.count * seconds;
      by_node += node_weight * share * group.count * seconds;
      out.collectives.push_back({std::string(cost::collective_kind_name(step->kind)), value.name, axis, phase,
                                 static_cast<double>(step->bytes), share * group.count, seconds});
    };
    const bool parameter = value.role == ir::ValueRole::Parameter;
    // A collective matmul: each collective beside its contraction's products, (n-1)/n of
    // them (parameter_collectives.h); what they cannot cover is exposed, what they cover
    // costs the interference.
    if (const MatmulCollective fused =
            parameter ? MatmulCollective::None
                      : pricer.matmul_collective_at(axis, group.value, key.consumer, key.operand, produced,
                                                    reader.inputs[op], reader.input_grads[op]);
        fused != MatmulCollective::None) {
      const ir::NodeId contraction =
          fused == MatmulCollective::Gather ? key.consumer : *graph_.value(group.value).producer;
      const auto r = static_cast<std::size_t>(folding().rep_node[static_cast<std::size_t>(contraction)]);
      const double covered =
          static_cast<double>(options_.mesh[a] - 1) / options_.mesh[a] / folding().instances[r];
      const double k = options_.overlap_interference;
      auto hidden = [&](const Placement& from, const Placement& to, const char* phase, double products) {
        double seconds = 0, unused = 0;
        record(from, to, phase, seconds, unused, 1.0);  // the collective as recorded, in full
        out.activation_matmul += seconds;
        const double exposed = std::max(0.0, seconds - products) + k * std::min(seconds, products);
        out.activations += exposed;
        price.collectives += exposed;
      };
      hidden(produced, reader.inputs[op], "forward", covered * out.by_node[r].forward * group.count);
      if (facts_->requires_grad[static_cast<std::size_t>(group.value)])
        hidden(reader.input_grads[op], gradient_placement(produced), "backward",
               covered * out.by_node[r].backward * group.count);
      continue;
    }
    // Where each parameter collective runs (search/parameter_collectives.h).
    auto beside = [&](ParameterOverlap overlap) -> double& {
      return overlap == ParameterOverlap::BesideForward    ? out.parameter_forward
             : overlap == ParameterOverlap::BesideBackward ? out.parameter_step
                                                           : out.parameter_exposed;
    };
    const ParameterOverlap first =
        parameter ? pricer.gather_overlap(axis, group.value, key.consumer, key.operand, produced, reader.inputs[op])
                  : activation_collective_overlap();
    // A prefetched gather and its gather again for backward run in their unit's group.
    const double gather_latency =
        parameter && first == ParameterOverlap::BesideForward ? grouped_share(key.consumer, group.value, 0) : 1.0;
    record(produced, reader.inputs[op], "forward", parameter ? beside(first) : out.activations, price.collectives,
           1.0, 1.0, gather_latency);
    // A recomputed reader's forward, run again in backward, reshards an activation again.
    if (!parameter && folding().runs_again(static_cast<std::size_t>(key.consumer)))
      record(produced, reader.inputs[op], "backward", out.activations, price.collectives, 1.0);
    // A gathered weight is released after its read and gathered again for the backward (and
    // for the recomputed forward): ZeRO-3 / FSDP's traffic, as the runtime runs it.
    if (parameter)
      record(produced, reader.inputs[op], "backward", beside(regather_overlap()), price.collectives,
             pricer.forward_passes(group.value, key.consumer, key.operand) - 1, 1.0, gather_latency);
    if (facts_->requires_grad[static_cast<std::size_t>(group.value)]) {
      const Placement canonical = gradient_placement(produced);
      const Placement handed = pricer.reduced_gradient(group.value, produced, reader.input_grads[op]);
      // A parameter's, or one the rewrite reduces with its parameters' (edge_seconds).
      const bool bucketed = parameter || pricer.reduced_with_parameters(group.value, produced, handed);
      const ParameterOverlap reduction =
          bucketed ? pricer.parameter_gradient_at(axis, group.value, key.consumer, key.operand, produced, handed)
                   : pricer.activation_gradient_at(axis, group.value, key.consumer, key.operand, produced,
                                                   reader.inputs[op], handed);
      record(handed, canonical, bucketed ? "step" : "backward",
             bucketed                                         ? beside(reduction)
             : reduction == ParameterOverlap::BesideBackward ? out.activation_backward
                                                             : out.activations,
             bucketed ? price.gradient_sync : price.collectives,
             pricer.gradient_share(group.value, produced, handed) *
                 (bucketed ? options_.step_share : 1.0),  // once a step (ShardingModelOptions)
             // a stage's price (node_prices) counts an activation's hidden all-reduce at
             // the interference, as the solver does (edge_seconds)
             !bucketed && reduction == ParameterOverlap::BesideBackward ? options_.overlap_interference : 1.0,
             !bucketed                      ? 1.0
             : canonical.is_replicate()      ? std::min(1.0, bytes / options_.bucket_bytes)
             : reduction == ParameterOverlap::BesideBackward ? grouped_share(key.consumer, group.value, 1)
                                                             : 1.0);
    }
  }
}

std::vector<NodePrice> ShardingModel::node_prices(int first_axis) const {
  const Tally tally = this->tally(first_axis);
  const ShardingMemory memory = this->memory();
  const BlockFolding& folding = this->folding();
  std::vector<NodePrice> out(graph_.nodes().size());
  const double unscale = options_.activation_memory_scale > 0 ? 1.0 / options_.activation_memory_scale : 1.0;
  for (const ir::Node& node : graph_.nodes()) {
    const auto u = static_cast<std::size_t>(node.id);
    const auto r = static_cast<std::size_t>(folding.rep_node[u]);
    const NodePrice& total = tally.by_node[r];
    const double n = folding.instances[r];
    const bool kept = folding.in_block[r] && folding.selective_kept[r];
    const double outputs = memory.output_memory(folding.rep_node[u], 0, decisions_.nodes[0][r], true) * unscale;
    out[u] = {total.forward / n,
              total.backward / n,
              total.collectives / n,
              total.gradient_sync / n,
              memory.output_memory(folding.rep_node[u], 0, decisions_.nodes[0][r], false) * unscale,
              kept ? 0.0 : total.forward / n,
              kept ? outputs : 0.0,
              outputs};
  }
  return out;
}

ShardingEvaluation ShardingModel::evaluate() const {
  ShardingEvaluation out;
  Tally tally = this->tally();
  const double forward = tally.forward, backward = tally.backward, compute = forward + backward;
  const double activations = tally.activations, statistics = tally.statistics;
  const double parameter_forward = tally.parameter_forward, parameter_step = tally.parameter_step;
  const double parameter_exposed = tally.parameter_exposed;
  out.collectives = std::move(tally.collectives);
  // Hidden under its phase's compute at the interference price, the excess exposed.
  const double k = options_.overlap_interference;
  auto exposed = [k](double sync, double beside) { return std::max(0.0, sync - beside) + k * std::min(sync, beside); };
  const double gradients =
      exposed(parameter_forward, forward) + exposed(parameter_step, backward) + parameter_exposed;
  out.parameter_sync = parameter_forward + parameter_step + parameter_exposed;
  out.parameter_sync_hidden = parameter_forward <= forward && parameter_step <= backward;
  double optimizer = 0, broadcasts = 0;
  for (const ir::Value& v : graph_.values()) {
    if (!is_leaf(v)) continue;
    optimizer += options_.step_share * optimizer_seconds(v.id, -1, {});
    for (int a = 0; a < static_cast<int>(options_.mesh.size()); ++a) {
      const LeafChoice& choice = decisions_.leaves[static_cast<std::size_t>(a)][static_cast<std::size_t>(v.id)];
      const double seconds = zero_broadcast_seconds(v.id, a, choice);
      if (seconds <= 0) continue;
      broadcasts += options_.step_share * seconds;
      out.collectives.push_back({"broadcast", v.name, a, "step",
                                 facts_->value_bytes(v.id) * decisions_.held_except(v.id, a), options_.step_share,
                                 seconds});
    }
  }
  // The asynchronous all-reduces of activation gradients hide under the weight gradients'
  // products, about half of the backward's compute (a contraction's backward is two
  // products of its forward's size).
  const double activation_beside = exposed(tally.activation_backward, backward / 2);
  out.step_time = compute + activations + activation_beside + gradients + statistics + optimizer + broadcasts;
  out.breakdown = {{"compute", compute},
                   {"activations", activations + activation_beside},
                   {"activations_beside_backward_total", tally.activation_backward},
                   {"activations_beside_matmul_total", tally.activation_matmul},
                   {"gradient_sync", gradients},
                   {"gradient_sync_total", out.parameter_sync},
                   {"statistics", statistics},
                   {"optimizer", optimizer},
                   {"zero_broadcast", broadcasts}};
  // Memory: the weights and optimizer state, the gathered weights' peak (two units, at any
  // moment), and what the step holds at its fullest moment by liveness (ShardingMemory::step_peak:
  // saved activations, gradients made so far, one node's transient), each part as it stands at
  // that moment, so the parts sum to the total.
  const ShardingMemory memory = this->memory();
  const cost::ModelStateBytes states = parameter_bytes_by_kind();
  const double gathered = gathered_parameter_bytes();
  StepPeak peak = memory.step_peak();
  out.fits = states.weights + states.optimizer + gathered + peak.total() <= options_.memory_limit;
  if (const std::optional<UnevenShares> shares = uneven_shares()) {
    // The batch's uneven shares (set_input_ratios: the balance LP's, hetero_balance.h), priced
    // as the LP prices them: rank i of the axis' group computes its share, ratio x n of the
    // even one, at its own device's speed, and the slowest of them sets the step; what scales
    // with the batch scales with its share, against its own device's memory.
    const double n = static_cast<double>(shares->ranks.size());
    // memory_limit is the smallest device's memory x the plan's fraction of it.
    double smallest = std::numeric_limits<double>::infinity();
    for (int r = 0; r < cluster_.world_size(); ++r)
      smallest = std::min(smallest, static_cast<double>(cluster_.device_of(r).memory_bytes));
    const double fraction = options_.memory_limit / smallest;
    double paced = 0, most = 0;
    out.fits = true;
    for (std::size_t i = 0; i < shares->ranks.size(); ++i) {
      const cost::DeviceType& device = cluster_.device_of(shares->ranks[i]);
      const double scale = shares->ratios[i] * n;
      paced = std::max(paced, compute_seconds(device) * scale);
      most = std::max(most, scale);
      out.fits = out.fits && states.weights + states.optimizer + gathered + memory.step_peak(scale).total() <=
                                 static_cast<double>(device.memory_bytes) * fraction;
    }
    out.step_time += paced - compute;
    out.breakdown["compute"] = paced;
    peak = memory.step_peak(most);
  }
  out.memory_per_rank = states.weights + states.optimizer + gathered + peak.total();
  out.memory_breakdown = {{"weights", states.weights},
                          {"gradients", peak.gradients},
                          {"optimizer", states.optimizer},
                          {"activations", peak.saved},
                          {"backward_working", peak.working},
                          {"gathered_parameters", gathered}};
  if (memory.fp8_cast_bytes() > 0) out.memory_breakdown["fp8_casts"] = peak.casts;
  double flops = 0;
  for (const ir::Node& node : graph_.nodes())
    flops += static_cast<double>(analysis::node_flops(ops::OpTable::builtin(), graph_, node).matmul);
  out.model_flops = 3 * flops * facts_->batch_scale;
  return out;
}

void ShardingModel::adopt(const plan::Sharding& sharding) {
  // A sharding this graph cannot take changes nothing: the decisions as they were come back.
  auto nodes = decisions_.nodes;
  auto leaves = decisions_.leaves;
  try {
    adopt_decisions(sharding);
  } catch (...) {
    decisions_.nodes = std::move(nodes);
    decisions_.leaves = std::move(leaves);
    throw;
  }
}

void ShardingModel::adopt_decisions(const plan::Sharding& sharding) {
  const std::size_t axes = options_.mesh.size();
  if (sharding.mesh != options_.mesh)
    throw ValidationError(fmt::format("plan: sharding mesh [{}] priced on a model of mesh [{}]",
                                      fmt::join(sharding.mesh, ", "), fmt::join(options_.mesh, ", ")));
  for (const ir::Value& v : graph_.values()) {
    if (!is_leaf(v)) continue;
    const auto& texts = plan::sharding_entry(sharding.placements, v.name, "placement", axes);
    auto zero = sharding.zero.find(v.name);
    for (std::size_t a = 0; a < axes; ++a) {
      LeafChoice& choice = decisions_.leaves[a][static_cast<std::size_t>(v.id)];
      choice.placement = parse_placement(texts[a]);
      choice.zero = zero != sharding.zero.end() &&
                    std::ranges::find(zero->second, static_cast<int>(a)) != zero->second.end();
    }
  }
  auto read_axis = [&](std::size_t a) {
    for (const ir::Node& node : graph_.nodes()) {
      if (node.outputs.empty()) continue;
      const std::string& name = graph_.value(node.outputs[0]).name;
      const std::string& text = plan::sharding_entry(sharding.strategies, name, "strategy", axes)[a];
      const auto& rule = facts_->rules[static_cast<std::size_t>(node.id)];
      Strategy& slot = decisions_.nodes[a][static_cast<std::size_t>(node.id)];
      if (text == "replicate" || !rule) {
        if (text != "replicate")
          throw ValidationError(fmt::format("plan: node '{}' ({}, module '{}') has strategy '{}' on mesh axis {} "
                                            "but no sharding rule", name, node.op, node.module_path, text, a));
        slot = replicate_strategy(node);
        continue;
      }
      bool found = false;
      for (Strategy& s : strategy_enumerator().node_strategies(node.id, static_cast<int>(a))) {
        if (s.str(*rule) != text) continue;
        slot = std::move(s);
        found = true;
        break;
      }
      if (!found)
        throw ValidationError(fmt::format("plan: node '{}' ({}, module '{}'): strategy '{}' is not one its rule {} "
                                          "takes on mesh axis {} of {} ranks", name, node.op, node.module_path, text,
                                          rule->str(), a, options_.mesh[a]));
    }
  };
  for (std::size_t a = 0; a < axes; ++a) read_axis(a);
  if (axes > 1) read_axis(0);
}

plan::Sharding ShardingModel::sharding(std::string level) const {
  plan::Sharding out;
  out.mesh = options_.mesh;
  out.axis_names = {"data", "tensor"};
  out.axis_names.resize(options_.mesh.size(), "axis");
  out.level = std::move(level);
  out.recompute = options_.recompute;
  out.collective_matmul = options_.collective_matmul;
  out.async_gradients = options_.async_gradients;
  out.graph = ir::graph_fingerprint(graph_);
  const auto axes = options_.mesh.size();
  for (const ir::Value& v : graph_.values()) {
    std::vector<std::string> per_axis;
    for (std::size_t a = 0; a < axes; ++a)
      per_axis.push_back(decisions_.value_placement(static_cast<int>(a), v.id).str());
    out.placements[v.name] = std::move(per_axis);
    if (!is_leaf(v)) continue;
    out.leaves.push_back(v.name);
    if (v.role == ir::ValueRole::Input) out.inputs.push_back(v.name);
    std::vector<int> zero;
    for (std::size_t a = 0; a < axes; ++a)
      if (decisions_.leaves[a][static_cast<std::size_t>(v.id)].zero) zero.push_back(static_cast<int>(a));
    if (!zero.empty()) out.zero[v.name] = std::move(zero);
  }
  for (const ir::Node& node : graph_.nodes()) {
    if (node.outputs.empty()) continue;
    const auto& rule = facts_->rules[static_cast<std::size_t>(node.id)];
    std::vector<std::string> per_axis;
    for (std::size_t a = 0; a < axes; ++a) {
      const Strategy& s = decisions_.nodes[a][static_cast<std::size_t>(node.id)];
      per_axis.push_back(rule ? s.str(*rule) : std::string("replicate"));
    }
    out.strategies[graph_.value(node.outputs[0]).name] = std::move(per_axis);
  }
  return out;
}

std::optional<ShardingModel::UnevenShares> ShardingModel::uneven_shares() const {
  const int axis = batch_axis();
  if (axis < 0) return std::nullopt;
  for (ir::ValueId in : graph_.inputs()) {
    const Placement& p = decisions_.leaves[static_cast<std::size_t>(axis)][static_cast<std::size_t>(in)].placement;
    const ir::TensorType& type = graph_.value(in).type;
    if (type.batch_dim && p.is_shard() && p.dim == *type.batch_dim && !p.ratios.empty()) {
      if (p.ratios.size() != static_cast<std::size_t>(options_.mesh[static_cast<std::size_t>(axis)]))
        throw ValidationError(fmt::format("plan: input '{}' has {} batch shares on a mesh axis of {} ranks",
                                          graph_.value(in).name, p.ratios.size(),
                                          options_.mesh[static_cast<std::size_t>(axis)]));
      return UnevenShares{axis, axis_ranks(axis), p.ratios};
    }
  }
  return std::nullopt;
}

int ShardingModel::batch_axis() const {
  for (std::size_t a = 0; a < options_.mesh.size(); ++a) {
    if (options_.mesh[a] <= 1) continue;
    for (ir::ValueId in : graph_.inputs()) {
      const ir::TensorType& type = graph_.value(in).type;
      const Placement& p = decisions_.leaves[a][static_cast<std::size_t>(in)].placement;
      if (type.batch_dim && p.is_shard() && p.dim == *type.batch_dim) return static_cast<int>(a);
    }
  }
  return -1;
}

void ShardingModel::set_input_ratios(int axis, const std::vector<double>& ratios) {
  for (ir::ValueId in : graph_.inputs()) {
    Placement& p = decisions_.leaves[static_cast<std::size_t>(axis)][static_cast<std::size_t>(in)].placement;
    const ir::TensorType& type = graph_.value(in).type;
    if (type.batch_dim && p.is_shard() && p.dim == *type.batch_dim) p.ratios = ratios;
  }
}

}  // namespace shardwise::search
