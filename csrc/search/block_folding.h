// The repeated blocks of a graph (analysis/repeated_blocks.h: a transformer's layers) folded
// into their first instance, so that the SPMD search decides a layer once and every layer
// takes its decisions; and which of their nodes a recomputation runs again.
//
// Folding: the largest group's instance k > 0 has its j-th node stand as instance 0's j-th
// (same op, operand count and rule; a block of another size is left unfolded), which then
// counts one more instance. A parameter or buffer read only at one position of folded nodes
// folds into the leaf instance 0 reads there (same shape and role). Every other node and leaf
// stands for itself.
//
// Recomputation (plan::Recompute): the blocks are the checkpointed regions. A block's
// recomputed forward ends at its last node that saves for backward (torch.utils.checkpoint's
// early stop); selective recomputation keeps the outputs of the products and fused attention
// (analysis/selective_recompute.h) and runs the rest again. The checkpoints are the largest
// activation each block reads from outside it.
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include "ir/graph.h"
#include "ops/dim_rule.h"
#include "plan/plan.h"

namespace shardwise::analysis {
struct SavedTensors;
}  // namespace shardwise::analysis

namespace shardwise::search {

struct BlockFolding {
  std::vector<ir::NodeId> rep_node;    // per node: the node standing for it (itself when unfolded)
  std::vector<ir::ValueId> rep_leaf;   // per value: the leaf standing for it (leaves), else -1
  std::vector<double> instances;       // per node: instances folded into it (representatives)
  std::vector<bool> in_block;          // per node
  std::vector<bool> up_to_last_save;   // per node of a block: at or before its last node that saves
  std::vector<bool> selective_kept;    // per node: analysis::kept_by_selective_recompute
  std::vector<ir::ValueId> block_inputs;  // the checkpointed values when recomputing
  // Every group's blocks, numbered in order (groups in order, then their members): per node
  // its block's number, -1 outside any; per block its checkpoint (analysis::block_checkpoint,
  // -1 where it reads no activation from outside).
  std::vector<int> block_of;
  std::vector<ir::ValueId> checkpoint_of;
  plan::Recompute recompute = plan::Recompute::None;

  bool represents_itself(std::size_t node) const { return rep_node[node] == static_cast<ir::NodeId>(node); }
  // Is the node in a block run as a checkpointed region (any recomputation)?
  bool checkpointed(std::size_t node) const;
  // Selective recomputation keeps the node's outputs whole from the forward.
  bool kept_whole(std::size_t node) const;
  // Does its forward run again in backward (full: every checkpointed node; selective: not
  // the ones it keeps)?
  bool recomputed(std::size_t node) const;
  // Does the checkpointed node run again when backward recomputes its block: at or before the
  // block's last node that saves for backward? Then the reshards into it run again too, and
  // its forward where recomputed. The block's save-free tail (the last projection's reshard,
  // the residual add) runs once.
  bool runs_again(std::size_t node) const;
  // Is its forward computed again in backward: recomputed (not kept) and run again.
  bool reruns_forward(std::size_t node) const;
};

// `rules`: per node, the rule the search splits it by (nodes of different rules never fold).
BlockFolding fold_repeated_blocks(const ir::Graph& graph, const std::vector<std::optional<ops::DimRule>>& rules,
                                  const analysis::SavedTensors& saved, plan::Recompute recompute);

}  // namespace shardwise::search
