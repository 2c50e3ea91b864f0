#include "transform/pipeline_job.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/error.h"

namespace shardwise::transform {
namespace {

using Ranks = std::vector<int>;

// A plan by its degrees: `pipeline` stages of `data` ranks, micro-batches of `micro` rows per
// data rank.
plan::Plan degrees(int pipeline, int data, int global_batch, int micro) {
  plan::Plan p;
  p.pipeline = pipeline;
  p.data = data;
  p.global_batch = global_batch;
  p.micro_batch = micro;
  return p;
}

std::string codes(const std::vector<schedule::Action>& actions) {
  std::string out;
  for (const schedule::Action& a : actions)
    out += std::string(schedule::action_kind_code(a.kind)) + std::to_string(a.micro_batch) + "@s" +
           std::to_string(a.stage) + " ";
  return out;
}

// 1F1B over two stages of data 2 (Megatron's layout, ranks 0-1 then 2-3), a global batch of 8
// in micro-batches of 1 row per data rank: 4 micro-batches. Rank 3 is pipeline rank 1, the
// second rank of its block. Two channels: activations 0 -> 1, gradients
// 1 -> 0, a two-rank group per coordinate of each. No sub-mesh groups: one shape, torch's
// DeviceMesh makes them.
TEST(PipelineJob, OneFOneBOnTwoStagesOfDataTwo) {
  const PipelineJob job = make_pipeline_job(degrees(2, 2, 8, 1), 4, 3);
  EXPECT_EQ(job.blocks.ranks, (std::vector<Ranks>{{0, 1}, {2, 3}}));
  EXPECT_EQ(job.pipeline_rank, 1);
  EXPECT_EQ(job.local, 1);
  EXPECT_EQ(job.micro_batches, 4);
  EXPECT_EQ(job.stage_ranks, (Ranks{0, 1}));
  EXPECT_FALSE(job.split_backward);
  // The last stage alternates forward and backward from the first micro-batch; each next
  // activation's receive is posted before the backward that precedes its forward
  // (schedule/early_receives.h), each gradient sent right after its backward.
  EXPECT_EQ(codes(job.actions),
            "RA0@s1 F0@s1 RA1@s1 B0@s1 SG0@s1 F1@s1 RA2@s1 B1@s1 SG1@s1 F2@s1 RA3@s1 B2@s1 SG2@s1 F3@s1 B3@s1 SG3@s1 ");
  EXPECT_EQ(job.channels, (std::vector<schedule::P2PChannel>{{0, 1, false}, {1, 0, true}}));
  std::vector<Ranks> groups;
  for (const JobGroup& g : job.groups) groups.push_back(g.ranks);
  EXPECT_EQ(groups, (std::vector<Ranks>{{0, 2}, {1, 3}, {2, 0}, {3, 1}}));
  for (const JobGroup& g : job.groups) EXPECT_EQ(g.kind, JobGroupKind::Channel);
}

// Stages of their own sizes (one rank, then a block of 2 x 1): the sub-mesh groups come first,
// then the channels': activations from the one rank to each of the block's two, gradients
// back from the block's rank serving receiver 0 (0 mod 2: rank 1) alone.
TEST(PipelineJob, StageMeshesMakeTheirSubMeshGroupsBeforeTheChannels) {
  plan::Plan p = degrees(2, 1, 4, 2);
  p.stage_meshes = {{1, 1}, {2, 1}};
  const PipelineJob job = make_pipeline_job(p, 3, 0);
  EXPECT_EQ(job.pipeline_rank, 0);
  EXPECT_EQ(job.local, 0);
  EXPECT_EQ(job.micro_batches, 2);
  std::vector<Ranks> groups;
  std::vector<JobGroupKind> kinds;
  for (const JobGroup& g : job.groups) {
    groups.push_back(g.ranks);
    kinds.push_back(g.kind);
  }
  EXPECT_EQ(groups, (std::vector<Ranks>{{1, 2}, {1}, {2}, {1, 2},           // block 1: data, tensor axes, whole
                                        {0, 1}, {0, 2}, {1, 0}}));  // activations, gradients
  EXPECT_EQ(kinds.front(), JobGroupKind::Axis);
  EXPECT_EQ(kinds[3], JobGroupKind::SubMesh);
  EXPECT_EQ(kinds.back(), JobGroupKind::Channel);
}

// ZB-V: two chunks per rank in a V (stage 3 on rank 0), backward split into B and W.
TEST(PipelineJob, ZeroBubbleVPlacesItsStagesInAVAndSplitsBackward) {
  plan::Plan p = degrees(2, 1, 4, 1);
  p.virtual_stages = 2;
  p.schedule = plan::Schedule::ZeroBubbleV;
  const PipelineJob job = make_pipeline_job(p, 2, 0);
  EXPECT_EQ(job.stage_ranks, (Ranks{0, 1, 1, 0}));
  EXPECT_TRUE(job.split_backward);
}

TEST(PipelineJob, AJobOfAnotherSizeOrARankOutsideItIsRefused) {
  const plan::Plan p = degrees(2, 2, 4, 1);
  try {
    make_pipeline_job(p, 3, 0);
    FAIL() << "a plan of 4 ranks ran on 3";
  } catch (const support::ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find("pipeline 2 x data 2 x tensor 1 = 4 ranks, the job 3"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(make_pipeline_job(p, 4, 4), support::ValidationError);
}

}  // namespace
}  // namespace shardwise::transform
