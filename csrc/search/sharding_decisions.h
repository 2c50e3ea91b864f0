// The decisions of one SPMD search candidate: every node's strategy and every leaf's
// placement (and ZeRO) on every mesh axis. ShardingModel changes them (solve_axis, adopt);
// the parts that price them (sharding_strategies.h, sharding_edges.h, sharding_memory.h)
// read them, most often with one axis' decision replaced by a candidate: a choice of one
// axis is priced beside what the other axes have decided.
#pragma once

#include <vector>

#include "ir/graph.h"
#include "search/placement.h"
#include "search/strategy.h"

namespace shardwise::search {

// A leaf's decision on one axis.
struct LeafChoice {
  Placement placement;
  bool zero = false;  // parameters only: optimizer state sharded over the axis (ZeRO-1)

  friend bool operator==(const LeafChoice&, const LeafChoice&) = default;
};

struct ShardingDecisions {
  // Every node replicated on every axis (replicate_strategy), every leaf whole.
  ShardingDecisions(const ir::Graph& graph, std::vector<int> mesh);

  int axis_size(int axis) const { return mesh[static_cast<std::size_t>(axis)]; }
  // The node's strategy on axis `b` while `axis` takes `choice` (-1: none replaced).
  const Strategy& strategy_on(int b, ir::NodeId node, int axis, const Strategy& choice) const {
    return b == axis ? choice : nodes[static_cast<std::size_t>(b)][static_cast<std::size_t>(node)];
  }
  // The leaf's choice on axis `b` while `axis` takes `choice`.
  const LeafChoice& leaf_on(int b, ir::ValueId leaf, int axis, const LeafChoice& choice) const {
    return b == axis ? choice : leaves[static_cast<std::size_t>(b)][static_cast<std::size_t>(leaf)];
  }
  // How `value` is held on `axis`: its leaf's placement, or its producer's output placement.
  Placement value_placement(int axis, ir::ValueId value) const;
  // Product of held fractions over the axes from first_axis on, `axis` excluded (-1: none).
  double held_except(ir::ValueId value, int axis, int first_axis = 0) const;
  double held_all(ir::ValueId value) const { return held_except(value, -1); }

  const ir::Graph* graph;                       // a pointer: decisions are copied and assigned
  std::vector<int> mesh;                        // axis sizes, outermost first
  std::vector<std::vector<Strategy>> nodes;     // [axis][node]
  std::vector<std::vector<LeafChoice>> leaves;  // [axis][value]
};

}  // namespace shardwise::search
