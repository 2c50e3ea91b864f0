#include "transform/collective_matmul.h"

#include <algorithm>
#include <string>
#include <string_view>
#include <variant>

#include "transform/async_gradients.h"
#include "transform/rank_graph.h"

namespace shardwise::transform {
namespace {

constexpr std::string_view kGatherAttr = "shardwise.gather_matmul";
constexpr std::string_view kScatterAttr = "shardwise.matmul_scatter";
constexpr std::string_view kWholeAttr = "shardwise.whole";
constexpr std::string_view kMatmulOverlap = "matmul";

// One even, exposed collective of `op` along a dim (its blocks the runtime's ring takes and
// joins: runtime/collective_matmul.py, _Blocks).
bool one_even(const ir::Graph& graph, const std::vector<ir::NodeId>& steps, std::string_view op) {
  if (steps.size() != 1) return false;
  const ir::Node& step = graph.node(steps[0]);
  const std::string* overlap = step_overlap(step);
  return step.op == op && !step.attrs.contains("ratios") && step_action(step).dim >= 0 && overlap != nullptr &&
         *overlap == search::parameter_overlap_name(search::ParameterOverlap::Exposed);
}

// The region's steps are one ring on `node`'s contraction: one even `forward` collective along
// a row dim, and none or one even `backward` one on the same axis, dim and groups.
bool one_ring(const ir::Graph& graph, const ir::Node& node, const StepRegion& region, std::string_view forward,
              std::string_view backward) {
  if (!one_even(graph, region.forward, forward)) return false;
  const ReshardAction f = step_action(graph.node(region.forward[0]));
  if (!search::collective_matmul_rows(graph, node, f.dim)) return false;
  if (region.backward.empty()) return true;
  if (!one_even(graph, region.backward, backward)) return false;
  const ReshardAction b = step_action(graph.node(region.backward[0]));
  return b.axis == f.axis && b.dim == f.dim && b.groups == f.groups;
}

// A contraction the runtime calls on local operands, with no other collective inside it: a
// call whose operand's gradient all-reduce runs in its backward (async-gradient, the pass
// before) is one module of the runtime's, which a ring cannot also be.
int local_contraction_input(const ir::Graph& graph, const ir::Node& node) {
  if (node.attrs.contains(std::string(kWholeAttr)) || async_gradient_operand(node) >= 0) return -1;
  return search::collective_matmul_input(graph, node);
}

void mark(ir::Graph& graph, const StepRegion& region) {
  for (const auto* steps : {&region.forward, &region.backward})
    for (ir::NodeId id : *steps) graph.mutable_attrs(id)["overlap"] = std::string(kMatmulOverlap);
}

// The gather rings: a contraction, first to read its operand's region.
void fuse_gathers(ir::Graph& graph) {
  const std::vector<std::vector<ir::NodeId>> users = graph.users_by_value();
  for (const ir::Node& node : graph.nodes()) {
    const int input = local_contraction_input(graph, node);
    if (input < 0 || node.attrs.contains(std::string(kGatherAttr))) continue;
    const ir::ValueId value = node.inputs[static_cast<std::size_t>(input)];
    const StepRegion region = region_ending_at(graph, value);
    if (region.forward.empty() || graph.value(region.source).role == ir::ValueRole::Parameter) continue;
    // The first operand in node order that reads the region's value.
    const std::vector<ir::NodeId>& readers = users[static_cast<std::size_t>(value)];
    std::size_t first = 0;
    while (graph.node(readers[0]).inputs[first] != value) ++first;
    if (readers[0] != node.id || first != static_cast<std::size_t>(input)) continue;
    if (!one_ring(graph, node, region, "shardwise::all_gather", "shardwise::reduce_scatter")) continue;
    graph.mutable_attrs(node.id)[std::string(kGatherAttr)] = static_cast<std::int64_t>(input);
    mark(graph, region);
  }
}

// The region of the step nodes that alone read `value`, one after another (none: no steps).
StepRegion sole_region_from(const ir::Graph& graph, const std::vector<std::vector<ir::NodeId>>& users,
                            ir::ValueId value) {
  ir::ValueId v = value;
  for (const auto* next = &users[static_cast<std::size_t>(v)];
       next->size() == 1 && is_step_node(graph.node(next->front())); next = &users[static_cast<std::size_t>(v)])
    v = graph.node(next->front()).outputs[0];
  return region_ending_at(graph, v);
}

// The scatter rings: a contraction whose output one operand reads through one region.
void fuse_scatters(ir::Graph& graph) {
  const std::vector<std::vector<ir::NodeId>> users = graph.users_by_value();
  const std::vector<ir::ValueId>& outputs = graph.outputs();
  auto output = [&](ir::ValueId v) { return std::find(outputs.begin(), outputs.end(), v) != outputs.end(); };
  for (const ir::Node& node : graph.nodes()) {
    const int input = local_contraction_input(graph, node);
    if (input < 0 || node.attrs.contains(std::string(kGatherAttr))) continue;
    const StepRegion region = sole_region_from(graph, users, node.outputs[0]);
    if (region.source != node.outputs[0] || region.forward.empty() || output(region.source)) continue;
    // No value of the chain leaves the graph.
    bool leaves = false;
    for (const auto* steps : {&region.forward, &region.backward})
      for (ir::NodeId id : *steps) leaves = leaves || output(graph.node(id).outputs[0]);
    if (leaves) continue;
    const ir::ValueId v = region_end(graph, region);
    const std::vector<ir::NodeId>& readers = users[static_cast<std::size_t>(v)];
    if (readers.size() != 1 || std::count(graph.node(readers[0]).inputs.begin(), graph.node(readers[0]).inputs.end(),
                                          v) != 1)
      continue;
    if (!one_ring(graph, node, region, "shardwise::reduce_scatter", "shardwise::all_gather")) continue;
    graph.mutable_attrs(node.id)[std::string(kScatterAttr)] = static_cast<std::int64_t>(input);
    mark(graph, region);
  }
}

bool ring_marked(const ir::Graph& graph, const StepRegion& region) {
  if (region.forward.empty()) return false;
  const std::string* overlap = step_overlap(graph.node(region.forward[0]));
  return overlap != nullptr && *overlap == kMatmulOverlap;
}

}  // namespace

void fuse_collective_matmuls(ir::Graph& rank_graph) {
  fuse_gathers(rank_graph);
  fuse_scatters(rank_graph);
}

search::MatmulCollective operand_ring(const ir::Graph& rank_graph, const ir::Node& reader, std::size_t operand) {
  if (auto it = reader.attrs.find(std::string(kGatherAttr));
      it != reader.attrs.end() && std::get<std::int64_t>(it->second) == static_cast<std::int64_t>(operand))
    return search::MatmulCollective::Gather;
  const StepRegion region = region_ending_at(rank_graph, reader.inputs.at(operand));
  const auto producer = rank_graph.value(region.source).producer;
  if (producer && ring_marked(rank_graph, region) && rank_graph.node(*producer).attrs.contains(std::string(kScatterAttr)))
    return search::MatmulCollective::Scatter;
  return search::MatmulCollective::None;
}

std::optional<RingSteps> scatter_ring(const ir::Graph& rank_graph, const ir::Node& node) {
  if (!node.attrs.contains(std::string(kScatterAttr))) return std::nullopt;
  const StepRegion region = sole_region_from(rank_graph, rank_graph.users_by_value(), node.outputs[0]);
  RingSteps ring;
  for (ir::NodeId id : region.forward) ring.forward.push_back(step_action(rank_graph.node(id)));
  for (auto it = region.backward.rbegin(); it != region.backward.rend(); ++it)
    ring.backward.push_back(step_action(rank_graph.node(*it)));
  return ring;
}

}  // namespace shardwise::transform
