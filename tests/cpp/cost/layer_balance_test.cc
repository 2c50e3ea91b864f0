#include "cost/layer_balance.h"

#include <gtest/gtest.h>

#include <numeric>

#include "cost/cluster_presets.h"
#include "cost/plan_cost.h"
#include "models/gpt.h"

namespace shardwise::cost {
namespace {

TEST(LayerBalance, TheLastStagesHeadTakesAShareOfItsLayers) {
  // 24 layers on 4 stages; the last also runs a head worth two layers.
  EXPECT_EQ(balance_layers({.layers = 24, .pipeline = 4, .virtual_stages = 1, .layer = 1, .first = 0.1, .last = 2}),
            (std::vector<int>{6, 7, 7, 4}));  // largest time 7: device 0 pays 0.1 more
  // Nothing outside the layers: the count split, remainder to the first devices.
  EXPECT_EQ(balance_layers({.layers = 10, .pipeline = 4, .virtual_stages = 1, .layer = 1}),
            (std::vector<int>{3, 3, 2, 2}));
}

TEST(LayerBalance, InterleavedChunksKeepAtLeastOneLayerEach) {
  // p 2, v 2: device 0 holds chunks 0 and 2, device 1 chunks 1 and 3. A huge head still
  // leaves device 1 one layer per chunk.
  std::vector<int> chunks =
      balance_layers({.layers = 8, .pipeline = 2, .virtual_stages = 2, .layer = 1, .first = 0, .last = 100});
  EXPECT_EQ(chunks, (std::vector<int>{3, 1, 3, 1}));
  EXPECT_EQ(std::accumulate(chunks.begin(), chunks.end(), 0), 8);
  EXPECT_TRUE(balance_layers({.layers = 3, .pipeline = 2, .virtual_stages = 2, .layer = 1}).empty());
}

TEST(LayerBalance, TheEvaluatorPricesTheBalancedSplitFaster) {
  // A GPT whose LM head (vocabulary 65,536 on hidden 512) costs several layers.
  ir::Graph g = models::build_gpt({.layers = 8, .hidden = 512, .heads = 8, .seq = 512, .vocab = 65536});
  Cluster c = preset("dgx-a100", 1);
  AnalyticCostModel model;
  plan::Plan p;
  p.pipeline = 2;
  p.data = 4;
  p.global_batch = 64;
  p.micro_batch = 2;
  PlanCost even = evaluate(g, c, p, model);
  EXPECT_GT(even.last_stage_extra, 2 * even.layer_time);
  p.layers_per_stage = balance_layers({.layers = 8, .pipeline = 2, .virtual_stages = 1, .layer = even.layer_time,
                                       .first = even.first_stage_extra, .last = even.last_stage_extra});
  EXPECT_LT(p.layers_per_stage[1], p.layers_per_stage[0]);
  PlanCost balanced = evaluate(g, c, p, model);
  EXPECT_LT(balanced.step_time, even.step_time);
}

// Stages sized to their devices: a half-speed device's layer takes twice the time, so it
// gets fewer layers (layer_balance.h's example), and three speeds share 14 layers by speed.
TEST(LayerBalance, HeterogeneousDevicesTakeLayersBySpeed) {
  EXPECT_EQ(balance_layers({.layers = 8, .pipeline = 2, .virtual_stages = 1, .layer = 1, .device_scale = {1, 2}}),
            (std::vector<int>{6, 2}));
  EXPECT_EQ(balance_layers({.layers = 14, .pipeline = 3, .virtual_stages = 1, .layer = 1, .device_scale = {1, 2, 4}}),
            (std::vector<int>{8, 4, 2}));
  // Equal speeds: the split without device_scale.
  EXPECT_EQ(balance_layers({.layers = 10, .pipeline = 4, .virtual_stages = 1, .layer = 1, .device_scale = {1, 1, 1, 1}}),
            balance_layers({.layers = 10, .pipeline = 4, .virtual_stages = 1, .layer = 1}));
}

}  // namespace
}  // namespace shardwise::cost
