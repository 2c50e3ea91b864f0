#include "search/resharding.h"

#include <gtest/gtest.h>

#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "cost/cluster_presets.h"
#include "support/error.h"
#include "transform/reshard_actions.h"

namespace shardwise::search {
namespace {

using cost::CollectiveKind;

constexpr std::int64_t kMiB = 1 << 20;
constexpr std::int64_t kB = 16 * kMiB;  // a bf16 [2048, 4096] tensor

Placement R() { return Placement::replicate(); }
Placement S(int dim, std::int64_t groups = 1) { return Placement::shard(dim, groups); }
Placement P(ops::Reduction reduction = ops::Reduction::Sum) { return Placement::partial(reduction); }
Placement uneven(int dim, std::vector<double> ratios) {
  Placement p = Placement::shard(dim);
  p.ratios = std::move(ratios);
  return p;
}

std::optional<ReshardStep> step(CollectiveKind kind, std::int64_t bytes) { return ReshardStep{kind, bytes}; }

TEST(ReshardStepTest, WorkedExample) {
  EXPECT_EQ(reshard_step(P(), S(0), kB, 8), step(CollectiveKind::ReduceScatter, 16 * kMiB));
  EXPECT_EQ(reshard_step(S(0), S(1), kB, 8), step(CollectiveKind::AllToAll, 2 * kMiB));
  EXPECT_EQ(reshard_step(R(), S(1), kB, 8), std::nullopt);
}

TEST(ReshardStepTest, FromReplicateIsAlwaysLocal) {
  EXPECT_EQ(reshard_step(R(), R(), kB, 8), std::nullopt);
  EXPECT_EQ(reshard_step(R(), S(0), kB, 8), std::nullopt);
  EXPECT_EQ(reshard_step(R(), S(2, 3), kB, 8), std::nullopt);
  EXPECT_EQ(reshard_step(R(), uneven(0, {0.75, 0.25}), kB, 2), std::nullopt);
  EXPECT_EQ(reshard_step(R(), P(), kB, 8), std::nullopt);
  EXPECT_EQ(reshard_step(R(), P(ops::Reduction::Mean), kB, 8), std::nullopt);
}

TEST(ReshardStepTest, FromShard) {
  // S -> R: gather the whole tensor.
  EXPECT_EQ(reshard_step(S(0), R(), kB, 8), step(CollectiveKind::AllGather, kB));
  EXPECT_EQ(reshard_step(S(2, 3), R(), kB, 8), step(CollectiveKind::AllGather, kB));
  // S -> S: equal is local; contiguous shards of two dims an all-to-all of each rank's 1/n;
  // a strided one, or another grouping of the same dim, gathered whole, then cut (as run).
  EXPECT_EQ(reshard_step(S(1), S(1), kB, 8), std::nullopt);
  EXPECT_EQ(reshard_step(S(2, 3), S(2, 3), kB, 8), std::nullopt);
  EXPECT_EQ(reshard_step(S(0), S(1), kB, 8), step(CollectiveKind::AllToAll, kB / 8));
  EXPECT_EQ(reshard_step(S(2), S(2, 3), kB, 8), step(CollectiveKind::AllGather, kB));
  EXPECT_EQ(reshard_step(S(2, 3), S(2, 6), kB, 4), step(CollectiveKind::AllGather, kB));
  EXPECT_EQ(reshard_step(S(0), S(1, 3), kB, 8), step(CollectiveKind::AllGather, kB));
  // S -> P: gather, then every rank but one zeroes its copy.
  EXPECT_EQ(reshard_step(S(0), P(), kB, 8), step(CollectiveKind::AllGather, kB));
  EXPECT_EQ(reshard_step(S(1, 3), P(ops::Reduction::Mean), kB, 8), step(CollectiveKind::AllGather, kB));
}

TEST(ReshardStepTest, UnevenShardsArePricedAsTheRewriteRunsThem) {
  const auto a = uneven(0, {0.75, 0.25});
  EXPECT_EQ(reshard_step(a, R(), kB, 2), step(CollectiveKind::AllGather, kB));
  EXPECT_EQ(reshard_step(a, P(), kB, 2), step(CollectiveKind::AllGather, kB));
  // No direct reduce-scatter or all-to-all for uneven blocks (transform/reshard_actions.h):
  // all-reduced or gathered whole, then cut locally.
  EXPECT_EQ(reshard_step(P(), a, kB, 2), step(CollectiveKind::AllReduce, kB));
  EXPECT_EQ(reshard_step(a, S(1), kB, 2), step(CollectiveKind::AllGather, kB));
  EXPECT_EQ(reshard_step(S(1), a, kB, 2), step(CollectiveKind::AllGather, kB));
  // Same ratios hold the same data; so do even ratios and an even shard.
  EXPECT_EQ(reshard_step(a, uneven(0, {0.75, 0.25}), kB, 2), std::nullopt);
  EXPECT_EQ(reshard_step(S(0), uneven(0, {0.5, 0.5}), kB, 2), std::nullopt);
  EXPECT_EQ(reshard_step(uneven(0, {0.5, 0.5}), S(0), kB, 2), std::nullopt);
  // Different ratios move data.
  EXPECT_EQ(reshard_step(a, uneven(0, {0.5, 0.5}), kB, 2), step(CollectiveKind::AllGather, kB));
  EXPECT_EQ(reshard_step(a, S(0), kB, 2), step(CollectiveKind::AllGather, kB));
  EXPECT_EQ(reshard_step(S(0), a, kB, 2), step(CollectiveKind::AllGather, kB));
}

// The search prices the collective the rewrite runs (transform/reshard_actions.h), on one axis:
// for every pair of these placements, the priced kind is the one collective among the steps
// (a gather, then a local cut, where no direct all-to-all or reduce-scatter runs), or none.
TEST(ReshardStepTest, PricesTheCollectiveTheRewriteRuns) {
  const std::vector<std::string> texts = {"R",       "S(0)",          "S(1)",    "S(1,g3)", "S(0,g2)",
                                          "S(0)[0.25,0.75]", "P(sum)", "P(mean)"};
  int checked = 0;
  for (const std::string& a : texts)
    for (const std::string& b : texts) {
      SCOPED_TRACE(a + " -> " + b);
      const Placement from = parse_placement(a), to = parse_placement(b);
      std::optional<CollectiveKind> run;
      for (const transform::ReshardAction& action : transform::reshard_actions({from}, {to})) {
        // A step's name is its collective's ("slice", "zero_others", "scale": local, none).
        const std::optional<CollectiveKind> kind = cost::parse_collective_kind(transform::reshard_kind_name(action.kind));
        if (!kind) continue;
        EXPECT_FALSE(run.has_value()) << "two collectives";
        run = kind;
      }
      const std::optional<ReshardStep> priced = reshard_step(from, to, kB, 2);
      EXPECT_EQ(priced.has_value(), run.has_value());
      if (priced && run) EXPECT_EQ(priced->kind, *run);
      ++checked;
    }
  EXPECT_EQ(checked, 64);
}

TEST(ReshardStepTest, FromPartial) {
  EXPECT_EQ(reshard_step(P(), R(), kB, 8), step(CollectiveKind::AllReduce, kB));
  EXPECT_EQ(reshard_step(P(ops::Reduction::Mean), R(), kB, 8), step(CollectiveKind::AllReduce, kB));
  EXPECT_EQ(reshard_step(P(), S(1), kB, 8), step(CollectiveKind::ReduceScatter, kB));
  EXPECT_EQ(reshard_step(P(ops::Reduction::Max), S(2, 3), kB, 8), step(CollectiveKind::ReduceScatter, kB));
  EXPECT_EQ(reshard_step(P(), P(), kB, 8), std::nullopt);
  EXPECT_EQ(reshard_step(P(ops::Reduction::Mean), P(ops::Reduction::Mean), kB, 8), std::nullopt);
  EXPECT_EQ(reshard_step(P(), P(ops::Reduction::Mean), kB, 8), std::nullopt);  // rescaled by each rank
  EXPECT_EQ(reshard_step(P(ops::Reduction::Mean), S(1), kB, 8), step(CollectiveKind::AllReduce, kB));
  EXPECT_EQ(reshard_step(P(ops::Reduction::Max), P(ops::Reduction::Min), kB, 8), step(CollectiveKind::AllReduce, kB));
}

TEST(ReshardStepTest, EdgeSizes) {
  EXPECT_EQ(reshard_step(S(0), S(1), 0, 8), step(CollectiveKind::AllToAll, 0));
  EXPECT_EQ(reshard_step(S(0), S(1), 100, 8), step(CollectiveKind::AllToAll, 12));  // rounds down
  EXPECT_EQ(reshard_step(S(0), S(1), kB, 1), step(CollectiveKind::AllToAll, kB));
  EXPECT_EQ(reshard_step(P(), R(), kB, 1), step(CollectiveKind::AllReduce, kB));  // free on one rank
}

TEST(ReshardStepTest, RejectsBadArguments) {
  EXPECT_THROW(reshard_step(P(), R(), kB, 0), support::ValidationError);
  EXPECT_THROW(reshard_step(P(), R(), kB, -2), support::ValidationError);
  EXPECT_THROW(reshard_step(P(), R(), -1, 8), support::ValidationError);
  EXPECT_THROW(reshard_step(R(), R(), -1, 8), support::ValidationError);
}

// Records the collective it was asked to price.
class RecordingModel final : public cost::CostModel {
 public:
  cost::OpTime node_time(const ir::Graph&, const ir::Node&, const cost::DeviceType&, cost::Precision,
                         const cost::NodeContext&) const override {
    return {};
  }
  double collective_time(const cost::Cluster&, CollectiveKind kind, std::span<const int> ranks, std::int64_t bytes,
                         cost::Algorithm algorithm) const override {
    ++calls;
    last_kind = kind;
    last_ranks.assign(ranks.begin(), ranks.end());
    last_bytes = bytes;
    last_algorithm = algorithm;
    return 1e-3 + static_cast<double>(bytes) * 1e-12;
  }

  mutable int calls = 0;
  mutable CollectiveKind last_kind = CollectiveKind::Broadcast;
  mutable std::vector<int> last_ranks;
  mutable std::int64_t last_bytes = -1;
  mutable cost::Algorithm last_algorithm = cost::Algorithm::Ring;
};

TEST(ReshardTimeTest, AsksTheModelForTheStep) {
  const auto cluster = cost::preset("dgx-a100", 1);
  std::vector<int> ranks(8);
  std::iota(ranks.begin(), ranks.end(), 0);
  RecordingModel model;

  EXPECT_DOUBLE_EQ(reshard_time(model, cluster, ranks, P(), R(), kB), 1e-3 + static_cast<double>(kB) * 1e-12);
  EXPECT_EQ(model.calls, 1);
  EXPECT_EQ(model.last_kind, CollectiveKind::AllReduce);
  EXPECT_EQ(model.last_ranks, ranks);
  EXPECT_EQ(model.last_bytes, kB);
  EXPECT_EQ(model.last_algorithm, cost::Algorithm::Auto);

  // The axis size is the number of ranks: AllToAll gets B / 8.
  reshard_time(model, cluster, ranks, S(0), S(1), kB);
  EXPECT_EQ(model.last_kind, CollectiveKind::AllToAll);
  EXPECT_EQ(model.last_bytes, kB / 8);

  // Local changes never reach the model.
  EXPECT_EQ(reshard_time(model, cluster, ranks, R(), S(1), kB), 0.0);
  EXPECT_EQ(reshard_time(model, cluster, ranks, P(), P(), kB), 0.0);
  EXPECT_EQ(model.calls, 2);

  EXPECT_THROW(reshard_time(model, cluster, std::span<const int>(), P(), R(), kB), support::ValidationError);
}

TEST(ReshardTimeTest, MatchesTheAnalyticModel) {
  const auto cluster = cost::preset("dgx-a100", 1);
  const std::vector<int> ranks = {0, 1, 2, 3, 4, 5, 6, 7};
  const cost::AnalyticCostModel model;
  EXPECT_DOUBLE_EQ(reshard_time(model, cluster, ranks, P(), R(), kB),
                   model.collective_time(cluster, CollectiveKind::AllReduce, ranks, kB, cost::Algorithm::Auto));
  EXPECT_DOUBLE_EQ(reshard_time(model, cluster, ranks, S(0), R(), kB),
                   model.collective_time(cluster, CollectiveKind::AllGather, ranks, kB, cost::Algorithm::Auto));
  EXPECT_GT(reshard_time(model, cluster, ranks, P(), R(), kB), reshard_time(model, cluster, ranks, P(), S(0), kB));
  // One rank: the collective is free.
  const std::vector<int> one = {3};
  EXPECT_EQ(reshard_time(model, cluster, one, P(), R(), kB), 0.0);
}

}  // namespace
}  // namespace shardwise::search
