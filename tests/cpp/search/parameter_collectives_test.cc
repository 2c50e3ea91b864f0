// The rules of how the runtime runs a parameter's collectives (search/parameter_collectives.h):
// the units its grouped collectives follow, and where a gradient's reduce-scatter runs.
#include "search/parameter_collectives.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "test_graphs.h"

namespace shardwise::search {
namespace {

TEST(ParameterUnits, EachLayerIsAUnitAndTheNodesAroundThemAreTheirOwn) {
  const ir::Graph g = testing::gpt(3, 64, 4, 16, 100);
  const std::vector<int> units = parameter_units(g);
  ASSERT_EQ(units.size(), g.nodes().size());
  // Every node of layer k in one unit, no two layers sharing one; the nodes before the first
  // layer (the embeddings) in one unit, those after the last (final norm, head, loss) in another.
  std::map<std::string, std::set<int>> by_owner;
  for (const ir::Node& node : g.nodes()) {
    std::string owner = "after";
    for (int k = 0; k < 3; ++k)
      if (node.module_path.rfind("transformer.h." + std::to_string(k), 0) == 0) owner = "layer" + std::to_string(k);
    if (owner == "after" && by_owner.count("layer0") == 0) owner = "before";
    by_owner[owner].insert(units[static_cast<std::size_t>(node.id)]);
  }
  ASSERT_EQ(by_owner.size(), 5u);
  std::set<int> all;
  for (const auto& [owner, set] : by_owner) {
    EXPECT_EQ(set.size(), 1u) << owner;
    all.insert(*set.begin());
  }
  EXPECT_EQ(all, (std::set<int>{0, 1, 2, 3, 4}));  // numbered in node order, one each
  EXPECT_EQ(*by_owner["before"].begin(), 0);
  EXPECT_EQ(*by_owner["layer2"].begin(), 3);
}

TEST(GradientScatterOverlap, OneEvenContiguousReduceScatterOnOneAxisRunsBesideBackward) {
  const Placement P = Placement::partial(), R = Placement::replicate();
  EXPECT_EQ(gradient_scatter_overlap({P, R}, {Placement::shard(0), R}), ParameterOverlap::BesideBackward);
  EXPECT_EQ(gradient_scatter_overlap({R, P}, {R, Placement::shard(1)}), ParameterOverlap::BesideBackward);
  // Shards on the other axis that need no step are fine.
  EXPECT_EQ(gradient_scatter_overlap({P, Placement::shard(1)}, {Placement::shard(0), Placement::shard(1)}),
            ParameterOverlap::BesideBackward);
  // Else the steps block where backward reaches the read.
  EXPECT_EQ(gradient_scatter_overlap({P, P}, {Placement::shard(0), Placement::shard(1)}),
            ParameterOverlap::Exposed);  // two axes
  EXPECT_EQ(gradient_scatter_overlap({P, P}, {Placement::shard(0), P}),
            ParameterOverlap::Exposed);  // the other axis left to the buckets, whose hook comes first
  EXPECT_EQ(gradient_scatter_overlap({P, R}, {Placement::shard(0, 3), R}), ParameterOverlap::Exposed);  // strided
  Placement uneven = Placement::shard(0);
  uneven.ratios = {0.25, 0.75};
  EXPECT_EQ(gradient_scatter_overlap({P, R}, {uneven, R}), ParameterOverlap::Exposed);
  EXPECT_EQ(gradient_scatter_overlap({P, Placement::shard(0)}, {Placement::shard(0), Placement::shard(0)}),
            ParameterOverlap::Exposed);  // two axes cut dim 0
  EXPECT_EQ(gradient_scatter_overlap({Placement::partial(ops::Reduction::Mean), R}, {Placement::shard(0), R}),
            ParameterOverlap::Exposed);
  EXPECT_EQ(gradient_scatter_overlap({R, R}, {R, R}), ParameterOverlap::Exposed);  // nothing to reduce
  EXPECT_EQ(gradient_scatter_overlap({P, R}, {R, R}), ParameterOverlap::Exposed);  // an all-reduce
}

}  // namespace
}  // namespace shardwise::search
