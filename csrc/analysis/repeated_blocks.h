// Repeated blocks: sibling modules that run the same computation (the layers of a
// transformer), found from the graph alone, with no model-specific names.
//
// For every module path P some node runs under, P's block is the nodes whose module path
// is P or starts with "P.", in node order. A block's fingerprint is its node sequence with,
// per node: the op, attributes, output types, module path relative to P, and each operand
// as either "output k of the block's j-th node" or an external value: a parameter or buffer
// under P by its name relative to P and its type, one outside P (tied, shared) by its full
// name; any other value (graph input, activation, constant) by its type and its number in
// order of first use in the block, so the first layer reading the graph input matches the
// next reading the previous layer's output. Sibling modules
// (same parent path) with equal fingerprints form a group when there are at least two.
//
// Only maximal groups are reported: a group whose parent lies inside a member of another
// reported group (the two layer norms inside each GPT-2 layer) is left out. Groups come in
// order of their first node; members too.
//
// Worked example: GPT-2 (12 layers) gives one group
//   {parent "transformer.h", module_paths {"transformer.h.0", ..., "transformer.h.11"},
//    nodes {{ids of layer 0}, ..., {ids of layer 11}}}
//
// Cost: each node is fingerprinted once per enclosing module, O(nodes x depth x operands);
// a 48-layer GPT-2 graph (about 3,000 nodes) takes a few milliseconds.
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"

namespace shardwise::analysis {

struct RepeatedBlockGroup {
  std::string parent;                          // "" for the root module
  std::vector<std::string> module_paths;       // the siblings, in order of first node
  std::vector<std::vector<ir::NodeId>> nodes;  // each sibling's block, in node order

  friend bool operator==(const RepeatedBlockGroup&, const RepeatedBlockGroup&) = default;
};

std::vector<RepeatedBlockGroup> find_repeated_blocks(const ir::Graph& graph);

// The group with the most nodes in all its blocks (a transformer's layers), or nullptr when
// there is none; the first on a tie. Points into `groups`.
const RepeatedBlockGroup* largest_group(const std::vector<RepeatedBlockGroup>& groups);

// A block's checkpoint under recomputation: the largest activation (a value some node makes)
// it reads from outside itself, -1 when it reads none (the first layer reading only the graph's
// input). What a recomputed block keeps from its forward to its backward.
ir::ValueId block_checkpoint(const ir::Graph& graph, const std::vector<ir::NodeId>& block);

}  // namespace shardwise::analysis
