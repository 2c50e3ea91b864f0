#include "search/micro_batch_check.h"

#include <gtest/gtest.h>

#include <string>

#include "cost/cluster_presets.h"
#include "cost/op_cost.h"
#include "ir/parser.h"
#include "search/joint_planner.h"
#include "support/error.h"

namespace shardwise::search {
namespace {

// Two repeated blocks of linear -> batch norm (training) -> relu, then a mean cross entropy:
// the batch norms couple the rows of the batch.
ir::Graph blocks_with_batch_norm(bool training) {
  std::string text = "graph(%x: f32[b8,64], %y: i64[b8]) {\n";
  std::string h = "x";
  for (int b = 0; b < 2; ++b) {
    const std::string p = "blocks." + std::to_string(b);
    text += "  %" + p + ".fc.weight: f32[64,64] parameter\n";
    text += "  %" + p + ".bn.weight: f32[64] parameter\n  %" + p + ".bn.bias: f32[64] parameter\n";
    text += "  %" + p + ".bn.running_mean: f32[64] buffer\n  %" + p + ".bn.running_var: f32[64] buffer\n";
    text += "  %lin" + std::to_string(b) + ": f32[b8,64] = aten::linear(%" + h + ", %" + p + ".fc.weight) @" + p +
            ".fc\n";
    text += "  %bn" + std::to_string(b) + ": f32[b8,64] = aten::batch_norm(%lin" + std::to_string(b) + ", %" + p +
            ".bn.weight, %" + p + ".bn.bias, %" + p + ".bn.running_mean, %" + p + ".bn.running_var) {training=" +
            (training ? "true" : "false") + ", momentum=0.1, eps=1e-05, cudnn_enabled=false} @" + p + ".bn\n";
    text += "  %h" + std::to_string(b) + ": f32[b8,64] = aten::relu(%bn" + std::to_string(b) + ") @" + p + "\n";
    h = "h" + std::to_string(b);
  }
  text += "  %head.weight: f32[10,64] parameter\n";
  text += "  %logits: f32[b8,10] = aten::linear(%" + h + ", %head.weight) @head\n";
  text += "  %loss: f32[] = aten::cross_entropy_loss(%logits, %y) {reduction=1}\n  return (%loss)\n}\n";
  return ir::parse_graph(text);
}

plan::Plan in_micro_batches(std::int64_t micro_batch) {
  plan::Plan p;
  p.pipeline = 2;
  p.global_batch = 8;
  p.micro_batch = micro_batch;
  return p;
}

TEST(MicroBatchCheck, RefusesMicroBatchesOfACoupledGraphNamingTheOpAndModule) {
  const ir::Graph g = blocks_with_batch_norm(true);
  try {
    check_micro_batches(ops::OpTable::builtin(), g, in_micro_batches(2));
    FAIL() << "accepted 4 micro-batches over batch norms in training";
  } catch (const support::ValidationError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("4 micro-batches of 2 rows"), std::string::npos) << what;
    EXPECT_NE(what.find("aten::batch_norm in module 'blocks.0.bn'"), std::string::npos) << what;
    EXPECT_NE(what.find("micro_batch_semantics='per_micro_batch'"), std::string::npos) << what;
  }
  // One micro-batch, the user's opt-in, or batch norm in eval mode: accepted.
  EXPECT_NO_THROW(check_micro_batches(ops::OpTable::builtin(), g, in_micro_batches(8)));
  plan::Plan chosen = in_micro_batches(2);
  chosen.micro_batch_semantics = plan::MicroBatchSemantics::PerMicroBatch;
  EXPECT_NO_THROW(check_micro_batches(ops::OpTable::builtin(), g, chosen));
  EXPECT_NO_THROW(check_micro_batches(ops::OpTable::builtin(), blocks_with_batch_norm(false), in_micro_batches(2)));
}

TEST(MicroBatchCheck, TheJointPlannerKeepsACoupledGraphInOneMicroBatch) {
  const cost::Cluster cluster = cost::preset("dgx-a100", 1);
  JointPlanOptions options;
  options.global_batch = 8;
  options.level = SearchLevel::Thorough;
  const ir::Graph coupled = blocks_with_batch_norm(true);
  const JointPlanResult exact = plan_joint(coupled, cluster, cost::AnalyticCostModel{}, options);
  EXPECT_EQ(exact.plan.num_micro_batches(), 1);
  for (const auto& c : exact.best) EXPECT_EQ(c.plan.num_micro_batches(), 1) << plan::plan_to_json_string(c.plan);
  // Chosen per micro-batch, or a graph in eval mode: micro-batches are candidates again.
  options.micro_batch_semantics = plan::MicroBatchSemantics::PerMicroBatch;
  const JointPlanResult chosen = plan_joint(coupled, cluster, cost::AnalyticCostModel{}, options);
  bool split = false;
  for (const auto& c : chosen.best) split = split || c.plan.num_micro_batches() > 1;
  EXPECT_TRUE(split);
  EXPECT_EQ(chosen.plan.micro_batch_semantics, plan::MicroBatchSemantics::PerMicroBatch);
  options.micro_batch_semantics = plan::MicroBatchSemantics::Exact;
  const JointPlanResult eval = plan_joint(blocks_with_batch_norm(false), cluster, cost::AnalyticCostModel{}, options);
  split = false;
  for (const auto& c : eval.best) split = split || c.plan.num_micro_batches() > 1;
  EXPECT_TRUE(split);
}

}  // namespace
}  // namespace shardwise::search
