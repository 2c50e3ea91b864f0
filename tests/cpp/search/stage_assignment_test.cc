#include "search/stage_assignment.h"

#include <gtest/gtest.h>

#include <vector>

#include "analysis/repeated_blocks.h"
#include "test_graphs.h"

namespace shardwise::search {
namespace {

// The stage of each layer's first node.
std::vector<int> stage_of_layers(const ir::Graph& graph, const StageAssignment& a) {
  std::vector<analysis::RepeatedBlockGroup> groups = analysis::find_repeated_blocks(graph);
  std::vector<int> out;
  for (const auto& layer : analysis::largest_group(groups)->nodes)
    out.push_back(a.stage_of_node[static_cast<std::size_t>(layer.front())]);
  return out;
}

// A plan without layers_per_stage is priced with its layers split evenly (cost::even_layers);
// the runtime's cut is the same split. GPT with a 51,200-word head: balanced by FLOPs, 2
// stages took all 4 layers on the first and the head alone on the last, which no price assumed.
TEST(StageAssignment, WithoutLayersPerStageTheLayersSplitEvenlyAsTheEvaluatorPricesThem) {
  const ir::Graph g = testing::gpt(4, 256, 8, 128, 51200);
  EXPECT_EQ(stage_of_layers(g, assign_stages(g, 2)), (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(stage_of_layers(g, assign_stages(g, 3)), (std::vector<int>{0, 0, 1, 2}));  // the first 4 % 3 one more
  EXPECT_EQ(assign_stages(g, 2).stage_of_node, assign_stages(g, 2, {2, 2}).stage_of_node);
  EXPECT_EQ(stage_of_layers(g, assign_stages(g, 2, {3, 1})), (std::vector<int>{0, 0, 0, 1}));
}

// Fewer layers than stages: no even split exists; the cut balances FLOPs wherever it can.
TEST(StageAssignment, FewerLayersThanStagesBalanceByFlops) {
  const ir::Graph g = testing::gpt(2, 256, 8, 128, 4096);
  const StageAssignment a = assign_stages(g, 4);
  EXPECT_EQ(a.stage_cost.size(), 4u);
  EXPECT_EQ(a.stage_of_node.back(), 3);
  for (std::size_t i = 1; i < a.stage_of_node.size(); ++i) EXPECT_LE(a.stage_of_node[i - 1], a.stage_of_node[i]);
}

}  // namespace
}  // namespace shardwise::search
