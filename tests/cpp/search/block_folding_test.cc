// The repeated blocks folded into their first instance, and what a recomputation runs again
// (search/block_folding.h), on two layers of linear -> tanh.
#include "search/block_folding.h"

#include <gtest/gtest.h>

#include <vector>

#include "analysis/saved_for_backward.h"
#include "models/gpt.h"
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

// Two families of repeated blocks (models::GptConfig::dense_layers: two dense layers, then
// three mixture-of-experts ones): the larger folds, and recomputation checkpoints the blocks of
// both, one checkpoint each (its residual input; the first layer reads the embeddings' sum).
TEST(BlockFoldingTest, RecomputationCheckpointsTheBlocksOfEveryFamily) {
  const ir::Graph g = models::build_gpt(
      {.layers = 5, .hidden = 32, .heads = 2, .seq = 8, .vocab = 64, .experts = 4, .dense_layers = 2});
  const BlockFolding none = fold(g, plan::Recompute::None);
  const BlockFolding full = fold(g, plan::Recompute::Full);
  EXPECT_EQ(full.block_inputs.size(), 5U);
  EXPECT_EQ(none.block_inputs.size(), 5U);  // the checkpoints are found either way, held only when recomputing
  int dense_nodes = 0, folded = 0;
  for (const ir::Node& node : g.nodes()) {
    const auto u = static_cast<std::size_t>(node.id);
    const bool dense = node.module_path.starts_with("transformer.h.0") || node.module_path.starts_with("transformer.h.1");
    if (dense) {
      ++dense_nodes;
      EXPECT_TRUE(full.checkpointed(u)) << node.module_path;
      EXPECT_FALSE(none.checkpointed(u));
      EXPECT_TRUE(full.represents_itself(u));  // the smaller family is not folded
    }
    if (!full.represents_itself(u)) ++folded;
  }
  EXPECT_GT(dense_nodes, 0);
  EXPECT_GT(folded, 0);  // layers 3 and 4 fold into layer 2
}

}  // namespace
}  // namespace shardwise::search
