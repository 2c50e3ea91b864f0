// The repeated blocks folded into their first instance, and what a recomputation runs again
// (search/block_folding.h), on two layers of linear -> tanh.
#include "search/block_folding.h"

#include <gtest/gtest.h>

#include <vector>

#include "analysis/saved_for_backward.h"
#include "search/sharding_strategies.h"
#include "sharding_parts.h"

namespace shardwise::search {
namespace {

using testing::two_layers;

BlockFolding fold(const ir::Graph& g, plan::Recompute recompute) {
  return fold_repeated_blocks(g, rules_at_batch(g, 1.0), analysis::saved_tensors(g), recompute);
}

TEST(BlockFoldingTest, TheSecondLayerFoldsIntoTheFirst) {
  const ir::Graph g = two_layers();
  const BlockFolding f = fold(g, plan::Recompute::None);
  // Nodes in order: h0 = linear (0), a0 = tanh (1), h1 = linear (2), a1 = tanh (3). Layer 1's
  // linear and tanh stand as layer 0's, which count two instances each.
  EXPECT_EQ(f.rep_node, (std::vector<ir::NodeId>{0, 1, 0, 1}));
  EXPECT_EQ(f.instances, (std::vector<double>{2, 2, 1, 1}));
  EXPECT_TRUE(f.represents_itself(1));
  EXPECT_FALSE(f.represents_itself(2));
  // layers.1.fc.weight, read only where layer 0 reads layers.0.fc.weight, folds into it; x and
  // the activations are no leaves to fold.
  const ir::ValueId w0 = *g.find_value("layers.0.fc.weight");
  const ir::ValueId w1 = *g.find_value("layers.1.fc.weight");
  EXPECT_EQ(f.rep_leaf[static_cast<std::size_t>(w1)], w0);
  EXPECT_EQ(f.rep_leaf[static_cast<std::size_t>(w0)], w0);
  EXPECT_EQ(f.rep_leaf[static_cast<std::size_t>(*g.find_value("x"))], *g.find_value("x"));
  EXPECT_EQ(f.rep_leaf[static_cast<std::size_t>(*g.find_value("h0"))], -1);
  // The checkpoints: the activation each layer reads from outside it, layer 1's a0 (layer 0
  // reads only x, an input, not an activation).
  EXPECT_EQ(f.block_inputs, (std::vector<ir::ValueId>{*g.find_value("a0")}));
}

TEST(BlockFoldingTest, FullRecomputationRunsEveryNodeOfALayerAgain) {
  const ir::Graph g = two_layers();
  const BlockFolding none = fold(g, plan::Recompute::None);
  const BlockFolding full = fold(g, plan::Recompute::Full);
  for (std::size_t node = 0; node < 4; ++node) {
    EXPECT_TRUE(full.in_block[node]);
    // The tanh saves its output, the last node of each layer to save: every node is at or
    // before it, so each runs again, its forward too.
    EXPECT_TRUE(full.up_to_last_save[node]);
    EXPECT_TRUE(full.checkpointed(node));
    EXPECT_TRUE(full.recomputed(node));
    EXPECT_TRUE(full.runs_again(node));
    EXPECT_TRUE(full.reruns_forward(node));
    EXPECT_FALSE(full.kept_whole(node));
    EXPECT_FALSE(none.checkpointed(node));
    EXPECT_FALSE(none.runs_again(node));
  }
}

}  // namespace
}  // namespace shardwise::search
