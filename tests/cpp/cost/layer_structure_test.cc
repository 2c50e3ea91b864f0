#include "cost/layer_structure.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "cost/cluster_presets.h"
#include "cost/plan_cost.h"
#include "ir/parser.h"
#include "models/gpt.h"

namespace shardwise::cost {
namespace {

// A LLaMA-shaped decoder without names a rule could key on: per layer, two separate
// projections (q, k) meet in a pointwise op before the output projection, and a gated MLP
// (gate -> silu, up; multiplied) before the down projection.
ir::Graph gated_decoder(int layers) {
  std::string text = "graph(%x: f32[b4,64]) {\n  %h0: f32[b4,64] = aten::relu(%x) @embed\n";
  for (int i = 0; i < layers; ++i) {
    text += fmt::format(R"(  %layers.{0}.q.weight: f32[64,64] parameter
  %layers.{0}.k.weight: f32[64,64] parameter
  %layers.{0}.o.weight: f32[64,64] parameter
  %layers.{0}.gate.weight: f32[128,64] parameter
  %layers.{0}.up.weight: f32[128,64] parameter
  %layers.{0}.down.weight: f32[64,128] parameter
  %q{0}: f32[b4,64] = aten::linear(%h{0}, %layers.{0}.q.weight) @layers.{0}.attn.q
  %k{0}: f32[b4,64] = aten::linear(%h{0}, %layers.{0}.k.weight) @layers.{0}.attn.k
  %s{0}: f32[b4,64] = aten::mul.Tensor(%q{0}, %k{0}) @layers.{0}.attn
  %o{0}: f32[b4,64] = aten::linear(%s{0}, %layers.{0}.o.weight) @layers.{0}.attn.o
  %r{0}: f32[b4,64] = aten::add.Tensor(%h{0}, %o{0}) @layers.{0}
  %g{0}: f32[b4,128] = aten::linear(%r{0}, %layers.{0}.gate.weight) @layers.{0}.mlp.gate
  %a{0}: f32[b4,128] = aten::silu(%g{0}) @layers.{0}.mlp.act
  %u{0}: f32[b4,128] = aten::linear(%r{0}, %layers.{0}.up.weight) @layers.{0}.mlp.up
  %p{0}: f32[b4,128] = aten::mul.Tensor(%a{0}, %u{0}) @layers.{0}.mlp
  %d{0}: f32[b4,64] = aten::linear(%p{0}, %layers.{0}.down.weight) @layers.{0}.mlp.down
  %h{1}: f32[b4,64] = aten::add.Tensor(%r{0}, %d{0}) @layers.{0}
)",
                        i, i + 1);
  }
  text += fmt::format("  %head.weight: f32[256,64] parameter\n"
                      "  %y: f32[b4,256] = aten::linear(%h{}, %head.weight) @head\n  return (%y)\n}}\n",
                      layers);
  return ir::parse_graph(text);
}

std::string op_path(const ir::Graph& g, ir::NodeId id) { return g.node(id).module_path; }

TEST(LayerStructure, SeveralColumnProjectionsShareOneRowEnd) {
  ir::Graph g = gated_decoder(3);
  LayerStructure s = find_layer_structure(g);
  ASSERT_EQ(s.num_layers(), 3);
  ASSERT_EQ(s.row_ends.size(), 2u);  // attention and MLP: one all-reduce each
  EXPECT_EQ(op_path(g, s.row_ends[0]), "layers.0.attn.o");
  EXPECT_EQ(op_path(g, s.row_ends[1]), "layers.0.mlp.down");
  std::vector<std::string> columns, all;
  for (const auto& [id, split] : s.layer_split) {
    if (split == TensorSplit::Column) columns.push_back(op_path(g, id));
    if (split == TensorSplit::All) all.push_back(op_path(g, id));
  }
  std::sort(columns.begin(), columns.end());
  EXPECT_EQ(columns, (std::vector<std::string>{"layers.0.attn.k", "layers.0.attn.q", "layers.0.mlp.gate",
                                               "layers.0.mlp.up"}));
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, (std::vector<std::string>{"layers.0.attn", "layers.0.mlp", "layers.0.mlp.act"}));
  // Every weight matrix of the first layer (each layer is priced as the first) is sharded,
  // and the head's (vocabulary-parallel).
  EXPECT_EQ(s.sharded_params.size(), 6u + 1u);
  EXPECT_EQ(s.pre.size(), 1u);
  EXPECT_EQ(s.graph_batch, 4);
  EXPECT_DOUBLE_EQ(s.layer_input_bytes, 4 * 64 * 4);
}

// The FP8 linears whose input gradient the runtime's async-gradient pass would all-reduce
// beside dW (where a column split all-reduces it): an input read by the linear alone, so not
// q and k (one h), nor gate and up (one r, which the residual add reads too); o, down and the
// head read theirs alone. Compiled, those run eagerly (NodeContext::async_input_gradient).
TEST(LayerStructure, AsyncGradientSitesAreTheLinearsThatReadTheirInputAlone) {
  ir::Graph g = gated_decoder(2);
  LayerStructure s = find_layer_structure(g);
  ASSERT_EQ(s.async_gradient_site.size(), g.nodes().size());
  std::vector<std::string> sites;
  for (const ir::Node& node : g.nodes())
    if (s.async_gradient_site[static_cast<std::size_t>(node.id)]) sites.push_back(op_path(g, node.id));
  std::sort(sites.begin(), sites.end());
  EXPECT_EQ(sites, (std::vector<std::string>{"head", "layers.0.attn.o", "layers.0.mlp.down", "layers.1.attn.o",
                                             "layers.1.mlp.down"}));
}

TEST(LayerStructure, TensorParallelWeightsAreOneTthOfTheWhole) {
  ir::Graph g = gated_decoder(4);
  Cluster c = preset("dgx-a100", 1);
  AnalyticCostModel model;
  auto weights_at = [&](int t) {
    plan::Plan p;
    p.tensor = t;
    p.data = 8 / t;
    p.global_batch = 8;
    p.micro_batch = 1;
    p.precision = "f32";
    PlanCost cost = evaluate(g, c, p, model);
    EXPECT_EQ(cost.tensor_parallel_pairs_per_layer, 2);
    return cost.memory_breakdown.at("weights");
  };
  const double whole = weights_at(1);
  EXPECT_DOUBLE_EQ(weights_at(2), whole / 2);
  EXPECT_DOUBLE_EQ(weights_at(8), whole / 8);
}

TEST(LayerStructure, PricingWithTheStructureFoundOnceGivesTheSameFigures) {
  ir::Graph g = models::build_gpt({.layers = 4, .hidden = 64, .heads = 4, .seq = 16, .vocab = 128});
  LayerStructure s = find_layer_structure(g);
  EXPECT_EQ(s.row_ends.size(), 2u);  // GPT-2's fused c_attn + c_proj, c_fc + c_proj
  EXPECT_EQ(s.attention_heads, 4);
  // wte's lookup is vocabulary-parallel (its table is also the tied LM head), and wpe's: one
  // forward all-reduce each. The position embedding's [1, s, h] does not grow with the batch.
  ASSERT_EQ(s.pre_lookups.size(), 2u);
  EXPECT_TRUE(s.pre_lookups[0].batched);
  EXPECT_FALSE(s.pre_lookups[1].batched);
  EXPECT_TRUE(s.post_lookups.empty());
  EXPECT_EQ(find_layer_structure(gated_decoder(2)).attention_heads, 0);  // no attention op
  Cluster c = preset("dgx-a100", 1);
  AnalyticCostModel model;
  plan::Plan p;
  p.tensor = 2;
  p.pipeline = 2;
  p.data = 2;
  p.global_batch = 8;
  p.micro_batch = 1;
  PlanCost once = evaluate(s, g, c, p, model), fresh = evaluate(g, c, p, model);
  EXPECT_EQ(once.step_time, fresh.step_time);
  EXPECT_EQ(once.memory_per_rank, fresh.memory_per_rank);
  EXPECT_EQ(once.breakdown(), fresh.breakdown());
}

}  // namespace
}  // namespace shardwise::cost
