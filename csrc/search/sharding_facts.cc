#include "search/sharding_facts.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <numeric>
#include <utility>

#include "analysis/batch_dim.h"
#include "analysis/gradient_flow.h"
#include "analysis/saved_for_backward.h"
#include "analysis/state_values.h"
#include "search/sharding_options.h"
#include "search/sharding_strategies.h"
#include "support/error.h"

namespace shardwise::search {

namespace {

// The bytes of the floating dtype most of the graph's parameter elements are in (its
// activations' where it has no floating parameter): what the model computes in as captured.
double graph_float_bytes(const ir::Graph& graph) {
  std::map<std::int64_t, std::int64_t> elements;  // element bytes -> parameter elements
  for (bool parameters : {true, false}) {
    for (const ir::Value& value : graph.values()) {
      const bool wanted = parameters ? value.role == ir::ValueRole::Parameter : value.role == ir::ValueRole::Activation;
      if (wanted && ir::is_floating(value.type.dtype)) elements[ir::dtype_bytes(value.type.dtype)] += value.type.numel();
    }
    if (!elements.empty()) break;
  }
  std::int64_t bytes = 4, most = -1;
  for (const auto& [size, count] : elements)
    if (count > most) bytes = size, most = count;
  return static_cast<double>(bytes);
}

using support::ValidationError;

bool scales_with_batch(const ir::Value& value) {
  return value.role == ir::ValueRole::Activation || value.role == ir::ValueRole::Input;
}

// The pace and the scale: the slowest device, the batch the capture traced against the plan's,
// each axis' balance of speeds, the memory constants and the FP8 linears of the precision.
void price_devices_and_batch(const ShardingModelOptions& options, ShardingFacts& facts) {
  const cost::Cluster& cluster = facts.cluster;
  const ir::Graph& graph = facts.graph;
  const int axes = static_cast<int>(options.mesh.size());
  cluster.require_precision(options.precision, "spmd search");
  facts.device = &cluster.device_of(0);
  for (const cost::DeviceType& type : cluster.device_types())
    if (type.peak_flops.at(options.precision) < facts.device->peak_flops.at(options.precision)) facts.device = &type;
  const std::int64_t b0 = analysis::input_batch(graph);
  // A batch dim of size 1 has no index in the rules (a unit dim is tied to none), so nothing
  // could split the batch: say so rather than return a plan that never shards it.
  if (b0 == 1 && options.global_batch > 1 && options.require_batch_index)
    throw ValidationError(fmt::format(
        "spmd search: the graph was captured at batch 1; capture it with a batch of at least 2 (the batch size "
        "does not matter otherwise: the search scales it to global_batch {})",
        options.global_batch));
  facts.batch_scale = b0 > 0 ? static_cast<double>(options.global_batch) / static_cast<double>(b0) : 1.0;
  facts.batch_traced = b0 > 1;
  // Peak rate at the plan's precision stands for a device's speed, as `device` does: every
  // group along an axis is alike in a cluster description (a run of devices per node), so
  // axis_ranks' first group stands for all.
  for (int b = 0; b < axes; ++b) {
    std::vector<double> speeds;
    for (int r : axis_ranks(options.mesh, b)) speeds.push_back(cluster.device_of(r).peak_flops.at(options.precision));
    const double sum = std::accumulate(speeds.begin(), speeds.end(), 0.0);
    const double slowest = *std::min_element(speeds.begin(), speeds.end());
    facts.axis_balance.push_back(sum > 0 ? static_cast<double>(speeds.size()) * slowest / sum : 1.0);
    if (facts.axis_balance.back() < 1.0)
      for (double& speed : speeds) speed /= sum;  // each rank's share of the axis' speed
    else
      speeds.clear();  // even
    facts.axis_speed_shares.push_back(std::move(speeds));
  }
  const cost::Precision states = cost::model_state_precision(options.precision, graph);
  facts.memory = options.memory.value_or(cost::memory_constants(states));
  facts.float_bytes = states == cost::Precision::F32 || states == cost::Precision::TF32 ? 4 : 2;
  facts.float_scale = facts.float_bytes / graph_float_bytes(graph);
  if (options.precision == cost::Precision::FP8)
    for (const ir::Node& node : graph.nodes()) facts.fp8_linears.push_back(analysis::fp8_linear(graph, node));
  if (options.compile) facts.compiled = analysis::compiled_fusion(graph);
}

// Per value what autograd saves of it, how often it is read and whether a gradient flows
// into it.
void trace_gradient_flow(const analysis::SavedTensors& saved, ShardingFacts& facts) {
  const ir::Graph& graph = facts.graph;
  const auto num_values = graph.values().size();
  facts.saved.assign(num_values, 0.0);
  for (const ir::Value& value : graph.values()) {
    const std::int64_t bytes = value.type.bytes();
    const auto v = static_cast<std::size_t>(value.id);
    if (bytes > 0) facts.saved[v] = static_cast<double>(saved.bytes[v]) / static_cast<double>(bytes);
  }
  // Reads per value: a leaf read n times sums n partial gradients before one reduction.
  facts.reads.assign(num_values, 0.0);
  for (const ir::Node& node : graph.nodes())
    for (ir::ValueId in : node.inputs) facts.reads[static_cast<std::size_t>(in)] += 1;
  // Gradients flow into floating parameters and everything computed from them.
  facts.requires_grad = analysis::gradient_flow(graph);
  facts.from_state = analysis::state_values(graph);
}

}  // namespace

std::vector<int> axis_ranks(const std::vector<int>& mesh, int axis) {
  int stride = 1;
  for (std::size_t b = static_cast<std::size_t>(axis) + 1; b < mesh.size(); ++b) stride *= mesh[b];
  std::vector<int> ranks;
  for (int k = 0; k < mesh[static_cast<std::size_t>(axis)]; ++k) ranks.push_back(k * stride);
  return ranks;
}

ShardingFacts::ShardingFacts(const ir::Graph& graph, const cost::Cluster& cluster, const cost::CostModel& model,
                             const ShardingModelOptions& options)
    : graph(graph), cluster(cluster), model(model) {
  int world = 1;
  for (int size : options.mesh) world *= size;
  if (world != cluster.world_size())
    throw ValidationError(fmt::format("spmd search: mesh of {} ranks on a cluster of {}", world, cluster.world_size()));
  // Each step reads what the ones before it set.
  price_devices_and_batch(options, *this);
  analysis::SavedTensors saved_tensors = analysis::saved_tensors(graph);
  if (options.compile) saved_tensors.bytes = analysis::compiled_saved_bytes(graph, saved_tensors.bytes, compiled);
  trace_gradient_flow(saved_tensors, *this);
  rules = rules_at_batch(graph, batch_scale);
  folding = fold_repeated_blocks(graph, rules, saved_tensors, options.recompute);
  units = count_parameter_units(graph);
  strided = strided_sizes(rules);
  edges = group_edges(graph, folding, rules);
}

double ShardingFacts::value_bytes(ir::ValueId value) const {
  const ir::Value& v = graph.value(value);
  // A floating value scaled by the plan's precision against the graph's, never wider than
  // its own dtype or the plan's (a bf16 graph's float32 upcast stays 4 bytes in f32).
  const double own = static_cast<double>(ir::dtype_bytes(v.type.dtype));
  const double element = ir::is_floating(v.type.dtype) ? std::min(own * float_scale, std::max(own, float_bytes)) : own;
  return value_elements(value) * element;
}

double ShardingFacts::value_elements(ir::ValueId value) const {
  const ir::Value& v = graph.value(value);
  const double elements = static_cast<double>(v.type.numel());
  // An activation without a batch dim (a position embedding's [1, s, h] rows, a causal mask,
  // a rotary table) is the same size at every batch; where the capture's batch of 1 left the
  // batch dims untraced (batch_dim.h ties no index to a unit dim), every activation scales.
  if (!scales_with_batch(v) || (batch_traced && !v.type.batch_dim)) return elements;
  return elements * batch_scale;
}

}  // namespace shardwise::search
