// The program one rank of a plan runs, and its hash (transform/job_program.h).
#include "transform/job_program.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ir/parser.h"
#include "ir/printer.h"
#include "support/error.h"

namespace shardwise::transform {
namespace {

// Two linears of parameters, one micro-batch of 4 rows: a pipeline of two stages cuts it
// between them, and each stage's linear is a contraction the fused-accumulation pass marks.
ir::Graph two_linears() {
  return ir::parse_graph(R"(graph(%x: f32[b4,16]) {
  %w1: f32[16,16] parameter
  %w2: f32[16,16] parameter
  %h: f32[b4,16] = aten::linear(%x, %w1) {bias=none} @fc1
  %a: f32[b4,16] = aten::tanh(%h) @act
  %y: f32[b4,16] = aten::linear(%a, %w2) {bias=none} @fc2
  %loss: f32[] = aten::sum(%y) {dtype=none}
  return (%loss)
})");
}

// Pipeline 2 of one rank each (1F1B), a global batch of 8 in micro-batches of 4: two.
plan::Plan two_stages() {
  plan::Plan p;
  p.pipeline = 2;
  p.global_batch = 8;
  p.micro_batch = 4;
  p.precision = "f32";
  return p;
}

std::vector<std::string> printed(const std::vector<ir::Graph>& graphs) {
  std::vector<std::string> out;
  for (const ir::Graph& g : graphs) out.push_back(ir::print_graph(g));
  return out;
}

// A stage of one rank runs the whole graph replicated, with the plan's micro-batches, cut in
// two, each stage after its passes: what the runtime's rank program builds from the same inputs.
TEST(JobProgram, APipelinedRanksProgramIsItsStageMeshProgramCutWithItsPasses) {
  const ir::Graph graph = two_linears();
  const RankProgramGraphs job = job_program(graph, two_stages(), 1);
  ASSERT_EQ(job.stages.size(), 2u);
  RewriteOptions options;
  options.micro_batches = 2;
  const RankProgramGraphs same =
      build_rank_program(graph, replicated_sharding(graph), 0, options, {2, {}, {false, true}});
  EXPECT_EQ(printed(job.stages), printed(same.stages));
  EXPECT_EQ(program_hash(job), program_hash(same));
  // The fused-accumulation pass marked each stage's linear (its mark is in what is hashed).
  EXPECT_NE(ir::print_graph(job.stages[0]).find("shardwise.fused_accumulation"), std::string::npos);
  EXPECT_NE(ir::print_graph(job.stages[1]).find("shardwise.fused_accumulation"), std::string::npos);
}

// The hash covers what runs: the stage passes (fused accumulation off; ZB-H1's B/W split) and
// the FP8 marks, not the rewrite alone. Ranks of alike blocks hash alike; the plan's record combines them in order.
TEST(JobProgram, TheHashChangesWithEveryPassTheStagesRun) {
  const ir::Graph graph = two_linears();
  const plan::Plan plain = two_stages();
  const std::uint64_t h = program_hash(job_program(graph, plain, 0));
  EXPECT_EQ(program_hash(job_program(graph, plain, 1)), h);
  plan::Plan unfused = plain;
  unfused.fused_accumulation = false;
  EXPECT_NE(program_hash(job_program(graph, unfused, 0)), h);
  plan::Plan split = plain;
  split.schedule = plan::Schedule::ZeroBubbleH1;
  EXPECT_NE(program_hash(job_program(graph, split, 0)), h);
  plan::Plan fp8 = plain;  // (its linears marked with their amax axes: rank_graph.h)
  fp8.precision = "fp8";
  EXPECT_NE(program_hash(job_program(graph, fp8, 0)), h);
  EXPECT_EQ(plan_programs_hash(graph, plain), combined_programs_hash({hex_hash(h), hex_hash(h)}));
}

TEST(JobProgram, ARankOutsideThePlanIsRefused) {
  EXPECT_THROW(job_program(two_linears(), two_stages(), 2), support::ValidationError);
}

}  // namespace
}  // namespace shardwise::transform
