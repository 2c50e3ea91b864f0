#include "cost/plan_cost.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <set>
#include <vector>
#include <nlohmann/json.hpp>

#include "cost/cluster_presets.h"
#include "cost/collective_cost.h"
#include "cost/layer_structure.h"
#include "cost/memory_cost.h"
#include "cost/pipeline_transfers.h"
#include "models/gpt.h"
#include "schedule/schedules.h"
#include "support/error.h"

namespace shardwise::cost {
namespace {

ir::Graph tiny_gpt() { return models::build_gpt({.layers = 4, .hidden = 64, .heads = 4, .seq = 16, .vocab = 128}); }

plan::Plan tiny_plan() {
  plan::Plan p;
  p.tensor = 2;
  p.pipeline = 2;
  p.data = 2;
  p.global_batch = 8;
  p.micro_batch = 1;  // m = 8 / (1 x 2) = 4
  return p;
}

// An fp8 plan's stage holds its casts' copies at once (op_cost.h, fp8_cast_transient_bytes), as
// the SPMD search prices them: the most is the MLP's down projection's (row-parallel over t = 2):
// x, 4 x 16 x 256 / 2 elements (one micro-batch of 4 rows), cast to float32 and float8 (5 bytes
// an element), then W, 64 x 256 / 2, beside x's float8 copy. In one micro-batch the stage's
// backward holds nothing beyond its gradients (no parameter has one at its first backward), so
// the casts add to the bf16 plan's memory.
TEST(PlanCost, AnFp8PlanHoldsItsLargestCastsCopiesAtOnce) {
  const ir::Graph g = tiny_gpt();
  const Cluster c = preset("dgx-h100", 1);
  AnalyticCostModel model;
  plan::Plan bf16 = tiny_plan();
  bf16.micro_batch = 4;  // m = 8 / (4 x 2) = 1
  plan::Plan fp8 = bf16;
  fp8.precision = "fp8";
  const PlanCost as_bf16 = evaluate(g, c, bf16, model), as_fp8 = evaluate(g, c, fp8, model);
  const double x = 4 * 16.0 * 256 / 2, w = 64.0 * 256 / 2;
  const double casts = std::max(5 * x, x + 5 * w);
  EXPECT_DOUBLE_EQ(casts, 8192 + 5 * 8192);
  EXPECT_DOUBLE_EQ(as_fp8.memory_breakdown.at("fp8_casts"), casts);
  EXPECT_DOUBLE_EQ(as_fp8.memory_breakdown.at("backward_working"), 0);
  EXPECT_FALSE(as_bf16.memory_breakdown.contains("fp8_casts"));
  EXPECT_DOUBLE_EQ(as_fp8.memory_per_rank, as_bf16.memory_per_rank + casts);
  // In 4 micro-batches of a row (1F1B) every backward from the second on finds the gradients
  // made and holds its own in flight on top of them (47,104 bytes here), more than the casts
  // (43,008 at a row), which come at another moment: the larger counts, the casts add nothing.
  plan::Plan fp8_in_four = tiny_plan();
  fp8_in_four.precision = "fp8";
  const PlanCost four = evaluate(g, c, fp8_in_four, model);
  const double casts_of_a_row = std::max(5 * x / 4, x / 4 + 5 * w);
  EXPECT_DOUBLE_EQ(casts_of_a_row, 2048 + 5 * 8192);
  EXPECT_GT(four.memory_breakdown.at("backward_working"), casts_of_a_row);
  EXPECT_DOUBLE_EQ(four.memory_breakdown.at("fp8_casts"), 0);
  EXPECT_THROW(evaluate(g, preset("dgx-a100", 1), fp8, model), support::ValidationError);  // no FP8 units
}

// plan.state_dtype: a run stepping its bf16 parameters in bf16 holds 2 + 2 + 4 bytes a
// parameter where the mixed-precision convention holds 2 + 2 + 12: the optimizer's share a
// third, its step shorter, everything else as it was.
TEST(PlanCost, AStateDtypeWithoutMasterCopyHoldsAThirdOfTheOptimizerState) {
  const ir::Graph g = tiny_gpt();
  const Cluster c = preset("dgx-h100", 1);
  AnalyticCostModel model;
  plan::Plan own = tiny_plan();
  own.state_dtype = "bf16";
  const PlanCost mixed = evaluate(g, c, tiny_plan(), model), plain = evaluate(g, c, own, model);
  EXPECT_DOUBLE_EQ(plain.memory_breakdown.at("optimizer"), mixed.memory_breakdown.at("optimizer") / 3);
  EXPECT_DOUBLE_EQ(plain.memory_breakdown.at("weights"), mixed.memory_breakdown.at("weights"));
  EXPECT_DOUBLE_EQ(plain.memory_breakdown.at("activations"), mixed.memory_breakdown.at("activations"));
  // The optimizer's step reads and writes fewer bytes; the rest of the step is the same.
  EXPECT_LT(plain.breakdown().at("optimizer"), mixed.breakdown().at("optimizer"));
  EXPECT_DOUBLE_EQ(plain.breakdown().at("compute"), mixed.breakdown().at("compute"));
}

// ZeRO-1 as the runtime runs it (runtime/optim.py): each parameter is stepped by one owner of
// its data group and broadcast to the others after the step, before the next forward reads
// it. The evaluator prices that broadcast of the rank's weights over its data ranks (0, 2, 4,
// 6 at t 2), exposed, as the SPMD search does (zero_broadcast); without ZeRO there is none.
TEST(PlanCost, ZeroOneBroadcastsEachOwnersParametersAfterTheStep) {
  const ir::Graph g = tiny_gpt();
  const Cluster c = preset("dgx-h100", 1);
  AnalyticCostModel model;
  plan::Plan plain = tiny_plan();
  plain.pipeline = 1;
  plain.data = 4;  // m = 8 / (1 x 4) = 2
  plan::Plan zero = plain;
  zero.zero_stage = 1;
  const PlanCost without = evaluate(g, c, plain, model), with = evaluate(g, c, zero, model);
  EXPECT_FALSE(without.breakdown().contains("zero_broadcast"));
  const double weights = with.memory_breakdown.at("weights");
  EXPECT_DOUBLE_EQ(weights, without.memory_breakdown.at("weights"));  // ZeRO-1 shards no weight
  const double broadcast =
      model.collective_time(c, CollectiveKind::Broadcast, std::vector<int>{0, 2, 4, 6}, static_cast<std::int64_t>(weights),
                            Algorithm::Auto);
  EXPECT_GT(broadcast, 0);
  EXPECT_DOUBLE_EQ(with.breakdown().at("zero_broadcast"), broadcast);
  EXPECT_DOUBLE_EQ(with.step_time, with.compute + with.tensor_parallel + with.pipeline_p2p + with.pipeline_bubble +
                                       with.data_parallel + with.optimizer + broadcast);
  // The rest of the step is the same; the optimizer steps a quarter of the parameters.
  EXPECT_DOUBLE_EQ(with.compute, without.compute);
  EXPECT_DOUBLE_EQ(with.data_parallel, without.data_parallel);
  EXPECT_LT(with.optimizer, without.optimizer);
}

// Context parallelism (plan.context): each rank of a stage holds half of every row's tokens,
// so at the same micro-batch count the saved activations halve exactly; with 2 heads on 2
// tensor ranks the 2 context ranks cannot split heads, so attention runs as a ring, whose
// last rank computes (2c - 1) / c of its share of attention and waits for the sends the
// blocks do not hide (context_parallel, shown apart from the compute that holds it). With 16
// heads the heads' all-to-all is cheaper than the ring's imbalance, and is priced instead.
// plan.expert: each rank of a stage's data axis holds a quarter of every layer's experts (and
// their gradients and optimizer states, reduced over no rank), and pays the tokens' gathers and
// the outputs' reduce-scatters around each experts op, exposed inside compute.
TEST(PlanCost, AnExpertSplitHoldsAQuarterOfTheExpertsAndPricesTheirDispatch) {
  const ir::Graph g = models::build_gpt(
      {.layers = 4, .hidden = 1024, .heads = 16, .seq = 2048, .vocab = 32000, .ffn_hidden = 2048, .experts = 8});
  const Cluster c = preset("dgx-h100", 1);
  AnalyticCostModel model;
  plan::Plan rows;
  rows.pipeline = 2, rows.data = 4, rows.global_batch = 16, rows.micro_batch = 1;
  plan::Plan split = rows;
  split.expert = 4;
  const PlanCost a = evaluate(g, c, rows, model);
  const PlanCost b = evaluate(g, c, split, model);
  // A stage's 2 layers hold 2 x 50.3M expert parameters beside 2 x 4.2M others and the
  // embedding's 34.8M: three quarters of the experts dropped is about half of the rank's states.
  for (const char* kind : {"weights", "gradients", "optimizer"}) {
    const double saved = 1 - b.memory_breakdown.at(kind) / a.memory_breakdown.at(kind);
    EXPECT_GT(saved, 0.45) << kind;
    EXPECT_LT(saved, 0.75) << kind;
  }
  EXPECT_EQ(a.breakdown().count("expert_parallel"), 0u);
  EXPECT_GT(b.expert_parallel, 0);
  EXPECT_EQ(b.breakdown().at("expert_parallel"), b.expert_parallel);
  EXPECT_NEAR(b.compute - a.compute, b.expert_parallel, 1e-9 * b.compute);
  EXPECT_LT(b.data_parallel_total, a.data_parallel_total);  // the experts' gradients reduced over no rank
  // An expert count the ranks do not divide, or a graph without experts, is refused by name.
  const ir::Graph six = models::build_gpt(
      {.layers = 4, .hidden = 1024, .heads = 16, .seq = 2048, .vocab = 32000, .ffn_hidden = 2048, .experts = 6});
  try {
    evaluate(six, c, split, model);
    ADD_FAILURE() << "6 experts over 4 ranks were priced";
  } catch (const support::ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find("the 6 experts of transformer.h.0.mlp.experts do not split over 4 ranks"),
              std::string::npos)
        << e.what();
  }
  const ir::Graph dense = models::build_gpt({.layers = 4, .hidden = 1024, .heads = 16, .seq = 2048, .vocab = 32000});
  EXPECT_THROW(evaluate(dense, c, split, model), support::ValidationError);
}

TEST(PlanCost, AContextSplitHoldsHalfOfEachSequenceAndPricesTheRing) {
  const ir::Graph g = models::build_gpt({.layers = 4, .hidden = 1024, .heads = 2, .seq = 8192, .vocab = 32000});
  const Cluster c = preset("dgx-h100", 1);
  AnalyticCostModel model;
  plan::Plan rows;  // two micro-batches of one row on each of 2 data ranks
  rows.tensor = 2, rows.pipeline = 2, rows.data = 2, rows.global_batch = 4, rows.micro_batch = 1;
  plan::Plan ring = rows;  // two micro-batches of one row split over 2 context ranks
  ring.data = 1, ring.context = 2, ring.global_batch = 2;
  const PlanCost a = evaluate(g, c, rows, model);
  const PlanCost b = evaluate(g, c, ring, model);
  ASSERT_EQ(a.micro_batches, 2);
  ASSERT_EQ(b.micro_batches, 2);
  EXPECT_NEAR(b.memory_breakdown.at("activations"), a.memory_breakdown.at("activations") / 2,
              1e-9 * a.memory_breakdown.at("activations"));
  EXPECT_EQ(a.breakdown().count("context_parallel"), 0u);
  EXPECT_GT(b.context_parallel, 0);
  EXPECT_EQ(b.breakdown().at("context_parallel"), b.context_parallel);
  EXPECT_LT(b.context_parallel, b.compute);
  // Half the tokens, but attention's causal share is 3/2 of half on the last rank: more than
  // half the compute, less than all of it.
  EXPECT_GT(b.compute, a.compute / 2);
  EXPECT_LT(b.compute, a.compute);
  // Gradients are reduced over the 2 context ranks as over 2 data ranks.
  EXPECT_GT(b.data_parallel_total, 0);
  const ir::Graph heads = models::build_gpt({.layers = 4, .hidden = 1024, .heads = 16, .seq = 8192, .vocab = 32000});
  const PlanCost h = evaluate(heads, c, ring, model);
  EXPECT_NEAR(h.memory_breakdown.at("activations"), b.memory_breakdown.at("activations"),
              1e-9 * b.memory_breakdown.at("activations"));
  EXPECT_GT(h.context_parallel, 0);
  EXPECT_LT(h.compute, b.compute);  // no causal imbalance: whole sequences over half the heads
  EXPECT_GT(h.compute, a.compute / 2);
  // A sequence the ranks do not split evenly is no plan the runtime runs: refused, naming the
  // layer (its module) and the numbers.
  const ir::Graph odd = models::build_gpt({.layers = 4, .hidden = 1024, .heads = 16, .seq = 8191, .vocab = 32000});
  try {
    evaluate(odd, c, ring, model);
    ADD_FAILURE() << "a sequence of 8191 over 2 context ranks was priced";
  } catch (const support::ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find("(module 'transformer.h.0.attn') has a sequence of 8191 that 2 ranks do "
                                         "not split"),
              std::string::npos)
        << e.what();
  }
}

TEST(PlanCost, FindsMegatronPairsAndCountsAllReduces) {
  ir::Graph g = tiny_gpt();
  Cluster c = preset("dgx-a100", 1);
  AnalyticCostModel model;
  PlanCost cost = evaluate(g, c, tiny_plan(), model);
  EXPECT_EQ(cost.layers, 4);
  EXPECT_EQ(cost.tensor_parallel_pairs_per_layer, 2);  // attention (c_attn, c_proj) and MLP (c_fc, c_proj)
  EXPECT_EQ(cost.all_reduces_per_layer_per_micro_batch, 4);  // 1 forward + 1 backward per pair
  EXPECT_EQ(cost.micro_batches, 4);

  // Hand-checked tensor-parallel time on the first stage, the bottleneck: m x (2 layers x 2
  // pairs x 2 all-reduces of the row-parallel output + the forward all-reduces of the two
  // vocabulary-parallel lookups, wte and wpe), each [16, 64] bf16 = 2,048 bytes over {0, 1}.
  std::vector<int> tp = {0, 1};
  double one = collective_time(c, CollectiveKind::AllReduce, tp, 16 * 64 * 2);
  EXPECT_NEAR(cost.tensor_parallel, 4 * (2 * 2 * 2 + 2) * one, 1e-12);

  // 1F1B's bubble is (p - 1) / m of the ideal time where the stages are equal; here the first
  // stage (the lookups) is the slower, and a slow first stage waits only for the second's
  // forward and backward beyond its own (pipeline_transfers.h, uneven_bubble_scale; its figures
  // are checked by hand in pipeline_transfers_test.cc): less than that, never nothing.
  ASSERT_EQ(cost.stage_times.size(), 2u);
  EXPECT_GT(cost.stage_times[0], cost.stage_times[1]);
  EXPECT_LT(cost.bubble_fraction, 1.0 / 4);
  EXPECT_GT(cost.bubble_fraction, 0.0);
  // The tied embedding's gradient summed between the first and last stage after the step.
  EXPECT_GT(cost.shared_weight_sync, 0);
  EXPECT_NEAR(cost.step_time, cost.compute + cost.tensor_parallel + cost.pipeline_p2p + cost.pipeline_bubble +
                                  cost.data_parallel + cost.optimizer + cost.shared_weight_sync,
              1e-15);
  // p > 1: each bucket is issued in the last backward that completes it (runtime/buckets.py),
  // so the reduction hides behind the stage's last chunk and the cooldown after it, less the
  // interference: between interference x total and the total, never the whole of it.
  EXPECT_TRUE(cost.data_parallel_overlapped);
  EXPECT_GT(cost.data_parallel_total, 0.0);
  EXPECT_LT(cost.data_parallel, cost.data_parallel_total);
  EXPECT_GE(cost.data_parallel, kOverlapInterference * cost.data_parallel_total - 1e-15);

  // Model FLOPs: per sample 3 x the forward matmuls (layers and LM head); Megatron's
  // accounting counts the layers' forward 4 times (recomputation included).
  //   layer: 2*16*(3+1+8)*64^2 + 2*2*16*16*64 = 1,638,400; head: 2*16*64*128 = 262,144.
  EXPECT_DOUBLE_EQ(cost.model_flops, 8.0 * 3 * (4 * 1638400.0 + 262144.0));
  EXPECT_NEAR(cost.tflops_per_device, cost.model_flops / cost.step_time / 8 / 1e12, 1e-9);
  EXPECT_DOUBLE_EQ(cost.megatron_flops, 8.0 * (4 * 4 * 1638400.0 + 3 * 262144.0));
  EXPECT_NEAR(cost.megatron_tflops_per_device, cost.megatron_flops / cost.step_time / 8 / 1e12, 1e-9);
}

TEST(PlanCost, StageMeshesPriceEachStageOnItsOwnWidth) {
  ir::Graph g = tiny_gpt();
  Cluster c = preset("dgx-a100", 1);
  AnalyticCostModel model;
  // The same layout written as stage meshes: two stages of {data 2, tensor 2}, a micro-batch
  // of 2 rows (1 per data rank). Compute, tensor parallelism, data parallelism, memory: as
  // the plain plan's. Only the boundary differs: equal meshes send by coordinate a rank's
  // share of the whole (the plain plan's Megatron scatter prices whole / t).
  plan::Plan plain = tiny_plan();
  plain.recompute = plan::Recompute::None;
  plan::Plan meshes = plain;
  meshes.data = meshes.tensor = 1;
  meshes.micro_batch = 2;
  meshes.stage_meshes = {{2, 2}, {2, 2}};
  const PlanCost a = evaluate(g, c, plain, model), b = evaluate(g, c, meshes, model);
  EXPECT_NEAR(b.compute, a.compute, 1e-15);
  EXPECT_NEAR(b.tensor_parallel, a.tensor_parallel, 1e-15);
  EXPECT_NEAR(b.data_parallel_total, a.data_parallel_total, 1e-15);
  EXPECT_NEAR(b.optimizer, a.optimizer, 1e-15);
  EXPECT_NEAR(b.memory_per_rank, a.memory_per_rank, 1e-6);
  EXPECT_LE(b.pipeline_p2p, a.pipeline_p2p);

  // 8 GPUs as a narrow first stage and a wide second one: the wide stage's ranks each run a
  // third of the rows, so with layers split 1 : 3 the two stages take about the same time.
  plan::Plan uneven = meshes;
  uneven.micro_batch = 6;
  uneven.global_batch = 24;
  uneven.stage_meshes = {{2, 1}, {6, 1}};
  uneven.layers_per_stage = {1, 3};
  const PlanCost u = evaluate(g, c, uneven, model);
  ASSERT_EQ(u.stage_times.size(), 2u);
  EXPECT_GT(u.stage_times[1], 0.0);
  // stage 0: 1 layer + the embeddings at 3 rows; stage 1: 3 layers + the head at 1 row.
  EXPECT_LT(std::abs(u.stage_times[0] / u.stage_times[1] - 1.0), 0.6) << u.stage_times[0] << " " << u.stage_times[1];
  plan::Plan even = uneven;
  even.layers_per_stage = {2, 2};
  // The narrow stage with half the layers is the slower stage: the whole step's m micro-batches
  // run at its pace. (Its step need not be: a slow first stage idles for little of the second's,
  // pipeline_transfers.h.)
  const PlanCost e = evaluate(g, c, even, model);
  EXPECT_LT(*std::ranges::max_element(u.stage_times), *std::ranges::max_element(e.stage_times));
  EXPECT_LT(u.compute, e.compute);
  // Between meshes of different shapes the boundary value goes whole (gathered on the
  // sender's sub-mesh): priced, not free.
  EXPECT_GT(u.pipeline_p2p, 0.0);
  EXPECT_THROW(evaluate(g, preset("dgx-a100", 2), uneven, model), support::ValidationError);  // 16 ranks, plan has 8
}

TEST(PlanCost, RecomputationAndInterleaving) {
  ir::Graph g = tiny_gpt();
  Cluster c = preset("dgx-a100", 1);
  AnalyticCostModel model;
  plan::Plan p = tiny_plan();
  PlanCost base = evaluate(g, c, p, model);
  p.recompute = plan::Recompute::Full;
  PlanCost rec = evaluate(g, c, p, model);
  EXPECT_EQ(rec.all_reduces_per_layer_per_micro_batch, 6);  // recomputation repeats the forward ones
  EXPECT_GT(rec.compute, base.compute);
  EXPECT_LT(rec.memory_breakdown.at("activations"), base.memory_breakdown.at("activations") * 1.01 + 1);
  EXPECT_DOUBLE_EQ(rec.model_flops, base.model_flops);  // same accounting either way

  p.schedule = plan::Schedule::Interleaved1F1B;
  p.virtual_stages = 2;
  PlanCost inter = evaluate(g, c, p, model);
  // (p - 1) / (v m) with equal stages; the slower first stage's share of it here (above).
  EXPECT_LT(inter.bubble_fraction, 1.0 / (2 * 4));
  EXPECT_LT(inter.bubble_fraction, rec.bubble_fraction);  // interleaving shrinks it
}

// A model with two families of repeated blocks (DeepSeek-V3's dense first layers, then its
// mixture-of-experts layers): recomputation checkpoints both, as the runtime does. The dense
// family sits before the layers (the largest family), so its blocks are priced with the
// embedding, and under full recomputation each micro-batch keeps only their checkpoints (each
// block's residual input), the block recomputed in the backward holding its saved bytes
// meanwhile (here larger than a layer's, whose experts save less than a dense MLP), and their
// forward runs again. By hand from the structure: one stage, GPipe, m = 2 micro-batches in flight.
TEST(PlanCost, RecomputationCheckpointsEveryFamilyOfRepeatedBlocks) {
  const ir::Graph g = models::build_gpt({.layers = 6, .hidden = 64, .heads = 4, .seq = 16, .vocab = 128,
                                         .ffn_hidden = 256, .experts = 4, .dense_layers = 2});
  const LayerStructure structure = find_layer_structure(g);
  ASSERT_EQ(structure.num_layers(), 4);
  ASSERT_EQ(structure.outer_block_checkpoint.size(), 2U);  // transformer.h.0 and .1
  const Cluster c = preset("dgx-h100", 1);
  AnalyticCostModel model;
  plan::Plan p;
  p.schedule = plan::Schedule::GPipe;
  p.micro_batch = 1;
  p.data = 8;
  p.global_batch = 16;  // m = 16 / (1 x 8) = 2
  const PlanCost none = evaluate(g, c, p, model);
  p.recompute = plan::Recompute::Full;
  const PlanCost full = evaluate(g, c, p, model);

  const DeviceType& device = c.device_of(0);
  auto saved = [&](ir::NodeId id) { return static_cast<double>(structure.activation_bytes[static_cast<std::size_t>(id)]); };
  auto forward = [&](ir::NodeId id) { return model.node_time(g, g.node(id), device, Precision::BF16, {}).forward; };
  double layer = 0, layer_forward = 0, outside = 0, dense = 0, dense_forward = 0, checkpoints = 0;
  std::vector<double> per_block(2, 0.0);
  for (ir::NodeId id : structure.layers->nodes.front()) layer += saved(id), layer_forward += forward(id);
  for (const ir::Node& node : g.nodes()) {
    const int block = structure.outer_block[static_cast<std::size_t>(node.id)];
    if (block < 0) continue;
    EXPECT_TRUE(node.module_path.starts_with(fmt::format("transformer.h.{}", block))) << node.module_path;
    dense += saved(node.id), dense_forward += forward(node.id);
    per_block[static_cast<std::size_t>(block)] += saved(node.id);
  }
  for (ir::NodeId id : structure.pre) outside += saved(id);
  for (ir::NodeId id : structure.post) outside += saved(id);
  for (ir::ValueId v : structure.outer_block_checkpoint) checkpoints += static_cast<double>(g.value(v).type.bytes());
  const double largest = std::max(per_block[0], per_block[1]);
  ASSERT_GT(largest, layer);
  const double m = 2, layers = 4, kept = structure.layer_input_bytes;
  EXPECT_DOUBLE_EQ(none.memory_breakdown.at("activations"), m * (layers * layer + outside));
  EXPECT_NEAR(full.memory_breakdown.at("activations"),
              m * (layers * kept + outside - dense + checkpoints) + layer + (largest - layer),
              1e-9 * none.memory_breakdown.at("activations"));
  EXPECT_NEAR(full.compute - none.compute, m * (layers * layer_forward + dense_forward), 1e-9 * full.compute);
}

// Selective recomputation sits between none and full in both prices: it runs again only the
// forward of the ops it does not keep, and keeps, beside each layer's input, the outputs of
// its products and fused attention. Its collectives run again, as under full recomputation.
TEST(PlanCost, SelectiveRecomputationRunsTheCheapOpsAgainAndKeepsTheProducts) {
  ir::Graph g = tiny_gpt();
  Cluster c = preset("dgx-a100", 1);
  AnalyticCostModel model;
  plan::Plan p = tiny_plan();
  const PlanCost none = evaluate(g, c, p, model);
  p.recompute = plan::Recompute::Full;
  const PlanCost full = evaluate(g, c, p, model);
  p.recompute = plan::Recompute::Selective;
  const PlanCost selective = evaluate(g, c, p, model);
  EXPECT_EQ(selective.all_reduces_per_layer_per_micro_batch, 6);
  EXPECT_GT(selective.compute, none.compute);
  EXPECT_LT(selective.compute, full.compute);
  const auto acts = [](const PlanCost& cost) { return cost.memory_breakdown.at("activations"); };
  EXPECT_GT(acts(selective), acts(full));
  EXPECT_LT(acts(selective), acts(none));
  EXPECT_DOUBLE_EQ(selective.model_flops, none.model_flops);

  // Exactly: the first stage holds min(m, p) = 2 micro-batches of its 2 layers; selective
  // keeps per layer, beyond full's input, the bytes of the outputs of the layer's kept nodes.
  const LayerStructure structure = find_layer_structure(g);
  double kept = 0;
  for (ir::NodeId id : structure.layers->nodes.front()) {
    if (!structure.selective_kept[static_cast<std::size_t>(id)]) continue;
    const auto split = structure.layer_split.find(id);
    const bool column = split != structure.layer_split.end() &&
                        (split->second == TensorSplit::Column || split->second == TensorSplit::All);
    for (ir::ValueId out : g.node(id).outputs)
      kept += static_cast<double>(g.value(out).type.bytes()) / (column ? p.tensor : 1);
  }
  EXPECT_GT(kept, 0);
  const double batch_scale = static_cast<double>(p.micro_batch) / structure.graph_batch;
  EXPECT_NEAR(acts(selective) - acts(full), 2 * 2 * kept * batch_scale, 1e-6 * acts(selective));
}

TEST(PlanCost, ZeroBubbleH1FillsTheBubbleWithWeightGradientsAtOneFOneBsMemory) {
  ir::Graph g = tiny_gpt();
  Cluster c = preset("dgx-a100", 1);
  AnalyticCostModel model;
  plan::Plan p = tiny_plan();
  p.recompute = plan::Recompute::None;
  const PlanCost one = evaluate(g, c, p, model);
  p.schedule = plan::Schedule::ZeroBubbleH1;
  const PlanCost zb = evaluate(g, c, p, model);
  // The same work; the bubble (p - 1)(F + B - W) = (p - 1)(t - 2W), W half the bottleneck
  // stage's backward: 1F1B's (p - 1) t less (p - 1) times that backward, which is more than a
  // third and less than all of a micro-batch's compute on the stage (backward ~ 2 x forward).
  EXPECT_DOUBLE_EQ(zb.compute, one.compute);
  // The sends each step waits for (pipeline_transfers.h) at p = 2, m = 4: one a micro-batch in
  // both, their receives posted a computation early (with each posted where it is read, 1F1B
  // waited for 5 and ZB-H1 for 6); 2 v m + 2 (p - 1) = 10 was the old charge.
  EXPECT_GT(one.pipeline_transfer, 0.0);
  EXPECT_DOUBLE_EQ(zb.pipeline_transfer, one.pipeline_transfer);
  EXPECT_NEAR(one.pipeline_p2p, 4 * one.pipeline_transfer, 1e-12 * one.pipeline_p2p);
  EXPECT_NEAR(zb.pipeline_p2p, 4 * zb.pipeline_transfer, 1e-12 * zb.pipeline_p2p);
  const double m = 4, stages = 2, per_micro_batch = one.compute / m;
  const double saved = one.pipeline_bubble - zb.pipeline_bubble;
  // Equal stages would save (p - 1) x W, a third of a micro-batch; the first stage is the slower
  // here, so both bubbles are the second stage's share of the equal ones (uneven_bubble_scale).
  EXPECT_GT(saved, 0.0);
  EXPECT_LT(saved, (stages - 1) * per_micro_batch / 3);
  EXPECT_NEAR(zb.step_time, one.step_time - saved + (zb.pipeline_p2p - one.pipeline_p2p), 1e-15);
  // Memory: the first stage holds p micro-batches in both; ZB-H1's later stage holds p too
  // (schedules.h), each with the head's and the loss's activations besides, which makes it
  // the most loaded (1F1B's later stage holds one); never below 1F1B's.
  EXPECT_DOUBLE_EQ(one.memory_breakdown.at("stage"), 0.0);
  EXPECT_DOUBLE_EQ(zb.memory_breakdown.at("stage"), 1.0);
  EXPECT_GE(zb.memory_per_rank, one.memory_per_rank);

  // ZB-V: two chunks per device in a V. The LM head's chunk sits on device 0 beside the
  // embedding's, so device 0 is the bottleneck and holds the most; its bubble is half of what
  // ZB-H1's would be on the same bottleneck: (p - 1)(t - 2W) / 2.
  p.schedule = plan::Schedule::ZeroBubbleV;
  p.virtual_stages = 2;
  const PlanCost zv = evaluate(g, c, p, model);
  EXPECT_DOUBLE_EQ(zv.memory_breakdown.at("stage"), 0.0);
  EXPECT_GT(zv.pipeline_bubble, 0.0);
  const double t_v = (zv.compute + zv.tensor_parallel) / m;
  EXPECT_LT(zv.pipeline_bubble, (stages - 1) * t_v / 2);
  EXPECT_GT(zv.pipeline_bubble, (stages - 1) * t_v / 6);
  p.recompute = plan::Recompute::Full;  // the runtime cannot split a recomputed block's backward
  EXPECT_THROW(plan::validate(p), support::ValidationError);

  // One micro-batch on 2 stages leaves nothing to fill with: F F B B, and only the second
  // stage's W beside the first stage's B. The bubble is (p - 1)(t - W) under either schedule,
  // no V halving: against 1F1B's (p - 1) t, a W saved, not two.
  p.recompute = plan::Recompute::None;
  p.global_batch = 2;  // m = 2 / (1 x 2) = 1
  p.schedule = plan::Schedule::OneFOneB;
  p.virtual_stages = 1;
  const PlanCost alone = evaluate(g, c, p, model);
  p.schedule = plan::Schedule::ZeroBubbleH1;
  const PlanCost zb_alone = evaluate(g, c, p, model);
  ASSERT_EQ(zb_alone.micro_batches, 1);
  const double saved_alone = alone.pipeline_bubble - zb_alone.pipeline_bubble;
  EXPECT_GT(saved_alone, 0.0);
  EXPECT_LT(saved_alone, (stages - 1) * alone.compute / 2);  // W is at most a third of t
  p.schedule = plan::Schedule::ZeroBubbleV;
  p.virtual_stages = 2;
  const PlanCost zv_alone = evaluate(g, c, p, model);
  EXPECT_GT(zv_alone.pipeline_bubble, (stages - 1) * (zv_alone.compute + zv_alone.tensor_parallel) / 2);
}

// A split backward (ZB-H1, ZB-V) holds, besides its saved tensors from F to W, the gradients
// its B leaves at the weight-reading nodes' outputs until W (runtime/weight_split.py): the
// evaluator prices each rank by liveness over its own list (schedule::peak_bytes_held), with
// each chunk's layers and the embedding's and the head's bytes where they run.
TEST(PlanCost, ASplitBackwardHoldsItsWeightReadersGradientsFromBToW) {
  const ir::Graph g = models::build_gpt({.layers = 4, .hidden = 64, .heads = 4, .seq = 16, .vocab = 128});
  const LayerStructure st = find_layer_structure(g);
  auto sum = [](const std::vector<ir::NodeId>& nodes, const std::vector<std::int64_t>& by_node) {
    double out = 0;
    for (ir::NodeId id : nodes) out += static_cast<double>(by_node[static_cast<std::size_t>(id)]);
    return out;
  };
  const auto& layer = st.layers->nodes.front();
  // A block holds gradients at its weight-reading nodes' outputs (layer norms, products):
  // fewer bytes than it saves, but not few.
  const double held = sum(layer, st.weight_gradient_held), saved = sum(layer, st.activation_bytes);
  EXPECT_GT(held, 0.2 * saved);
  EXPECT_LT(held, saved);
  const Cluster c = preset("dgx-a100", 1);
  AnalyticCostModel model;
  plan::Plan p;
  p.pipeline = 2, p.data = 4, p.tensor = 1, p.global_batch = 16, p.micro_batch = 1;  // m = 4
  p.recompute = plan::Recompute::None;
  p.schedule = plan::Schedule::ZeroBubbleH1;
  const PlanCost zb = evaluate(g, c, p, model);
  const double scale = 1.0 / st.graph_batch;
  // The last stage (2 layers, the head and the loss), the most loaded: chunk 1 of the list.
  const std::vector<double> kept = {0, (2 * saved + sum(st.post, st.activation_bytes)) * scale};
  const std::vector<double> left = {0, (2 * held + sum(st.post, st.weight_gradient_held)) * scale};
  const double expected = schedule::peak_bytes_held(pipeline_schedule(p).per_rank[1], kept, left);
  EXPECT_DOUBLE_EQ(zb.memory_breakdown.at("stage"), 1.0);
  EXPECT_NEAR(zb.memory_breakdown.at("activations"), expected, 1e-9 * expected);
  // More than its p micro-batches of saved tensors alone (what it was priced at before).
  EXPECT_GT(expected, 2 * kept[1] * (1 + 1e-9));
}

// A tied embedding (the LM head reads wte) is one tensor on a rank that runs both the
// embedding and the head: one stage, or ZB-V's first device.
TEST(PlanCost, ATiedEmbeddingIsHeldOnceWhereTheFirstAndLastStageShareARank) {
  const ir::Graph tied = tiny_gpt();
  double parameters = 0;
  for (const ir::Value& v : tied.values())
    if (v.role == ir::ValueRole::Parameter) parameters += static_cast<double>(v.type.numel());
  const double h = 64, layer = 12 * h * h + 13 * h;
  ASSERT_DOUBLE_EQ(parameters, 4 * layer + (128 + 16) * h + 2 * h);  // models/gpt.h, tied
  const Cluster c = preset("dgx-a100", 1);
  AnalyticCostModel model;
  plan::Plan one;
  one.data = 8, one.global_batch = 8, one.micro_batch = 1;
  const MemoryConstants bf16 = memory_constants(Precision::BF16);
  EXPECT_DOUBLE_EQ(evaluate(tied, c, one, model).memory_breakdown.at("weights"), parameters * bf16.weight_bytes);
  plan::Plan v = one;
  v.pipeline = 2, v.data = 4, v.virtual_stages = 2, v.schedule = plan::Schedule::ZeroBubbleV;
  v.recompute = plan::Recompute::None;
  const PlanCost zv = evaluate(tied, c, v, model);
  ASSERT_DOUBLE_EQ(zv.memory_breakdown.at("stage"), 0.0);
  EXPECT_DOUBLE_EQ(zv.memory_breakdown.at("weights"), (parameters - 2 * layer) * bf16.weight_bytes);
}

// Where the embedding and the head are on different pipeline ranks, the tied table's gradient is
// all-reduced between them after the step (runtime/pipeline_engine.py): priced, exposed, once a
// weight; where one rank runs both (one stage, ZB-V's V), nothing.
TEST(PlanCost, ATiedEmbeddingOnTwoPipelineRanksHasItsGradientSummedAfterTheStep) {
  const ir::Graph tied = tiny_gpt();
  const Cluster c = preset("dgx-a100", 1);
  AnalyticCostModel model;
  plan::Plan p;
  p.pipeline = 2, p.data = 4, p.global_batch = 16, p.micro_batch = 1;
  p.recompute = plan::Recompute::None;
  const PlanCost two = evaluate(tied, c, p, model);
  const double table = 128 * 64;  // wte, models/gpt.h: the head reads it
  const std::vector<int> readers = {0, 4};  // the first stage's rank 0 and the last stage's
  const double expected = model.collective_time(c, CollectiveKind::AllReduce, readers,
                                                static_cast<std::int64_t>(table * 4), Algorithm::Auto);
  ASSERT_GT(expected, 0);
  EXPECT_DOUBLE_EQ(two.shared_weight_sync, expected);
  EXPECT_DOUBLE_EQ(two.breakdown().at("shared_weight_sync"), expected);
  const double parts = two.compute + two.tensor_parallel + two.pipeline_p2p + two.pipeline_bubble +
                       two.data_parallel + two.optimizer + two.zero_broadcast;
  EXPECT_DOUBLE_EQ(two.step_time, parts + expected);

  plan::Plan v = p;
  v.virtual_stages = 2, v.schedule = plan::Schedule::ZeroBubbleV;
  EXPECT_EQ(evaluate(tied, c, v, model).shared_weight_sync, 0.0);
  EXPECT_FALSE(evaluate(tied, c, v, model).breakdown().contains("shared_weight_sync"));
  plan::Plan one = p;
  one.pipeline = 1, one.data = 8;
  EXPECT_EQ(evaluate(tied, c, one, model).shared_weight_sync, 0.0);
}

// Four CPU processes sharing a machine's cores: a pipeline's busy stage runs faster while the
// others wait, but the node's ranks never compute more than four ranks at the shared rate.
Cluster shared_cores(double alone) {
  nlohmann::json j = cluster_to_json(preset("dgx-a100", 1));
  j["nodes"][0]["count"] = 4;
  if (alone != 1.0) j["nodes"][0]["compute_alone"] = alone;
  return cluster_from_json(j);
}

TEST(PlanCost, RanksSharingCoresPriceAPipelineByTheBusierOfItsPathAndTheirPool) {
  ir::Graph g = tiny_gpt();
  AnalyticCostModel model;
  plan::Plan p;
  p.pipeline = 4;
  p.global_batch = 8;
  p.micro_batch = 1;  // m = 8
  const PlanCost own = evaluate(g, shared_cores(1.0), p, model);
  const PlanCost shared = evaluate(g, shared_cores(2.0), p, model);
  ASSERT_EQ(own.stage_times.size(), 4u);
  double busy = 0;  // every rank's compute over the step: 8 micro-batches of each stage
  for (double t : own.stage_times) busy += 8 * t;
  const double path = own.compute + own.pipeline_bubble;
  const double expected = std::max(path / 2.0, busy / 4.0);
  ASSERT_LT(expected, path);  // the case this test is about
  EXPECT_NEAR(shared.compute + shared.pipeline_bubble, expected, 1e-12 * path);
  EXPECT_NEAR(shared.step_time, own.step_time - (path - expected), 1e-12 * own.step_time);
  EXPECT_DOUBLE_EQ(shared.bubble_fraction, own.bubble_fraction);

  // No pipeline: every rank busy all step, nothing changes.
  plan::Plan data;
  data.data = 4;
  data.global_batch = 8;
  data.micro_batch = 2;
  EXPECT_DOUBLE_EQ(evaluate(g, shared_cores(2.0), data, model).step_time,
                   evaluate(g, shared_cores(1.0), data, model).step_time);
}

// Each micro-batch after the first adds its gradients into .grad where the runtime does not write
// them there itself (runtime/fused_accumulation.py), at the device's memory bandwidth (read both,
// write one): a plan that turns the fusion off, every micro-batch; a stage with data ranks, the
// last (its buckets' hooks count that backward); ZeRO-3, into its shards. A stage of one data
// rank with the fusion pays nothing. Stage times are per micro-batch, so a plan of one
// micro-batch is the same stages without any accumulation.
TEST(PlanCost, UnfusedGradientAccumulationAddsEachLaterMicroBatchsGradients) {
  const ir::Graph g = tiny_gpt();
  const Cluster c = shared_cores(1.0);  // 4 ranks with their own devices
  AnalyticCostModel model;
  auto stages = [&](int pipeline, int data, int micro_batches, bool fused, int zero) {
    plan::Plan p;
    p.pipeline = pipeline, p.data = data, p.global_batch = data * micro_batches, p.micro_batch = 1;
    p.fused_accumulation = fused, p.zero_stage = zero;
    return evaluate(g, c, p, model).stage_times;
  };
  auto added = [&](int pipeline, int data, int micro_batches, bool fused, int zero) {
    const std::vector<double> many = stages(pipeline, data, micro_batches, fused, zero);
    const std::vector<double> one = stages(pipeline, data, 1, fused, zero);
    std::vector<double> out;
    for (std::size_t s = 0; s < many.size(); ++s) out.push_back(many[s] - one[s]);
    return out;
  };
  for (double d : added(4, 1, 8, true, 0)) EXPECT_EQ(d, 0.0);  // fused: nothing added

  // Unfused on 4 stages of one layer each: the middle stages add one layer's gradients, 7 of 8
  // micro-batches, 3 passes of 4 bytes (float32) an element.
  const std::vector<double> unfused = added(4, 1, 8, false, 0);
  const LayerStructure structure = find_layer_structure(g);
  ASSERT_TRUE(structure.layers.has_value());
  std::set<ir::ValueId> weights;
  for (ir::NodeId id : structure.layers->nodes.front())
    for (ir::ValueId in : g.node(id).inputs)
      if (g.value(in).role == ir::ValueRole::Parameter) weights.insert(in);
  double elements = 0;
  for (ir::ValueId w : weights) elements += static_cast<double>(g.value(w).type.numel());
  const double bandwidth = c.device_of(0).memory_bandwidth * AnalyticConstants{}.memory_efficiency;
  const double gradient_bytes = plan_memory_constants(plan::Plan{}, g).gradient_bytes;
  ASSERT_EQ(unfused.size(), 4u);
  EXPECT_NEAR(unfused[1], 7.0 / 8.0 * 3.0 * gradient_bytes * elements / bandwidth, 1e-9 * unfused[1]);
  EXPECT_NEAR(unfused[2], unfused[1], 1e-12 * unfused[1]);
  EXPECT_GT(unfused[0], unfused[1]);  // the embeddings too
  const std::vector<double> longer = added(4, 1, 16, false, 0);
  EXPECT_NEAR(longer[1], unfused[1] * (15.0 / 16.0) / (7.0 / 8.0), 1e-9 * unfused[1]);

  // Two data ranks: the fusion writes in place until a parameter's last backward of the step,
  // which its bucket's hook counts: autograd adds that one (1 of 8 micro-batches' share, a
  // seventh of the unfused plan's 7); ZeRO-3 adds into its shards (half) every time.
  const std::vector<double> hooked = added(2, 2, 8, true, 0), plain = added(2, 2, 8, false, 0),
                            sharded = added(2, 2, 8, true, 3);
  ASSERT_EQ(hooked.size(), 2u);
  for (std::size_t s = 0; s < 2; ++s) {
    EXPECT_GT(hooked[s], 0.0);
    EXPECT_NEAR(hooked[s], plain[s] / 7.0, 1e-9 * plain[s]);
    EXPECT_NEAR(sharded[s], plain[s] / 2.0, 1e-9 * plain[s]);
  }
}

TEST(PlanCost, DataParallelOnlyOverlapsAndMismatchesAreErrors) {
  ir::Graph g = tiny_gpt();
  Cluster c = preset("dgx-a100", 1);
  AnalyticCostModel model;
  plan::Plan p;
  p.data = 8;
  p.global_batch = 16;
  PlanCost cost = evaluate(g, c, p, model);
  EXPECT_TRUE(cost.data_parallel_overlapped);
  EXPECT_EQ(cost.pipeline_bubble, 0.0);
  EXPECT_EQ(cost.tensor_parallel, 0.0);
  EXPECT_GT(cost.data_parallel_total, 0.0);

  p.data = 4;  // 4 != 8 ranks
  EXPECT_THROW(evaluate(g, c, p, model), support::ValidationError);
  p.data = 1;
  p.pipeline = 8;  // 8 stages, 4 layers
  EXPECT_THROW(evaluate(g, c, p, model), support::ValidationError);
}

TEST(PlanCost, Gpt3_175BOnInterleaved1F1B) {
  auto start = std::chrono::steady_clock::now();
  ir::Graph g = models::build_gpt({.layers = 96, .hidden = 12288, .heads = 96, .seq = 2048, .vocab = 51200});
  Cluster c = preset("dgx-a100", 192);
  plan::Plan p;
  p.tensor = 8;
  p.pipeline = 8;
  p.data = 24;
  p.global_batch = 1536;
  p.schedule = plan::Schedule::Interleaved1F1B;
  p.virtual_stages = 2;
  p.recompute = plan::Recompute::Full;
  PlanCost cost = evaluate(g, c, p, AnalyticCostModel{});
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("[ timing ] GPT-3 175B built and costed in %.3f s\n", seconds);
  // Megatron-LM's measured run: 140 TFLOP/s in its accounting (recomputation counted).
  EXPECT_GT(cost.megatron_tflops_per_device, 100);
  EXPECT_LT(cost.megatron_tflops_per_device, 200);
  // Model FLOPs leave the recomputed forward out: 3/4 of the layers' share.
  EXPECT_LT(cost.tflops_per_device, 0.76 * cost.megatron_tflops_per_device);
  EXPECT_GT(cost.tflops_per_device, 0.74 * cost.megatron_tflops_per_device);
  EXPECT_LT(cost.memory_per_rank, 80e9);
}

}  // namespace
}  // namespace shardwise::cost
