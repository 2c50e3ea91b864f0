// The SPMD search end to end on the C++-built GPT (models/gpt.h); the transformers models
// are searched from Python (tests/python/plan/test_spmd_search.py).
#include "search/spmd_search.h"

#include <gtest/gtest.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>

#include "cost/cluster_presets.h"
#include "ir/parser.h"
#include "models/gpt.h"
#include "search/placement.h"
#include "search/plan_report.h"
#include "support/error.h"
#include "transform/collective_matmul.h"
#include "transform/job_rank_graph.h"
#include "transform/rank_graph.h"
#include "transform/spmd_rewrite.h"

namespace shardwise::search {
namespace {

ir::Graph gpt(int layers, int hidden, int heads, int batch = 2, int vocab = 50304, int seq = 1024) {
  models::GptConfig c;
  c.layers = layers;
  c.hidden = hidden;
  c.heads = heads;
  c.seq = seq;
  c.vocab = vocab;
  c.batch = batch;
  c.dropout = 0;
  return models::build_gpt(c);
}

// x [2, 1024] -> linear 4096 -> gelu -> linear 1024 -> mean: an MLP with no embedding.
ir::Graph mlp() {
  ir::Graph g;
  auto f32 = [](std::vector<std::int64_t> shape, std::optional<int> batch = std::nullopt) {
    return ir::TensorType{ir::DType::F32, std::move(shape), batch};
  };
  ir::ValueId x = g.add_value("x", f32({2, 1024}, 0), ir::ValueRole::Input);
  ir::ValueId w1 = g.add_value("fc1.weight", f32({4096, 1024}), ir::ValueRole::Parameter);
  ir::ValueId w2 = g.add_value("fc2.weight", f32({1024, 4096}), ir::ValueRole::Parameter);
  ir::NodeId a = g.add_node("aten::linear", {x, w1}, {{"h", f32({2, 4096}, 0)}}, {}, "fc1");
  ir::NodeId b = g.add_node("aten::gelu", {g.node(a).outputs[0]}, {{"act", f32({2, 4096}, 0)}}, {}, "act");
  ir::NodeId c = g.add_node("aten::linear", {g.node(b).outputs[0], w2}, {{"y", f32({2, 1024}, 0)}}, {}, "fc2");
  ir::NodeId d = g.add_node("aten::mean", {g.node(c).outputs[0]}, {{"loss", f32({})}}, {}, "");
  g.set_outputs({g.node(d).outputs[0]});
  return g;
}

cost::Cluster a100_with_memory(double gib) {
  nlohmann::json j = cost::cluster_to_json(cost::preset("dgx-a100", 1));
  for (auto& d : j["device_types"]) d["memory_bytes"] = static_cast<std::int64_t>(gib * (1LL << 30));
  return cost::cluster_from_json(j);
}

const std::string& at(const plan::Plan& p, const std::string& value, int axis) {
  return p.sharding->placements.at(value).at(static_cast<std::size_t>(axis));
}


// The graph `text` (parameters and body, "graph @g(...) {" opened) ending in the mean of
// value `last` as its loss.
ir::Graph with_mean_loss(const std::string& text, const std::string& last) {
  return ir::parse_graph(text +
                         fmt::format("  %loss: f32[] = aten::mean(%{}) {{dtype=none}}\n  return (%loss)\n}}", last));
}

// Batch 2 on a mesh of one data rank and 8 tensor ranks.
SpmdSearchOptions tensor_axis_of_8() {
  SpmdSearchOptions o;
  o.global_batch = 2;
  o.mesh = std::vector<int>{1, 8};
  return o;
}

TEST(SpmdSearch, MlpAtLargeBatchIsPureDataParallel) {
  ir::Graph g = mlp();
  SpmdSearchOptions o;
  o.global_batch = 65536;
  SpmdSearchResult r = search_spmd(g, cost::preset("dgx-a100", 1), cost::AnalyticCostModel{}, o);
  ASSERT_TRUE(r.fits);
  // Every product split over the batch on all 8 ranks, on whole weights: held whole, or held
  // sharded and gathered for the product (ZeRO-3, whose gathers and gradient reduce-scatters
  // run beside compute: as cheap as data parallelism's all-reduce at this batch, and half the
  // memory). No activation is ever resharded: no tensor parallelism.
  int batch_shards = 1;
  for (int axis = 0; axis < 2; ++axis)
    if (at(r.plan, "x", axis) == "S(0)") batch_shards *= r.plan.sharding->mesh[static_cast<std::size_t>(axis)];
  EXPECT_EQ(batch_shards, 8);
  for (const auto& [name, per_axis] : r.plan.sharding->strategies)
    if (name == "h" || name == "y")
      for (std::size_t axis = 0; axis < 2; ++axis)
        if (r.plan.sharding->mesh[axis] > 1) EXPECT_EQ(per_axis[axis].rfind("split _0", 0), 0u) << name << " " << per_axis[axis];
  for (const auto& c : r.plan.predicted->collectives)
    EXPECT_TRUE(c.value == "fc1.weight" || c.value == "fc2.weight" || c.value == "loss") << c.kind << " of " << c.value;
}

TEST(SpmdSearch, AGivenMeshsTensorAxisLeavesTheBatchToTheDataAxis) {
  // The MLP at a large batch is pure data parallelism wherever the batch may go; on a mesh the
  // user names data 1 x tensor 8, the tensor axis keeps off the batch: no value is split
  // along its batch dim there, and the weights carry the axis (tensor parallelism).
  ir::Graph g = mlp();
  SpmdSearchOptions o;
  o.global_batch = 65536;
  o.mesh = std::vector<int>{1, 8};
  const SpmdSearchResult free = search_spmd(g, cost::preset("dgx-a100", 1), cost::AnalyticCostModel{}, o);
  EXPECT_EQ(at(free.plan, "x", 1), "S(0)");
  o.batch_on_tensor_axis = false;
  const SpmdSearchResult tensor = search_spmd(g, cost::preset("dgx-a100", 1), cost::AnalyticCostModel{}, o);
  for (const auto& [name, per_axis] : tensor.plan.sharding->placements) {
    const auto id = g.find_value(name);
    ASSERT_TRUE(id.has_value()) << name;
    const auto& batch_dim = g.value(*id).type.batch_dim;
    if (batch_dim) EXPECT_NE(per_axis[1], fmt::format("S({})", *batch_dim)) << name;
  }
  EXPECT_TRUE(at(tensor.plan, "fc1.weight", 1).starts_with("S") || at(tensor.plan, "fc2.weight", 1).starts_with("S"))
      << at(tensor.plan, "fc1.weight", 1) << " " << at(tensor.plan, "fc2.weight", 1);
}

TEST(SpmdSearch, ASharedWeightReducesItsGradientOnce) {
  // w read by two products (a tied weight): data parallel, its two partial gradients are
  // summed locally and all-reduced once per step, not once per reader.
  ir::Graph g;
  auto f32 = [](std::vector<std::int64_t> shape, std::optional<int> batch = std::nullopt) {
    return ir::TensorType{ir::DType::F32, std::move(shape), batch};
  };
  ir::ValueId x = g.add_value("x", f32({2, 1024}, 0), ir::ValueRole::Input);
  ir::ValueId w = g.add_value("w", f32({1024, 1024}), ir::ValueRole::Parameter);
  ir::NodeId a = g.add_node("aten::mm", {x, w}, {{"h", f32({2, 1024}, 0)}}, {}, "first");
  ir::NodeId b = g.add_node("aten::mm", {g.node(a).outputs[0], w}, {{"y", f32({2, 1024}, 0)}}, {}, "second");
  ir::NodeId c = g.add_node("aten::mean", {g.node(b).outputs[0]}, {{"loss", f32({})}}, {}, "");
  g.set_outputs({g.node(c).outputs[0]});
  SpmdSearchOptions o;
  o.global_batch = 65536;
  o.mesh = std::vector<int>{8, 1};
  SpmdSearchResult r = search_spmd(g, cost::preset("dgx-a100", 1), cost::AnalyticCostModel{}, o);
  EXPECT_EQ(at(r.plan, "w", 0), "R");
  double reductions = 0;
  for (const auto& col : r.plan.predicted->collectives)
    if (col.value == "w" && col.kind == "all_reduce") reductions += col.count;
  EXPECT_DOUBLE_EQ(reductions, 1.0);
}

TEST(SpmdSearch, SmallGptAtLargeBatchRunsItsBlocksDataParallel) {
  // A small vocabulary: with GPT-2's 50k rows the embedding is most of a model this small,
  // and sharding it (no gradient all-reduce) rightly beats replicating it.
  ir::Graph g = gpt(2, 256, 4, 2, 1024);
  cost::Cluster cluster = cost::preset("dgx-a100", 1);
  SpmdSearchOptions o;
  o.global_batch = 512;
  SpmdSearchResult r = search_spmd(g, cluster, cost::AnalyticCostModel{}, o);
  ASSERT_TRUE(r.fits);
  const plan::Plan& p = r.plan;
  // The blocks' GEMM weights whole for their products (held whole, or held sharded over the
  // data ranks and gathered, ZeRO-3: its collectives run beside compute and cost what data
  // parallelism's all-reduce does), their products split over the batch on all 8 ranks: no
  // block activation resharded. (The embeddings and the first layer norm of a block may be
  // sharded otherwise: see the issue note; this pins what the search gets right today.)
  for (const auto& c : p.predicted->collectives) {
    if (c.value.rfind("transformer.h.", 0) == 0) continue;  // a block's parameter
    const std::optional<ir::ValueId> id = g.find_value(c.value);
    ASSERT_TRUE(id.has_value()) << c.value;
    const ir::Value& v = g.value(*id);
    const bool in_block = v.producer && g.node(*v.producer).module_path.rfind("transformer.h.", 0) == 0;
    EXPECT_FALSE(in_block) << c.kind << " of the block activation " << c.value;
  }
  for (const auto& [name, per_axis] : p.sharding->strategies) {
    if (name.rfind("addmm", 0) != 0) continue;
    for (int axis = 0; axis < 2; ++axis)
      if (p.sharding->mesh[static_cast<std::size_t>(axis)] > 1)
        EXPECT_EQ(per_axis[static_cast<std::size_t>(axis)], "split m") << name;
  }
}

// The forward collectives of activations on `axis` that every repeated block runs once
// (count == layers), by kind.
std::multiset<std::string> block_forward_collectives(const plan::Plan& p, const ir::Graph& g, int axis, int layers) {
  std::multiset<std::string> kinds;
  for (const auto& c : p.predicted->collectives) {
    if (c.axis != axis || c.phase != "forward" || c.count != layers) continue;
    const std::optional<ir::ValueId> v = g.find_value(c.value);
    if (v && g.value(*v).role == ir::ValueRole::Activation) kinds.insert(c.kind);
  }
  return kinds;
}

TEST(SpmdSearch, FusedQkvGetsAStridedShardWhenDataParallelCannotFit) {
  // 4 layers of hidden 4096: 0.97B parameters x 16 bytes = 15.5 GB, more than 16 GiB x 0.9.
  ir::Graph g = gpt(4, 4096, 32);
  cost::Cluster cluster = a100_with_memory(16);
  SpmdSearchOptions o;
  // 2 x 1024 tokens a step. (At twice the tokens a token-parallel attention projection, its
  // weight whole and the heads' output exchanged all-to-all, costs within 1% of the
  // row-parallel one and wins the tie under the cost model.)
  o.global_batch = 2;
  o.mesh = std::vector<int>{1, 8};
  SpmdSearchResult r = search_spmd(g, cluster, cost::AnalyticCostModel{}, o);
  ASSERT_TRUE(r.fits);
  const plan::Plan& p = r.plan;
  for (int layer = 0; layer < 4; ++layer) {
    const std::string block = "transformer.h." + std::to_string(layer) + ".";
    // q, k and v of the same heads on each rank: the [h, 3h] weight split in three groups.
    EXPECT_EQ(at(p, block + "attn.c_attn.weight", 1), "S(1,g3)") << block;
    EXPECT_EQ(at(p, block + "attn.c_attn.bias", 1), "S(0,g3)") << block;
    // The attention output projection row-parallel; the MLP: up projection column-parallel,
    // down projection row-parallel (Megatron).
    EXPECT_EQ(at(p, block + "attn.c_proj.weight", 1), "S(0)") << block;
    EXPECT_EQ(at(p, block + "mlp.c_fc.weight", 1), "S(1)") << block;
    EXPECT_EQ(at(p, block + "mlp.c_proj.weight", 1), "S(0)") << block;
  }
  EXPECT_LT(p.predicted->memory_per_rank, 16.0 * (1LL << 30) * 0.9);
  // One all-reduce's worth of activation traffic per attention and per MLP block: either the
  // all-reduce itself (Megatron) or its two halves around a sequence-sharded residual
  // (Megatron with sequence parallelism: no statistics all-reduce, 1/8 of the norms' work).
  const auto kinds = block_forward_collectives(p, g, 1, 4);
  const std::multiset<std::string> megatron = {"all_reduce", "all_reduce"};
  const std::multiset<std::string> sequence_parallel = {"all_gather", "all_gather", "reduce_scatter", "reduce_scatter"};
  EXPECT_TRUE(kinds == megatron || kinds == sequence_parallel) << fmt::format("{}", fmt::join(kinds, ", "));
  // Partial sums of the row-parallel products are reduced once, after the reshape that
  // follows them (a linear op carries them through) or right at the product.
  for (const auto& [name, per_axis] : p.sharding->strategies)
    if (per_axis[1] == "partial") EXPECT_EQ(p.sharding->placements.at(name)[1], "P(sum)") << name;
}

TEST(SpmdSearch, CollectiveMatmulsArePricedBesideTheirProducts) {
  // Two pre-norm gated MLP blocks of hidden 4096 over 2 x 2048 tokens on 8 A100s of 16 GiB:
  // the weights must be split; asked for collective matmuls, the search may run the
  // tensor-parallel gathers and scatters as rings (search/parameter_collectives.h), and the
  // plan says what the same placements cost with plain collectives.
  std::string text = "graph(%x: f32[b2,2048,4096]) {\n";
  std::string body, last = "x";
  for (int l = 0; l < 2; ++l) {
    text += fmt::format("  %ln{0}.weight: f32[4096] parameter\n  %up{0}.weight: f32[16384,4096] parameter\n"
                        "  %gate{0}.weight: f32[16384,4096] parameter\n  %down{0}.weight: f32[4096,16384] parameter\n",
                        l);
    body += fmt::format(
        "  %n{0}: f32[b2,2048,4096] = aten::rms_norm(%{1}, %ln{0}.weight) {{eps=1e-05, normalized_shape=[4096]}}\n"
        "  %u{0}: f32[b2,2048,16384] = aten::linear(%n{0}, %up{0}.weight) {{bias=none}}\n"
        "  %g{0}: f32[b2,2048,16384] = aten::linear(%n{0}, %gate{0}.weight) {{bias=none}}\n"
        "  %m{0}: f32[b2,2048,16384] = aten::mul.Tensor(%u{0}, %g{0})\n"
        "  %d{0}: f32[b2,2048,4096] = aten::linear(%m{0}, %down{0}.weight) {{bias=none}}\n"
        "  %y{0}: f32[b2,2048,4096] = aten::add.Tensor(%{1}, %d{0}) {{alpha=1}}\n",
        l, last);
    last = fmt::format("y{}", l);
  }
  const ir::Graph g = with_mean_loss(text + body, last);
  SpmdSearchOptions o = tensor_axis_of_8();
  o.allow_recompute = false;
  SpmdSearchResult plain = search_spmd(g, a100_with_memory(16), cost::AnalyticCostModel{}, o);
  o.collective_matmul = true;
  SpmdSearchResult fused = search_spmd(g, a100_with_memory(16), cost::AnalyticCostModel{}, o);
  ASSERT_TRUE(fused.fits && plain.fits);
  EXPECT_FALSE(plain.plan.sharding->collective_matmul);
  EXPECT_TRUE(fused.plan.sharding->collective_matmul);
  const auto& breakdown = fused.plan.predicted->breakdown;
  // The rings ran: their collectives counted in full beside the products, the step cheaper
  // than the same placements with plain collectives, and no dearer than the plain search's.
  EXPECT_GT(breakdown.at("activations_beside_matmul_total"), 0);
  EXPECT_LT(fused.plan.predicted->step_time, breakdown.at("step_time_plain_collectives"));
  EXPECT_LE(fused.plan.predicted->step_time, plain.plan.predicted->step_time);
  EXPECT_FALSE(plain.plan.predicted->breakdown.contains("step_time_plain_collectives"));
  EXPECT_EQ(plain.plan.predicted->breakdown.at("activations_beside_matmul_total"), 0);
}

TEST(SpmdSearch, GqaKeysAndValuesShareTheQueriesGather) {
  // Two pre-norm LLaMA blocks with grouped-query attention (hidden 2048, 16 heads of 128, 8
  // key/value heads, gated MLP of 5504) over 2 x 512 tokens on 8 A100s. q, k and v read one
  // norm output: Megatron's column-parallel k and v share the gather q's split needs. Priced
  // per reader edge (three gathers), the narrow k and v ran on the sequence instead, their
  // weights gathered and an all-to-all each into the heads: 1.60 ms a step against 1.33.
  std::string text = "graph(%x: f32[b2,512,2048]) {\n";
  std::string body, last = "x";
  for (int l = 0; l < 2; ++l) {
    text += fmt::format(
        "  %ln{0}.weight: f32[2048] parameter\n  %q{0}.weight: f32[2048,2048] parameter\n"
        "  %k{0}.weight: f32[1024,2048] parameter\n  %v{0}.weight: f32[1024,2048] parameter\n"
        "  %o{0}.weight: f32[2048,2048] parameter\n  %mn{0}.weight: f32[2048] parameter\n"
        "  %gate{0}.weight: f32[5504,2048] parameter\n  %up{0}.weight: f32[5504,2048] parameter\n"
        "  %down{0}.weight: f32[2048,5504] parameter\n",
        l);
    body += fmt::format(
        "  %n{0}: f32[b2,512,2048] = aten::rms_norm(%{1}, %ln{0}.weight) {{eps=1e-05, normalized_shape=[2048]}}\n"
        "  %q{0}: f32[b2,512,2048] = aten::linear(%n{0}, %q{0}.weight) {{bias=none}}\n"
        "  %qv{0}: f32[b2,512,16,128] = aten::view(%q{0}) {{size=[2,512,-1,128]}}\n"
        "  %qt{0}: f32[b2,16,512,128] = aten::transpose.int(%qv{0}) {{dim0=1, dim1=2}}\n",
        l, last);
    for (const char* t : {"k", "v"})
      body += fmt::format(
          "  %{1}{0}: f32[b2,512,1024] = aten::linear(%n{0}, %{1}{0}.weight) {{bias=none}}\n"
          "  %{1}v{0}: f32[b2,512,8,128] = aten::view(%{1}{0}) {{size=[2,512,-1,128]}}\n"
          "  %{1}t{0}: f32[b2,8,512,128] = aten::transpose.int(%{1}v{0}) {{dim0=1, dim1=2}}\n"
          "  %{1}u{0}: f32[b2,8,1,512,128] = aten::unsqueeze(%{1}t{0}) {{dim=2}}\n"
          "  %{1}e{0}: f32[b2,8,2,512,128] = aten::expand(%{1}u{0}) {{implicit=false, size=[2,8,2,512,128]}}\n"
          "  %{1}r{0}: f32[b2,16,512,128] = aten::reshape(%{1}e{0}) {{shape=[2,16,512,128]}}\n",
          l, t);
    body += fmt::format(
        "  %a{0}: f32[b2,16,512,128] = aten::scaled_dot_product_attention(%qt{0}, %kr{0}, %vr{0}) "
        "{{attn_mask=none, dropout_p=0.0, enable_gqa=false, is_causal=true, scale=none}}\n"
        "  %at{0}: f32[b2,512,16,128] = aten::transpose.int(%a{0}) {{dim0=1, dim1=2}}\n"
        "  %ar{0}: f32[b2,512,2048] = aten::reshape(%at{0}) {{shape=[2,512,-1]}}\n"
        "  %o{0}: f32[b2,512,2048] = aten::linear(%ar{0}, %o{0}.weight) {{bias=none}}\n"
        "  %h{0}: f32[b2,512,2048] = aten::add.Tensor(%{1}, %o{0}) {{alpha=1}}\n"
        "  %m{0}: f32[b2,512,2048] = aten::rms_norm(%h{0}, %mn{0}.weight) {{eps=1e-05, normalized_shape=[2048]}}\n"
        "  %g{0}: f32[b2,512,5504] = aten::linear(%m{0}, %gate{0}.weight) {{bias=none}}\n"
        "  %s{0}: f32[b2,512,5504] = aten::silu(%g{0})\n"
        "  %u{0}: f32[b2,512,5504] = aten::linear(%m{0}, %up{0}.weight) {{bias=none}}\n"
        "  %p{0}: f32[b2,512,5504] = aten::mul.Tensor(%s{0}, %u{0})\n"
        "  %d{0}: f32[b2,512,2048] = aten::linear(%p{0}, %down{0}.weight) {{bias=none}}\n"
        "  %y{0}: f32[b2,512,2048] = aten::add.Tensor(%h{0}, %d{0}) {{alpha=1}}\n",
        l, last);
    last = fmt::format("y{}", l);
  }
  const ir::Graph g = with_mean_loss(text + body, last);
  SpmdSearchOptions o = tensor_axis_of_8();
  const SpmdSearchResult r = search_spmd(g, cost::preset("dgx-a100", 1), cost::AnalyticCostModel{}, o);
  ASSERT_TRUE(r.fits);
  const plan::Plan& p = r.plan;
  for (int l = 0; l < 2; ++l) {
    // nn.Linear weights are [out, in]: column-parallel = S(0), row-parallel = S(1).
    for (const char* column : {"q", "k", "v", "gate", "up"})
      EXPECT_EQ(at(p, fmt::format("{}{}.weight", column, l), 1), "S(0)") << column << l;
    for (const char* row : {"o", "down"}) EXPECT_EQ(at(p, fmt::format("{}{}.weight", row, l), 1), "S(1)") << row << l;
  }
  for (const auto& c : p.predicted->collectives) EXPECT_NE(c.kind, "all_to_all") << c.value;
}

// One attention block over one sequence of 4,096 tokens (hidden 256, 4 heads of 64), causal.
ir::Graph long_sequence_block() {
  return with_mean_loss(R"(graph(%x: f32[b1,4096,256]) {
  %q.weight: f32[256,256] parameter
  %k.weight: f32[256,256] parameter
  %v.weight: f32[256,256] parameter
  %o.weight: f32[256,256] parameter
  %q: f32[b1,4096,256] = aten::linear(%x, %q.weight) {bias=none}
  %k: f32[b1,4096,256] = aten::linear(%x, %k.weight) {bias=none}
  %v: f32[b1,4096,256] = aten::linear(%x, %v.weight) {bias=none}
  %qv: f32[b1,4096,4,64] = aten::view(%q) {size=[1,4096,4,64]}
  %kv: f32[b1,4096,4,64] = aten::view(%k) {size=[1,4096,4,64]}
  %vv: f32[b1,4096,4,64] = aten::view(%v) {size=[1,4096,4,64]}
  %qt: f32[b1,4,4096,64] = aten::transpose.int(%qv) {dim0=1, dim1=2}
  %kt: f32[b1,4,4096,64] = aten::transpose.int(%kv) {dim0=1, dim1=2}
  %vt: f32[b1,4,4096,64] = aten::transpose.int(%vv) {dim0=1, dim1=2}
  %a: f32[b1,4,4096,64] = aten::scaled_dot_product_attention(%qt, %kt, %vt) {attn_mask=none, dropout_p=0.0, enable_gqa=false, is_causal=true, scale=none}
  %at: f32[b1,4096,4,64] = aten::transpose.int(%a) {dim0=1, dim1=2}
  %ar: f32[b1,4096,256] = aten::reshape(%at) {shape=[1,4096,256]}
  %y: f32[b1,4096,256] = aten::linear(%ar, %o.weight) {bias=none}
)", "y");
}

TEST(SpmdSearch, OneLongSequenceOnTheDataAxisRunsItsCausalAttentionAsARing) {
  // One sequence, eight data ranks: the batch cannot split, the sequence can, attention's too
  // as ring attention (context parallelism): each rank's key and value rows, in bf16 (the
  // search's precision here) 2 x 4 x 512 x 64 x 2 = 524,288 bytes, hop 7 times in forward,
  // then 7 times with their gradients (twice the bytes) and once as gradients alone in backward.
  const ir::Graph g = long_sequence_block();
  SpmdSearchOptions o;
  o.global_batch = 1;
  o.mesh = std::vector<int>{8, 1};
  const SpmdSearchResult r = search_spmd(g, cost::preset("dgx-a100", 1), cost::AnalyticCostModel{}, o);
  ASSERT_TRUE(r.fits);
  EXPECT_EQ(r.plan.sharding->strategies.at("a").at(0), "split s");
  EXPECT_EQ(at(r.plan, "a", 0), "S(2)");
  std::map<std::string, double> bytes;
  double seconds = 0;
  for (const auto& c : r.plan.predicted->collectives)
    if (c.kind == "send_recv" && c.value == "a") {
      bytes[c.phase] += c.bytes;
      seconds += c.seconds * c.count;
    }
  EXPECT_EQ(bytes, (std::map<std::string, double>{{"backward", 15 * 524288.0}, {"forward", 7 * 524288.0}}));
  EXPECT_GT(seconds, 0);
  // Without context parallelism the sequence's attention is never split.
  o.context_parallel = false;
  const SpmdSearchResult off = search_spmd(g, cost::preset("dgx-a100", 1), cost::AnalyticCostModel{}, o);
  ASSERT_TRUE(off.fits);
  EXPECT_NE(off.plan.sharding->strategies.at("a").at(0), "split s");
  EXPECT_GT(off.plan.predicted->step_time, r.plan.predicted->step_time);
  o.context_parallel = true;
  // On a mesh the user names data 1 x tensor 8 the tensor axis keeps to the model: no ring.
  o.mesh = std::vector<int>{1, 8};
  o.batch_on_tensor_axis = false;
  const SpmdSearchResult t = search_spmd(g, cost::preset("dgx-a100", 1), cost::AnalyticCostModel{}, o);
  ASSERT_TRUE(t.fits);
  EXPECT_NE(t.plan.sharding->strategies.at("a").at(1), "split s");
}

TEST(SpmdSearch, GptConv1DsRunTheirSequenceCollectivesAsStridedRings) {
  // GPT-2's Conv1D views [b, s, h] as [b * s, h] before its addmm, so a sequence cut is
  // strided there (one block of every batch row per rank, S(0,g2) at batch 2). The rings take
  // such blocks as they take contiguous ones (transform/collective_matmul.cc,
  // runtime/collective_matmul.py): the search prices them beside the products and the rewrite
  // marks the same addmms.
  const ir::Graph g = gpt(2, 4096, 32);
  SpmdSearchOptions o;
  o.global_batch = 2;
  o.mesh = std::vector<int>{1, 8};
  o.allow_recompute = false;
  o.collective_matmul = true;
  const SpmdSearchResult r = search_spmd(g, a100_with_memory(16), cost::AnalyticCostModel{}, o);
  ASSERT_TRUE(r.fits);
  EXPECT_GT(r.plan.predicted->breakdown.at("activations_beside_matmul_total"), 0);
  EXPECT_LT(r.plan.predicted->step_time, r.plan.predicted->breakdown.at("step_time_plain_collectives"));
  const transform::RankGraph rank = transform::job_rank_graph(g, *r.plan.sharding, 0);
  int strided_gathers = 0, strided_scatters = 0;
  for (const ir::Node& node : rank.graph.nodes()) {
    if (node.op != "aten::addmm") continue;
    if (transform::operand_ring(rank.graph, node, 1) == MatmulCollective::Gather) {
      const ir::Node& backward = rank.graph.node(*rank.graph.value(node.inputs[1]).producer);
      const ir::Node& forward = rank.graph.node(*rank.graph.value(backward.inputs[0]).producer);
      if (transform::step_action(forward).groups == 2) {
        ++strided_gathers;
        EXPECT_EQ(transform::step_action(backward).groups, 2) << node.module_path;
      }
    }
    if (const auto ring = transform::scatter_ring(rank.graph, node); ring && ring->forward.at(0).groups == 2)
      ++strided_scatters;
  }
  // Per layer: c_attn and c_fc gather in, c_proj (attention's and the MLP's) scatter out.
  EXPECT_EQ(strided_gathers, 4);
  EXPECT_EQ(strided_scatters, 4);
}

TEST(SpmdSearch, Gpt3BlockStructureOn1024A100sIsSearchedInSeconds) {
  // GPT-3 175B: 96 layers, hidden 12288, 96 heads, sequence 2048, batch 1536, on 128 DGX
  // A100 nodes with an 8-way tensor axis inside each. The search time is reported, not
  // asserted to the issue's budget (fast < 1 s, thorough < 30 s: timing never fails a test
  // on a loaded machine); the bounds below catch a change of complexity.
  models::GptConfig c;
  c.layers = 96;
  c.hidden = 12288;
  c.heads = 96;
  c.seq = 2048;
  c.vocab = 50304;
  c.batch = 2;
  c.dropout = 0;
  ir::Graph g = models::build_gpt(c);
  cost::Cluster cluster = cost::preset("dgx-a100", 128);
  SpmdSearchOptions o;
  o.global_batch = 1536;
  o.mesh = std::vector<int>{128, 8};
  SpmdSearchResult fast = search_spmd(g, cluster, cost::AnalyticCostModel{}, o);
  o.level = SearchLevel::Thorough;
  SpmdSearchResult thorough = search_spmd(g, cluster, cost::AnalyticCostModel{}, o);
  std::printf("GPT-3 175B SPMD search on 128x8 A100: fast %.2f s (step %.2f s), thorough %.2f s (step %.2f s)\n",
              fast.search_seconds, fast.plan.predicted->step_time, thorough.search_seconds,
              thorough.plan.predicted->step_time);
  EXPECT_TRUE(fast.fits);
  EXPECT_TRUE(thorough.fits);
  EXPECT_LE(thorough.plan.predicted->step_time, fast.plan.predicted->step_time * (1 + 1e-12));
  // The search times are printed above, not bounded here (benchmarks/planner_scaling.py).
  // Communication mostly hidden: the step within 1.5x of its compute (24.9 s of 22.1 s when
  // written; Megatron-LM's own 175B run at 140 TFLOP/s per GPU is about 23 s). The data
  // axis splits the batch and divides the MLP's up projection's optimizer state (ZeRO-1, or
  // the weight itself FSDP-style: the two price within 0.1% here, and which wins moved with
  // the reshard prices); the tensor axis splits that projection column-parallel (the down
  // projection's split varies with the costs).
  for (const auto& r : {&fast, &thorough}) {
    const auto& predicted = *r->plan.predicted;
    EXPECT_LT(predicted.step_time, 1.5 * predicted.breakdown.at("compute")) << predicted.step_time;
    EXPECT_EQ(r->plan.sharding->strategies.at("scaled_dot_product_attention").at(0), "split b");
    EXPECT_EQ(at(r->plan, "transformer.h.0.mlp.c_fc.weight", 1), "S(1)");
    const auto zero = r->plan.sharding->zero.find("transformer.h.0.mlp.c_fc.weight");
    const bool zero_on_data = zero != r->plan.sharding->zero.end() && zero->second == std::vector<int>{0};
    EXPECT_TRUE(zero_on_data || at(r->plan, "transformer.h.0.mlp.c_fc.weight", 0) == "S(0)");
    ASSERT_FALSE(r->plan.sharding->zero.empty());
    EXPECT_EQ(r->plan.zero_stage, 1);  // the ZeRO the runtime runs
  }
}

TEST(SpmdSearch, ThoroughIsNeverWorseThanFastAndBothAreDeterministic) {
  ir::Graph g = gpt(2, 1024, 16);
  cost::Cluster cluster = a100_with_memory(4);
  SpmdSearchOptions o;
  o.global_batch = 8;
  SpmdSearchResult fast = search_spmd(g, cluster, cost::AnalyticCostModel{}, o);
  SpmdSearchResult again = search_spmd(g, cluster, cost::AnalyticCostModel{}, o);
  EXPECT_EQ(plan::plan_to_json_string(fast.plan), plan::plan_to_json_string(again.plan));
  EXPECT_EQ(plan::plan_hash(fast.plan), plan::plan_hash(again.plan));
  o.level = SearchLevel::Thorough;
  SpmdSearchResult thorough = search_spmd(g, cluster, cost::AnalyticCostModel{}, o);
  EXPECT_EQ(thorough.plan.sharding->level, "thorough");
  EXPECT_LE(thorough.plan.predicted->step_time, fast.plan.predicted->step_time * (1 + 1e-12));
  // The plan survives its JSON form.
  EXPECT_EQ(plan::plan_from_json_string(plan::plan_to_json_string(thorough.plan)), thorough.plan);
}

TEST(SpmdSearch, HeterogeneousClusterSharesTheBatchBySpeed) {
  ir::Graph g = mlp();
  cost::Cluster cluster = cost::preset("mixed-a100-v100", 1);  // 4 A100 + 4 V100 on PCIe
  SpmdSearchOptions o;
  o.global_batch = 65536;
  o.mesh = std::vector<int>{8, 1};
  SpmdSearchResult r = search_spmd(g, cluster, cost::AnalyticCostModel{}, o);
  ASSERT_TRUE(r.balance.has_value());
  const BatchBalance& b = *r.balance;
  ASSERT_EQ(b.ratios.size(), 8u);
  // The A100s take more than the V100s, every rank of a kind the same share (+-1 sample).
  for (int i = 0; i < 4; ++i) EXPECT_GT(b.ratios[static_cast<std::size_t>(i)], b.ratios[4]);
  EXPECT_LT(b.step_time, b.even_step_time);
  EXPECT_LE(b.step_time, b.lp_step_time * 1.05);
  Placement input = parse_placement(at(r.plan, "x", 0));
  EXPECT_EQ(input.ratios.size(), 8u);
}

// GPT-2's shape captured at batch 2 on 4 A100s + 4 V100s: the batch takes uneven shares
// from the input on. Priced with even blocks, the search used to keep input_ids whole, look
// the tokens up with the table split by hidden, and split the batch after an all-to-all; with
// uneven shares the run gathers the whole activation there instead (no all-to-all moves
// uneven blocks) and every device looks up the whole batch at the slowest one's pace.
TEST(SpmdSearch, HeterogeneousSharesStartAtTheInputs) {
  const ir::Graph g = gpt(4, 1024, 16);
  SpmdSearchOptions o;
  o.global_batch = 64;
  o.mesh = std::vector<int>{8, 1};
  const SpmdSearchResult r = search_spmd(g, cost::preset("mixed-a100-v100", 1), cost::AnalyticCostModel{}, o);
  ASSERT_TRUE(r.balance.has_value());
  for (const char* input : {"input_ids", "labels"}) {
    const Placement p = parse_placement(at(r.plan, input, 0));
    EXPECT_TRUE(p.is_shard() && p.dim == 0) << input << " " << p.str();
    EXPECT_EQ(p.ratios, r.balance->ratios) << input;
  }
  for (const plan::CollectiveRecord& c : r.plan.predicted->collectives)
    EXPECT_NE(c.kind, "all_to_all") << c.value;
  EXPECT_LT(r.balance->step_time * 1.3, r.balance->even_step_time);
}

// The even split overflows the V100s' 32 GB, the shares fit: the plan's step is the shares'
// (it was inf - inf, NaN, written as null). Without recomputation: with it, a plan whose even
// split fits is faster here since fused attention is priced as it runs.
TEST(SpmdSearch, SharesPriceAPlanWhoseEvenSplitDoesNotFit) {
  const ir::Graph g = gpt(24, 2048, 16, 2, 50304, 2048);
  SpmdSearchOptions o;
  o.global_batch = 48;
  o.mesh = std::vector<int>{8, 1};
  o.allow_recompute = false;
  const SpmdSearchResult r = search_spmd(g, cost::preset("mixed-a100-v100", 1), cost::AnalyticCostModel{}, o);
  ASSERT_TRUE(r.balance.has_value());
  EXPECT_TRUE(std::isinf(r.balance->even_step_time));
  ASSERT_TRUE(std::isfinite(r.plan.predicted->step_time)) << r.plan.predicted->step_time;
  EXPECT_NEAR(r.plan.predicted->step_time, r.balance->step_time, 0.01 * r.balance->step_time);
}

TEST(SpmdSearch, ClearErrors) {
  cost::Cluster cluster = cost::preset("dgx-a100", 1);
  SpmdSearchOptions o;
  o.global_batch = 0;
  EXPECT_THROW(search_spmd(gpt(1, 64, 4), cluster, cost::AnalyticCostModel{}, o), support::ValidationError);
  o.global_batch = 16;
  try {
    search_spmd(gpt(1, 64, 4, /*batch=*/1), cluster, cost::AnalyticCostModel{}, o);
    FAIL() << "a graph captured at batch 1 must be refused";
  } catch (const support::ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find("batch of at least 2"), std::string::npos) << e.what();
  }
  o.mesh = std::vector<int>{3, 2};
  EXPECT_THROW(search_spmd(gpt(1, 64, 4), cluster, cost::AnalyticCostModel{}, o), support::ValidationError);
  EXPECT_THROW(search_level_from_name("slow"), support::ValidationError);
}

TEST(SpmdSearch, ReportFoldsRepeatedBlocks) {
  ir::Graph g = gpt(3, 256, 4);
  SpmdSearchOptions o;
  o.global_batch = 64;
  SpmdSearchResult r = search_spmd(g, cost::preset("dgx-a100", 1), cost::AnalyticCostModel{}, o);
  std::string text = plan_report(r.plan, 72e9);
  EXPECT_NE(text.find("transformer.h.*.attn.c_attn.weight"), std::string::npos) << text;
  EXPECT_NE(text.find("x3"), std::string::npos) << text;
  EXPECT_NE(text.find("collectives per step"), std::string::npos) << text;
}

// On one mesh, selective recomputation's candidate lies between none and full in time and in
// memory; with the memory between selective's and none's, the search picks selective, and
// its sharding says so (what the rewrite and the runtime read). Asked for one, it tries that.
TEST(SpmdSearch, SelectiveRecomputationIsACandidateBetweenNoneAndFull) {
  ir::Graph g = gpt(8, 512, 8, 2, 1024);
  SpmdSearchOptions o;
  o.global_batch = 64;
  o.mesh = std::vector<int>{8, 1};
  const SpmdSearchResult all = search_spmd(g, a100_with_memory(80), cost::AnalyticCostModel{}, o);
  ASSERT_EQ(all.candidates.size(), 3u);
  const SpmdCandidate& none = all.candidates[0];
  const SpmdCandidate& selective = all.candidates[1];
  const SpmdCandidate& full = all.candidates[2];
  EXPECT_EQ(none.recompute, plan::Recompute::None);
  EXPECT_EQ(selective.recompute, plan::Recompute::Selective);
  EXPECT_EQ(full.recompute, plan::Recompute::Full);
  EXPECT_LT(none.step_time, selective.step_time);
  EXPECT_LT(selective.step_time, full.step_time);
  EXPECT_GT(none.memory_per_rank, selective.memory_per_rank);
  EXPECT_GT(selective.memory_per_rank, full.memory_per_rank);
  EXPECT_EQ(all.plan.recompute, plan::Recompute::None);  // everything fits: the fastest

  // Asked for one recomputation, the search tries that one alone.
  SpmdSearchOptions only = o;
  only.recompute = plan::Recompute::Selective;
  const SpmdSearchResult chosen = search_spmd(g, a100_with_memory(80), cost::AnalyticCostModel{}, only);
  ASSERT_EQ(chosen.candidates.size(), 1u);
  EXPECT_EQ(chosen.plan.recompute, plan::Recompute::Selective);
  EXPECT_EQ(chosen.candidates[0].step_time, selective.step_time);

  const double between = (none.memory_per_rank + selective.memory_per_rank) / 2;
  o.memory_fraction = 1.0;
  const SpmdSearchResult tight =
      search_spmd(g, a100_with_memory(between / (1LL << 30)), cost::AnalyticCostModel{}, o);
  ASSERT_TRUE(tight.fits);
  EXPECT_EQ(tight.plan.recompute, plan::Recompute::Selective);
  EXPECT_EQ(tight.plan.sharding->recompute, plan::Recompute::Selective);
  EXPECT_NEAR(tight.plan.predicted->step_time, selective.step_time, 1e-9 * selective.step_time);
}

TEST(SpmdSearch, AxisProblemsMetAgainAreSolvedOnce) {
  // The MLP has no repeated block: recomputation changes nothing it prices, so the candidates
  // with recomputation build exactly the axis problems of those without, and the search's
  // memo (FastSolveMemo) answers every one of them: the solver runs no more often than with
  // recomputation off, and the plan is the same (ties go to the earlier candidate).
  ir::Graph g = mlp();
  for (double gib : {80.0, 0.05}) {  // fits at once; needs the Lagrangian and the repairs
    SCOPED_TRACE(fmt::format("{} GiB", gib));
    SpmdSearchOptions o;
    o.global_batch = 4096;
    o.allow_recompute = false;
    const SpmdSearchResult off = search_spmd(g, a100_with_memory(gib), cost::AnalyticCostModel{}, o);
    o.allow_recompute = true;
    const SpmdSearchResult on = search_spmd(g, a100_with_memory(gib), cost::AnalyticCostModel{}, o);
    // Each mesh again with selective, then with full recomputation.
    ASSERT_EQ(on.candidates.size(), 3 * off.candidates.size());
    EXPECT_GT(off.axis_problems_solved, 0);
    EXPECT_EQ(on.axis_problems_solved, off.axis_problems_solved);
    EXPECT_EQ(on.axis_problems_reused, 3 * off.axis_problems_reused + 2 * off.axis_problems_solved);
    for (std::size_t c = 0; c < off.candidates.size(); ++c) {
      for (std::size_t k : {1, 2}) {
        const SpmdCandidate& again = on.candidates[k * off.candidates.size() + c];
        EXPECT_EQ(again.recompute, k == 1 ? plan::Recompute::Selective : plan::Recompute::Full);
        EXPECT_EQ(again.step_time, off.candidates[c].step_time);
        EXPECT_EQ(again.memory_per_rank, off.candidates[c].memory_per_rank);
      }
    }
    EXPECT_EQ(plan::plan_to_json_string(on.plan), plan::plan_to_json_string(off.plan));
  }
}

}  // namespace
}  // namespace shardwise::search
