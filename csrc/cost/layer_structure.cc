// The evaluator's view of a graph's layers; the model is documented in layer_structure.h.
#include "cost/layer_structure.h"

#include <algorithm>
#include <numeric>

#include "analysis/batch_dim.h"
#include "analysis/fp8_linears.h"
#include "analysis/gradient_flow.h"
#include "analysis/saved_for_backward.h"
#include "analysis/selective_recompute.h"
#include "analysis/weight_gradient_split.h"
#include "ops/experts.h"
#include "ops/op_table.h"

namespace shardwise::cost {
namespace {

ops::FlopsKind kind_of(const ir::Node& node) {
  const ops::OpSpec* spec = ops::OpTable::builtin().find(node.op);
  return spec != nullptr ? spec->flops.kind : ops::FlopsKind::Zero;
}

// A contraction reading a weight matrix: a candidate end of a tensor-parallel group.
bool weighted_contraction(const ir::Graph& graph, const ir::Node& node) {
  if (kind_of(node) != ops::FlopsKind::Contraction) return false;
  return std::any_of(node.inputs.begin(), node.inputs.end(), [&](ir::ValueId v) {
    const ir::Value& value = graph.value(v);
    return value.role == ir::ValueRole::Parameter && value.type.rank() >= 2;
  });
}

// Ops that need the whole feature dimension: a tensor-parallel region stops before them.
bool needs_whole_features(const ir::Node& node) { return kind_of(node) == ops::FlopsKind::PerInputElement; }

using Users = std::vector<std::vector<ir::NodeId>>;

Users users_of(const ir::Graph& graph) {
  Users users(graph.values().size());
  for (const ir::Node& node : graph.nodes())
    for (ir::ValueId in : node.inputs) users[static_cast<std::size_t>(in)].push_back(node.id);
  return users;
}

// Tensor-parallel groups inside one layer (see layer_structure.h).
void find_groups(const ir::Graph& graph, const std::vector<ir::NodeId>& layer, const Users& users, LayerStructure& out) {
  std::set<ir::NodeId> in_layer(layer.begin(), layer.end());
  std::map<ir::NodeId, ir::NodeId> group_of;  // split node -> its group's row end
  for (ir::NodeId first : layer) {
    const ir::Node& start = graph.node(first);
    if (!weighted_contraction(graph, start) || out.layer_split.contains(first)) continue;
    std::set<ir::NodeId> between, partners;
    std::vector<ir::NodeId> frontier;
    auto push_users = [&](const ir::Node& n) {
      for (ir::ValueId v : n.outputs)
        for (ir::NodeId u : users[static_cast<std::size_t>(v)])
          if (in_layer.contains(u)) frontier.push_back(u);
    };
    push_users(start);
    while (!frontier.empty()) {
      ir::NodeId id = frontier.back();
      frontier.pop_back();
      const ir::Node& n = graph.node(id);
      if (weighted_contraction(graph, n)) {
        partners.insert(id);
        continue;
      }
      if (needs_whole_features(n) || between.contains(id)) continue;
      between.insert(id);
      push_users(n);
    }
    if (partners.size() != 1) continue;
    const ir::NodeId row = *partners.begin();
    auto existing = out.layer_split.find(row);
    // The end may already close a group (the second of q/k/v, SwiGLU's up projection):
    // `first` joins it when its region lies inside that group's.
    if (existing != out.layer_split.end() && existing->second != TensorSplit::Row) continue;
    bool clash = std::any_of(between.begin(), between.end(), [&](ir::NodeId b) {
      auto g = group_of.find(b);
      return g != group_of.end() && g->second != row;
    });
    if (clash) continue;
    out.layer_split[first] = TensorSplit::Column;
    group_of[first] = row;
    if (existing == out.layer_split.end()) {
      out.layer_split[row] = TensorSplit::Row;
      group_of[row] = row;
      out.row_ends.push_back(row);
    }
    for (ir::NodeId b : between) {
      out.layer_split[b] = TensorSplit::All;
      group_of[b] = row;
    }
  }
}

// Outside the layers: weighted contractions column-parallel, everything after them 1/t.
void outside_splits(const ir::Graph& graph, const std::vector<ir::NodeId>& nodes, const Users& users,
                    std::map<ir::NodeId, TensorSplit>& split) {
  std::set<ir::NodeId> here(nodes.begin(), nodes.end());
  std::vector<ir::NodeId> frontier;
  for (ir::NodeId id : nodes) {
    if (!weighted_contraction(graph, graph.node(id))) continue;
    split[id] = TensorSplit::Column;
    frontier.push_back(id);
  }
  while (!frontier.empty()) {
    ir::NodeId id = frontier.back();
    frontier.pop_back();
    for (ir::ValueId v : graph.node(id).outputs)
      for (ir::NodeId u : users[static_cast<std::size_t>(v)])
        if (here.contains(u) && !split.contains(u)) {
          split[u] = TensorSplit::All;
          frontier.push_back(u);
        }
  }
}

// Parameters that nodes of `first` and nodes of `second` both read (a tied embedding).
std::set<ir::ValueId> parameters_read_by_both(const ir::Graph& graph, const std::vector<ir::NodeId>& first,
                                              const std::vector<ir::NodeId>& second) {
  std::set<ir::ValueId> read, both;
  for (ir::NodeId id : first)
    for (ir::ValueId in : graph.node(id).inputs)
      if (graph.value(in).role == ir::ValueRole::Parameter) read.insert(in);
  for (ir::NodeId id : second)
    for (ir::ValueId in : graph.node(id).inputs)
      if (read.contains(in)) both.insert(in);
  return both;
}

// Parameters a column/row split shards (weights; a row-parallel bias stays whole).
void note_params(const ir::Graph& graph, const std::map<ir::NodeId, TensorSplit>& split,
                 std::set<ir::ValueId>& sharded) {
  for (const auto& [id, s] : split) {
    if (s != TensorSplit::Column && s != TensorSplit::Row) continue;
    for (ir::ValueId in : graph.node(id).inputs) {
      const ir::Value& value = graph.value(in);
      if (value.role == ir::ValueRole::Parameter && (s == TensorSplit::Column || value.type.rank() >= 2))
        sharded.insert(in);
    }
  }
}

}  // namespace

LayerStructure with_whole_experts(LayerStructure structure, const ir::Graph& graph) {
  std::erase_if(structure.layer_split, [&](const auto& entry) { return ops::is_experts(graph.node(entry.first)); });
  std::erase_if(structure.row_ends, [&](ir::NodeId id) { return ops::is_experts(graph.node(id)); });
  for (const ir::Node& node : graph.nodes())
    if (ops::is_experts(node))
      for (std::size_t i = 0; i < node.inputs.size(); ++i)
        if (ops::is_expert_weight(node, i)) structure.sharded_params.erase(node.inputs[i]);
  return structure;
}

LayerStructure find_layer_structure(const ir::Graph& graph) {
  LayerStructure out;
  std::vector<analysis::RepeatedBlockGroup> groups = analysis::find_repeated_blocks(graph);
  if (const analysis::RepeatedBlockGroup* largest = analysis::largest_group(groups)) out.layers = *largest;

  out.outer_block.assign(graph.nodes().size(), -1);
  for (const analysis::RepeatedBlockGroup& group : groups) {
    if (out.layers && group == *out.layers) continue;
    for (const auto& block : group.nodes) {
      for (ir::NodeId id : block) out.outer_block[static_cast<std::size_t>(id)] = static_cast<int>(out.outer_block_checkpoint.size());
      out.outer_block_checkpoint.push_back(analysis::block_checkpoint(graph, block));
    }
  }

  std::set<ir::NodeId> in_layers;
  if (out.layers)
    for (const auto& b : out.layers->nodes) in_layers.insert(b.begin(), b.end());
  const ir::NodeId first_layer_node = out.layers ? out.layers->nodes.front().front() : 0;
  for (const ir::Node& node : graph.nodes()) {
    if (in_layers.contains(node.id)) continue;
    (out.layers && node.id < first_layer_node ? out.pre : out.post).push_back(node.id);
  }

  Users users = users_of(graph);
  if (out.layers) find_groups(graph, out.layers->nodes.front(), users, out);
  // A mixture of experts' experts op splits its experts over the t ranks (the tokens are on
  // every tensor rank already): each rank computes its experts' share of every token, a partial
  // sum all-reduced as a row-parallel end's (the SPMD search's split of the experts on the
  // tensor axis: what a searched stage layout runs; where t does not divide the experts it
  // prices that layout's own choice).
  if (out.layers)
    for (ir::NodeId id : out.layers->nodes.front())
      if (ops::is_experts(graph.node(id)) && !out.layer_split.contains(id)) {
        out.layer_split[id] = TensorSplit::Row;
        out.row_ends.push_back(id);
      }
  outside_splits(graph, out.post, users, out.outside_split);
  outside_splits(graph, out.pre, users, out.outside_split);
  for (auto [nodes, lookups] : {std::pair{&out.pre, &out.pre_lookups}, std::pair{&out.post, &out.post_lookups}})
    for (ir::NodeId id : *nodes) {
      const ir::Node& node = graph.node(id);
      const ops::OpSpec* spec = ops::OpTable::builtin().find(node.op);
      if (spec == nullptr || !spec->lookup || node.inputs.empty() || node.outputs.empty()) continue;
      const ir::Value& table = graph.value(node.inputs[0]);
      if (table.role != ir::ValueRole::Parameter || table.type.rank() != 2) continue;
      out.sharded_params.insert(node.inputs[0]);
      const ir::TensorType& type = graph.value(node.outputs[0]).type;
      lookups->push_back({static_cast<double>(type.bytes()), type.batch_dim.has_value()});
    }
  note_params(graph, out.layer_split, out.sharded_params);
  note_params(graph, out.outside_split, out.sharded_params);

  if (out.layers)
    for (ir::NodeId id : out.layers->nodes.front()) {
      const ir::Node& node = graph.node(id);
      if (kind_of(node) != ops::FlopsKind::Attention) continue;
      for (std::size_t i = 0; i < std::min<std::size_t>(3, node.inputs.size()); ++i) {
        const ir::TensorType& type = graph.value(node.inputs[i]).type;
        if (type.rank() >= 4)  // [batch..., heads, seq, head_dim]
          out.attention_heads = std::gcd(out.attention_heads, static_cast<int>(type.shape[type.shape.size() - 3]));
      }
    }

  out.pre_and_post_params = parameters_read_by_both(graph, out.pre, out.post);
  out.selective_kept = analysis::kept_by_selective_recompute(graph);
  out.gradient_flow = analysis::gradient_flow(graph);
  out.compiled = analysis::compiled_fusion(graph);
  {  // what autograd keeps, by node: eager, and compiled
    const std::vector<std::int64_t> eager = analysis::saved_for_backward(graph);
    const std::vector<std::int64_t> compiled = analysis::compiled_saved_bytes(graph, eager, out.compiled);
    out.activation_bytes.assign(graph.nodes().size(), 0);
    out.compiled_activation_bytes.assign(graph.nodes().size(), 0);
    for (const ir::Node& node : graph.nodes()) {
      for (ir::ValueId v : node.outputs) {
        out.activation_bytes[static_cast<std::size_t>(node.id)] += eager[static_cast<std::size_t>(v)];
        out.compiled_activation_bytes[static_cast<std::size_t>(node.id)] += compiled[static_cast<std::size_t>(v)];
      }
    }
  }
  out.weight_gradient_held = analysis::weight_gradient_held_bytes(graph);
  {  // FP8 linears where the async-gradient rule's per-node part holds (the split says the rest)
    const std::vector<std::vector<ir::NodeId>> users = graph.users_by_value();
    out.async_gradient_site.assign(graph.nodes().size(), false);
    for (const ir::Node& node : graph.nodes()) {
      const auto linear = analysis::fp8_linear(graph, node);
      if (!linear) continue;
      const ir::ValueId x = node.inputs[linear->input], w = node.inputs[linear->weight];
      const auto xi = static_cast<std::size_t>(x);
      out.async_gradient_site[static_cast<std::size_t>(node.id)] =
          graph.value(x).producer.has_value() && out.gradient_flow[xi] &&
          out.gradient_flow[static_cast<std::size_t>(w)] && users[xi].size() == 1 &&
          std::count(node.inputs.begin(), node.inputs.end(), x) == 1;
    }
  }
  out.graph_batch = static_cast<int>(std::max<std::int64_t>(1, analysis::input_batch(graph)));

  // The layer's input (the residual stream): the batched activation its first node reads
  // from outside the layer. Kept per layer under recomputation, sent between stages.
  if (out.layers) {
    const std::vector<ir::NodeId>& layer = out.layers->nodes.front();
    std::set<ir::NodeId> first(layer.begin(), layer.end());
    for (ir::ValueId in : graph.node(layer.front()).inputs) {
      const ir::Value& value = graph.value(in);
      const auto bytes = static_cast<double>(value.type.bytes());
      if (value.role == ir::ValueRole::Activation && !first.contains(*value.producer) &&
          (out.layer_input < 0 || bytes > out.layer_input_bytes)) {
        out.layer_input_bytes = bytes;
        out.layer_input = in;
      }
    }
  }
  return out;
}

}  // namespace shardwise::cost
