#include "models/gpt.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "analysis/flops.h"
#include "analysis/parameter_stats.h"
#include "analysis/repeated_blocks.h"
#include "analysis/shape_check.h"
#include "analysis/unknown_ops.h"
#include "ir/json.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "ops/op_table.h"
#include "support/error.h"

namespace shardwise::models {
namespace {

using Shape = std::vector<std::int64_t>;

constexpr int kNodesPerLayer = 37;  // as a transformers GPT-2 block captures (no .contiguous(): VALUE_IDENTITIES)

GptConfig small() { return GptConfig{.layers = 2, .hidden = 64, .heads = 4, .seq = 16, .vocab = 128}; }

GptConfig gpt3_175b() { return GptConfig{.layers = 96, .hidden = 12288, .heads = 96, .seq = 2048, .vocab = 51200}; }

// Megatron-LM's largest GPT configuration (Narayanan et al., 2021).
GptConfig megatron_1t() { return GptConfig{.layers = 128, .hidden = 25600, .heads = 160, .seq = 2048, .vocab = 51200}; }

// GPT-2 layout, tied embeddings: 12 l h^2 + 13 l h + (V + P) h + 2 h, with f = 4h; in general
// per layer 4h^2 + 2hf (attention and MLP weights) + 9h + f (biases and norms).
std::int64_t analytic_parameters(const GptConfig& c) {
  const std::int64_t l = c.layers, h = c.hidden, v = c.vocab;
  const std::int64_t f = c.ffn_hidden == 0 ? 4 * h : c.ffn_hidden;
  const std::int64_t p = c.positions == 0 ? c.seq : c.positions;
  const std::int64_t lm_head = c.tie_embeddings ? 0 : v * h;
  return l * (4 * h * h + 2 * h * f + 9 * h + f) + (v + p) * h + 2 * h + lm_head;
}

// Per layer: QKV 6bsh^2, out projection 2bsh^2, MLP 4bshf, QK^T and PV 4bs^2h; the LM head 2bshV.
std::int64_t analytic_matmul_flops(const GptConfig& c) {
  const std::int64_t l = c.layers, h = c.hidden, v = c.vocab, b = c.batch, s = c.seq;
  const std::int64_t f = c.ffn_hidden == 0 ? 4 * h : c.ffn_hidden;
  return l * (8 * b * s * h * h + 4 * b * s * h * f + 4 * b * s * s * h) + 2 * b * s * h * v;
}

std::vector<const ir::Value*> parameters(const ir::Graph& g) {
  std::vector<const ir::Value*> out;
  for (const auto& v : g.values()) {
    if (v.role == ir::ValueRole::Parameter) out.push_back(&v);
  }
  return out;
}

const ir::Node& producer(const ir::Graph& g, ir::ValueId id) { return g.node(*g.value(id).producer); }

std::string error_of(const GptConfig& c) {
  try {
    build_gpt(c);
  } catch (const support::ValidationError& e) {
    return e.what();
  }
  return "";
}

TEST(GptTest, ParametersHaveGpt2NamesShapesAndOrder) {
  const auto g = build_gpt(small());
  const auto params = parameters(g);
  std::vector<std::pair<std::string, Shape>> expected = {{"transformer.wte.weight", {128, 64}},
                                                         {"transformer.wpe.weight", {16, 64}}};
  for (int i = 0; i < 2; ++i) {
    const std::string p = "transformer.h." + std::to_string(i) + ".";
    expected.insert(expected.end(), {{p + "ln_1.weight", {64}},
                                     {p + "ln_1.bias", {64}},
                                     {p + "attn.c_attn.weight", {64, 192}},  // Conv1D: [in, out]
                                     {p + "attn.c_attn.bias", {192}},
                                     {p + "attn.c_proj.weight", {64, 64}},
                                     {p + "attn.c_proj.bias", {64}},
                                     {p + "ln_2.weight", {64}},
                                     {p + "ln_2.bias", {64}},
                                     {p + "mlp.c_fc.weight", {64, 256}},
                                     {p + "mlp.c_fc.bias", {256}},
                                     {p + "mlp.c_proj.weight", {256, 64}},
                                     {p + "mlp.c_proj.bias", {64}}});
  }
  expected.insert(expected.end(), {{"transformer.ln_f.weight", {64}}, {"transformer.ln_f.bias", {64}}});
  ASSERT_EQ(params.size(), expected.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i]->name, expected[i].first) << i;
    EXPECT_EQ(params[i]->type.shape, expected[i].second) << params[i]->name;
    EXPECT_EQ(params[i]->type.dtype, ir::DType::BF16) << params[i]->name;
  }
  // Tied: the LM head reads wte itself.
  const auto linear =
      std::find_if(g.nodes().begin(), g.nodes().end(), [](const ir::Node& n) { return n.op == "aten::linear"; });
  ASSERT_NE(linear, g.nodes().end());
  EXPECT_EQ(linear->module_path, "lm_head");
  EXPECT_EQ(g.value(linear->inputs[1]).name, "transformer.wte.weight");
}

TEST(GptTest, UntiedEmbeddingsAddAnLmHeadWeight) {
  auto c = small();
  c.tie_embeddings = false;
  const auto g = build_gpt(c);
  const auto params = parameters(g);
  EXPECT_EQ(params.back()->name, "lm_head.weight");
  EXPECT_EQ(params.back()->type.shape, (Shape{128, 64}));
  EXPECT_EQ(analysis::parameter_stats(g).parameters, analytic_parameters(c));
  EXPECT_EQ(analysis::parameter_stats(g).parameters,
            analysis::parameter_stats(build_gpt(small())).parameters + 128 * 64);
}

TEST(GptTest, ParameterCountIsTheAnalyticFormula) {
  auto wide_ffn = small();
  wide_ffn.ffn_hidden = 96;
  wide_ffn.positions = 32;
  for (const auto& c : {small(), wide_ffn, gpt3_175b(), megatron_1t()}) {
    const auto stats = analysis::parameter_stats(build_gpt(c));
    EXPECT_EQ(stats.parameters, analytic_parameters(c)) << c.layers << "x" << c.hidden;
    EXPECT_EQ(stats.parameter_bytes, 2 * stats.parameters);  // bf16
  }
  // 12 l h^2 + 13 l h + (V + P) h + 2 h, worked out.
  EXPECT_EQ(analysis::parameter_stats(build_gpt(small())).parameters, 109'312);
  EXPECT_EQ(analysis::parameter_stats(build_gpt(gpt3_175b())).parameters, 174'615'846'912);
  EXPECT_EQ(analysis::parameter_stats(build_gpt(megatron_1t())).parameters, 1'008'038'758'400);
}

TEST(GptTest, EveryLayerIsOneRepeatedBlock) {
  auto c = small();
  c.layers = 5;
  const auto g = build_gpt(c);
  const auto groups = analysis::find_repeated_blocks(g);
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].parent, "transformer.h");
  ASSERT_EQ(groups[0].module_paths.size(), 5u);
  for (std::size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(groups[0].module_paths[i], "transformer.h." + std::to_string(i));
    ASSERT_EQ(groups[0].nodes[i].size(), static_cast<std::size_t>(kNodesPerLayer)) << i;
    for (std::size_t k = 0; k < groups[0].nodes[i].size(); ++k) {
      EXPECT_EQ(g.node(groups[0].nodes[i][k]).op, g.node(groups[0].nodes[0][k]).op) << i << ":" << k;
    }
  }
  // 8 embedding, 1 dropout, 4 head and 7 loss nodes around the layers (batch 1).
  EXPECT_EQ(g.nodes().size(), static_cast<std::size_t>(5 * kNodesPerLayer + 20));
}

TEST(GptTest, MatmulFlopsAreTheAnalyticCount) {
  const auto& table = ops::OpTable::builtin();
  auto batched = small();
  batched.batch = 4;
  auto wide_ffn = small();
  wide_ffn.ffn_hidden = 96;
  wide_ffn.tie_embeddings = false;
  auto no_loss = small();
  no_loss.with_loss = false;
  for (const auto& c : {small(), batched, wide_ffn, no_loss, gpt3_175b()}) {
    EXPECT_EQ(analysis::forward_flops(table, build_gpt(c)).matmul_total, analytic_matmul_flops(c))
        << c.layers << "x" << c.hidden << " batch " << c.batch;
  }
  // l (24 b s h^2 + 4 b s^2 h) + 2 b s h V for the standard 4h MLP.
  const std::int64_t l = 96, b = 1, s = 2048, h = 12288, v = 51200;
  EXPECT_EQ(analysis::forward_flops(table, build_gpt(gpt3_175b())).matmul_total,
            l * (24 * b * s * h * h + 4 * b * s * s * h) + 2 * b * s * h * v);
}

TEST(GptTest, ShapesCheckAndEveryOpHasARule) {
  const auto& table = ops::OpTable::builtin();
  auto c = small();
  c.batch = 3;
  for (auto dtype : {ir::DType::BF16, ir::DType::F16, ir::DType::F32}) {
    c.dtype = dtype;
    const auto g = build_gpt(c);
    EXPECT_NO_THROW(ir::verify_graph(g));
    EXPECT_NO_THROW(analysis::check_shapes(table, g));
    EXPECT_TRUE(analysis::unknown_ops(table, g).empty());
  }
}

TEST(GptTest, EagerAttentionMaterialisesTheScoresWithTheSameMatmulFlops) {
  const auto& table = ops::OpTable::builtin();
  auto c = small();
  c.batch = 2;
  c.seq = 8;  // scores [2, 4, 8, 8], unlike q, k and v [2, 4, 8, 16]
  const auto sdpa = build_gpt(c);
  c.attention = GptAttention::Eager;
  const auto eager = build_gpt(c);
  EXPECT_NO_THROW(ir::verify_graph(eager));
  EXPECT_NO_THROW(analysis::check_shapes(table, eager));
  EXPECT_TRUE(analysis::unknown_ops(table, eager).empty());
  // The same two products per layer, as matmuls of the scores instead of one fused node.
  EXPECT_EQ(analysis::forward_flops(table, eager).matmul_total, analysis::forward_flops(table, sdpa).matmul_total);
  int sdpa_nodes = 0, softmaxes = 0, score_values = 0;
  for (const auto& n : eager.nodes()) {
    sdpa_nodes += n.op == "aten::scaled_dot_product_attention";
    softmaxes += n.op == "aten::softmax.int";
    for (auto out : n.outputs) {
      const auto& shape = eager.value(out).type.shape;
      score_values += shape == std::vector<std::int64_t>{2, 4, 8, 8};
    }
  }
  EXPECT_EQ(sdpa_nodes, 0);
  EXPECT_EQ(softmaxes, c.layers);
  // Per layer: matmul, div, where, softmax, dropout: five [b, heads, s, s] values.
  EXPECT_EQ(score_values, 5 * c.layers);
  // The mask is one buffer, not a parameter: the parameter count does not change.
  EXPECT_EQ(analysis::parameter_stats(eager).parameters, analysis::parameter_stats(sdpa).parameters);
}

TEST(GptTest, MathAttentionIsOneNodeReturningTheProbabilities) {
  const auto& table = ops::OpTable::builtin();
  auto c = small();
  c.seq = 8;
  c.attention = GptAttention::Math;
  const auto g = build_gpt(c);
  EXPECT_NO_THROW(ir::verify_graph(g));
  EXPECT_NO_THROW(analysis::check_shapes(table, g));
  EXPECT_TRUE(analysis::unknown_ops(table, g).empty());
  int math = 0;
  for (const auto& n : g.nodes()) {
    if (n.op != "aten::_scaled_dot_product_attention_math") continue;
    ++math;
    ASSERT_EQ(n.outputs.size(), 2u);
    EXPECT_EQ(g.value(n.outputs[1]).type.shape, (std::vector<std::int64_t>{1, 4, 8, 8}));
  }
  EXPECT_EQ(math, c.layers);
}

TEST(GptTest, HeavyOpsOfALayerInCaptureOrder) {
  auto c = small();
  c.batch = 2;
  const auto g = build_gpt(c);
  const std::set<std::string> heavy = {"aten::embedding", "aten::layer_norm", "aten::addmm",
                                       "aten::scaled_dot_product_attention", "aten::linear"};
  std::vector<std::pair<std::string, std::string>> seen;
  for (const auto& n : g.nodes()) {
    if (heavy.contains(n.op)) seen.emplace_back(n.op, n.module_path);
  }
  std::vector<std::pair<std::string, std::string>> expected = {{"aten::embedding", "transformer.wte"},
                                                               {"aten::embedding", "transformer.wpe"}};
  for (int i = 0; i < 2; ++i) {
    const std::string p = "transformer.h." + std::to_string(i);
    expected.insert(expected.end(), {{"aten::layer_norm", p + ".ln_1"},
                                     {"aten::addmm", p + ".attn.c_attn"},
                                     {"aten::scaled_dot_product_attention", p + ".attn"},
                                     {"aten::addmm", p + ".attn.c_proj"},
                                     {"aten::layer_norm", p + ".ln_2"},
                                     {"aten::addmm", p + ".mlp.c_fc"},
                                     {"aten::addmm", p + ".mlp.c_proj"}});
  }
  expected.insert(expected.end(), {{"aten::layer_norm", "transformer.ln_f"}, {"aten::linear", "lm_head"}});
  EXPECT_EQ(seen, expected);

  // Attention reads q, k, v in heads-major layout, causal without a mask; scale = head_dim^-0.5.
  const auto sdpa = std::find_if(g.nodes().begin(), g.nodes().end(),
                                 [](const ir::Node& n) { return n.op == "aten::scaled_dot_product_attention"; });
  ASSERT_NE(sdpa, g.nodes().end());
  ASSERT_EQ(sdpa->inputs.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(g.value(sdpa->inputs[i]).type.shape, (Shape{2, 4, 16, 16}));
  EXPECT_EQ(std::get<double>(sdpa->attrs.at("scale")), 0.25);
  EXPECT_EQ(std::get<bool>(sdpa->attrs.at("is_causal")), true);
  // Query is the split's first output, reshaped last (transformers does key and value first).
  const auto& query_transpose = producer(g, sdpa->inputs[0]);
  const auto& query_view = producer(g, query_transpose.inputs[0]);
  const auto& split = producer(g, query_view.inputs[0]);
  EXPECT_EQ(split.op, "aten::split.Tensor");
  EXPECT_EQ(query_view.inputs[0], split.outputs[0]);
  EXPECT_LT(producer(g, sdpa->inputs[1]).id, query_transpose.id);
}

TEST(GptTest, InputsOutputsAndBatchDimensions) {
  auto c = small();
  c.batch = 2;
  auto g = build_gpt(c);
  ASSERT_EQ(g.inputs().size(), 2u);
  EXPECT_EQ(g.value(g.inputs()[0]).name, "input_ids");
  EXPECT_EQ(g.value(g.inputs()[1]).name, "labels");
  for (auto id : g.inputs()) EXPECT_EQ(g.value(id).type, (ir::TensorType{ir::DType::I64, {2, 16}, 0}));
  ASSERT_EQ(g.outputs().size(), 2u);
  const auto& loss = g.value(g.outputs()[0]);
  EXPECT_EQ(producer(g, loss.id).op, "aten::cross_entropy_loss");
  EXPECT_EQ(loss.type, (ir::TensorType{ir::DType::F32, {}, {}}));
  // bf16: the logits returned are lm_head's, not the f32 copy the loss reads.
  const auto& logits = g.value(g.outputs()[1]);
  EXPECT_EQ(producer(g, logits.id).op, "aten::linear");
  EXPECT_EQ(logits.type, (ir::TensorType{ir::DType::BF16, {2, 16, 128}, 0}));
  // Batch 2 propagates through the flattened [b*s, h] views of Conv1D.
  for (const auto& n : g.nodes()) {
    if (n.op == "aten::addmm") {
      EXPECT_EQ(g.value(n.outputs[0]).type.batch_dim, 0) << g.value(n.outputs[0]).name;
    }
  }

  // f32: .float() returns the logits themselves, so the output is the upcast node's.
  c.dtype = ir::DType::F32;
  g = build_gpt(c);
  EXPECT_EQ(producer(g, g.outputs()[1]).op, "aten::to.dtype");

  // Without the loss: no labels, logits alone.
  c.with_loss = false;
  g = build_gpt(c);
  ASSERT_EQ(g.inputs().size(), 1u);
  ASSERT_EQ(g.outputs().size(), 1u);
  EXPECT_EQ(producer(g, g.outputs()[0]).op, "aten::linear");
  EXPECT_FALSE(g.find_value("labels").has_value());
}

TEST(GptTest, NoContiguousAsCaptureLeavesNone) {
  // torch.export records .contiguous() or not depending on the capture device's kernels, so
  // capture leaves every one out (VALUE_IDENTITIES); the built-in graph matches it at any batch.
  auto count_contiguous = [](const ir::Graph& g) {
    return std::count_if(g.nodes().begin(), g.nodes().end(),
                         [](const ir::Node& n) { return n.op == "aten::contiguous"; });
  };
  auto c = small();
  EXPECT_EQ(count_contiguous(build_gpt(c)), 0);
  c.batch = 2;
  EXPECT_EQ(count_contiguous(build_gpt(c)), 0);
}

TEST(GptTest, TextAndJsonRoundTrip) {
  auto c = small();
  c.batch = 2;
  const auto g = build_gpt(c);
  EXPECT_EQ(ir::parse_graph(ir::print_graph(g)), g);
  EXPECT_EQ(ir::graph_from_json_string(ir::graph_to_json_string(g)), g);
}

TEST(GptTest, ValidationErrorsNameTheField) {
  struct Case {
    void (*edit)(GptConfig&);
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](GptConfig& c) { c.layers = 0; }, "GptConfig.layers must be positive, got 0"},
      {[](GptConfig& c) { c.hidden = -64; }, "GptConfig.hidden must be positive, got -64"},
      {[](GptConfig& c) { c.heads = 0; }, "GptConfig.heads must be positive"},
      {[](GptConfig& c) { c.seq = 0; }, "GptConfig.seq must be positive"},
      {[](GptConfig& c) { c.vocab = 0; }, "GptConfig.vocab must be positive"},
      {[](GptConfig& c) { c.batch = 0; }, "GptConfig.batch must be positive"},
      {[](GptConfig& c) { c.ffn_hidden = -1; }, "GptConfig.ffn_hidden must be positive"},
      {[](GptConfig& c) { c.positions = -1; }, "GptConfig.positions must be positive"},
      {[](GptConfig& c) { c.heads = 5; }, "GptConfig.hidden (64) must be a multiple of GptConfig.heads (5)"},
      {[](GptConfig& c) { c.positions = 8; }, "GptConfig.positions (8) must be at least GptConfig.seq (16)"},
      {[](GptConfig& c) { c.dtype = ir::DType::I32; }, "GptConfig.dtype must be f64, f32, f16 or bf16, got i32"},
      {[](GptConfig& c) { c.dropout = 1.5; }, "GptConfig.dropout must be in [0, 1]"},
      {[](GptConfig& c) { c.layer_norm_eps = 0.0; }, "GptConfig.layer_norm_eps must be positive"},
  };
  for (const auto& test : cases) {
    auto c = small();
    test.edit(c);
    const auto message = error_of(c);
    EXPECT_NE(message.find(test.message), std::string::npos) << "got: " << message;
    EXPECT_EQ(message.rfind("build_gpt: ", 0), 0u) << message;
  }
  EXPECT_EQ(error_of(small()), "");
}

TEST(GptTest, TheLargestMegatronConfigBuilds) {
  // Structure only (about 5,000 nodes); benchmarks/planner_scaling.py times the builds.
  const auto start = std::chrono::steady_clock::now();
  const auto g = build_gpt(megatron_1t());
  std::printf("[ timing ] Megatron 1T graph built in %.3f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  EXPECT_EQ(g.nodes().size(), static_cast<std::size_t>(128 * kNodesPerLayer + 20));
  const auto sdpa = std::find_if(g.nodes().begin(), g.nodes().end(),
                                 [](const ir::Node& n) { return n.op == "aten::scaled_dot_product_attention"; });
  ASSERT_NE(sdpa, g.nodes().end());
  EXPECT_EQ(g.value(sdpa->outputs[0]).type.shape, (Shape{1, 160, 2048, 160}));
}

}  // namespace
}  // namespace shardwise::models
