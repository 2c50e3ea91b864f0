#include "search/block_folding.h"

#include <algorithm>
#include <set>
#include <utility>

#include "analysis/repeated_blocks.h"
#include "analysis/saved_for_backward.h"
#include "analysis/selective_recompute.h"

namespace shardwise::search {

namespace {

bool is_leaf(const ir::Value& value) { return !value.producer.has_value(); }

// Marks the blocks' nodes, and those at or before each block's last node that saves for
// backward (torch.utils.checkpoint's early stop): program order is node order.
void mark_blocks(const analysis::RepeatedBlockGroup& layers, const analysis::SavedTensors& saved, BlockFolding& out) {
  for (const auto& block : layers.nodes) {
    const int number = static_cast<int>(out.checkpoint_of.size());
    out.checkpoint_of.push_back(-1);
    for (ir::NodeId id : block) {
      out.in_block[static_cast<std::size_t>(id)] = true;
      out.block_of[static_cast<std::size_t>(id)] = number;
    }
    std::vector<ir::NodeId> order(block.begin(), block.end());
    std::ranges::sort(order);
    bool later = false;
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      later = later || saved.saves_by_node[static_cast<std::size_t>(*it)];
      out.up_to_last_save[static_cast<std::size_t>(*it)] = later;
    }
  }
}

// Instance k's j-th node folds into instance 0's, where they are alike.
void fold_nodes(const ir::Graph& graph, const std::vector<std::optional<ops::DimRule>>& rules,
                const analysis::RepeatedBlockGroup& layers, BlockFolding& out) {
  const auto& first = layers.nodes.front();
  for (std::size_t k = 1; k < layers.nodes.size(); ++k) {
    const auto& block = layers.nodes[k];
    if (block.size() != first.size()) continue;
    for (std::size_t j = 0; j < block.size(); ++j) {
      const ir::Node& node = graph.node(block[j]);
      const ir::Node& rep = graph.node(first[j]);
      if (node.op != rep.op || node.inputs.size() != rep.inputs.size() ||
          rules[static_cast<std::size_t>(node.id)] != rules[static_cast<std::size_t>(rep.id)])
        continue;
      out.rep_node[static_cast<std::size_t>(node.id)] = rep.id;
      out.instances[static_cast<std::size_t>(rep.id)] += 1;
    }
  }
}

// A parameter or buffer read only at one position of one instance folds into the value read
// at that position of instance 0.
void fold_leaves(const ir::Graph& graph, BlockFolding& out) {
  std::vector<std::vector<std::pair<ir::NodeId, int>>> readers(graph.values().size());
  for (const ir::Node& node : graph.nodes())
    for (std::size_t i = 0; i < node.inputs.size(); ++i)
      readers[static_cast<std::size_t>(node.inputs[i])].emplace_back(node.id, static_cast<int>(i));
  for (const ir::Value& value : graph.values()) {
    if (!is_leaf(value) || value.role == ir::ValueRole::Input) continue;
    const auto& users = readers[static_cast<std::size_t>(value.id)];
    if (users.empty()) continue;
    std::optional<ir::ValueId> target;
    bool ok = true;
    for (const auto& [user, pos] : users) {
      ir::NodeId rep = out.rep_node[static_cast<std::size_t>(user)];
      if (rep == user) {
        ok = false;
        break;
      }
      ir::ValueId candidate = graph.node(rep).inputs[static_cast<std::size_t>(pos)];
      if (target && *target != candidate) ok = false;
      target = candidate;
    }
    if (!ok || !target) continue;
    const ir::Value& rep_value = graph.value(*target);
    if (!is_leaf(rep_value) || rep_value.type.shape != value.type.shape || rep_value.role != value.role) continue;
    out.rep_leaf[static_cast<std::size_t>(value.id)] = *target;
  }
}

// Checkpoints when recomputing: the largest activation each block reads from outside.
void find_block_inputs(const ir::Graph& graph, const analysis::RepeatedBlockGroup& blocks, BlockFolding& out) {
  for (const auto& block : blocks.nodes)
    if (const ir::ValueId in = analysis::block_checkpoint(graph, block); in >= 0) {
      out.block_inputs.push_back(in);
      out.checkpoint_of[static_cast<std::size_t>(out.block_of[static_cast<std::size_t>(block.front())])] = in;
    }
}

}  // namespace

BlockFolding fold_repeated_blocks(const ir::Graph& graph, const std::vector<std::optional<ops::DimRule>>& rules,
                                  const analysis::SavedTensors& saved, plan::Recompute recompute) {
  const auto num_nodes = graph.nodes().size();
  BlockFolding out;
  out.recompute = recompute;
  out.rep_node.resize(num_nodes);
  for (std::size_t i = 0; i < num_nodes; ++i) out.rep_node[i] = static_cast<ir::NodeId>(i);
  out.instances.assign(num_nodes, 1.0);
  out.in_block.assign(num_nodes, false);
  out.block_of.assign(num_nodes, -1);
  out.up_to_last_save.assign(num_nodes, false);
  out.selective_kept = analysis::kept_by_selective_recompute(graph);
  out.rep_leaf.assign(graph.values().size(), -1);
  for (const ir::Value& value : graph.values())
    if (is_leaf(value)) out.rep_leaf[static_cast<std::size_t>(value.id)] = value.id;

  // The largest group (a transformer's layers) folds; every group's blocks are checkpointed
  // (DeepSeek-V3's dense first layers as well as its mixture-of-experts layers), as the
  // runtime runs them (transform/spmd_rewrite.cc, mark_recompute).
  const std::vector<analysis::RepeatedBlockGroup> groups = analysis::find_repeated_blocks(graph);
  const analysis::RepeatedBlockGroup* layers = analysis::largest_group(groups);
  if (layers == nullptr) return out;
  for (const analysis::RepeatedBlockGroup& group : groups) {
    mark_blocks(group, saved, out);
    find_block_inputs(graph, group, out);
  }
  fold_nodes(graph, rules, *layers, out);
  fold_leaves(graph, out);
  return out;
}

bool BlockFolding::checkpointed(std::size_t node) const {
  return recompute != plan::Recompute::None && in_block[node];
}

bool BlockFolding::kept_whole(std::size_t node) const {
  return recompute == plan::Recompute::Selective && in_block[node] && selective_kept[node];
}

bool BlockFolding::recomputed(std::size_t node) const { return checkpointed(node) && !kept_whole(node); }

bool BlockFolding::runs_again(std::size_t node) const { return checkpointed(node) && up_to_last_save[node]; }

bool BlockFolding::reruns_forward(std::size_t node) const { return recomputed(node) && up_to_last_save[node]; }

}  // namespace shardwise::search
