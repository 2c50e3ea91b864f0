#include "search/sharding_edges.h"

#include <algorithm>
#include <cstdint>
#include <set>

#include "analysis/gradient_flow.h"
#include "search/resharding.h"
#include "search/sharding_facts.h"
#include "search/sharding_options.h"

namespace shardwise::search {

namespace {

bool is_leaf(const ir::Value& value) { return !value.producer.has_value(); }

// A spec over `axes` mesh axes with `at_axis` on `axis` and `other(b)` on every other axis b:
// one axis's candidate beside what the other axes have chosen.
template <typename Other>
ShardingSpec one_axis_varied(std::size_t axes, int axis, const Placement& at_axis, Other other) {
  ShardingSpec spec;
  for (int b = 0; b < static_cast<int>(axes); ++b) spec.push_back(b == axis ? at_axis : other(b));
  return spec;
}

}  // namespace

EdgeGroups group_edges(const ir::Graph& graph, const BlockFolding& folding,
                       const std::vector<std::optional<ops::DimRule>>& rules) {
  EdgeGroups edges;
  for (const ir::Node& node : graph.nodes()) {
    const std::optional<ops::DimRule>& rule = rules[static_cast<std::size_t>(node.id)];
    for (std::size_t i = 0; i < node.inputs.size(); ++i) {
      if (rule && rule->reads_metadata_only(i)) continue;  // read as it is held (transform/spmd_rewrite.cc)
      const ir::Value& value = graph.value(node.inputs[i]);
      EdgeKey key{};
      if (is_leaf(value)) {
        key.producer = folding.rep_leaf[static_cast<std::size_t>(value.id)];
        key.producer_is_leaf = true;
      } else {
        key.producer = folding.rep_node[static_cast<std::size_t>(*value.producer)];
        key.producer_is_leaf = false;
      }
      key.consumer = folding.rep_node[static_cast<std::size_t>(node.id)];
      key.operand = static_cast<int>(i);
      EdgeGroup& group = edges[key];
      if (group.value < 0) group.value = value.id;
      group.count += 1;
    }
  }
  return edges;
}

ParameterUnits count_parameter_units(const ir::Graph& graph) {
  ParameterUnits out;
  out.of_node = parameter_units(graph);
  std::set<std::pair<int, ir::ValueId>> counted;
  for (const ir::Node& node : graph.nodes())
    for (ir::ValueId in : node.inputs) {
      const int unit = out.of_node[static_cast<std::size_t>(node.id)];
      const ir::Value& v = graph.value(in);
      if (v.role != ir::ValueRole::Parameter) continue;
      if (out.first_reading < 0) out.first_reading = unit;  // units are numbered in node order
      if (!counted.emplace(unit, in).second) continue;
      out.elements[{unit, v.type.shape.size() >= 2}] += static_cast<double>(v.type.numel());
    }
  return out;
}

double EdgePricer::edge_seconds(int axis, ir::ValueId value, int consumer, int operand, const Placement& produced,
                                const Placement& wanted, const Placement& gradient, double hidden_weight) const {
  const double bytes = facts_.value_bytes(value) * decisions_.held_except(value, axis);
  const bool parameter = facts_.graph.value(value).role == ir::ValueRole::Parameter;
  // Each collective costs what its mark (search/parameter_collectives.h, the rewrite's too)
  // says: in full where exposed, `hidden_weight` where it runs beside compute.
  auto weight = [&](ParameterOverlap overlap) { return overlap != ParameterOverlap::Exposed ? hidden_weight : 1.0; };
  double seconds = 0;
  // A collective matmul's collectives, forward and backward: beside the contraction's
  // products, at the interference price (evaluate() caps what they hide by the products).
  if (!parameter && matmul_collective_at(axis, value, consumer, operand, produced, wanted, gradient) !=
                        MatmulCollective::None) {
    double fused = reshard_seconds(axis, value, produced, wanted, bytes, 1.0);
    if (facts_.requires_grad[static_cast<std::size_t>(value)])
      fused += reshard_seconds(axis, value, gradient, gradient_placement(produced), bytes, 1.0);
    return options_.overlap_interference * fused;
  }
  const ParameterOverlap first = parameter ? gather_overlap(axis, value, consumer, operand, produced, wanted)
                                           : activation_collective_overlap();
  // A prefetched gather and its gather again for backward run in their unit's group.
  const double gather =
      reshard_seconds(axis, value, produced, wanted, bytes,
                      parameter ? parameter_latency_share(value, consumer, first, false, bytes) : 1.0);
  if (gather > 0)
    seconds = (weight(first) + (forward_passes(value, consumer, operand) - 1) * weight(regather_overlap())) * gather;
  // A recomputed reader reshards an activation again when backward runs its forward: exposed.
  if (!parameter && facts_.folding.runs_again(static_cast<std::size_t>(consumer))) seconds += gather;
  if (facts_.requires_grad[static_cast<std::size_t>(value)]) {
    const Placement canonical = gradient_placement(produced);
    const Placement handed = reduced_gradient(value, produced, gradient);
    // A parameter's, or one reduced with its parameters' gradients (reduced_with_parameters).
    const bool bucketed = parameter || reduced_with_parameters(value, produced, handed);
    const ParameterOverlap reduction =
        bucketed ? parameter_gradient_at(axis, value, consumer, operand, produced, handed)
                 : activation_gradient_at(axis, value, consumer, operand, produced, wanted, handed);
    // An activation's gradient beside its reader's weight gradient: hidden at the
    // interference price whatever the solver charges for parameter collectives (the weight
    // gradient's product, as long as the input gradient's, covers it; evaluate() caps it).
    const double reduction_weight =
        !bucketed && reduction != ParameterOverlap::Exposed ? options_.overlap_interference
                                                            : weight(reduction) * (bucketed ? options_.step_share : 1.0);
    seconds += reduction_weight * gradient_share(value, produced, handed) *
               reshard_seconds(axis, value, handed, canonical, bytes,
                               bucketed ? parameter_latency_share(value, consumer, reduction, canonical.is_replicate(),
                                                                  bytes)
                                        : 1.0);
  }
  return seconds;
}

bool EdgePricer::reduced_with_parameters(ir::ValueId value, const Placement& produced,
                                         const Placement& gradient) const {
  const auto v = static_cast<std::size_t>(value);
  return facts_.graph.value(value).producer && facts_.from_state[v] && produced.is_replicate() &&
         gradient.is_partial() && gradient.reduction == ops::Reduction::Sum;
}

int EdgePricer::forward_passes(ir::ValueId value, int consumer, int operand) const {
  // A parameter is gathered for its read, and again either for backward (released after the
  // read) or for the recomputed forward, whose gathered copy backward then uses
  // (search/parameter_collectives.h).
  if (facts_.graph.value(value).role != ir::ValueRole::Parameter) return 1;
  const auto c = static_cast<std::size_t>(consumer);
  if (facts_.folding.runs_again(c)) return 2;
  const auto o = static_cast<std::size_t>(operand);
  // An FP8 linear saves the float8 copy of its gathered W^T for backward (transform/fp8_axes.h).
  if (!facts_.fp8_linears.empty() && facts_.fp8_linears[c] && facts_.fp8_linears[c]->weight == o) return 1;
  return facts_.rules[c] && !backward_reads(*facts_.rules[c], o,
                                            analysis::operand_gradients(facts_.graph.node(consumer),
                                                                        facts_.requires_grad))
             ? 1
             : 2;
}

ParameterOverlap EdgePricer::activation_gradient_at(int axis, ir::ValueId value, int consumer, int operand,
                                                    const Placement& produced, const Placement& wanted,
                                                    const Placement& gradient) const {
  const auto c = static_cast<std::size_t>(consumer);
  if (!options_.async_gradients || !facts_.rules[c] || !facts_.requires_grad[static_cast<std::size_t>(value)])
    return activation_collective_overlap();
  // One all-reduce in all: no forward step on any axis, and one axis whose gradient goes
  // Partial -> Replicate while every other axis' gradient needs no step.
  int reductions = 0;
  bool other_steps = false;
  for (int b = 0; b < static_cast<int>(options_.mesh.size()); ++b) {
    const Placement held = b == axis ? produced : decisions_.value_placement(b, value);
    const Strategy& reader = decisions_.nodes[static_cast<std::size_t>(b)][c];
    const Placement& read = b == axis ? wanted : reader.inputs[static_cast<std::size_t>(operand)];
    const Placement& grad = b == axis ? gradient : reader.input_grads[static_cast<std::size_t>(operand)];
    const Placement canonical = gradient_placement(held);
    if (!(held == read)) other_steps = true;
    if (grad == canonical) continue;
    if (grad.is_partial() && grad.reduction == ops::Reduction::Sum && canonical.is_replicate()) ++reductions;
    else other_steps = true;
  }
  const ir::Node& node = facts_.graph.node(consumer);
  std::vector<bool> trainable;
  for (ir::ValueId in : node.inputs)
    trainable.push_back(facts_.graph.value(in).role == ir::ValueRole::Parameter &&
                        facts_.requires_grad[static_cast<std::size_t>(in)]);
  return activation_gradient_overlap(node.op, static_cast<std::size_t>(operand), reductions == 1 && !other_steps,
                                     facts_.reads[static_cast<std::size_t>(value)] == 1, trainable);
}

MatmulCollective EdgePricer::matmul_collective_at(int axis, ir::ValueId value, int consumer, int operand,
                                                  const Placement& produced, const Placement& wanted,
                                                  const Placement& gradient) const {
  if (!options_.collective_matmul) return MatmulCollective::None;
  const ir::Value& v = facts_.graph.value(value);
  if (v.role == ir::ValueRole::Parameter) return MatmulCollective::None;
  // Every other axis: no step forward, none backward.
  for (int b = 0; b < static_cast<int>(options_.mesh.size()); ++b) {
    if (b == axis || options_.mesh[static_cast<std::size_t>(b)] <= 1) continue;
    const Placement held = decisions_.value_placement(b, value);
    const Strategy& reader = decisions_.nodes[static_cast<std::size_t>(b)][static_cast<std::size_t>(consumer)];
    if (!(held == reader.inputs[static_cast<std::size_t>(operand)])) return MatmulCollective::None;
    if (facts_.requires_grad[static_cast<std::size_t>(value)] &&
        !(reader.input_grads[static_cast<std::size_t>(operand)] == gradient_placement(held)))
      return MatmulCollective::None;
  }
  // Even blocks, contiguous or strided (the ring takes a strided block as it takes a
  // contiguous one: transform/collective_matmul.cc).
  auto even = [](const Placement& p) { return p.is_shard() && p.ratios.empty(); };
  const bool grad = facts_.requires_grad[static_cast<std::size_t>(value)];
  const ir::Node& reader = facts_.graph.node(consumer);
  // Gather into the reader: S(d) -> R on a row dim, the gradient Partial -> S(d) or none.
  if (even(produced) && wanted.is_replicate() && search::collective_matmul_input(facts_.graph, reader) == operand &&
      search::collective_matmul_rows(facts_.graph, reader, produced.dim) &&
      (!grad || (gradient.is_partial() && gradient.reduction == ops::Reduction::Sum)))
    return MatmulCollective::Gather;
  // Scatter out of the producer: P(sum) -> S(d) on a row dim, the only read; the gradient
  // S(d) -> R (none without a gradient).
  if (!v.producer || !produced.is_partial() || produced.reduction != ops::Reduction::Sum || !even(wanted))
    return MatmulCollective::None;
  const ir::Node& producer = facts_.graph.node(*v.producer);
  if (facts_.reads[static_cast<std::size_t>(value)] != 1 ||
      std::find(facts_.graph.outputs().begin(), facts_.graph.outputs().end(), value) != facts_.graph.outputs().end() ||
      search::collective_matmul_input(facts_.graph, producer) < 0 ||
      !search::collective_matmul_rows(facts_.graph, producer, wanted.dim))
    return MatmulCollective::None;
  if (grad && !(gradient == wanted)) return MatmulCollective::None;
  return MatmulCollective::Scatter;
}

ParameterOverlap EdgePricer::parameter_gradient_at(int axis, ir::ValueId value, int consumer, int operand,
                                                   const Placement& produced, const Placement& gradient) const {
  const Placement canonical = gradient_placement(produced);
  if (canonical.is_replicate()) return gradient_reduction_overlap(canonical);
  const std::size_t axes = options_.mesh.size();
  const ShardingSpec grads = one_axis_varied(axes, axis, gradient, [&](int b) {
    return decisions_.nodes[static_cast<std::size_t>(b)][static_cast<std::size_t>(consumer)]
        .input_grads[static_cast<std::size_t>(operand)];
  });
  const ShardingSpec canonicals = one_axis_varied(
      axes, axis, canonical, [&](int b) { return gradient_placement(decisions_.value_placement(b, value)); });
  return gradient_scatter_overlap(grads, canonicals);
}

ParameterOverlap EdgePricer::gather_overlap(int axis, ir::ValueId value, int consumer, int operand,
                                            const Placement& produced, const Placement& wanted) const {
  const std::size_t axes = options_.mesh.size();
  const ShardingSpec held =
      one_axis_varied(axes, axis, produced, [&](int b) { return decisions_.value_placement(b, value); });
  const ShardingSpec read = one_axis_varied(axes, axis, wanted, [&](int b) {
    return decisions_.nodes[static_cast<std::size_t>(b)][static_cast<std::size_t>(consumer)]
        .inputs[static_cast<std::size_t>(operand)];
  });
  // The runtime issues the first group's gather at the program's start (runtime/
  // parameter_gathers.py): nothing of the forward runs before its reads, so it is exposed.
  // Not for a repeated block's reader: it stands for every layer's read, all but the first
  // of them beside the layer before (a model that starts with a block: block 0's gather is
  // priced hidden).
  const auto c = static_cast<std::size_t>(consumer);
  if (!facts_.folding.in_block[c] && facts_.units.of_node[c] == facts_.units.first_reading)
    return ParameterOverlap::Exposed;
  return forward_gather_overlap(held, read, facts_.folding.checkpointed(static_cast<std::size_t>(consumer)));
}

double EdgePricer::reshard_seconds(int axis, ir::ValueId value, const Placement& from, const Placement& to,
                                   double bytes, double latency_share) const {
  const auto ranks = axis_ranks(options_.mesh, axis);
  const Placement source = as_run(axis, value, from), target = as_run(axis, value, to);
  const double whole =
      reshard_time(facts_.model, facts_.cluster, ranks, source, target, static_cast<std::int64_t>(bytes));
  if (whole <= 0 || latency_share >= 1.0) return whole;
  // The latency part: the same collective on one byte.
  const double latency = reshard_time(facts_.model, facts_.cluster, ranks, source, target, 1);
  return whole - latency * (1.0 - latency_share);
}

double EdgePricer::parameter_latency_share(ir::ValueId value, int consumer, ParameterOverlap overlap,
                                           bool replicated_gradient, double bytes) const {
  if (replicated_gradient) return std::min(1.0, bytes / options_.bucket_bytes);
  if (overlap == ParameterOverlap::Exposed) return 1.0;
  const ir::Value& v = facts_.graph.value(value);
  const int unit = facts_.units.of_node[static_cast<std::size_t>(consumer)];
  auto it = facts_.units.elements.find({unit, v.type.shape.size() >= 2});
  return it != facts_.units.elements.end() && it->second > 0
             ? std::min(1.0, static_cast<double>(v.type.numel()) / it->second)
             : 1.0;
}

double EdgePricer::gradient_share(ir::ValueId value, const Placement& produced, const Placement& gradient) const {
  const auto v = static_cast<std::size_t>(value);
  // A replicated leaf's partial sums add up over its reads and are reduced once, in the
  // engine's buckets (transform/spmd_rewrite.cc: the canonical gradient kept Partial); a
  // sharded leaf's gradient is reduce-scattered at each read (a tied embedding held
  // vocabulary-parallel: once for the lookup, once for the head).
  if (!gradient.is_partial() || gradient.reduction != ops::Reduction::Sum || !produced.is_replicate() ||
      !is_leaf(facts_.graph.value(value)) || facts_.reads[v] <= 1)
    return 1.0;
  return 1.0 / facts_.reads[v];
}

Placement EdgePricer::reduced_gradient(ir::ValueId value, const Placement& produced, const Placement& gradient) const {
  const ir::Value& v = facts_.graph.value(value);
  if (gradient.is_replicate() && produced.is_replicate() && v.role == ir::ValueRole::Parameter &&
      facts_.requires_grad[static_cast<std::size_t>(value)] && facts_.reads[static_cast<std::size_t>(value)] > 1)
    return Placement::partial();
  return gradient;
}

Placement EdgePricer::as_run(int axis, ir::ValueId value, const Placement& p) const {
  if (axis < 0 || !p.is_shard() || !p.ratios.empty() || p.groups > 1) return p;
  const auto& shares = facts_.axis_speed_shares[static_cast<std::size_t>(axis)];
  const ir::TensorType& type = facts_.graph.value(value).type;
  if (shares.empty() || !type.batch_dim || p.dim != *type.batch_dim) return p;
  Placement uneven = p;
  uneven.ratios = shares;
  return uneven;
}

UnitGroupKey EdgePricer::unit_group_key(int consumer, ir::ValueId value, int kind) const {
  return std::tuple{facts_.units.of_node[static_cast<std::size_t>(consumer)], kind,
                    static_cast<int>(facts_.graph.value(value).type.dtype)};
}

std::map<UnitGroupKey, double> EdgePricer::unit_group_elements(int axis) const {
  const auto a = static_cast<std::size_t>(axis);
  std::map<UnitGroupKey, double> group_elements;
  std::set<std::tuple<int, int, ir::ValueId>> members;
  auto scattered = [&](const EdgeKey& key, ir::ValueId value, const Placement& produced, const Strategy& reader) {
    return facts_.requires_grad[static_cast<std::size_t>(value)] && !gradient_placement(produced).is_replicate() &&
           parameter_gradient_at(axis, value, key.consumer, key.operand, produced,
                                 reader.input_grads[static_cast<std::size_t>(key.operand)]) ==
               ParameterOverlap::BesideBackward;
  };
  for (const auto& [key, group] : facts_.edges) {
    const ir::Value& value = facts_.graph.value(group.value);
    if (value.role != ir::ValueRole::Parameter) continue;
    const Strategy& reader = decisions_.nodes[a][static_cast<std::size_t>(key.consumer)];
    const Placement produced = decisions_.value_placement(axis, group.value);
    const auto numel = static_cast<double>(value.type.numel());
    if (gather_overlap(axis, group.value, key.consumer, key.operand, produced,
                       reader.inputs[static_cast<std::size_t>(key.operand)]) == ParameterOverlap::BesideForward &&
        members.emplace(facts_.units.of_node[static_cast<std::size_t>(key.consumer)], 0, group.value).second)
      group_elements[unit_group_key(key.consumer, group.value, 0)] += numel;
    if (scattered(key, group.value, produced, reader) &&
        members.emplace(facts_.units.of_node[static_cast<std::size_t>(key.consumer)], 1, group.value).second)
      group_elements[unit_group_key(key.consumer, group.value, 1)] += numel;
  }
  return group_elements;
}


}  // namespace shardwise::search
