#include "search/joint_planner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cost/cluster.h"
#include "cost/cluster_presets.h"
#include "cost/layer_balance.h"
#include "cost/plan_cost.h"
#include "models/gpt.h"
#include "search/plan_report.h"
#include "search/stage_layout.h"
#include "support/error.h"
#include "test_graphs.h"

namespace shardwise::search {
namespace {

using testing::gpt;

// One DGX A100 node cut to `devices` GPUs, each of `memory_bytes` where given.
cost::Cluster a100_node(int devices, std::int64_t memory_bytes = 0) {
  nlohmann::json doc = nlohmann::json::parse(cost::cluster_to_json_string(cost::preset("dgx-a100", 1)));
  doc["nodes"][0]["count"] = devices;
  if (memory_bytes > 0)
    for (auto& d : doc["device_types"]) d["memory_bytes"] = memory_bytes;
  return cost::cluster_from_json_string(doc.dump());
}

TEST(JointPlanner, Gpt3OnAThousandA100sBeatsMegatronsConfigurationUnderTheSameModel) {
  ir::Graph g = gpt(96, 12288, 96);
  const cost::Cluster cluster = cost::preset("dgx-a100", 128);
  const cost::AnalyticCostModel model;
  plan::Plan megatron;  // Narayanan et al. 2021's 1,024-GPU row: t 8, p 16, d 8, interleaved
  megatron.tensor = 8;
  megatron.pipeline = 16;
  megatron.data = 8;
  megatron.global_batch = 1536;
  megatron.micro_batch = 1;
  megatron.schedule = plan::Schedule::Interleaved1F1B;
  megatron.virtual_stages = 2;
  megatron.recompute = plan::Recompute::Full;
  const double megatron_step = cost::evaluate(g, cluster, megatron, model).step_time;

  JointPlanOptions options;
  options.global_batch = 1536;
  JointPlanResult r = plan_joint(g, cluster, model, options);
  ASSERT_TRUE(r.fits);
  ASSERT_TRUE(r.plan.predicted.has_value());
  EXPECT_LE(r.plan.predicted->step_time, megatron_step);
  EXPECT_EQ(r.plan.world_size(), 1024);
  EXPECT_LE(r.plan.tensor, 8);  // tensor parallelism stays inside a node
  EXPECT_GT(r.evaluated, 100);
  ASSERT_FALSE(r.best.empty());
  EXPECT_EQ(r.best.front().plan, r.plan);
  for (std::size_t i = 1; i < r.best.size(); ++i) EXPECT_LE(r.best[i - 1].step_time, r.best[i].step_time);
}

// A long sequence a step (GPT 8 x 4096 at 32,768 tokens, 16 H100s): one row gives no data
// parallelism, so without context parallelism the 16 ranks are tensor x pipeline degrees (a
// pipeline of one micro-batch idles); with it, ranks split the row's sequence (plan.context,
// ring attention) and the plan is faster under the same evaluator.
TEST(JointPlanner, ALongSequenceOnFewRowsSplitsItsSequenceOverRanks) {
  ir::Graph g = gpt(8, 4096, 32, 32768, 32000);
  const cost::Cluster cluster = cost::preset("dgx-h100", 2);
  const cost::AnalyticCostModel model;
  JointPlanOptions options;
  options.global_batch = 1;
  const JointPlanResult ring = plan_joint(g, cluster, model, options);
  options.context_parallel = false;
  const JointPlanResult rows = plan_joint(g, cluster, model, options);
  ASSERT_TRUE(rows.fits);
  ASSERT_TRUE(ring.fits);
  EXPECT_EQ(rows.plan.context, 1);
  for (const JointCandidate& c : rows.best) EXPECT_EQ(c.plan.context, 1);
  // The best candidate splits the row's sequence; a plan of one stage and one micro-batch
  // comes back complete as the SPMD search's plan of its {c, t} mesh, whose data axis is
  // wider than the batch: what it splits instead of rows (the sequence, heads inside
  // attention, or a ring) is that search's choice, exact either way.
  const plan::Plan& best = ring.best.front().plan;
  EXPECT_GT(best.context, 1);
  EXPECT_EQ(best.data, 1);
  EXPECT_GT(best.predicted->breakdown.at("context_parallel"), 0);
  EXPECT_LT(ring.best.front().step_time, rows.best.front().step_time);
  EXPECT_NE(plan_report(best, 80e9).find(fmt::format("x context {} (each sequence split)", best.context)),
            std::string::npos)
      << plan_report(best, 80e9);
  if (best.pipeline == 1 && best.num_micro_batches() == 1) {
    ASSERT_TRUE(ring.plan.sharding.has_value());
    EXPECT_EQ(ring.plan.data, best.context);
    EXPECT_EQ(ring.plan.global_batch, 1);
  } else {
    EXPECT_EQ(ring.plan.context, best.context);
  }
  EXPECT_LT(ring.plan.predicted->step_time, rows.plan.predicted->step_time);
}

// Llama 3 405B's scale (126 layers of 16,384, 128 heads) at 131,072 tokens, 16 sequences a step,
// on 2,048 H100s: without context parallelism the data ranks stop at the batch's 16 rows, so
// each holds one micro-batch and a 16-stage pipeline idles most of the step; with it the
// planner splits each sequence over 16 ranks of each stage (Llama 3's own t 8, cp 16, p 16), its
// pipeline fed by 16 micro-batches, at less than a third of the step.
TEST(JointPlanner, Llama405BScaleAt131072TokensSplitsItsSequences) {
  ir::Graph g = gpt(126, 16384, 128, 131072, 128256);
  const cost::Cluster cluster = cost::preset("dgx-h100", 256);
  const cost::AnalyticCostModel model;
  JointPlanOptions options;
  options.global_batch = 16;
  const JointPlanResult ring = plan_joint(g, cluster, model, options);
  options.context_parallel = false;
  const JointPlanResult rows = plan_joint(g, cluster, model, options);
  ASSERT_TRUE(ring.fits);
  ASSERT_TRUE(rows.fits);
  EXPECT_EQ(rows.plan.context, 1);
  EXPECT_EQ(ring.plan.context * ring.plan.tensor * ring.plan.pipeline, 2048);
  EXPECT_GT(ring.plan.context, 1);
  EXPECT_EQ(ring.plan.num_micro_batches(), 16);
  EXPECT_LT(3 * ring.plan.predicted->step_time, rows.plan.predicted->step_time);
  // Priced by the evaluator, the sequence split's exposed sends are shown apart; the plan comes
  // back complete, priced with its stages' searched layout, whose collectives hold them.
  EXPECT_GT(ring.best.front().plan.predicted->breakdown.at("context_parallel"), 0);
  EXPECT_LT(ring.plan.predicted->breakdown.at("pipeline_bubble"), rows.plan.predicted->breakdown.at("pipeline_bubble"));
  // The reason, for the report: the plan the search chooses with context parallelism off.
  ASSERT_EQ(ring.split_reasons.size(), 1u);
  const SplitReason& why = ring.split_reasons.front();
  EXPECT_EQ(why.split, "context");
  EXPECT_EQ(why.with.plan.context, ring.plan.context);
  ASSERT_TRUE(why.without.has_value());
  EXPECT_EQ(why.without->plan.context, 1);
  EXPECT_EQ(std::tuple(why.without->plan.data, why.without->plan.tensor, why.without->plan.pipeline),
            std::tuple(rows.plan.data, rows.plan.tensor, rows.plan.pipeline));
  EXPECT_TRUE(why.without->fits);
  EXPECT_LT(3 * why.with.step_time, why.without->step_time);
  EXPECT_TRUE(rows.split_reasons.empty());
  std::printf("with context parallelism: %s\nwithout: %s\n", plan_report(ring.plan, 80e9).c_str(),
              plan_report(rows.plan, 80e9).c_str());
}

// A mixture of experts of DeepSeek-V3's width (hidden 7168, 256 experts of 2048, top 8; 32
// layers) on 256 H100s, with 7 heads, so no tensor axis (which would split the experts inside
// a node: the next test): kept whole over the data ranks, its experts fit only in a 32-stage
// pipeline whose ranks split each sequence (7.2 s a step, 1.3 s of it bubble); split over each
// stage's 16 data ranks (plan.expert), a 16-stage pipeline fits and is faster (4.5 s), and the
// report says how the experts are held.
TEST(JointPlanner, AMixtureOfExpertsTooLargeToReplicateSplitsItsExperts) {
  ir::Graph g = models::build_gpt({.layers = 32, .hidden = 7168, .heads = 7, .seq = 4096, .vocab = 129280,
                                   .ffn_hidden = 2048, .experts = 256, .experts_per_token = 8});
  const cost::Cluster cluster = cost::preset("dgx-h100", 32);
  const cost::AnalyticCostModel model;
  JointPlanOptions options;
  options.global_batch = 512;
  const JointPlanResult split = plan_joint(g, cluster, model, options);
  options.expert_parallel = false;
  const JointPlanResult whole = plan_joint(g, cluster, model, options);
  ASSERT_TRUE(split.fits);
  EXPECT_GT(split.plan.expert, 1);
  EXPECT_EQ(split.plan.expert, split.plan.stage_data());
  EXPECT_EQ(whole.plan.expert, 1);
  EXPECT_FALSE(whole.fits && whole.plan.predicted->step_time < split.plan.predicted->step_time);
  EXPECT_GT(split.plan.predicted->breakdown.at("expert_parallel"), 0);
  const std::string report = plan_report(split.plan, 80e9);
  EXPECT_NE(report.find("experts  each layer's experts split over the"), std::string::npos) << report;
  // The reason: the same degrees with every expert whole on every rank fit nowhere.
  const auto why = std::ranges::find(split.split_reasons, std::string("experts"), &SplitReason::split);
  ASSERT_NE(why, split.split_reasons.end());
  EXPECT_EQ(why->with.plan.expert, split.plan.expert);
  ASSERT_TRUE(why->without.has_value());
  EXPECT_EQ(why->without->plan.expert, 1);
  EXPECT_FALSE(why->without->plan.split_experts);
  EXPECT_TRUE(why->with.fits);
  EXPECT_FALSE(why->without->fits);
  EXPECT_GT(why->without->memory_per_rank, why->with.memory_per_rank);
  EXPECT_TRUE(std::ranges::none_of(whole.split_reasons, [](const SplitReason& r) { return r.split == "experts"; }));
  std::printf("experts split: %s\nwhole: %s (fits %d)\n", report.c_str(), plan_report(whole.plan, 80e9).c_str(),
              whole.fits);
}

// At DeepSeek-V3's scale (61 layers of its width, 256 experts of 2048, top 8; 4,096 tokens x
// 15,360 sequences on 2,048 H100s): the planner splits each layer's experts over the tensor
// ranks of its stage, inside a node (their tokens are on every tensor rank already: one all-reduce of the sum over
// NVLink), not over the data ranks (every token gathered across the network), and the report
// says so (benchmarks/moe.py --at-scale plans transformers' DeepseekV3ForCausalLM so).
TEST(JointPlanner, DeepSeekV3ScaleSplitsItsExpertsOverItsStagesTensorRanks) {
  ir::Graph g = models::build_gpt({.layers = 61, .hidden = 7168, .heads = 128, .seq = 4096, .vocab = 129280,
                                   .ffn_hidden = 2048, .experts = 256, .experts_per_token = 8});
  const cost::Cluster cluster = cost::preset("dgx-h100", 256);
  const cost::AnalyticCostModel model;
  JointPlanOptions options;
  options.global_batch = 15360;
  const JointPlanResult split = plan_joint(g, cluster, model, options);
  options.expert_parallel = false;
  const JointPlanResult whole = plan_joint(g, cluster, model, options);
  ASSERT_TRUE(split.fits);
  // t 4 with ZeRO-1 (t 8 without ZeRO before the fast search priced ZeRO-1 where a
  // combination needs it): 15.36 s a step.
  EXPECT_GT(split.plan.tensor, 1);
  // The stages' layout, as the runtime completes the plan on its capture at a micro-batch of
  // the data axis (the graph above is at batch 1: the plan comes back without it).
  plan::Plan completed = split.plan;
  const ir::Graph rows = models::build_gpt({.layers = 61, .hidden = 7168, .heads = 128, .seq = 4096,
                                            .vocab = 129280, .batch = static_cast<int>(completed.micro_batch *
                                                                                        completed.data),
                                            .ffn_hidden = 2048, .experts = 256, .experts_per_token = 8});
  completed.stage_sharding = complete_stage_sharding(rows, cluster, completed, SearchLevel::Fast);
  ASSERT_TRUE(completed.stage_sharding.has_value());
  int experts = 0;
  for (const auto& [name, per_axis] : completed.stage_sharding->strategies)
    if (name.starts_with("experts")) {
      ++experts;
      EXPECT_EQ(per_axis.at(1), "split e") << name;
    }
  EXPECT_GT(experts, 0);
  const std::string report = plan_report(completed, 80e9);
  EXPECT_NE(report.find(fmt::format("layers' experts split over the {} tensor ranks", split.plan.tensor)),
            std::string::npos)
      << report;
  // The data-axis split (plan.expert) was a candidate, priced and passed over.
  EXPECT_EQ(split.plan.expert, 1);
  EXPECT_TRUE(split.plan.split_experts);
  // Without the experts' split (expert_parallel false) every rank of a stage holds every expert,
  // and the plan says so for its completion: slower (500 s against 19 s a step when written).
  EXPECT_FALSE(whole.plan.split_experts);
  EXPECT_EQ(whole.plan.expert, 1);
  EXPECT_GT(whole.plan.predicted->step_time, 2 * split.plan.predicted->step_time);
  // The reason the plan gives: its own degrees with every expert whole, priced alike.
  ASSERT_EQ(split.split_reasons.size(), 1u);
  const SplitReason& why = split.split_reasons.front();
  EXPECT_EQ(why.split, "experts");
  ASSERT_TRUE(why.without.has_value());
  EXPECT_EQ(why.without->plan.tensor, split.plan.tensor);
  EXPECT_FALSE(why.without->plan.split_experts);
  EXPECT_TRUE(why.with.fits);
  EXPECT_TRUE(!why.without->fits || why.without->step_time > why.with.step_time);
  std::printf("%s\nwith the split: %.2f s, %.1f GB (fits %d); without: %.2f s, %.1f GB (fits %d)\n", report.c_str(),
              why.with.step_time, why.with.memory_per_rank / 1e9, why.with.fits, why.without->step_time,
              why.without->memory_per_rank / 1e9, why.without->fits);
}

// The joint plan of `g` on 4 A100s of 80 GB at batch 16 (stage layouts off), and its best
// candidates listed for a failure's message.
std::pair<JointPlanResult, std::string> plan_on_four_a100s(const ir::Graph& g) {
  const cost::Cluster cluster = a100_node(4);
  const cost::AnalyticCostModel model;
  JointPlanOptions options;
  options.global_batch = 16;
  options.stage_layouts = false;
  JointPlanResult r = plan_joint(g, cluster, model, options);
  std::string listed;
  for (const JointCandidate& c : r.best)
    listed += fmt::format("\n  p {} d {} b {} {} v {} {:.3f} s", c.plan.pipeline, c.plan.data, c.plan.micro_batch,
                          plan::schedule_name(c.plan.schedule), c.plan.virtual_stages, c.step_time);
  return {std::move(r), std::move(listed)};
}

// Megatron-LM's virtual pipeline cuts the layers into p x v equal chunks (Llama 3 70B: 80 layers,
// p 8, v 5 published); the planner prices every such v up to 8 beside 2 and 4. GPT 20 x 8000 with
// 5 heads (no tensor axis on 4 ranks) on 4 A100s of 80 GB: only 4 stages hold it, and its
// activations only with recomputation (no zero-bubble schedule, which takes none), so the bubble
// is interleaving's to cut: v = 5 (a layer a chunk) is the fastest, ahead of v = 4 and v = 2.
TEST(JointPlanner, PricesEveryVirtualStageCountThatCutsTheLayersEvenly) {
  const auto [r, listed] = plan_on_four_a100s(gpt(20, 8000, 5, 4096, 32000));
  ASSERT_TRUE(r.fits);
  EXPECT_EQ(r.plan.pipeline, 4) << listed;
  EXPECT_EQ(r.plan.schedule, plan::Schedule::Interleaved1F1B) << listed;
  EXPECT_EQ(r.plan.virtual_stages, 5) << listed;
}

// And a layer a chunk above 8 chunks a rank (the bound was 8, and Llama 3 70B's v = 10 on 8
// stages was never priced): GPT 36 x 6000 on the same 4 A100s, where v = 9 is a layer a chunk and
// the fastest.
TEST(JointPlanner, PricesALayerAChunkAboveEightChunksARank) {
  const auto [r, listed] = plan_on_four_a100s(gpt(36, 6000, 5, 4096, 32000));
  ASSERT_TRUE(r.fits);
  EXPECT_EQ(r.plan.pipeline, 4) << listed;
  EXPECT_EQ(r.plan.schedule, plan::Schedule::Interleaved1F1B) << listed;
  EXPECT_EQ(r.plan.virtual_stages, 9) << listed;
}

// Stages on sub-meshes of their own widths (plan.stage_meshes): 3 A100s of 4.25 GiB (4 GiB
// until a 1F1B stage's later backwards were priced with the gradients made beside those in
// flight: the plan below is 4.01 GB, above 0.9 x 4 GiB), GPT 4 x 2048.
// Without ZeRO, three replicas do not fit, nor do two stages of one rank; three stages of one
// rank each do, as does one rank holding the embedding and a layer and two data-parallel ranks
// holding the rest and the LM head, which the planner picks: faster than every plan of equal
// stages. (Three replicas sharding their optimizer state fit, and are faster still: with ZeRO
// the fast search picks them.)
TEST(JointPlanner, StagesOfDifferentWidthsWhereTheWorldSplitsNoOtherWay) {
  ir::Graph g = gpt(4, 2048, 16, 1024, 50304);
  const cost::Cluster cluster = a100_node(3, std::int64_t{17} << 28);
  const cost::AnalyticCostModel model;
  JointPlanOptions options;
  options.global_batch = 60;
  options.stage_layouts = false;
  const JointPlanResult replicas = plan_joint(g, cluster, model, options);
  options.allow_zero = false;
  const JointPlanResult r = plan_joint(g, cluster, model, options);
  ASSERT_TRUE(replicas.fits);
  EXPECT_EQ(replicas.plan.data, 3);
  EXPECT_EQ(replicas.plan.zero_stage, 1);
  EXPECT_LT(replicas.plan.predicted->step_time, r.plan.predicted->step_time);
  ASSERT_TRUE(r.fits);
  ASSERT_EQ(r.plan.stage_meshes.size(), 2u) << plan::plan_to_json_string(r.plan);
  EXPECT_EQ(r.plan.world_size(), 3);
  // Every plan of equal stages the planner had, and the three-stage pipeline priced by hand.
  plan::Plan three;
  three.pipeline = 3;
  three.global_batch = 60;
  three.micro_batch = 1;
  three.recompute = plan::Recompute::Full;
  const cost::PlanCost three_cost = cost::evaluate(g, cluster, three, model);
  EXPECT_LT(r.plan.predicted->step_time, three_cost.step_time);
  for (const JointCandidate& c : r.best)
    if (c.plan.stage_meshes.empty()) EXPECT_LE(r.plan.predicted->step_time, c.step_time);
  EXPECT_EQ(r.plan.stage_meshes[0], (std::vector<int>{1, 1}));  // the embedding's stage, full rows on one rank
}

TEST(JointPlanner, ThoroughIsNeverWorseThanFastAndBothAreDeterministic) {
  ir::Graph g = gpt(24, 2048, 16);  // GPT-3 1.3B
  const cost::Cluster cluster = cost::preset("dgx-a100", 2);
  const cost::AnalyticCostModel model;
  JointPlanOptions options;
  options.global_batch = 512;
  JointPlanResult fast = plan_joint(g, cluster, model, options);
  EXPECT_EQ(plan_joint(g, cluster, model, options).plan, fast.plan);
  options.level = SearchLevel::Thorough;
  JointPlanResult thorough = plan_joint(g, cluster, model, options);
  ASSERT_TRUE(fast.fits && thorough.fits);
  EXPECT_LE(thorough.plan.predicted->step_time, fast.plan.predicted->step_time);
  EXPECT_GT(thorough.evaluated, fast.evaluated);
}

// fast prices ZeRO-1 for the combinations that do not fit without it, even where others do:
// GPT-3 1.3B at batch 64 on 8 GPUs of 16 GiB fits as t 2 p 2 d 2 without ZeRO, and faster as 8
// data ranks whose optimizer state is sharded (the broadcast after the step included).
TEST(JointPlanner, FastTriesZeroWhereACombinationNeedsItThoughOthersFitWithout) {
  ir::Graph g = gpt(24, 2048, 16);
  const cost::Cluster cluster = a100_node(8, std::int64_t{16} << 30);
  const cost::AnalyticCostModel model;
  JointPlanOptions options;
  options.global_batch = 64;
  options.allow_zero = false;
  const JointPlanResult without = plan_joint(g, cluster, model, options);
  options.allow_zero = true;
  const JointPlanResult with = plan_joint(g, cluster, model, options);
  ASSERT_TRUE(without.fits && with.fits);
  EXPECT_EQ(without.plan.zero_stage, 0);
  EXPECT_EQ(with.plan.zero_stage, 1);
  EXPECT_GT(with.plan.data, 1);
  EXPECT_LT(with.plan.predicted->step_time, without.plan.predicted->step_time);
  EXPECT_GT(with.plan.predicted->breakdown.at("zero_broadcast"), 0);
}

TEST(JointPlanner, TightMemoryTurnsToZeroAndRecomputationOrReportsTheLeast) {
  ir::Graph g = gpt(24, 2048, 16);
  JointPlanOptions options;
  options.global_batch = 64;
  // 1 GiB a device: nothing fits.
  JointPlanResult r = plan_joint(g, a100_node(8, std::int64_t{1} << 30), cost::AnalyticCostModel{}, options);
  EXPECT_FALSE(r.fits);
  EXPECT_GT(r.plan.predicted->memory_per_rank, r.memory_limit);
}

TEST(JointPlanner, TensorDegreesDivideTheHeadCount) {
  // The same layers with 16 and with 12 heads on 8-GPU nodes: with 12, t = 8 would split
  // heads across ranks, so the planner never prices it.
  JointPlanOptions options;
  options.global_batch = 64;
  options.level = SearchLevel::Thorough;
  const cost::Cluster cluster = cost::preset("dgx-a100", 2);
  auto plans_priced = [&](int heads) {
    JointPlanResult r = plan_joint(gpt(8, 768, heads, 512, 1024), cluster, cost::AnalyticCostModel{}, options);
    EXPECT_FALSE(r.best.empty());
    return r.evaluated;
  };
  const int with_16 = plans_priced(16), with_12 = plans_priced(12);
  EXPECT_LT(with_12, with_16);
  JointPlanResult r = plan_joint(gpt(8, 768, 12, 512, 1024), cluster, cost::AnalyticCostModel{}, options);
  for (const JointCandidate& c : r.best) EXPECT_EQ(12 % c.plan.tensor, 0) << "t = " << c.plan.tensor;
}

TEST(JointPlanner, StagesBalancedByTimeWhenTheHeadIsHeavy) {
  // Llama-3-8B's sizes in GPT layout: a 128k vocabulary on hidden 4096, so the LM head costs
  // about two layers. The best pipelined plan with stages of their own sizes gives its last
  // stage fewer layers than its first, and beats the same plan with the count split. (The best
  // pipelined plan of all may split evenly.)
  ir::Graph g = gpt(32, 4096, 32, 8192, 128256);
  JointPlanOptions options;
  options.global_batch = 512;
  const cost::Cluster cluster = cost::preset("dgx-a100", 8);
  const cost::AnalyticCostModel model;
  JointPlanResult r = plan_joint(g, cluster, model, options);
  auto pipelined = std::find_if(r.best.begin(), r.best.end(), [](const JointCandidate& c) {
    return c.plan.pipeline > 1 && !c.plan.layers_per_stage.empty();
  });
  ASSERT_NE(pipelined, r.best.end());
  const plan::Plan& best = pipelined->plan;
  ASSERT_EQ(best.layers_per_stage.size(), static_cast<std::size_t>(best.pipeline * best.virtual_stages));
  EXPECT_LT(best.layers_per_stage.back(), best.layers_per_stage.front());
  plan::Plan even = best;
  even.layers_per_stage.clear();
  even.predicted.reset();
  EXPECT_LT(pipelined->step_time, cost::evaluate(g, cluster, even, model).step_time);
  EXPECT_NE(plan_report(best).find(fmt::format("layers per stage {}", fmt::join(best.layers_per_stage, " / "))),
            std::string::npos)
      << plan_report(best);
}

// GPT with 8 layers of hidden 2048 on 4 DGX A100 nodes whose devices hold 1.25 GiB and whose
// nodes talk over 10 Gb/s Ethernet: the model must be cut into stages, and the sends
// between them are long next to a stage's compute.
cost::Cluster slow_links_cluster(std::int64_t memory_bytes = std::int64_t{5} << 28) {  // 1.25 GiB
  nlohmann::json j = cost::cluster_to_json(cost::preset("dgx-a100", 4));
  for (auto& d : j["device_types"]) d["memory_bytes"] = memory_bytes;
  j["links"][1]["bandwidth"] = 1.25e9;
  return cost::cluster_from_json(j);
}

TEST(JointPlanner, AVaryingNetworkTimesPipelinesBySimulation) {
  ir::Graph g = gpt(8, 2048, 16);
  const cost::Cluster cluster = slow_links_cluster();
  const cost::AnalyticCostModel model;
  JointPlanOptions options;
  options.global_batch = 256;
  const JointPlanResult steady_evaluator = plan_joint(g, cluster, model, options);
  options.network = NetworkCondition{{0.1}, {1.0}};  // steady: sends overlap compute
  const JointPlanResult steady = plan_joint(g, cluster, model, options);
  options.network = NetworkCondition{{0.1, 0.1}, {1.0, 0.5}};  // halved every other 0.1 s
  const JointPlanResult varying = plan_joint(g, cluster, model, options);
  ASSERT_TRUE(steady_evaluator.fits && steady.fits && varying.fits);
  for (const JointPlanResult* r : {&steady_evaluator, &steady, &varying}) {
    const std::string report = plan_report(r->plan);
    fmt::print("{}: {:.4f} s a step; {} (planned in {:.2f} s)\n",
               r == &varying ? "halved every other 0.1 s" : r == &steady ? "steady, simulated" : "evaluator alone",
               r->plan.predicted->step_time, report.substr(0, report.find('\n')), r->search_seconds);
    // Every candidate's breakdown still adds up to its step time (the sequence split's and the
    // experts' waits are shown apart from the compute they are inside: plan_cost.h).
    for (const JointCandidate& c : r->best) {
      double sum = 0;
      for (const auto& [part, seconds] : c.plan.predicted->breakdown)
        if (part != "data_parallel_total" && part != "data_parallel_overlapped" && part != "pipeline_transfer" &&
            part != "context_parallel" && part != "expert_parallel")
          sum += seconds;
      EXPECT_NEAR(sum, c.step_time, 1e-9 * c.step_time) << plan_report(c.plan);
      EXPECT_LE(c.memory_per_rank, varying.memory_limit);
    }
    for (std::size_t i = 1; i < r->best.size(); ++i) EXPECT_LE(r->best[i - 1].step_time, r->best[i].step_time);
  }
  // The simulator times the sends as the runtime runs them (each starts once its receive is
  // posted, the reading compute waits for it); the evaluator charges the sends on its lists'
  // critical path while they are short, and simulates the lists at the send's length where
  // they are not (cost/pipeline_transfers.h, exposed_transfer_seconds). Here a send (0.85 ms
  // at t 8, 1.68 ms at t 4) is as long as the computation it hides behind, or longer: with the
  // count alone the evaluator priced the plan both picked (DualPipeV, d2 t8 p2) 1.7% below the
  // simulation, and one with ZeRO-1 at t 4 6.3% below (0.6306 against 0.6700 s), and picked
  // it. Now both pick DualPipeV d2 t8 p2 and price it within 0.1% (0.7004 against 0.6998 s).
  EXPECT_NEAR(steady.plan.predicted->step_time, steady_evaluator.plan.predicted->step_time,
              0.01 * steady_evaluator.plan.predicted->step_time);
  EXPECT_EQ(steady.plan.schedule, steady_evaluator.plan.schedule);
  EXPECT_GE(varying.plan.predicted->step_time, steady.plan.predicted->step_time);
  // On the varying network kFkB k = 2 used to win (0.838 s before the simulator modelled the
  // receive that starts a transfer; then over its 1F1B twin by more than Ada-Grouper's 1%):
  // its group's receives were posted before the group's first compute while every other
  // schedule posted each where it was read. With each receive posted one computation early in
  // every schedule, the V schedules hide their sends too and win: DualPipeV, 0.7455 s.
  EXPECT_NE(varying.plan.schedule, plan::Schedule::KFKB) << plan_report(varying.plan);
  // 1F1B plans are timed as kFkB too (time_on_the_network). Here ZeRO-1's plans fill the ten
  // best; on 1 GiB devices without ZeRO, where the plans that hold their micro-batches need
  // recomputation (which no V schedule takes), kFkB (k = 2, full recomputation, 1.109 s)
  // is among them, ahead of its own 1F1B twin, which is not (slower than the tenth).
  JointPlanOptions tight = options;
  tight.allow_zero = false;
  const JointPlanResult grouped = plan_joint(g, slow_links_cluster(std::int64_t{1} << 30), model, tight);
  ASSERT_TRUE(grouped.fits);
  auto kfkb = std::find_if(grouped.best.begin(), grouped.best.end(),
                           [](const JointCandidate& c) { return c.plan.schedule == plan::Schedule::KFKB; });
  ASSERT_NE(kfkb, grouped.best.end());
  EXPECT_GE(kfkb->plan.kfkb_k, 2);
  EXPECT_NE(plan_report(kfkb->plan).find(fmt::format("kfkb (k={})", kfkb->plan.kfkb_k)), std::string::npos);
  auto twin = std::find_if(grouped.best.begin(), grouped.best.end(), [&](const JointCandidate& c) {
    return c.plan.schedule == plan::Schedule::OneFOneB && c.plan.tensor == kfkb->plan.tensor &&
           c.plan.pipeline == kfkb->plan.pipeline && c.plan.micro_batch == kfkb->plan.micro_batch &&
           c.plan.recompute == kfkb->plan.recompute && c.plan.zero_stage == kfkb->plan.zero_stage &&
           c.plan.layers_per_stage == kfkb->plan.layers_per_stage;
  });
  if (twin != grouped.best.end()) {
    EXPECT_GT(twin->step_time, kfkb->step_time);
    EXPECT_GT(kfkb->memory_per_rank, twin->memory_per_rank);  // k times the activations in flight
  } else {
    EXPECT_GE(grouped.best.back().step_time, kfkb->step_time);
  }
  // Deterministic.
  EXPECT_EQ(plan_joint(g, cluster, model, options).plan, varying.plan);
}

// 1.25 GiB devices over slow links (the varying network's cluster, above): the model must be
// split, and the search's layout (sequence parallelism) is cheaper than Megatron's.
TEST(JointPlanner, TheTenBestArePricedWithTheirStagesSearchedLayout) {
  ir::Graph g = gpt(8, 2048, 16);
  const cost::Cluster cluster = slow_links_cluster();
  const cost::AnalyticCostModel model;
  JointPlanOptions options;
  options.global_batch = 256;
  const JointPlanResult searched = plan_joint(g, cluster, model, options);
  options.stage_layouts = false;
  const JointPlanResult megatron = plan_joint(g, cluster, model, options);
  ASSERT_TRUE(searched.fits && megatron.fits);
  fmt::print("stages laid out by the search ({} searches, {:.2f} s): {:.4f} s a step, t {} p {} d {}; Megatron's "
             "layout ({:.2f} s): {:.4f} s, t {} p {} d {}\n",
             searched.stage_layout_searches, searched.search_seconds, searched.plan.predicted->step_time,
             searched.plan.tensor, searched.plan.pipeline, searched.plan.data, megatron.search_seconds,
             megatron.plan.predicted->step_time, megatron.plan.tensor, megatron.plan.pipeline, megatron.plan.data);
  EXPECT_GT(searched.stage_layout_searches, 0);
  EXPECT_LE(searched.stage_layout_searches, 12);  // fast's budget
  EXPECT_EQ(megatron.stage_layout_searches, 0);
  // Every one of the ten best with a tensor axis is priced with its stages' searched layout,
  // unless the budget ran out first (reprice_with_stage_layouts): since zero-bubble plans are
  // priced with the gradients they hold from B to W, two of them no longer fit here, and since
  // the stages' backward working sets are priced (the loss' vocabulary-sized gradients) the
  // ninth and tenth best (t 8 p 2 d 2, micro-batch 1, 1F1B; t 4 c 2 p 4) come after the
  // twelfth search.
  // A context-parallel candidate keeps the evaluator's ring prices (reprice: no layout is
  // searched at a sequence block); since receives are posted early (schedule/early_receives.h)
  // two of them (t 4 c 2 p 4, interleaved) are among the ten best; since the fast search
  // prices ZeRO-1 for the combinations that need it, five (c 4 t 2 and c 2 t 4, ZeRO-1), and
  // five with a tensor axis, every one searched.
  for (const JointCandidate& c : searched.best)
    EXPECT_TRUE(c.searched_layout == (c.plan.tensor > 1 && c.plan.context == 1) ||
                (c.plan.tensor > 1 && searched.stage_layout_searches == 12))
        << c.plan.tensor << " " << c.plan.micro_batch << " c " << c.plan.context << " " << plan_report(c.plan);
  EXPECT_GE(std::ranges::count_if(searched.best, [](const JointCandidate& c) { return c.searched_layout; }), 5);
  for (const JointCandidate& c : megatron.best) EXPECT_FALSE(c.searched_layout);
  EXPECT_GT(searched.plan.tensor, 1);
  EXPECT_TRUE(searched.searched_layout);
  // Sequence parallelism (the search's, not Megatron's layout in the evaluator) makes the
  // tensor axis cheaper: the plan is at least as fast as Megatron's layout's best.
  EXPECT_LT(searched.plan.predicted->step_time, megatron.plan.predicted->step_time);
  EXPECT_EQ(plan_joint(g, cluster, model, {.global_batch = 256}).plan, searched.plan);  // deterministic
}

TEST(JointPlanner, RejectsABadNetworkCondition) {
  ir::Graph g = gpt(4, 256, 4, 128, 1024);
  JointPlanOptions options;
  options.global_batch = 8;
  for (const NetworkCondition& bad : {NetworkCondition{{}, {}}, NetworkCondition{{1.0}, {1.0, 0.5}},
                                      NetworkCondition{{1.0, 0.0}, {1.0, 0.5}}, NetworkCondition{{1.0}, {-0.5}}}) {
    options.network = bad;
    EXPECT_THROW(plan_joint(g, cost::preset("dgx-a100", 2), cost::AnalyticCostModel{}, options),
                 support::ValidationError);
  }
}

TEST(JointPlanner, RejectsWhatItCannotPlan) {
  ir::Graph g = gpt(4, 256, 4, 128, 1024);
  JointPlanOptions options;
  options.global_batch = 0;
  EXPECT_THROW(plan_joint(g, cost::preset("dgx-a100", 1), cost::AnalyticCostModel{}, options),
               support::ValidationError);
}

// 8 full-speed and 8 half-speed A100s (a node of each, the second declared as the first's
// profile at 0.5): the stages are sized to their devices, the faster stages taking more
// layers, and the plan beats the same plan with equal stages by the time the slow stage
// loses.
TEST(JointPlanner, SizesStagesToTheirDevices) {
  const ir::Graph g = gpt(24, 2048, 16, 2048, 50304);
  nlohmann::json doc = nlohmann::json::parse(cost::cluster_to_json_string(cost::preset("dgx-a100", 2)));
  doc["device_types"].push_back({{"name", "a100-half"}, {"like", "a100-sxm4-80gb"}, {"speed", 0.5}});
  doc["nodes"][1] = {{"device", "a100-half"}, {"count", 8}};
  const cost::Cluster cluster = cost::cluster_from_json_string(doc.dump());
  JointPlanOptions options;
  options.global_batch = 64;
  const JointPlanResult result = plan_joint(g, cluster, cost::AnalyticCostModel{}, options);
  const plan::Plan& best = result.plan;
  ASSERT_TRUE(best.predicted);
  ASSERT_GT(best.pipeline, 1) << plan::plan_to_json_string(best);
  ASSERT_EQ(best.layers_per_stage.size(), static_cast<std::size_t>(best.pipeline * best.virtual_stages));
  const std::vector<int> device = cost::layers_per_device(best.layers_per_stage, best.pipeline,
                                                          plan::v_shaped(best.schedule));
  const cost::PlanCost priced = cost::evaluate(g, cluster, best, cost::AnalyticCostModel{});
  ASSERT_EQ(priced.stage_devices.size(), static_cast<std::size_t>(best.pipeline));
  // Stages on full-speed devices hold more layers than those on half-speed ones, wherever the
  // planner put them (plan.stage_groups), and run at about half the slow type's time a layer.
  int fast_least = 1 << 30, slow_most = 0;
  for (int s = 0; s < best.pipeline; ++s) {
    const auto u = static_cast<std::size_t>(s);
    if (priced.stage_devices[u] == "a100-sxm4-80gb") {
      fast_least = std::min(fast_least, device[u]);
      EXPECT_NEAR(priced.stage_scale[u], 0.5, 0.05);
    } else {
      EXPECT_EQ(priced.stage_devices[u], "a100-half");
      slow_most = std::max(slow_most, device[u]);
      EXPECT_EQ(priced.stage_scale[u], 1.0);
    }
  }
  EXPECT_GT(fast_least, slow_most) << plan::plan_to_json_string(best);
  // The same plan with equal stages: slower by what the slow stages lose.
  plan::Plan equal = best;
  equal.layers_per_stage.clear();
  equal.predicted.reset();
  const cost::PlanCost even = cost::evaluate(g, cluster, equal, cost::AnalyticCostModel{});
  EXPECT_GT(even.step_time, 1.3 * best.predicted->step_time) << even.step_time << " " << best.predicted->step_time;
  std::printf("8 + 8 half-speed A100s: %s, layers per device %s, %.1f ms; equal stages %.1f ms\n",
              plan::schedule_name(best.schedule).data(), fmt::format("{}", device).c_str(),
              best.predicted->step_time * 1e3, even.step_time * 1e3);
}

}  // namespace
}  // namespace shardwise::search
