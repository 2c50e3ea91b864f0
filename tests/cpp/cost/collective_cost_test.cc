#include "cost/collective_cost.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "cost/cluster_presets.h"
#include "support/error.h"
#include "test_clusters.h"

namespace shardwise::cost {
namespace {

using testing::error_of;

constexpr std::int64_t kGB = 1'000'000'000;  // B = 1e9 bytes keeps the arithmetic readable

// Sums of decimal literals and of rounded terms differ in the last bits.
void expect_seconds(double actual, double expected) { EXPECT_NEAR(actual, expected, 1e-12 * expected + 1e-18); }

std::vector<int> iota(int n, int first = 0) {
  std::vector<int> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

// ---- names ------------------------------------------------------------------------------

TEST(CollectiveCostTest, NamesRoundTrip) {
  for (auto k : {CollectiveKind::AllReduce, CollectiveKind::AllGather, CollectiveKind::ReduceScatter,
                 CollectiveKind::AllToAll, CollectiveKind::Broadcast, CollectiveKind::SendRecv}) {
    EXPECT_EQ(collective_kind_from_name(collective_kind_name(k)), k);
  }
  for (auto a : {Algorithm::Auto, Algorithm::Ring, Algorithm::Hierarchical}) {
    EXPECT_EQ(algorithm_from_name(algorithm_name(a)), a);
  }
  EXPECT_EQ(parse_collective_kind("allreduce"), std::nullopt);
  EXPECT_EQ(error_of<support::ValidationError>([] { collective_kind_from_name("allreduce"); }),
            "unknown collective 'allreduce' (known: all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, "
            "send_recv)");
  EXPECT_EQ(error_of<support::ValidationError>([] { algorithm_from_name("tree"); }),
            "unknown collective algorithm 'tree' (known: auto, ring, hierarchical)");
}

// ---- 1-level hierarchy: one node of 4, bus 1 GB/s (bw = 1e9), 1 us (a = 1e-6) -------------

TEST(CollectiveCostTest, OneLevelRing) {
  const Cluster c = testing::flat_cluster(4);
  const auto all = iota(4);
  // all-reduce: 2(n-1)/n * B/bw + 2(n-1) a = 2*3/4 * 1 s + 6 us = 1.500006 s
  expect_seconds(collective_time(c, CollectiveKind::AllReduce, all, kGB), 1.500006);
  // all-gather, reduce-scatter, all-to-all: (n-1)/n * B/bw + (n-1) a = 0.75 s + 3 us
  expect_seconds(collective_time(c, CollectiveKind::AllGather, all, kGB), 0.750003);
  expect_seconds(collective_time(c, CollectiveKind::ReduceScatter, all, kGB), 0.750003);
  expect_seconds(collective_time(c, CollectiveKind::AllToAll, all, kGB), 0.750003);
  // broadcast (pipelined ring): B/bw + (n-1) a = 1 s + 3 us
  expect_seconds(collective_time(c, CollectiveKind::Broadcast, all, kGB), 1.000003);
  // send/recv: B/bw + a = 1 s + 1 us
  const std::vector<int> pair = {0, 3};
  expect_seconds(collective_time(c, CollectiveKind::SendRecv, pair, kGB), 1.000001);
  // Two ranks all-reduce: 2*1/2 * 1 s + 2 us
  expect_seconds(collective_time(c, CollectiveKind::AllReduce, pair, kGB), 1.000002);
}

// A call's overhead is paid once per collective, so two collectives of the same ring steps
// and bytes cost more than one: an all-gather plus a reduce-scatter against an all-reduce.
TEST(CollectiveCostTest, CallOverheadOncePerCall) {
  LinkLevel bus{"bus", 0, 1e9, 1e-6, {}, 5e-4};
  const Cluster c("flat", {testing::test_device("dev")}, {Node::uniform("dev", 4)}, {bus});
  const auto all = iota(4);
  expect_seconds(collective_time(c, CollectiveKind::AllReduce, all, kGB), 1.500006 + 5e-4);
  expect_seconds(collective_time(c, CollectiveKind::AllGather, all, kGB), 0.750003 + 5e-4);
  const std::vector<int> pair = {0, 3};
  expect_seconds(collective_time(c, CollectiveKind::SendRecv, pair, kGB), 1.000001 + 5e-4);
  const double split = collective_time(c, CollectiveKind::AllGather, all, 65536) +
                       collective_time(c, CollectiveKind::ReduceScatter, all, 65536);
  EXPECT_NEAR(split - collective_time(c, CollectiveKind::AllReduce, all, 65536), 5e-4, 1e-12);
  // Nothing to do is still free.
  EXPECT_EQ(collective_time(c, CollectiveKind::AllReduce, all, 0), 0.0);
  const std::vector<int> one = {2};
  EXPECT_EQ(collective_time(c, CollectiveKind::AllReduce, one, kGB), 0.0);
}

// Across nodes, whichever algorithm runs it, one call pays the outermost level's overhead once.
TEST(CollectiveCostTest, CallOverheadOnceForAHierarchicalCall) {
  Cluster two = preset("dgx-a100", 2);
  std::vector<LinkLevel> links = two.links();
  links.back().call_overhead = 1e-3;
  const Cluster slow(two.name(), two.device_types(), two.nodes(), links);
  const auto all = iota(16);
  for (Algorithm a : {Algorithm::Ring, Algorithm::Hierarchical}) {
    const CollectiveEstimate before = estimate_collective(two, CollectiveKind::AllReduce, all, kGB, a);
    const CollectiveEstimate after = estimate_collective(slow, CollectiveKind::AllReduce, all, kGB, a);
    EXPECT_EQ(after.algorithm, before.algorithm);
    expect_seconds(after.seconds, before.seconds + 1e-3);
  }
}

TEST(CollectiveCostTest, OneNodeHasNoHierarchicalForm) {
  const Cluster c = testing::flat_cluster(4);
  const auto all = iota(4);
  for (auto a : {Algorithm::Auto, Algorithm::Ring, Algorithm::Hierarchical}) {
    const CollectiveEstimate e = estimate_collective(c, CollectiveKind::AllReduce, all, kGB, a);
    EXPECT_EQ(e.algorithm, Algorithm::Ring);
    expect_seconds(e.seconds, 1.500006);
  }
}

// ---- 2-level hierarchy: 2 nodes x 4; fast 100 GB/s 1 us inside, net 10 GB/s 10 us across --

TEST(CollectiveCostTest, TwoLevelGroupInsideANodeUsesTheInnerLevel) {
  const Cluster c = testing::two_level_cluster(2, 4);
  const auto node1 = iota(4, 4);  // ranks 4..7
  // all-reduce: 2*3/4 * 1e9/1e11 + 6 * 1e-6 = 0.015 + 0.000006
  expect_seconds(collective_time(c, CollectiveKind::AllReduce, node1, kGB), 0.015006);
  // all-gather / reduce-scatter / all-to-all: 3/4 * 0.01 + 3e-6
  expect_seconds(collective_time(c, CollectiveKind::AllGather, node1, kGB), 0.007503);
  expect_seconds(collective_time(c, CollectiveKind::ReduceScatter, node1, kGB), 0.007503);
  expect_seconds(collective_time(c, CollectiveKind::AllToAll, node1, kGB), 0.007503);
  // broadcast: 0.01 + 3e-6
  expect_seconds(collective_time(c, CollectiveKind::Broadcast, node1, kGB), 0.010003);
  // send/recv inside a node: 0.01 + 1e-6
  const std::vector<int> neighbours = {4, 5};
  expect_seconds(collective_time(c, CollectiveKind::SendRecv, neighbours, kGB), 0.010001);
}

TEST(CollectiveCostTest, TwoLevelRingAcrossNodesUsesTheOuterLevel) {
  const Cluster c = testing::two_level_cluster(2, 4);
  const auto all = iota(8);
  const auto ring = Algorithm::Ring;
  // all-reduce: 2*7/8 * 1e9/1e10 + 14 * 1e-5 = 0.175 + 0.00014
  expect_seconds(collective_time(c, CollectiveKind::AllReduce, all, kGB, ring), 0.17514);
  // all-gather / reduce-scatter / all-to-all: 7/8 * 0.1 + 7e-5 = 0.0875 + 0.00007
  expect_seconds(collective_time(c, CollectiveKind::AllGather, all, kGB, ring), 0.08757);
  expect_seconds(collective_time(c, CollectiveKind::ReduceScatter, all, kGB, ring), 0.08757);
  expect_seconds(collective_time(c, CollectiveKind::AllToAll, all, kGB, ring), 0.08757);
  // broadcast: 0.1 + 7e-5
  expect_seconds(collective_time(c, CollectiveKind::Broadcast, all, kGB, ring), 0.10007);
  // send/recv across nodes: 0.1 + 1e-5
  const std::vector<int> across = {3, 4};
  expect_seconds(collective_time(c, CollectiveKind::SendRecv, across, kGB), 0.10001);
}

TEST(CollectiveCostTest, TwoLevelHierarchical) {
  const Cluster c = testing::two_level_cluster(2, 4);  // m = 2 nodes, k = 4 per node
  const auto all = iota(8);
  const auto hier = Algorithm::Hierarchical;
  // Pieces (B = 1e9, B/k = 2.5e8):
  //   inside RS or AG on B  : 3/4 * 1e9/1e11 + 3 * 1e-6     = 0.0075 + 0.000003 = 0.007503
  //   across AR on B/k      : 2*1/2 * 2.5e8/1e10 + 2 * 1e-5 = 0.025 + 0.00002   = 0.02502
  //   across AG or RS on B/k: 1/2 * 2.5e8/1e10 + 1e-5        = 0.0125 + 0.00001  = 0.01251
  // all-reduce = RS + AR + AG = 0.007503 + 0.02502 + 0.007503 = 0.040026
  CollectiveEstimate e = estimate_collective(c, CollectiveKind::AllReduce, all, kGB, hier);
  EXPECT_EQ(e.algorithm, Algorithm::Hierarchical);
  expect_seconds(e.seconds, 0.040026);
  // all-gather = across AG (B/k) + inside AG (B) = 0.01251 + 0.007503 = 0.020013
  expect_seconds(collective_time(c, CollectiveKind::AllGather, all, kGB, hier), 0.020013);
  // reduce-scatter = inside RS (B) + across RS (B/k) = 0.020013
  expect_seconds(collective_time(c, CollectiveKind::ReduceScatter, all, kGB, hier), 0.020013);
  // broadcast = across (m = 2): 1e9/1e10 + 1e-5 = 0.10001, inside (k = 4): 0.01 + 3e-6 = 0.010003
  //           = 0.110013
  expect_seconds(collective_time(c, CollectiveKind::Broadcast, all, kGB, hier), 0.110013);
  // all-to-all has no hierarchical form: the ring price, reported as Ring.
  e = estimate_collective(c, CollectiveKind::AllToAll, all, kGB, hier);
  EXPECT_EQ(e.algorithm, Algorithm::Ring);
  expect_seconds(e.seconds, 0.08757);
}

TEST(CollectiveCostTest, AutoPicksTheFaster) {
  const Cluster c = testing::two_level_cluster(2, 4);
  const auto all = iota(8);
  // all-reduce: hierarchical 0.040026 < ring 0.17514
  EXPECT_EQ(
      estimate_collective(c, CollectiveKind::AllReduce, all, kGB),
      (CollectiveEstimate{estimate_collective(c, CollectiveKind::AllReduce, all, kGB, Algorithm::Hierarchical).seconds,
                          Algorithm::Hierarchical}));
  // broadcast: ring 0.10007 < hierarchical 0.110013
  CollectiveEstimate e = estimate_collective(c, CollectiveKind::Broadcast, all, kGB);
  EXPECT_EQ(e.algorithm, Algorithm::Ring);
  expect_seconds(e.seconds, 0.10007);
  // A latency-bound all-reduce of 1000 bytes:
  //   ring: 2*7/8 * 1000/1e10 + 14e-5 = 1.75e-7 + 1.4e-4 = 1.40175e-4
  //   hier: 2 * (3/4 * 1000/1e11 + 3e-6) + (250/1e10 + 2e-5) = 2 * 3.0075e-6 + 2.0025e-5 = 2.604e-5
  e = estimate_collective(c, CollectiveKind::AllReduce, all, 1000);
  EXPECT_EQ(e.algorithm, Algorithm::Hierarchical);
  expect_seconds(e.seconds, 2.604e-5);
  expect_seconds(collective_time(c, CollectiveKind::AllReduce, all, 1000, Algorithm::Ring), 1.40175e-4);
}

TEST(CollectiveCostTest, HierarchicalNeedsSeveralRanksOnEachOfSeveralNodes) {
  const Cluster c = testing::two_level_cluster(2, 4);
  // One rank per node: k = 1. Ring over net: 2*1/2 * 0.1 + 2 * 1e-5 = 0.10002
  const std::vector<int> column = {1, 5};
  CollectiveEstimate e = estimate_collective(c, CollectiveKind::AllReduce, column, kGB, Algorithm::Hierarchical);
  EXPECT_EQ(e.algorithm, Algorithm::Ring);
  expect_seconds(e.seconds, 0.10002);
  // Uneven (2 + 1): ring of 3 over net: 2*2/3 * 0.1 + 4e-5
  const std::vector<int> uneven = {0, 1, 4};
  e = estimate_collective(c, CollectiveKind::AllReduce, uneven, kGB);
  EXPECT_EQ(e.algorithm, Algorithm::Ring);
  expect_seconds(e.seconds, 0.4 / 3 + 4e-5);
}

TEST(CollectiveCostTest, GroupOrderDoesNotMatter) {
  const Cluster c = testing::two_level_cluster(2, 4);
  const std::vector<int> shuffled = {6, 0, 3, 5, 1, 7, 2, 4};
  expect_seconds(collective_time(c, CollectiveKind::AllReduce, shuffled, kGB), 0.040026);
}

// ---- 3 levels and heterogeneous links ------------------------------------------------------

TEST(CollectiveCostTest, HierarchicalInsideUsesEachNodesInnermostLevel) {
  // 2 nodes x 4; "pair" (span 2) 200 GB/s 0.5 us, "node" 100 GB/s 1 us, "net" 10 GB/s 10 us.
  const Cluster c("three", {testing::test_device("dev")}, {Node::uniform("dev", 4), Node::uniform("dev", 4)},
                  {LinkLevel{"pair", 2, 2e11, 5e-7, {}}, LinkLevel{"node", 0, 1e11, 1e-6, {}},
                   LinkLevel{"net", 0, 1e10, 1e-5, {}}});
  const std::vector<int> pairs = {0, 1, 4, 5};  // m = 2, k = 2; {0,1} and {4,5} are pairs
  // inside RS/AG (k = 2, pair): 1/2 * 1e9/2e11 + 5e-7 = 0.0025005
  // across AR on B/2 = 5e8:     2*1/2 * 5e8/1e10 + 2e-5 = 0.05002
  // total = 2 * 0.0025005 + 0.05002 = 0.055021
  expect_seconds(collective_time(c, CollectiveKind::AllReduce, pairs, kGB, Algorithm::Hierarchical), 0.055021);
  // {1, 2} straddles two pairs: the "node" level. 2*1/2 * 1e9/1e11 + 2e-6 = 0.010002
  const std::vector<int> straddle = {1, 2};
  expect_seconds(collective_time(c, CollectiveKind::AllReduce, straddle, kGB), 0.010002);
}

TEST(CollectiveCostTest, TheSlowestDeviceSetsThePace) {
  // One node: 2 "fast" then 2 "slow"; bus 1 GB/s 1 us, slow's override 0.5 GB/s 2 us.
  LinkLevel bus{"bus", 0, 1e9, 1e-6, {{"slow", LinkSpeed{5e8, 2e-6}}}};
  const Cluster c("hetero", {testing::test_device("fast"), testing::test_device("slow")},
                  {Node{{{"fast", 2}, {"slow", 2}}}}, {bus});
  // All four: 2*3/4 * 1e9/5e8 + 6 * 2e-6 = 3 + 0.000012
  expect_seconds(collective_time(c, CollectiveKind::AllReduce, iota(4), kGB), 3.000012);
  // The two fast ones: 2*1/2 * 1 + 2 * 1e-6 = 1.000002
  const std::vector<int> fast = {0, 1};
  expect_seconds(collective_time(c, CollectiveKind::AllReduce, fast, kGB), 1.000002);
}

// ---- the worked example of the header: two DGX A100 nodes -----------------------------------

TEST(CollectiveCostTest, DgxA100WorkedExample) {
  const Cluster c = preset("dgx-a100", 2);
  const double b = 1 << 30;
  // ring on NVSwitch: 2*7/8 * 2^30 / 3e11 + 14 * 3e-6
  expect_seconds(collective_time(c, CollectiveKind::AllReduce, iota(8), 1 << 30), 1.75 * b / 3e11 + 14 * 3e-6);
  // ring on IB: 2*15/16 * 2^30 / 2.5e10 + 30 * 7e-6
  expect_seconds(collective_time(c, CollectiveKind::AllReduce, iota(16), 1 << 30, Algorithm::Ring),
                 1.875 * b / 2.5e10 + 30 * 7e-6);
  // hierarchical: 2 * (7/8 * 2^30 / 3e11 + 7 * 3e-6) + (2*1/2 * 2^27 / 2.5e10 + 2 * 7e-6)
  const double hierarchical = 2 * (0.875 * b / 3e11 + 7 * 3e-6) + (b / 8 / 2.5e10 + 2 * 7e-6);
  const CollectiveEstimate e = estimate_collective(c, CollectiveKind::AllReduce, iota(16), 1 << 30);
  EXPECT_EQ(e.algorithm, Algorithm::Hierarchical);
  expect_seconds(e.seconds, hierarchical);
  EXPECT_NEAR(e.seconds, 11.69e-3, 0.005e-3);
}

// ---- trivial and bad calls --------------------------------------------------------------

TEST(CollectiveCostTest, NothingToDoCostsNothing) {
  const Cluster c = testing::two_level_cluster(2, 4);
  const std::vector<int> one = {5};
  for (auto k : {CollectiveKind::AllReduce, CollectiveKind::AllGather, CollectiveKind::ReduceScatter,
                 CollectiveKind::AllToAll, CollectiveKind::Broadcast, CollectiveKind::SendRecv}) {
    EXPECT_EQ(collective_time(c, k, one, kGB), 0.0);
    EXPECT_EQ(collective_time(c, k, iota(2), 0), 0.0);
  }
}

TEST(CollectiveCostTest, RejectsBadCalls) {
  const Cluster c = testing::two_level_cluster(2, 4);
  EXPECT_EQ(error_of<support::ValidationError>([&] { collective_time(c, CollectiveKind::AllReduce, iota(2), -1); }),
            "bytes: must be >= 0, got -1");
  EXPECT_EQ(error_of<support::ValidationError>([&] { collective_time(c, CollectiveKind::SendRecv, iota(3), 8); }),
            "send_recv: takes 2 ranks (source, destination), got 3");
  EXPECT_EQ(error_of<support::ValidationError>([&] { collective_time(c, CollectiveKind::AllGather, {}, 8); }),
            "ranks: a group needs at least one rank");
  const std::vector<int> outside = {0, 8};
  EXPECT_THROW(collective_time(c, CollectiveKind::AllGather, outside, 0), support::ValidationError);
}

// ---- the interface --------------------------------------------------------------------------

// A stand-in for a profiled model: proves callers can hold any CollectiveCostModel.
class ConstantCost final : public CollectiveCostModel {
 private:
  CollectiveEstimate do_estimate(CollectiveKind, std::span<const int>, std::int64_t, Algorithm) const override {
    return {42.0, Algorithm::Ring};
  }
};

double price_through(const CollectiveCostModel& model, std::span<const int> ranks) {
  return model.time(CollectiveKind::AllReduce, ranks, kGB);
}

TEST(CollectiveCostTest, ModelsAreInterchangeableBehindTheInterface) {
  const Cluster c = testing::flat_cluster(4);
  const AlphaBetaCollectiveCost alpha_beta(c);
  EXPECT_EQ(&alpha_beta.cluster(), &c);
  expect_seconds(price_through(alpha_beta, iota(4)), 1.500006);
  EXPECT_EQ(alpha_beta.estimate(CollectiveKind::AllReduce, iota(4), kGB),
            estimate_collective(c, CollectiveKind::AllReduce, iota(4), kGB));
  EXPECT_EQ(price_through(ConstantCost(), iota(4)), 42.0);
}

}  // namespace
}  // namespace shardwise::cost
