#include "cost/op_cost.h"

#include <gtest/gtest.h>

#include "analysis/compiled_fusion.h"
#include "ir/graph.h"

namespace shardwise::cost {
namespace {

DeviceType a100() { return {"a100", {1.95e13, 1.56e14, 3.12e14, 3.12e14}, 80LL << 30, 2.039e12}; }

ir::TensorType bf16(std::vector<std::int64_t> shape, std::optional<int> batch_dim = std::nullopt) {
  ir::TensorType t;
  t.dtype = ir::DType::BF16;
  t.shape = std::move(shape);
  t.batch_dim = batch_dim;
  return t;
}

TEST(OpCost, MatmulFollowsTheEfficiencyCurve) {
  ir::Graph g;
  ir::ValueId x = g.add_value("x", bf16({2048, 4096}, 0), ir::ValueRole::Input);
  ir::ValueId w = g.add_value("w", bf16({4096, 4096}), ir::ValueRole::Parameter);
  g.add_node("aten::mm", {x, w}, {{"y", bf16({2048, 4096}, 0)}});
  AnalyticCostModel model;
  OpTime t = model.node_time(g, g.node(0), a100(), Precision::BF16, {});
  // d = 2*2048*4096^2 / (2 * (2048*4096*2 + 4096^2)) = 1024; eff = 0.75 * 1024 / 1120.
  double flops = 2.0 * 2048 * 4096 * 4096;
  double eff = 0.75 * 1024 / (1024 + 96);
  EXPECT_NEAR(t.forward, flops / (3.12e14 * eff), 1e-9);
  EXPECT_NEAR(t.backward, 2 * t.forward, 1e-12);
  EXPECT_TRUE(t.contraction);

  // Column split by 4 and batch x2: output and weight / 4, input x2.
  OpTime s = model.node_time(g, g.node(0), a100(), Precision::BF16, {2.0, 4, TensorSplit::Column});
  double m = 4096, k = 4096, n = 1024;
  double d = (m * k * n) / (m * k + k * n + m * n);
  EXPECT_NEAR(s.forward, 2 * m * k * n / (3.12e14 * 0.75 * d / (d + 96)), 1e-9);
}

// precision "fp8": a linear's forward product and dX at the fp8 peak, dW at bf16, plus the
// casts (each operand read twice, written as one byte per element); other nodes as bf16.
TEST(OpCost, AnFp8LinearRunsItsProductsAtTheFp8PeakAndPaysItsCasts) {
  ir::Graph g;
  ir::ValueId x = g.add_value("x", bf16({2048, 4096}, 0), ir::ValueRole::Input);
  ir::ValueId w = g.add_value("w", bf16({4096, 4096}), ir::ValueRole::Parameter);
  g.add_node("aten::mm", {x, w}, {{"y", bf16({2048, 4096}, 0)}});
  const ir::ValueId a = g.add_value("a", bf16({4096, 4096}), ir::ValueRole::Input);
  g.add_node("aten::mm", {g.node(0).outputs[0], a}, {{"z", bf16({2048, 4096}, 0)}});  // no weight: bf16
  DeviceType h100{"h100", {6.7e13, 4.945e14, 9.895e14, 9.895e14, 1.979e15}, 80LL << 30, 3.35e12};
  AnalyticCostModel model;
  const OpTime t = model.node_time(g, g.node(0), h100, Precision::FP8, {});
  const double flops = 2.0 * 2048 * 4096 * 4096, eff = 0.75 * 1024 / (1024 + 96), bandwidth = 3.35e12 * 0.75;
  const double x_elems = 2048.0 * 4096, w_elems = 4096.0 * 4096;
  // |x| (2 + 2) and its amax (2), scaled float32 copy (2 + 4), float8 cast (4 + 1): 17 bytes an
  // element of bf16;
  // W once more into _scaled_mm's layout in backward (1 + 1).
  const double cast_x = x_elems * (4 * 2 + 9) / bandwidth, cast_w = w_elems * (4 * 2 + 9) / bandwidth;
  const double relayout_w = w_elems * 2 / bandwidth;
  EXPECT_NEAR(t.forward, flops / (1.979e15 * eff) + cast_x + cast_w, 1e-12);
  EXPECT_NEAR(t.backward, flops / (1.979e15 * eff) + flops / (9.895e14 * eff) + cast_x + cast_w + relayout_w, 1e-12);
  EXPECT_TRUE(t.contraction);
  // The product of two activations computes in bf16, as in a bf16 plan.
  EXPECT_EQ(model.node_time(g, g.node(1), h100, Precision::FP8, {}),
            model.node_time(g, g.node(1), h100, Precision::BF16, {}));
  // In a float32 model the rest computes in float32 (the model's dtype), as does dW.
  ir::Graph f;
  auto f32 = [](std::vector<std::int64_t> shape) { return ir::TensorType{ir::DType::F32, std::move(shape), {}}; };
  const ir::ValueId fx = f.add_value("x", f32({2048, 4096}), ir::ValueRole::Input);
  const ir::ValueId fa = f.add_value("a", f32({4096, 4096}), ir::ValueRole::Input);
  const ir::ValueId fw = f.add_value("w", f32({4096, 4096}), ir::ValueRole::Parameter);
  f.add_node("aten::mm", {fx, fa}, {{"z", f32({2048, 4096})}});
  f.add_node("aten::mm", {fx, fw}, {{"y", f32({2048, 4096})}});
  EXPECT_EQ(model.node_time(f, f.node(0), h100, Precision::FP8, {}),
            model.node_time(f, f.node(0), h100, Precision::F32, {}));
  const double cast4 = (x_elems + w_elems) * (4 * 4 + 9) / bandwidth + relayout_w;
  EXPECT_NEAR(model.node_time(f, f.node(1), h100, Precision::FP8, {}).backward,
              flops / (1.979e15 * eff) + flops / (6.7e13 * eff) + cast4, 1e-12);
  // A column split by 4 divides the product, W and the output gradient, not x.
  const OpTime s = model.node_time(g, g.node(0), h100, Precision::FP8, {1.0, 4, TensorSplit::Column});
  const double d = (2048.0 * 4096 * 1024) / (2048.0 * 4096 + 4096.0 * 1024 + 2048.0 * 1024);
  const double e = 0.75 * d / (d + 96);
  EXPECT_NEAR(s.forward, flops / 4 / (1.979e15 * e) + cast_x + cast_w / 4, 1e-12);

  // Compiled (plan.compile), the runtime traces a linear whose weight is whole as it reads it
  // (held, or gathered: it saves its float8 W^T, transform/fp8_axes.h): its casts fused, each operand read twice and written as float8 (2 x 2 + 1
  // bytes an element of bf16), W's transposed copy written directly.
  const analysis::FusedValues fused = analysis::compiled_fusion(g);
  NodeContext compiled;
  compiled.compiled = &fused;
  const OpTime c = model.node_time(g, g.node(0), h100, Precision::FP8, compiled);
  const double fused_x = x_elems * 5 / bandwidth, fused_w = w_elems * 5 / bandwidth;
  EXPECT_NEAR(c.forward, flops / (1.979e15 * eff) + fused_x + fused_w, 1e-12);
  EXPECT_NEAR(c.backward, flops / (1.979e15 * eff) + flops / (9.895e14 * eff) + fused_x + fused_w, 1e-12);
  // Its weight split (amaxes all-reduced, a traced op): fused too, at the rank's shares; its
  // input gradient all-reduced beside dW (an asynchronous gradient): run eagerly, eager casts.
  NodeContext split = compiled;
  split.shards = 4;
  split.split = TensorSplit::Column;
  const OpTime cs = model.node_time(g, g.node(0), h100, Precision::FP8, split);
  EXPECT_NEAR(cs.forward, flops / 4 / (1.979e15 * e) + fused_x + fused_w / 4, 1e-12);
  split.async_input_gradient = true;
  EXPECT_EQ(model.node_time(g, g.node(0), h100, Precision::FP8, split),
            model.node_time(g, g.node(0), h100, Precision::FP8, {1.0, 4, TensorSplit::Column}));
}

TEST(OpCost, PointwiseIsMemoryBoundAndViewsAreFree) {
  ir::Graph g;
  ir::ValueId x = g.add_value("x", bf16({2048, 4096}, 0), ir::ValueRole::Input);
  ir::NodeId gelu = g.add_node("aten::gelu", {x}, {{"y", bf16({2048, 4096}, 0)}});
  ir::NodeId view = g.add_node("aten::view", {x}, {{"v", bf16({2048, 4096}, 0)}}, {{"size", std::vector<std::int64_t>{2048, 4096}}});
  AnalyticCostModel model;
  OpTime t = model.node_time(g, g.node(gelu), a100(), Precision::BF16, {});
  double bytes = 2.0 * 2048 * 4096 * 2;
  EXPECT_NEAR(t.forward, bytes / (2.039e12 * 0.75), 1e-12);
  EXPECT_NEAR(t.backward, 2 * t.forward, 1e-12);
  EXPECT_EQ(model.node_time(g, g.node(view), a100(), Precision::BF16, {}).forward, 0.0);
}

TEST(OpCost, EmbeddingBackwardWritesTheWholeTableGradient) {
  ir::Graph g;
  ir::ValueId table = g.add_value("wte", bf16({50304, 1024}), ir::ValueRole::Parameter);
  ir::TensorType ids{ir::DType::I64, {8, 128}, 0};
  ir::ValueId x = g.add_value("ids", ids, ir::ValueRole::Input);
  g.add_node("aten::embedding", {table, x}, {{"h", bf16({8, 128, 1024}, 0)}});
  AnalyticCostModel model;
  OpTime t = model.node_time(g, g.node(0), a100(), Precision::BF16, {});
  const double bandwidth = 2.039e12 * 0.75;
  const double out = 2.0 * 8 * 128 * 1024 * 2;  // read + write of the output
  EXPECT_NEAR(t.forward, out / bandwidth, 1e-12);
  // The output gradient read twice over, plus the dense table gradient zeroed and written.
  EXPECT_NEAR(t.backward, 2 * out / bandwidth + 2.0 * 50304 * 1024 * 2 / bandwidth, 1e-12);
}

TEST(OpCost, CausalFractionCountsTheTilesAFusedKernelComputes) {
  EXPECT_DOUBLE_EQ(attention_causal_fraction(2048, 2048, false, 128), 1.0);
  EXPECT_DOUBLE_EQ(attention_causal_fraction(2048, 2048, true, 128), 136.0 / 256.0);
  EXPECT_DOUBLE_EQ(attention_causal_fraction(8192, 8192, true, 128), 2080.0 / 4096.0);
  // One tile holds the whole matrix: every score computed.
  EXPECT_DOUBLE_EQ(attention_causal_fraction(100, 100, true, 128), 1.0);
  // 200 queries, 200 keys, tiles of 128: the first row tile computes 128 keys, the second
  // (72 rows) all 200. (128 * 128 + 72 * 200) / 200^2.
  EXPECT_DOUBLE_EQ(attention_causal_fraction(200, 200, true, 128), (128.0 * 128 + 72.0 * 200) / 40000.0);
}

ir::Graph attention_graph(bool causal, std::int64_t s) {
  ir::Graph g;
  auto q = g.add_value("q", bf16({4, 32, s, 128}, 0), ir::ValueRole::Input);
  auto k = g.add_value("k", bf16({4, 32, s, 128}, 0), ir::ValueRole::Input);
  auto v = g.add_value("v", bf16({4, 32, s, 128}, 0), ir::ValueRole::Input);
  g.add_node("aten::scaled_dot_product_attention", {q, k, v}, {{"o", bf16({4, 32, s, 128}, 0)}},
             {{"attn_mask", ir::NoneAttr{}}, {"dropout_p", 0.0}, {"enable_gqa", false}, {"is_causal", causal},
              {"scale", ir::NoneAttr{}}});
  return g;
}

TEST(OpCost, FusedAttentionIsItsComputedProductsWithoutScoreBytes) {
  AnalyticCostModel model;
  const std::int64_t s = 8192;
  // Intensity from Q, K, V and O only: 4 s^2 d per head over 2 x 4 s d elements = s / 2.
  const double heads = 4 * 32, d = 128, products = 4.0 * heads * s * s * d;
  const double intensity = products / (2.0 * 4 * heads * s * d);
  const double efficiency = 0.75 * intensity / (intensity + 96);
  const ir::Graph full = attention_graph(false, s);
  OpTime t = model.node_time(full, full.node(0), a100(), Precision::BF16, {});
  EXPECT_NEAR(t.forward, products / (3.12e14 * efficiency), 1e-12);
  EXPECT_NEAR(t.backward, 2.5 * t.forward, 1e-12);
  EXPECT_TRUE(t.contraction);
  // Causal: 2080 of 4096 tiles computed over the same Q, K, V and O: fewer products per
  // element moved, so the intensity falls with them.
  const ir::Graph causal = attention_graph(true, s);
  OpTime c = model.node_time(causal, causal.node(0), a100(), Precision::BF16, {});
  const double fraction = 2080.0 / 4096.0;
  const double causal_efficiency = 0.75 * intensity * fraction / (intensity * fraction + 96);
  EXPECT_NEAR(c.forward, products * fraction / (3.12e14 * causal_efficiency), 1e-12);
  EXPECT_LT(c.forward, 0.52 * t.forward);
  // Split by heads 4 ways (TensorSplit::All): a quarter of the work, the same intensity.
  OpTime split = model.node_time(causal, causal.node(0), a100(), Precision::BF16, {1.0, 4, TensorSplit::All});
  EXPECT_NEAR(split.forward, c.forward / 4, 1e-12);
}

TEST(OpCost, AnAttentionSplitOnlyByTheValuesColumnsComputesEveryScore) {
  // Split 4 ways by e (the value's columns: q and k whole, v and the output a quarter), each
  // rank computes every score Q K^T and a quarter of P V: (1 + 1/4) / 2 of the products, on
  // 1 + 1 + 1/4 + 1/4 of the operands' elements. By heads, a quarter of both.
  AnalyticCostModel model;
  const std::int64_t s = 2048;
  const ir::Graph g = attention_graph(false, s);
  NodeContext by_e;
  by_e.operand_shards = {1, 1, 4, 4};
  by_e.work_shards = 4;
  const double heads = 4 * 32, d = 128, products = 4.0 * heads * s * s * d;
  const double matmul = products * (1 + 0.25) / 2, elements = heads * s * d * 2.5;
  const double intensity = matmul / (2 * elements);
  EXPECT_NEAR(model.node_time(g, g.node(0), a100(), Precision::BF16, by_e).forward,
              matmul / (3.12e14 * 0.75 * intensity / (intensity + 96)), 1e-12);
  NodeContext by_heads;
  by_heads.operand_shards = {4, 4, 4, 4};
  by_heads.work_shards = 4;
  const double quarter = products / 4, quarter_intensity = quarter / (2 * heads * s * d);
  EXPECT_NEAR(model.node_time(g, g.node(0), a100(), Precision::BF16, by_heads).forward,
              quarter / (3.12e14 * 0.75 * quarter_intensity / (quarter_intensity + 96)), 1e-12);
}

TEST(OpCost, TheMathKernelComputesEveryScoreAndMovesNineBytesEach) {
  // The same causal attention as the math kernel: every score, Q K V O intensity, 9 bytes a
  // score (Megatron-LM 2021's kernel, fitted on its Table 1), backward 2 x.
  const std::int64_t s = 2048;
  ir::Graph g;
  auto q = g.add_value("q", bf16({4, 32, s, 128}, 0), ir::ValueRole::Input);
  auto k = g.add_value("k", bf16({4, 32, s, 128}, 0), ir::ValueRole::Input);
  auto v = g.add_value("v", bf16({4, 32, s, 128}, 0), ir::ValueRole::Input);
  g.add_node("aten::_scaled_dot_product_attention_math", {q, k, v},
             {{"o", bf16({4, 32, s, 128}, 0)}, {"p", bf16({4, 32, s, s}, 0)}},
             {{"attn_mask", ir::NoneAttr{}}, {"dropout_p", 0.0}, {"enable_gqa", false}, {"is_causal", true},
              {"dropout_mask", ir::NoneAttr{}}, {"scale", ir::NoneAttr{}}});
  AnalyticCostModel model;
  OpTime t = model.node_time(g, g.node(0), a100(), Precision::BF16, {});
  const double heads = 4 * 32, d = 128, products = 4.0 * heads * s * s * d;
  const double intensity = products / (2.0 * 4 * heads * s * d);
  const double gemm = products / (3.12e14 * 0.75 * intensity / (intensity + 96));
  const double softmax = heads * s * s * 9.0 / (2.039e12 * 0.75);
  EXPECT_NEAR(t.forward, gemm + softmax, 1e-12);
  EXPECT_NEAR(t.backward, 2 * gemm + 2 * softmax, 1e-12);
  // The flash kernel on the same shapes: about half the products, no score bytes.
  const ir::Graph flash = attention_graph(true, s);
  EXPECT_LT(model.node_time(flash, flash.node(0), a100(), Precision::BF16, {}).forward, 0.5 * t.forward);
}

TEST(OpCost, UnfusedAttentionPaysForItsScoresInMemory) {
  // matmul -> softmax -> matmul over [1, 16, 2048, 2048] scores: the softmax reads and writes
  // them (2 x 2 bytes each in bf16).
  ir::Graph g;
  const std::int64_t s = 2048;
  auto q = g.add_value("q", bf16({1, 16, s, 128}, 0), ir::ValueRole::Input);
  auto kt = g.add_value("kt", bf16({1, 16, 128, s}, 0), ir::ValueRole::Input);
  auto scores = g.node(g.add_node("aten::matmul", {q, kt}, {{"scores", bf16({1, 16, s, s}, 0)}})).outputs[0];
  g.add_node("aten::softmax.int", {scores}, {{"probs", bf16({1, 16, s, s}, 0)}},
             {{"dim", std::int64_t{-1}}, {"dtype", ir::NoneAttr{}}});
  AnalyticCostModel model;
  OpTime softmax = model.node_time(g, g.node(1), a100(), Precision::BF16, {});
  EXPECT_NEAR(softmax.forward, 2.0 * 16 * s * s * 2 / (2.039e12 * 0.75), 1e-12);
}

TEST(OpCost, AMeasuredDeviceIsPricedAtItsMeasuredTimes) {
  // A 1024 GEMM measured at 45 GFLOP/s and a 64 MiB copy at 15 GB/s: the device written from
  // them prices the same GEMM and the same copy at exactly the measured seconds.
  AnalyticConstants constants;
  const std::int64_t n = 1024, bytes = 64 << 20;
  const double gemm_seconds = 2.0 * n * n * n / 45e9, copy_seconds = 2.0 * bytes / 15e9;
  DeviceType cpu{"cpu", {}, 1LL << 30, bandwidth_for_measured_copy(constants, 15e9)};
  cpu.peak_flops = {peak_for_measured_gemm(constants, 45e9, n), 1, 1, 1};
  EXPECT_NEAR(cpu.peak_flops.at(Precision::F32), 45e9 / (0.75 * (1024.0 / 3) / (1024.0 / 3 + 96)), 1e-3);
  ir::Graph g;
  ir::TensorType f32{ir::DType::F32, {n, n}, std::nullopt};
  ir::ValueId a = g.add_value("a", f32, ir::ValueRole::Input);
  ir::ValueId b = g.add_value("b", f32, ir::ValueRole::Input);
  g.add_node("aten::mm", {a, b}, {{"c", f32}});
  ir::TensorType u8{ir::DType::U8, {bytes}, std::nullopt};
  ir::ValueId src = g.add_value("src", u8, ir::ValueRole::Input);
  g.add_node("aten::clone", {src}, {{"dst", u8}});
  AnalyticCostModel model(constants);
  EXPECT_NEAR(model.node_time(g, g.node(0), cpu, Precision::F32, {}).forward, gemm_seconds, 1e-12);
  EXPECT_NEAR(model.node_time(g, g.node(1), cpu, Precision::F32, {}).forward, copy_seconds, 1e-12);
}

TEST(OpCost, EfficiencyCurveSaturates) {
  AnalyticConstants c;
  EXPECT_NEAR(matmul_efficiency(c, 96), 0.375, 1e-12);
  EXPECT_LT(matmul_efficiency(c, 1e6), 0.75);
  EXPECT_GT(matmul_efficiency(c, 1e6), 0.749);
}

}  // namespace
}  // namespace shardwise::cost

namespace shardwise::cost {
namespace {

// A compiled plan's memory-bound nodes move only what crosses memory (analysis/compiled_fusion.h):
// mm -> gelu -> mul(., s) -> mm, and add(m, z) after the second product. Each [64, 64] bf16
// tensor is 8,192 bytes.
TEST(OpCost, ACompiledPlansPointwiseChainMovesOnlyWhatCrossesMemory) {
  ir::Graph g;
  auto t = [] { return ir::TensorType{ir::DType::BF16, {64, 64}, {}}; };
  const auto x = g.add_value("x", t(), ir::ValueRole::Input);
  const auto w = g.add_value("w", t(), ir::ValueRole::Parameter);
  const auto s = g.add_value("s", t(), ir::ValueRole::Input);
  auto node = [&](const char* op, std::vector<ir::ValueId> in, const char* name) {
    return g.add_node(op, std::move(in), {{name, t()}});
  };
  const ir::NodeId mm = node("aten::mm", {x, w}, "y");
  const ir::NodeId gelu = node("aten::gelu", {g.node(mm).outputs[0]}, "g");
  const ir::NodeId mul = node("aten::mul.Tensor", {g.node(gelu).outputs[0], s}, "m");
  const ir::NodeId mm2 = node("aten::mm", {g.node(mul).outputs[0], w}, "z");
  const ir::NodeId add = node("aten::add.Tensor", {g.node(mul).outputs[0], g.node(mm2).outputs[0]}, "out");
  g.set_outputs({g.node(add).outputs[0]});
  const analysis::FusedValues fused = analysis::compiled_fusion(g);
  AnalyticCostModel model;
  const double bandwidth = 2.039e12 * 0.75, tensor = 8192;
  NodeContext compiled;
  compiled.compiled = &fused;
  auto time = [&](ir::NodeId n, const NodeContext& context) {
    return model.node_time(g, g.node(n), a100(), Precision::BF16, context);
  };
  // gelu reads y and writes nothing (g stays in registers); mul reads s and writes m; the add
  // reads m and z again and writes the output.
  EXPECT_NEAR(time(gelu, compiled).forward, tensor / bandwidth, 1e-18);
  EXPECT_NEAR(time(mul, compiled).forward, 2 * tensor / bandwidth, 1e-18);
  EXPECT_NEAR(time(add, compiled).forward, 3 * tensor / bandwidth, 1e-18);
  EXPECT_NEAR(time(gelu, compiled).backward, 2 * tensor / bandwidth, 1e-18);  // memory_backward_factor
  // Eager: gelu writes g (2 tensors), mul reads it as a fused pointwise pair would (2).
  EXPECT_NEAR(time(gelu, {}).forward, 2 * tensor / bandwidth, 1e-18);
  EXPECT_NEAR(time(mul, {}).forward, 2 * tensor / bandwidth, 1e-18);
  // Products are their library kernels either way.
  EXPECT_EQ(time(mm, compiled), time(mm, {}));
  // Split four ways (every operand), a quarter of the bytes.
  NodeContext split = compiled;
  split.shards = 4;
  split.split = TensorSplit::All;
  EXPECT_NEAR(time(mul, split).forward, 2 * tensor / 4 / bandwidth, 1e-18);
}

}  // namespace
}  // namespace shardwise::cost
