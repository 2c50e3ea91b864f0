#include "transform/job_groups.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "support/error.h"

namespace shardwise::transform {
namespace {

using Ranks = std::vector<int>;

std::vector<Ranks> ranks_of(const std::vector<JobGroup>& groups) {
  std::vector<Ranks> out;
  for (const JobGroup& g : groups) out.push_back(g.ranks);
  return out;
}

// A 2 x 3 mesh (ranks 0..5, row-major): axis 0 pairs the ranks 3 apart, axis 1 the rows.
TEST(JobGroups, MeshAxisGroupsAreTheRankIrsGroupsInOrderOfTheirFirstRank) {
  const auto groups = mesh_axis_groups({2, 3});
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0], (std::vector<Ranks>{{0, 3}, {1, 4}, {2, 5}}));
  EXPECT_EQ(groups[1], (std::vector<Ranks>{{0, 1, 2}, {3, 4, 5}}));
  EXPECT_THROW(mesh_axis_groups({2, 0}), support::ValidationError);
}

// Stage meshes of their own sizes: a block of one rank (0), a 2 x 2 block on ranks 1..4 and a
// 1 x 3 block on 5..7. Each block's data-axis groups, its tensor-axis groups, then the block.
TEST(JobGroups, SubMeshesMakeEachBlocksAxesThenTheBlockInBlockOrder) {
  const PipelineBlocks blocks{{{0}, {1, 2, 3, 4}, {5, 6, 7}}, {{1, 1}, {2, 2}, {1, 3}}, {}};
  const auto groups = sub_mesh_groups(blocks);
  EXPECT_EQ(ranks_of(groups), (std::vector<Ranks>{{1, 3}, {2, 4}, {1, 2}, {3, 4}, {1, 2, 3, 4},  // block 1
                                                  {5}, {6}, {7}, {5, 6, 7}, {5, 6, 7}}));          // block 2
  EXPECT_EQ(groups[0].kind, JobGroupKind::Axis);
  EXPECT_EQ(groups[0].block, 1);
  EXPECT_EQ(groups[0].axis, 0);
  EXPECT_EQ(groups[2].axis, 1);
  EXPECT_EQ(groups[4].kind, JobGroupKind::SubMesh);
  EXPECT_EQ(groups[9].block, 2);
}

// A channel from a block of 2 ranks to one of 4: receiver k is served by sender k mod 2.
TEST(JobGroups, ChannelsLinkEachReceiverWithTheSenderServingIt) {
  const PipelineBlocks blocks{{{0, 1}, {2, 3, 4, 5}}, {{2, 1}, {4, 1}}, {}};
  const auto groups = channel_groups(blocks, {{0, 1, false}, {1, 0, true}});
  EXPECT_EQ(ranks_of(groups), (std::vector<Ranks>{{0, 2}, {1, 3}, {0, 4}, {1, 5},     // activations 0 -> 1
                                                  {2, 0}, {3, 1}}));                  // gradients 1 -> 0
  EXPECT_EQ(groups[4].channel, (schedule::P2PChannel{1, 0, true}));
  EXPECT_THROW(channel_groups(blocks, {{0, 2, false}}), support::ValidationError);
}

// Three pipeline ranks of 2 ranks each. The embedding (tied) is read on pipeline ranks 0 and 2:
// by coordinate where their layouts agree; whole over all four ranks where they differ. A leaf
// read on one pipeline rank has no group.
TEST(JobGroups, SharedLeavesSumByCoordinateOrWholeWhereLayoutsDiffer) {
  const std::map<std::string, std::set<int>> owners{{"wte", {2, 0}}, {"ln.weight", {1}}};
  const PipelineBlocks alike{{{0, 1}, {2, 3}, {4, 5}}, {{2, 1}, {2, 1}, {2, 1}}, {}};
  const auto by_coordinate = shared_leaf_groups(alike, owners);
  EXPECT_EQ(ranks_of(by_coordinate), (std::vector<Ranks>{{0, 4}, {1, 5}}));
  EXPECT_EQ(by_coordinate[0].leaf, "wte");
  EXPECT_FALSE(by_coordinate[0].whole);

  const PipelineBlocks differ{alike.ranks, {{2, 1}, {2, 1}, {1, 2}}, {0, 0, 1}};
  const auto whole = shared_leaf_groups(differ, owners);
  EXPECT_EQ(ranks_of(whole), (std::vector<Ranks>{{0, 1, 4, 5}}));
  EXPECT_TRUE(whole[0].whole);
}

// The plan's blocks: Megatron's layout (every stage one {data, tensor} sub-mesh, one layout),
// stages placed on other blocks (stage_groups), and stages of their own sizes, whose layout is
// their sub-mesh and sharding (a stage of one rank has none).
TEST(JobGroups, APlansBlocksAreItsStagesRanksMeshesAndLayouts) {
  plan::Plan p;
  p.pipeline = 2;
  p.data = 2;
  p.tensor = 2;
  PipelineBlocks b = pipeline_blocks(p);
  EXPECT_EQ(b.ranks, (std::vector<Ranks>{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(b.meshes, (std::vector<Ranks>{{2, 2}, {2, 2}}));
  EXPECT_EQ(b.layouts, (Ranks{0, 0}));
  p.stage_groups = {1, 0};
  EXPECT_EQ(pipeline_blocks(p).ranks, (std::vector<Ranks>{{4, 5, 6, 7}, {0, 1, 2, 3}}));

  plan::Plan own;
  own.pipeline = 3;
  own.stage_meshes = {{1, 1}, {2, 1}, {2, 1}};
  b = pipeline_blocks(own);
  EXPECT_EQ(b.ranks, (std::vector<Ranks>{{0}, {1, 2}, {3, 4}}));
  EXPECT_EQ(b.layouts, (Ranks{0, 1, 1}));  // no shardings yet: the sub-mesh alone
  plan::Sharding a, c;
  a.mesh = c.mesh = {2, 1};
  c.placements["w"] = {"S(0)", "R"};
  own.stage_shardings = {plan::Sharding{}, a, c};
  EXPECT_EQ(pipeline_blocks(own).layouts, (Ranks{0, 1, 2}));
  own.stage_shardings = {a, a, a};  // (a stage of one rank: its sharding is no layout)
  EXPECT_EQ(pipeline_blocks(own).layouts, (Ranks{0, 1, 1}));
}

TEST(JobGroups, BlocksThatDisagreeWithTheirMeshesAreRefused) {
  EXPECT_THROW(check_blocks({{{0, 1}}, {{3, 1}}, {}}), support::ValidationError);         // 2 ranks, 3 in the mesh
  EXPECT_THROW(check_blocks({{{0, 1}, {1, 2}}, {{2}, {2}}, {}}), support::ValidationError);  // rank 1 twice
  EXPECT_THROW(check_blocks({{{0}}, {{1}}, {0, 1}}), support::ValidationError);              // two layouts, one block
  EXPECT_NO_THROW(check_blocks({{{0}, {1}}, {{1}, {1}}, {}}));
}

}  // namespace
}  // namespace shardwise::transform
