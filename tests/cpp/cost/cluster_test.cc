#include "cost/cluster.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cost/cluster_presets.h"
#include "cost/constants.h"
#include "support/error.h"
#include "test_clusters.h"

namespace shardwise::cost {
namespace {

using nlohmann::json;
using testing::error_of;
using testing::test_device;

// Node 0 mixes two device types (runs of 2 "a" then 1 "b"), node 1 holds 4 "a":
//   rank:   0 1 2 | 3 4 5 6
//   node:   0 0 0 | 1 1 1 1
//   device: a a b | a a a a
// Three levels: "pair" (groups of 2 inside a node), "node", "net"; "b" is slower on each.
Cluster rich_cluster() {
  LinkLevel pair{"pair", 2, 2e11, 5e-7, {{"b", LinkSpeed{5e10, 1e-6}}}};
  LinkLevel node{"node", 0, 1e11, 1e-6, {}};
  LinkLevel net{"net", 0, 1e10, 1e-5, {{"b", LinkSpeed{5e9, 2e-5}}}};
  return Cluster("rich", {test_device("a"), test_device("b")}, {Node{{{"a", 2}, {"b", 1}}}, Node::uniform("a", 4)},
                 {pair, node, net});
}

// ---- small value types ---------------------------------------------------------

TEST(ClusterTest, PrecisionNamesRoundTrip) {
  for (Precision p : kAllPrecisions) EXPECT_EQ(parse_precision(precision_name(p)), p);
  EXPECT_EQ(precision_name(Precision::TF32), "tf32");
  EXPECT_EQ(parse_precision("fp32"), std::nullopt);
  const PeakFlops f{1, 2, 3, 4};
  EXPECT_EQ(f.at(Precision::F32), 1);
  EXPECT_EQ(f.at(Precision::TF32), 2);
  EXPECT_EQ(f.at(Precision::BF16), 3);
  EXPECT_EQ(f.at(Precision::F16), 4);
}

// FP8 is optional: a device without FP8 units lists no "fp8" peak (read as 0, not written),
// and a plan in fp8 on it is refused naming the device, never priced at another rate.
TEST(ClusterTest, Fp8IsAnOptionalPeakThatAPlanInFp8Requires) {
  EXPECT_EQ(parse_precision("fp8"), Precision::FP8);
  EXPECT_EQ(precision_name(Precision::FP8), "fp8");
  const PeakFlops f{1, 2, 3, 4, 5};
  EXPECT_EQ(f.at(Precision::FP8), 5);
  const json without = json::parse(R"({"device_types": [{"name": "a100", "peak_flops": {"f32": 1e10, "tf32": 1e10,
      "bf16": 4e10, "f16": 4e10}, "memory_bytes": 1e9, "memory_bandwidth": 1e10},
      {"name": "h100", "peak_flops": {"f32": 1e10, "tf32": 1e10, "bf16": 4e10, "f16": 4e10, "fp8": 8e10},
       "memory_bytes": 1e9, "memory_bandwidth": 1e10}],
      "nodes": [{"device": "h100", "count": 2}, {"device": "a100", "count": 2}],
      "links": [{"name": "net", "bandwidth": 1e9, "latency": 1e-4}]})");
  const Cluster mixed = cluster_from_json(without);
  EXPECT_EQ(mixed.device_of(0).peak_flops.fp8, 8e10);
  EXPECT_EQ(mixed.device_of(2).peak_flops.fp8, 0.0);
  const json written = cluster_to_json(mixed);
  EXPECT_FALSE(written["device_types"][0]["peak_flops"].contains("fp8"));
  EXPECT_EQ(written["device_types"][1]["peak_flops"]["fp8"], 8e10);
  EXPECT_EQ(cluster_from_json(written), mixed);
  mixed.require_precision(Precision::BF16, "test");  // every device has bf16
  const std::string refused =
      error_of<support::ValidationError>([&] { mixed.require_precision(Precision::FP8, "spmd search"); });
  EXPECT_NE(refused.find("spmd search: precision 'fp8' needs FP8 matrix units"), std::string::npos) << refused;
  EXPECT_NE(refused.find("'a100'"), std::string::npos) << refused;
  EXPECT_NO_THROW(rank_range(mixed, 0, 2).require_precision(Precision::FP8, "test"));  // the H100s alone
  json negative = without;
  negative["device_types"][1]["peak_flops"]["fp8"] = -1;
  const std::string bad = error_of<support::ValidationError>([&] { cluster_from_json(negative); });
  EXPECT_NE(bad.find("device_types[1].peak_flops.fp8"), std::string::npos) << bad;
}

TEST(ClusterTest, LinkSpeedForADeviceUsesItsOverride) {
  const LinkLevel net{"net", 0, 1e10, 1e-5, {{"b", LinkSpeed{5e9, 2e-5}}}};
  EXPECT_EQ(net.speed_for("a"), (LinkSpeed{1e10, 1e-5}));
  EXPECT_EQ(net.speed_for("b"), (LinkSpeed{5e9, 2e-5}));
}

// ---- rank queries --------------------------------------------------------------

TEST(ClusterTest, RanksAreNumberedNodeMajorRunByRun) {
  const Cluster c = rich_cluster();
  EXPECT_EQ(c.world_size(), 7);
  EXPECT_EQ(c.num_nodes(), 2);
  EXPECT_TRUE(c.heterogeneous());
  const std::vector<int> nodes = {0, 0, 0, 1, 1, 1, 1};
  const std::vector<int> locals = {0, 1, 2, 0, 1, 2, 3};
  const std::vector<std::string> devices = {"a", "a", "b", "a", "a", "a", "a"};
  for (int r = 0; r < 7; ++r) {
    EXPECT_EQ(c.node_of(r), nodes[static_cast<std::size_t>(r)]) << r;
    EXPECT_EQ(c.local_rank(r), locals[static_cast<std::size_t>(r)]) << r;
    EXPECT_EQ(c.device_of(r).name, devices[static_cast<std::size_t>(r)]) << r;
  }
  EXPECT_EQ(c.first_rank(0), 0);
  EXPECT_EQ(c.first_rank(1), 3);
  ASSERT_NE(c.find_device_type("b"), nullptr);
  EXPECT_EQ(c.find_device_type("b")->name, "b");
  EXPECT_EQ(c.find_device_type("c"), nullptr);
}

// A pipeline stage's sub-mesh: the first ranks, run by run, node by node, on the same links.
TEST(ClusterTest, FirstRanksKeepWholeNodesThenPartOfTheNext) {
  const Cluster c = rich_cluster();
  const Cluster two = first_ranks(c, 2);
  EXPECT_EQ(two.world_size(), 2);
  EXPECT_EQ(two.num_nodes(), 1);
  EXPECT_FALSE(two.heterogeneous());
  ASSERT_EQ(two.device_types().size(), 1u);  // only the types its ranks use
  EXPECT_EQ(two.device_types().front().name, "a");
  EXPECT_EQ(two.links()[1], c.links()[1]);  // "b"'s own link speeds go with "b"
  EXPECT_TRUE(two.links()[0].per_device.empty());
  const Cluster five = first_ranks(c, 5);
  EXPECT_EQ(five.num_nodes(), 2);
  for (int r = 0; r < 5; ++r) {
    EXPECT_EQ(five.device_of(r).name, c.device_of(r).name) << r;
    EXPECT_EQ(five.node_of(r), c.node_of(r)) << r;
  }
  EXPECT_EQ(first_ranks(c, 7), c);
  EXPECT_NE(error_of<support::ValidationError>([&] { first_ranks(c, 0); }).find("0 ranks of a cluster of 7"),
            std::string::npos);
  EXPECT_THROW(first_ranks(c, 8), support::ValidationError);
}

TEST(ClusterTest, UniformNodesPutRankROnNodeRDividedByD) {
  const Cluster c = testing::two_level_cluster(3, 4);
  EXPECT_EQ(c.world_size(), 12);
  EXPECT_FALSE(c.heterogeneous());
  for (int r = 0; r < 12; ++r) {
    EXPECT_EQ(c.node_of(r), r / 4);
    EXPECT_EQ(c.local_rank(r), r % 4);
  }
}

TEST(ClusterTest, RankQueriesRejectOutOfRange) {
  const Cluster c = testing::flat_cluster(4);
  EXPECT_EQ(error_of<support::ValidationError>([&] { c.node_of(4); }),
            "rank 4 is out of range for a cluster of 4 ranks");
  EXPECT_THROW(c.device_of(-1), support::ValidationError);
  EXPECT_THROW(c.local_rank(7), support::ValidationError);
  EXPECT_EQ(error_of<support::ValidationError>([&] { c.first_rank(1); }),
            "node 1 is out of range for a cluster of 1 nodes");
}

// ---- spans ---------------------------------------------------------------------------

TEST(ClusterTest, SpanOnAOneLevelHierarchyIsAlwaysLevelZero) {
  const Cluster c = testing::flat_cluster(4);
  const std::vector<int> one = {2};
  const std::vector<int> all = {3, 0, 2, 1};
  EXPECT_EQ(c.span_of(one), (GroupSpan{0, 1, 1, true}));
  EXPECT_EQ(c.span_of(all), (GroupSpan{0, 1, 4, true}));
}

TEST(ClusterTest, SpanOnATwoLevelHierarchy) {
  const Cluster c = testing::two_level_cluster(3, 4);  // nodes {0-3}, {4-7}, {8-11}
  const std::vector<int> inside = {1, 3};
  const std::vector<int> column = {8, 0, 4};  // one rank per node
  const std::vector<int> two_nodes = {0, 1, 4, 5};
  const std::vector<int> uneven = {0, 1, 2, 5};  // 3 on node 0, 1 on node 1
  const std::vector<int> everything = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  EXPECT_EQ(c.span_of(inside), (GroupSpan{0, 1, 2, true}));
  EXPECT_EQ(c.span_of(column), (GroupSpan{1, 3, 1, true}));
  EXPECT_EQ(c.span_of(two_nodes), (GroupSpan{1, 2, 2, true}));
  EXPECT_EQ(c.span_of(uneven), (GroupSpan{1, 2, 3, false}));
  EXPECT_EQ(c.span_of(everything), (GroupSpan{1, 3, 4, true}));
}

TEST(ClusterTest, SpanOnAThreeLevelHierarchyFollowsTheGroups) {
  const Cluster c = rich_cluster();  // pairs: {0,1}, {2} on node 0; {3,4}, {5,6} on node 1
  const std::vector<int> pair = {1, 0};
  const std::vector<int> across_pairs = {0, 2};
  const std::vector<int> neighbours_in_two_pairs = {4, 5};
  const std::vector<int> across_nodes = {1, 3};
  EXPECT_EQ(c.span_of(pair).level, 0);
  EXPECT_EQ(c.span_of(across_pairs).level, 1);
  EXPECT_EQ(c.span_of(neighbours_in_two_pairs).level, 1);
  EXPECT_EQ(c.span_of(across_nodes).level, 2);
}

TEST(ClusterTest, SpanRejectsBadGroups) {
  const Cluster c = testing::flat_cluster(4);
  EXPECT_EQ(error_of<support::ValidationError>([&] { c.span_of({}); }), "ranks: a group needs at least one rank");
  const std::vector<int> twice = {1, 2, 1};
  EXPECT_EQ(error_of<support::ValidationError>([&] { c.span_of(twice); }), "ranks: rank 1 appears more than once");
  const std::vector<int> outside = {0, 9};
  EXPECT_EQ(error_of<support::ValidationError>([&] { c.span_of(outside); }),
            "rank 9 is out of range for a cluster of 4 ranks");
}

TEST(ClusterTest, LinkSpeedIsTheSlowestMember) {
  const Cluster c = rich_cluster();
  const std::vector<int> fast_only = {0, 3};
  const std::vector<int> with_b = {2, 3};
  EXPECT_EQ(c.link_speed(2, fast_only), (LinkSpeed{1e10, 1e-5}));
  EXPECT_EQ(c.link_speed(2, with_b), (LinkSpeed{5e9, 2e-5}));   // b's override
  EXPECT_EQ(c.link_speed(1, with_b), (LinkSpeed{1e11, 1e-6}));  // no override at "node"
  EXPECT_THROW(c.link_speed(3, with_b), support::ValidationError);
  EXPECT_THROW(c.link_speed(0, {}), support::ValidationError);
}

// ---- validation ----------------------------------------------------------------------

std::vector<LinkLevel> two_links() {
  return {LinkLevel{"fast", 0, 1e11, 1e-6, {}}, LinkLevel{"net", 0, 1e10, 1e-5, {}}};
}

std::string construct_error(std::vector<DeviceType> types, std::vector<Node> nodes, std::vector<LinkLevel> links) {
  return error_of<support::ValidationError>([&] { Cluster("bad", types, nodes, links); });
}

TEST(ClusterTest, RejectsImpossibleDeviceTypes) {
  const std::vector<Node> nodes = {Node::uniform("dev", 2)};
  DeviceType t = test_device("dev");
  t.peak_flops.tf32 = 0;
  EXPECT_EQ(construct_error({t}, nodes, two_links()),
            "device_types[0].peak_flops.tf32: peak FLOP/s must be positive and finite, got 0");
  t = test_device("dev");
  t.peak_flops.f16 = -1;
  EXPECT_EQ(construct_error({t}, nodes, two_links()),
            "device_types[0].peak_flops.f16: peak FLOP/s must be positive and finite, got -1");
  t = test_device("dev");
  t.memory_bytes = 0;
  EXPECT_EQ(construct_error({t}, nodes, two_links()),
            "device_types[0].memory_bytes: memory must be positive bytes, got 0");
  t = test_device("dev");
  t.memory_bandwidth = -5;
  EXPECT_EQ(construct_error({t}, nodes, two_links()),
            "device_types[0].memory_bandwidth: memory bandwidth must be positive and finite bytes/s, got -5");
  EXPECT_EQ(construct_error({test_device("dev"), test_device("dev")}, nodes, two_links()),
            "device_types[1].name: duplicate device type 'dev' (also device_types[0])");
  EXPECT_EQ(construct_error({test_device("")}, nodes, two_links()), "device_types[0].name: a device type needs a name");
  EXPECT_EQ(construct_error({}, nodes, two_links()), "device_types: a cluster needs at least one device type");
}

TEST(ClusterTest, RejectsImpossibleNodes) {
  const std::vector<DeviceType> types = {test_device("A100"), test_device("V100")};
  EXPECT_EQ(construct_error(types, {Node::uniform("A100", 8), Node::uniform("V100", 8), Node::uniform("A200", 8)},
                            two_links()),
            "nodes[2].device: unknown device type 'A200' (known: A100, V100)");
  EXPECT_EQ(construct_error(types, {Node::uniform("A100", 0)}, two_links()),
            "nodes[0].count: device count must be at least 1, got 0");
  EXPECT_EQ(construct_error(types, {Node{{{"A100", 4}, {"V100", -1}}}}, two_links()),
            "nodes[0].devices[1].count: device count must be at least 1, got -1");
  EXPECT_EQ(construct_error(types, {Node{}}, two_links()), "nodes[0].devices: a node needs at least one device");
  EXPECT_EQ(construct_error(types, {}, two_links()), "nodes: a cluster needs at least one node");
  // Checked before the rank tables grow: a typo'd count fails at once.
  EXPECT_EQ(construct_error(types, {Node::uniform("A100", 8), Node::uniform("A100", 1'000'000'000)}, two_links()),
            "nodes[1].count: the cluster would exceed 16777216 ranks");
}

TEST(ClusterTest, RejectsImpossibleLinks) {
  const std::vector<DeviceType> types = {test_device("dev")};
  const std::vector<Node> nodes = {Node::uniform("dev", 4), Node::uniform("dev", 4)};
  auto links = two_links();
  links[1].bandwidth = 0;
  EXPECT_EQ(construct_error(types, nodes, links),
            "links[1].bandwidth: bandwidth must be positive and finite bytes/s, got 0");
  links = two_links();
  links[0].latency = -1e-6;
  EXPECT_EQ(construct_error(types, nodes, links), "links[0].latency: latency must be finite seconds >= 0, got -1e-06");
  links = two_links();
  links[0].per_device.emplace("gpu", LinkSpeed{1e9, 0});
  EXPECT_EQ(construct_error(types, nodes, links), "links[0].per_device.gpu: unknown device type 'gpu' (known: dev)");
  links = two_links();
  links[0].per_device.emplace("dev", LinkSpeed{-2, 0});
  EXPECT_EQ(construct_error(types, nodes, links),
            "links[0].per_device.dev.bandwidth: bandwidth must be positive and finite bytes/s, got -2");
  links = two_links();
  links[0].name = "";
  EXPECT_EQ(construct_error(types, nodes, links), "links[0].name: a link level needs a name");
  EXPECT_EQ(construct_error(types, nodes, {}), "links: a cluster needs at least one link level");
}

TEST(ClusterTest, RejectsSpansThatDoNotNest) {
  const std::vector<DeviceType> types = {test_device("dev")};
  const std::vector<Node> nodes = {Node::uniform("dev", 8)};
  const LinkLevel node{"node", 0, 1e11, 1e-6, {}};
  const LinkLevel net{"net", 0, 1e10, 1e-5, {}};
  EXPECT_EQ(construct_error(types, nodes, {node, LinkLevel{"net", 2, 1e10, 1e-5, {}}}),
            "links[1].span: the outermost level connects nodes and takes no span (0 or absent), got 2");
  EXPECT_EQ(construct_error(types, nodes, {LinkLevel{"node", 4, 1e11, 1e-6, {}}, net}),
            "links[0].span: the last level inside a node must cover the whole node (span 0 or absent), got 4");
  EXPECT_EQ(construct_error(types, nodes, {LinkLevel{"pair", 0, 1e11, 1e-6, {}}, node, net}),
            "links[0].span: an inner level below the whole-node level needs a span of at least 1, got 0");
  EXPECT_EQ(construct_error(types, nodes,
                            {LinkLevel{"pair", 2, 1e11, 1e-6, {}}, LinkLevel{"triple", 3, 1e11, 1e-6, {}}, node, net}),
            "links[1].span: spans must nest: 3 is not a larger multiple of links[0].span = 2");
  // Nesting spans are fine.
  EXPECT_NO_THROW(Cluster("ok", types, nodes,
                          {LinkLevel{"pair", 2, 1e11, 1e-6, {}}, LinkLevel{"quad", 4, 1e11, 1e-6, {}}, node, net}));
}

// ---- JSON ----------------------------------------------------------------------------

TEST(ClusterJsonTest, RoundTripIsExact) {
  const Cluster c = rich_cluster();
  EXPECT_EQ(cluster_from_json(cluster_to_json(c)), c);
  EXPECT_EQ(cluster_from_json_string(cluster_to_json_string(c)), c);
  EXPECT_EQ(cluster_from_json_string(cluster_to_json_string(c, 2)), c);
  // Writing what was read gives the same text.
  EXPECT_EQ(cluster_to_json_string(cluster_from_json_string(cluster_to_json_string(c))), cluster_to_json_string(c));
  // Awkward doubles survive.
  Cluster odd("odd", {DeviceType{"d", PeakFlops{0.1, 1.0 / 3, 1e-300, 1.7976931348623157e308}, 1, 2.5e-7}},
              {Node::uniform("d", 1)}, {LinkLevel{"l", 0, 0.30000000000000004, 0, {}}});
  EXPECT_EQ(cluster_from_json_string(cluster_to_json_string(odd)), odd);
}

TEST(ClusterJsonTest, CallOverheadRoundTripsAndIsAtLeastZero) {
  const json doc = json::parse(R"({"device_types": [{"name": "cpu", "peak_flops": {"f32": 1e10, "tf32": 1e10,
      "bf16": 4e10, "f16": 4e10}, "memory_bytes": 1e9, "memory_bandwidth": 1e10}],
      "nodes": [{"device": "cpu", "count": 4}],
      "links": [{"name": "loopback", "bandwidth": 1e9, "latency": 1e-4, "call_overhead": 2e-4}]})");
  const Cluster c = cluster_from_json(doc);
  EXPECT_EQ(c.links()[0].call_overhead, 2e-4);
  EXPECT_EQ(cluster_from_json(cluster_to_json(c)), c);
  EXPECT_NE(c.summary().find("+ 200 us per call"), std::string::npos) << c.summary();
  json none = doc;
  none["links"][0].erase("call_overhead");
  EXPECT_EQ(cluster_from_json(none).links()[0].call_overhead, 0.0);           // the default
  EXPECT_FALSE(cluster_to_json(cluster_from_json(none))["links"][0].contains("call_overhead"));  // 0 is not written
  EXPECT_EQ(cost::preset("cpu", 2).links()[0].call_overhead, 2e-4);
  EXPECT_EQ(cost::preset("dgx-h100", 1).links()[0].call_overhead, 0.0);
  json negative = doc;
  negative["links"][0]["call_overhead"] = -1e-6;
  try {
    cluster_from_json(negative);
    FAIL() << "call_overhead -1e-6 accepted";
  } catch (const support::ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find("links[0].call_overhead"), std::string::npos) << e.what();
  }
}

TEST(ClusterJsonTest, ComputeAloneRoundTripsAndIsAtLeastOne) {
  const json shared = json::parse(R"({"device_types": [{"name": "cpu", "peak_flops": {"f32": 1e10, "tf32": 1e10,
      "bf16": 4e10, "f16": 4e10}, "memory_bytes": 1e9, "memory_bandwidth": 1e10}],
      "nodes": [{"device": "cpu", "count": 4, "compute_alone": 2}, {"devices": [{"device": "cpu", "count": 2}]}],
      "links": [{"name": "loopback", "bandwidth": 1e9, "latency": 1e-4}]})");
  const Cluster c = cluster_from_json(shared);
  EXPECT_EQ(c.nodes()[0].compute_alone, 2.0);
  EXPECT_EQ(c.nodes()[1].compute_alone, 1.0);  // the default
  EXPECT_EQ(cluster_from_json(cluster_to_json(c)), c);
  EXPECT_EQ(cluster_to_json(c)["nodes"][0]["compute_alone"], 2.0);
  EXPECT_FALSE(cluster_to_json(c)["nodes"][1].contains("compute_alone"));  // 1 is not written
  // A stage's sub-mesh keeps its ranks' sharing.
  EXPECT_EQ(rank_range(c, 1, 2).nodes()[0].compute_alone, 2.0);
  json slower = shared;
  slower["nodes"][0]["compute_alone"] = 0.5;
  try {
    cluster_from_json(slower);
    FAIL() << "compute_alone 0.5 accepted";
  } catch (const support::ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find("nodes[0].compute_alone"), std::string::npos) << e.what();
  }
}

TEST(ClusterJsonTest, OverlapInterferenceRoundTripsIsAtLeastZeroAndTheLargestNodesCounts) {
  const json shared = json::parse(R"({"device_types": [{"name": "cpu", "peak_flops": {"f32": 1e10, "tf32": 1e10,
      "bf16": 4e10, "f16": 4e10}, "memory_bytes": 1e9, "memory_bandwidth": 1e10}],
      "nodes": [{"device": "cpu", "count": 2, "overlap_interference": 1.5}, {"devices": [{"device": "cpu", "count": 2}]}],
      "links": [{"name": "loopback", "bandwidth": 1e9, "latency": 1e-4}]})");
  const Cluster c = cluster_from_json(shared);
  EXPECT_EQ(c.nodes()[0].overlap_interference, 1.5);
  EXPECT_FALSE(c.nodes()[1].overlap_interference.has_value());
  EXPECT_EQ(cluster_from_json(cluster_to_json(c)), c);
  EXPECT_FALSE(cluster_to_json(c)["nodes"][1].contains("overlap_interference"));  // unset is not written
  EXPECT_EQ(overlap_interference(c), 1.5);
  EXPECT_EQ(overlap_interference(rank_range(c, 2, 2)), kOverlapInterference);  // the second node alone: the constant
  EXPECT_EQ(overlap_interference(rank_range(c, 0, 1)), 1.5);
  json hidden = shared;
  hidden["nodes"][0]["overlap_interference"] = 0.0;  // hidden for free is a valid measurement
  EXPECT_EQ(overlap_interference(cluster_from_json(hidden)), kOverlapInterference);
  json negative = shared;
  negative["nodes"][0]["overlap_interference"] = -0.5;
  try {
    cluster_from_json(negative);
    FAIL() << "overlap_interference -0.5 accepted";
  } catch (const support::ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find("nodes[0].overlap_interference"), std::string::npos) << e.what();
  }
}

TEST(ClusterJsonTest, WritesTheSchema) {
  LinkLevel net{"net", 0, 1e10, 1e-5, {{"b", LinkSpeed{5e9, 2e-5}}}};
  const Cluster c("small", {test_device("a"), test_device("b")}, {Node::uniform("a", 2), Node{{{"a", 1}, {"b", 1}}}},
                  {LinkLevel{"pair", 0, 1e11, 1e-6, {}}, net});
  const json expected = json::parse(R"({
    "format": "shardwise.cluster", "version": 1, "name": "small",
    "device_types": [
      {"name": "a", "peak_flops": {"f32": 1e12, "tf32": 2e12, "bf16": 4e12, "f16": 4e12},
       "memory_bytes": 17179869184, "memory_bandwidth": 1e12},
      {"name": "b", "peak_flops": {"f32": 1e12, "tf32": 2e12, "bf16": 4e12, "f16": 4e12},
       "memory_bytes": 17179869184, "memory_bandwidth": 1e12}],
    "nodes": [{"device": "a", "count": 2},
              {"devices": [{"device": "a", "count": 1}, {"device": "b", "count": 1}]}],
    "links": [{"name": "pair", "bandwidth": 1e11, "latency": 1e-6},
              {"name": "net", "bandwidth": 1e10, "latency": 1e-5,
               "per_device": {"b": {"bandwidth": 5e9, "latency": 2e-5}}}]})");
  EXPECT_EQ(cluster_to_json(c), expected) << cluster_to_json(c).dump(2);
}

// A minimal hand-written file: no format/version/name, integers where doubles go, an
// integral float for memory_bytes, span given.
constexpr const char* kHandWritten = R"({
  "device_types": [{"name": "gpu", "peak_flops": {"f32": 10, "tf32": 20, "bf16": 40, "f16": 40},
                    "memory_bytes": 80e9, "memory_bandwidth": 2000000000000}],
  "nodes": [{"device": "gpu", "count": 4}, {"device": "gpu", "count": 4}],
  "links": [{"name": "pair", "span": 2, "bandwidth": 100, "latency": 0},
            {"name": "node", "bandwidth": 50, "latency": 1e-6},
            {"name": "net", "bandwidth": 10, "latency": 1e-5}]})";

TEST(ClusterJsonTest, ReadsAHandWrittenFile) {
  const Cluster c = cluster_from_json_string(kHandWritten);
  EXPECT_EQ(c.name(), "");
  EXPECT_EQ(c.world_size(), 8);
  EXPECT_EQ(c.device_of(7).memory_bytes, 80'000'000'000);
  EXPECT_EQ(c.device_of(0).peak_flops.bf16, 40.0);
  EXPECT_EQ(c.links()[0].span, 2);
  EXPECT_EQ(cluster_from_json(cluster_to_json(c)), c);
}

// A mixed fleet: three whole DGX A100 nodes and one with a throttled GPU, declared as the
// A100's profile at 0.5 (the catalogue's type, not listed in the file) and a V100 at 0.8 of
// the V100 declared before it.
TEST(ClusterJsonTest, ReadsNodeKindsWithCountsAndDegradedDevices) {
  const json j = json::parse(R"({
    "device_types": [{"name": "a100-sxm4-80gb", "like": "a100-sxm4-80gb"},
                     {"name": "a100-half", "like": "a100-sxm4-80gb", "speed": 0.5},
                     {"name": "v100", "peak_flops": {"f32": 1.4e13, "tf32": 1.4e13, "bf16": 1.4e13, "f16": 1.12e14},
                      "memory_bytes": 34359738368, "memory_bandwidth": 9e11},
                     {"name": "v100-slow", "like": "v100", "speed": 0.8, "memory_bytes": 17179869184}],
    "nodes": [{"repeat": 3, "device": "a100-sxm4-80gb", "count": 8},
              {"devices": [{"device": "a100-sxm4-80gb", "count": 7}, {"device": "a100-half", "count": 1}]},
              {"repeat": 2, "devices": [{"device": "v100", "count": 3}, {"device": "v100-slow", "count": 1}]}],
    "links": [{"name": "node", "bandwidth": 3e11, "latency": 3e-6},
              {"name": "net", "bandwidth": 2.5e10, "latency": 7e-6}]})");
  const Cluster c = cluster_from_json(j);
  EXPECT_EQ(c.num_nodes(), 6);
  EXPECT_EQ(c.world_size(), 3 * 8 + 8 + 2 * 4);
  EXPECT_TRUE(c.heterogeneous());
  const DeviceType& a100 = c.device_of(0);
  const DeviceType& half = c.device_of(31);
  EXPECT_EQ(c.device_of(30).name, "a100-sxm4-80gb");
  EXPECT_EQ(half.name, "a100-half");
  EXPECT_DOUBLE_EQ(half.peak_flops.bf16, 0.5 * a100.peak_flops.bf16);
  EXPECT_DOUBLE_EQ(half.peak_flops.f32, 0.5 * a100.peak_flops.f32);
  EXPECT_DOUBLE_EQ(half.memory_bandwidth, 0.5 * a100.memory_bandwidth);
  EXPECT_EQ(half.memory_bytes, a100.memory_bytes);
  const DeviceType& slow = c.device_of(35);
  EXPECT_EQ(slow.name, "v100-slow");
  EXPECT_DOUBLE_EQ(slow.peak_flops.f16, 0.8 * 1.12e14);
  EXPECT_EQ(slow.memory_bytes, 17179869184);
  EXPECT_EQ(c.device_of(39).name, "v100-slow");
  // Written in full, read back equal.
  EXPECT_EQ(cluster_from_json(cluster_to_json(c)), c);
}

TEST(ClusterJsonTest, DegradedDevicesAndNodeKindsRefuseWhatCannotBe) {
  const json good = json::parse(R"({
    "device_types": [{"name": "slow", "like": "a100-sxm4-80gb", "speed": 0.5}],
    "nodes": [{"repeat": 2, "device": "slow", "count": 2}],
    "links": [{"name": "node", "bandwidth": 1e11, "latency": 1e-6}]})");
  EXPECT_EQ(cluster_from_json(good).world_size(), 4);
  json j = good;
  j["device_types"][0]["like"] = "a200";
  EXPECT_NE(error_of<support::ParseError>([&] { cluster_from_json(j); })
                .find("device_types[0].like: unknown device type 'a200' (known: a100-sxm4-80gb"),
            std::string::npos);
  j = good;
  j["device_types"][0]["speed"] = 0;
  EXPECT_EQ(error_of<support::ParseError>([&] { cluster_from_json(j); }), "device_types[0].speed: speed must be > 0, got 0");
  j = good;
  j["device_types"][0].erase("like");
  EXPECT_NE(error_of<support::ParseError>([&] { cluster_from_json(j); }).find("give \"like\" too"), std::string::npos);
  j = good;
  j["nodes"][0]["repeat"] = 0;
  EXPECT_EQ(error_of<support::ParseError>([&] { cluster_from_json(j); }),
            "nodes[0].repeat: a node kind repeats at least once, got 0");
  j["nodes"][0]["repeat"] = 1000000000;  // refused before a billion nodes are made
  EXPECT_NE(error_of<support::ParseError>([&] { cluster_from_json(j); }).find("nodes[0].repeat: the cluster would exceed"),
            std::string::npos);
}

void expect_parse_error(const json& j, const std::string& message) {
  EXPECT_EQ(error_of<support::ParseError>([&] { cluster_from_json(j); }), message);
}

TEST(ClusterJsonTest, StructuralErrorsNameThePath) {
  const json good = json::parse(kHandWritten);
  json j = good;
  j["nodes"][1].erase("count");
  expect_parse_error(j, "nodes[1]: missing \"count\"");
  j = good;
  j["links"][0]["bandwidth"] = "fast";
  expect_parse_error(j, "links[0].bandwidth: expected a number, found string");
  j = good;
  j["links"][1]["latancy"] = 1;
  expect_parse_error(j,
                     "links[1]: unknown key \"latancy\" (expected \"name\", \"span\", \"bandwidth\", \"latency\", "
                     "\"per_device\", \"call_overhead\")");
  j = good;
  j["device_types"][0]["peak_flops"].erase("tf32");
  expect_parse_error(j, "device_types[0].peak_flops: missing \"tf32\"");
  j = good;
  j["device_types"][0]["memory_bytes"] = 1.5;
  expect_parse_error(j, "device_types[0].memory_bytes: expected an integer, found 1.5");
  j = good;
  j.erase("links");
  expect_parse_error(j, "cluster: missing \"links\"");
  j = good;
  j["nodes"] = json::object();
  expect_parse_error(j, "nodes: expected an array, found object");
  j = good;
  j["nodes"][0]["devices"] = json::array();
  expect_parse_error(j,
                     "nodes[0]: give either \"device\" and \"count\" (one run) or \"devices\" (a list of runs), "
                     "not both");
  j = good;
  j["nodes"][0] = json{{"devices", json::array({json{{"device", "gpu"}}})}};
  expect_parse_error(j, "nodes[0].devices[0]: missing \"count\"");
  j = good;
  j["links"][1]["per_device"] = json{{"gpu", json{{"bandwidth", 1}}}};
  expect_parse_error(j, "links[1].per_device.gpu: missing \"latency\"");
  j = good;
  j["format"] = "shardwise.graph";
  expect_parse_error(j, "format: expected \"shardwise.cluster\", got \"shardwise.graph\"");
  j = good;
  j["version"] = 2;
  expect_parse_error(j, "version: unsupported version 2 (this build reads 1)");
  expect_parse_error(json::array(), "cluster: expected an object, found array");
}

TEST(ClusterJsonTest, ImpossibleValuesAreValidationErrorsNamingThePath) {
  json j = json::parse(kHandWritten);
  j["nodes"].push_back(json{{"device", "A200"}, {"count", 8}});
  EXPECT_EQ(error_of<support::ValidationError>([&] { cluster_from_json(j); }),
            "nodes[2].device: unknown device type 'A200' (known: gpu)");
  j = json::parse(kHandWritten);
  j["links"][2]["bandwidth"] = -10;
  EXPECT_EQ(error_of<support::ValidationError>([&] { cluster_from_json(j); }),
            "links[2].bandwidth: bandwidth must be positive and finite bytes/s, got -10");
  j = json::parse(kHandWritten);
  j["nodes"][0]["count"] = 0;
  EXPECT_EQ(error_of<support::ValidationError>([&] { cluster_from_json(j); }),
            "nodes[0].count: device count must be at least 1, got 0");
}

TEST(ClusterJsonTest, MalformedTextIsAParseError) {
  for (const char* text : {"", "{", "[1,", "{\"nodes\": }"}) {
    const std::string message = error_of<support::ParseError>([&] { cluster_from_json_string(text); });
    EXPECT_EQ(message.rfind("invalid cluster JSON: ", 0), 0u) << message;
  }
}

TEST(ClusterTest, SummaryNamesTheParts) {
  const std::string s = rich_cluster().summary();
  EXPECT_EQ(s,
            "rich: 7 ranks on 2 nodes: 1 x [2 a + 1 b], 1 x [4 a]; links pair (groups of 2) 200 GB/s 0.5 us "
            "(b: 50 GB/s 1 us) < node 100 GB/s 1 us < net 10 GB/s 10 us (b: 5 GB/s 20 us)");
}

}  // namespace
}  // namespace shardwise::cost
