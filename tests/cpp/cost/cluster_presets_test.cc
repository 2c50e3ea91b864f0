#include "cost/cluster_presets.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/error.h"
#include "test_clusters.h"

namespace shardwise::cost {
namespace {

using testing::error_of;

TEST(ClusterPresetsTest, ListsTheNamesSorted) {
  EXPECT_EQ(preset_names(), (std::vector<std::string>{"cpu", "dgx-a100", "dgx-h100", "mixed-a100-v100", "v100"}));
}

TEST(ClusterPresetsTest, EveryPresetBuildsAndRoundTrips) {
  for (const auto& name : preset_names()) {
    for (int nodes : {1, 2, 3, 16}) {
      const Cluster c = preset(name, nodes);
      EXPECT_GE(c.world_size(), nodes) << name;
      EXPECT_EQ(cluster_from_json_string(cluster_to_json_string(c)), c) << name << " x" << nodes;
    }
  }
}

TEST(ClusterPresetsTest, DgxA100) {
  const Cluster c = preset("dgx-a100", 2);
  EXPECT_EQ(c.name(), "dgx-a100 x2");
  EXPECT_EQ(c.world_size(), 16);
  EXPECT_EQ(c.num_nodes(), 2);
  EXPECT_EQ(c.node_of(9), 1);
  const DeviceType& a100 = c.device_of(0);
  EXPECT_EQ(a100.name, "a100-sxm4-80gb");
  EXPECT_EQ(a100.peak_flops, (PeakFlops{19.5e12, 156e12, 312e12, 312e12}));
  EXPECT_EQ(a100.memory_bytes, 80LL << 30);
  EXPECT_EQ(a100.memory_bandwidth, 2039e9);
  ASSERT_EQ(c.links().size(), 2u);
  EXPECT_EQ(c.links()[0].name, "nvswitch");
  EXPECT_EQ(c.links()[0].bandwidth, 300e9);  // 600 GB/s bidirectional
  EXPECT_EQ(c.links()[1].name, "infiniband");
  EXPECT_EQ(c.links()[1].bandwidth, 25e9);  // one HDR 200 Gb/s NIC per GPU
  EXPECT_EQ(c.links()[0].latency, 3e-6);
  EXPECT_EQ(c.links()[1].latency, 7e-6);
}

TEST(ClusterPresetsTest, DgxH100) {
  const Cluster c = preset("dgx-h100", 1);
  EXPECT_EQ(c.world_size(), 8);
  const DeviceType& h100 = c.device_of(7);
  EXPECT_EQ(h100.name, "h100-sxm5-80gb");
  EXPECT_EQ(h100.peak_flops, (PeakFlops{67e12, 494.5e12, 989.5e12, 989.5e12, 1979e12}));
  EXPECT_EQ(h100.memory_bandwidth, 3350e9);
  EXPECT_EQ(c.links()[0].bandwidth, 450e9);  // 900 GB/s bidirectional
  EXPECT_EQ(c.links()[1].bandwidth, 50e9);   // one NDR 400 Gb/s NIC per GPU
}

TEST(ClusterPresetsTest, V100) {
  const Cluster c = preset("v100", 3);
  EXPECT_EQ(c.world_size(), 24);
  const DeviceType& v100 = c.device_of(23);
  EXPECT_EQ(v100.name, "v100-sxm2-32gb");
  EXPECT_EQ(v100.peak_flops, (PeakFlops{15.7e12, 15.7e12, 15.7e12, 125e12}));  // no tf32 / bf16 tensor cores
  EXPECT_EQ(v100.memory_bytes, 32LL << 30);
  EXPECT_EQ(v100.memory_bandwidth, 900e9);
  EXPECT_EQ(c.links()[0].bandwidth, 150e9);
  EXPECT_EQ(c.links()[1].bandwidth, 6.25e9);  // 4 x EDR 100 Gb/s shared by 8 GPUs
}

TEST(ClusterPresetsTest, MixedOneNodeIsFourA100AndFourV100OnPcie) {
  const Cluster c = preset("mixed-a100-v100", 1);
  EXPECT_EQ(c.world_size(), 8);
  EXPECT_EQ(c.num_nodes(), 1);
  EXPECT_TRUE(c.heterogeneous());
  for (int r = 0; r < 8; ++r) EXPECT_EQ(c.device_of(r).name, r < 4 ? "a100-pcie-80gb" : "v100-pcie-32gb") << r;
  ASSERT_EQ(c.links().size(), 1u);
  EXPECT_EQ(c.links()[0].name, "pcie");
  const std::vector<int> a100s = {0, 1, 2, 3};
  const std::vector<int> everyone = {0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_EQ(c.link_speed(0, a100s).bandwidth, 32e9);     // PCIe Gen4 x16
  EXPECT_EQ(c.link_speed(0, everyone).bandwidth, 16e9);  // the V100s' Gen3 limits the ring
}

TEST(ClusterPresetsTest, MixedSeveralNodesPutsA100NodesFirst) {
  const Cluster c = preset("mixed-a100-v100", 3);  // 2 DGX A100 + 1 DGX-1V
  EXPECT_EQ(c.world_size(), 24);
  EXPECT_EQ(c.device_of(15).name, "a100-sxm4-80gb");
  EXPECT_EQ(c.device_of(16).name, "v100-sxm2-32gb");
  const std::vector<int> a100_nodes = {0, 8};
  const std::vector<int> both = {0, 16};
  const std::vector<int> v100_node = {16, 17};
  EXPECT_EQ(c.link_speed(1, a100_nodes).bandwidth, 25e9);
  EXPECT_EQ(c.link_speed(1, both).bandwidth, 6.25e9);
  EXPECT_EQ(c.link_speed(0, v100_node).bandwidth, 150e9);
  const Cluster two = preset("mixed-a100-v100", 2);
  EXPECT_EQ(two.device_of(7).name, "a100-sxm4-80gb");
  EXPECT_EQ(two.device_of(8).name, "v100-sxm2-32gb");
}

TEST(ClusterPresetsTest, CpuIsOneNodeOfProcesses) {
  const Cluster c = preset("cpu", 4);
  EXPECT_EQ(c.name(), "cpu (4 processes)");
  EXPECT_EQ(c.world_size(), 4);
  EXPECT_EQ(c.num_nodes(), 1);
  EXPECT_EQ(c.device_of(3).name, "cpu");
  EXPECT_EQ(c.links().size(), 1u);
  EXPECT_EQ(preset("cpu").world_size(), 1);
}

TEST(ClusterPresetsTest, Errors) {
  EXPECT_EQ(error_of<support::ValidationError>([] { preset("dgx-a200", 1); }),
            "unknown cluster preset 'dgx-a200' (known: cpu, dgx-a100, dgx-h100, mixed-a100-v100, v100)");
  EXPECT_EQ(error_of<support::ValidationError>([] { preset("dgx-a100", 0); }),
            "nodes: preset 'dgx-a100' needs at least 1 node, got 0");
  EXPECT_EQ(error_of<support::ValidationError>([] { preset("cpu", -2); }),
            "nodes: preset 'cpu' needs at least 1 process, got -2");
  EXPECT_THROW(preset("dgx-h100", 2'000'000'000), support::ValidationError);
}

TEST(ClusterPresetsTest, KnownDeviceTypesCoverThePresets) {
  const auto known = known_device_types();
  auto find = [&](const std::string& name) {
    for (const auto& t : known) {
      if (t.name == name) return t;
    }
    ADD_FAILURE() << name << " is not in known_device_types()";
    return DeviceType{};
  };
  std::vector<Cluster> clusters = {preset("mixed-a100-v100", 1)};
  for (const auto& name : preset_names()) clusters.push_back(preset(name, 2));
  for (const Cluster& c : clusters) {
    for (const auto& t : c.device_types()) EXPECT_EQ(find(t.name), t);
  }
}

}  // namespace
}  // namespace shardwise::cost
