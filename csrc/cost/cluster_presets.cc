#include "cost/cluster_presets.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "support/error.h"

namespace shardwise::cost {
namespace {

constexpr double kTera = 1e12;
constexpr double kGiga = 1e9;
constexpr std::int64_t kGiB = std::int64_t{1} << 30;
constexpr int kMaxPresetNodes = 1 << 20;

// ---- device types ----------------------------------------------------------------
// Peak FLOP/s are the datasheets' dense figures (the "with sparsity" ones halved).
// Memory is the marketed capacity in GiB: nvidia-smi reports 81920 MiB for an A100 80GB;
// what a process can allocate is a few hundred MiB less once the CUDA context exists.

// NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM column): FP32 19.5 TFLOPS,
// TF32 156 (312 sparse), BF16 312, FP16 312 (624 sparse); 80GB HBM2e, 2,039 GB/s.
DeviceType a100_sxm4_80gb() {
  return {"a100-sxm4-80gb", {19.5 * kTera, 156 * kTera, 312 * kTera, 312 * kTera}, 80 * kGiB, 2039 * kGiga};
}

// Same datasheet, A100 80GB PCIe column: same compute, 1,935 GB/s.
DeviceType a100_pcie_80gb() {
  return {"a100-pcie-80gb", {19.5 * kTera, 156 * kTera, 312 * kTera, 312 * kTera}, 80 * kGiB, 1935 * kGiga};
}

// NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column): FP32 67 TFLOPS, TF32 989*,
// BF16 1,979*, FP16 1,979*, FP8 3,958* (* with sparsity: dense is half); 80GB HBM3, 3.35 TB/s.
DeviceType h100_sxm5_80gb() {
  return {"h100-sxm5-80gb", {67 * kTera, 494.5 * kTera, 989.5 * kTera, 989.5 * kTera, 1979 * kTera}, 80 * kGiB,
          3350 * kGiga};
}

// NVIDIA Tesla V100 datasheet (V100 SXM2 column): FP32 15.7 TFLOPS, Tensor (FP16 with
// FP32 accumulate) 125 TFLOPS; 32GB HBM2, 900 GB/s. Volta has neither TF32 nor BF16
// tensor cores: TF32 mode changes nothing and PyTorch runs bf16 matmuls at (at best) the
// f32 rate, so both are listed at 15.7.
DeviceType v100_sxm2_32gb() {
  return {"v100-sxm2-32gb", {15.7 * kTera, 15.7 * kTera, 15.7 * kTera, 125 * kTera}, 32 * kGiB, 900 * kGiga};
}

// Same datasheet, V100 PCIe column: FP32 14 TFLOPS, Tensor 112 TFLOPS, 900 GB/s.
DeviceType v100_pcie_32gb() {
  return {"v100-pcie-32gb", {14 * kTera, 14 * kTera, 14 * kTera, 112 * kTera}, 32 * kGiB, 900 * kGiga};
}

// One CPU process of the "cpu" preset: about one core. Measured on this project's
// 2-core Xeon @ 2.5 GHz VM with torch 2.13 and one thread per process (1024^3 matmul):
// f32 62 GFLOP/s, bf16 17 GFLOP/s, f16 0.35 GFLOP/s (no AVX512-FP16: torch's CPU f16
// matmul is not vectorised there), streaming add 12.9 GB/s. Rounded down; no TF32 on a
// CPU, so tf32 = f32. FP8: torch._scaled_mm with rowwise scales (the form fp8 plans run,
// analysis/fp8_linears.h) ran at 0.6x the f32 matmul there (57 against 94 GFLOP/s, 1024^3;
// per-tensor scales took 0.04 GFLOP/s), hence 30. 4 GiB of memory per process is a floor,
// not a measurement: shardwise.Cluster.detect() describes the real machine.
DeviceType cpu_process() {
  return {"cpu", {50 * kGiga, 50 * kGiga, 15 * kGiga, 0.3 * kGiga, 30 * kGiga}, 4 * kGiB, 10 * kGiga};
}

// ---- links -----------------------------------------------------------------------
// Bandwidth per GPU and per direction; latency is one ring step. NCCL's own tuning model
// (src/graph/tuning.cc, hwLat, ring) puts a step at 2.5-5.7 us on NVLink and PCIe and
// 2.5-9.6 us on the network depending on the protocol and the release; we use 3 us
// (NVLink), 5 us (PCIe) and 7 us (InfiniBand: NIC and switch hops on top of PCIe).
// (Literals, not n * 1e-6: 100 * 1e-6 is not the double nearest 1e-4 and shows as
// 9.999999999999999e-05 in JSON.)
constexpr double kNvlinkLatency = 3e-6;
constexpr double kPcieLatency = 5e-6;
constexpr double kInfinibandLatency = 7e-6;

// DGX A100 user guide / A100 datasheet: third-generation NVLink through NVSwitch,
// 600 GB/s per GPU bidirectional = 300 GB/s per direction.
constexpr double kNvlink3 = 300 * kGiga;
// DGX H100 user guide / H100 datasheet: fourth-generation NVLink, 900 GB/s bidirectional.
constexpr double kNvlink4 = 450 * kGiga;
// DGX-1 with V100 (hybrid cube mesh, NVLink2: 6 links x 25 GB/s per direction per GPU);
// a ring over the mesh sustains about 150 GB/s per direction per GPU (NCCL measures
// ~130 GB/s bus bandwidth on DGX-1V).
constexpr double kNvlink2CubeMesh = 150 * kGiga;
// DGX A100: 8 single-port ConnectX-6 HDR 200 Gb/s for compute, one per GPU = 25 GB/s.
constexpr double kHdrPerGpu = 200.0 / 8 * kGiga;
// DGX H100: 8 ConnectX-7 NDR 400 Gb/s for compute, one per GPU = 50 GB/s.
constexpr double kNdrPerGpu = 400.0 / 8 * kGiga;
// DGX-1: 4 EDR 100 Gb/s InfiniBand ports per node = 50 GB/s shared by 8 GPUs.
constexpr double kEdrPerGpu = 4 * 100.0 / 8 / 8 * kGiga;
// PCIe x16 per direction: Gen4 32 GB/s (A100 PCIe datasheet: "64 GB/s"), Gen3 16 GB/s
// (V100 datasheet: "32 GB/s"); both are the link rates, as the NVLink figures are.
constexpr double kPcieGen4 = 32 * kGiga;
constexpr double kPcieGen3 = 16 * kGiga;
// The "cpu" preset's processes talk through Gloo over loopback TCP. Measured on the
// 2-core VM above: a 64 MiB all-reduce moves 0.45 GB/s of ring bandwidth and a tiny one
// takes ~0.3 ms per ring step; 0.5 GB/s and 100 us are round figures in that range.
// Per call, whatever the ring: 2 processes, 1 KiB, median of 50 after a barrier (2026-12-01):
// all-reduce 0.37 ms, all-gather 0.30 ms, i.e. call + 2 steps and call + 1 step with a step
// of ~0.07 ms and a call of ~0.23 ms; 200 us is the round figure. 4 processes on the 2 cores
// measured 4.6-5.0 ms and 3.6-3.8 ms (a call of ~2.6 ms: each hop waits for a process to be
// scheduled); the preset does not know the cores, Cluster.detect(measure_links=True) measures them.
constexpr double kLoopbackBandwidth = 0.5 * kGiga;
constexpr double kLoopbackLatency = 1e-4;
constexpr double kLoopbackCallOverhead = 2e-4;

LinkLevel level(std::string name, double bandwidth, double latency, double call_overhead = 0) {
  return LinkLevel{std::move(name), 0, bandwidth, latency, {}, call_overhead};
}

Cluster uniform_cluster(std::string_view preset_name, int nodes, const DeviceType& device, int per_node,
                        std::vector<LinkLevel> links) {
  return Cluster(fmt::format("{} x{}", preset_name, nodes), {device},
                 std::vector<Node>(static_cast<std::size_t>(nodes), Node::uniform(device.name, per_node)),
                 std::move(links));
}

Cluster dgx_a100(int nodes) {
  return uniform_cluster(
      "dgx-a100", nodes, a100_sxm4_80gb(), 8,
      {level("nvswitch", kNvlink3, kNvlinkLatency), level("infiniband", kHdrPerGpu, kInfinibandLatency)});
}

Cluster dgx_h100(int nodes) {
  return uniform_cluster(
      "dgx-h100", nodes, h100_sxm5_80gb(), 8,
      {level("nvswitch", kNvlink4, kNvlinkLatency), level("infiniband", kNdrPerGpu, kInfinibandLatency)});
}

Cluster dgx1_v100(int nodes) {
  return uniform_cluster(
      "v100", nodes, v100_sxm2_32gb(), 8,
      {level("nvlink", kNvlink2CubeMesh, kNvlinkLatency), level("infiniband", kEdrPerGpu, kInfinibandLatency)});
}

Cluster mixed_a100_v100(int nodes) {
  if (nodes == 1) {
    // One PCIe machine, 4 + 4: no NVLink between the two kinds, each GPU limited by its
    // own PCIe generation (the ring by the slower, Gen3). A single link level.
    const DeviceType a100 = a100_pcie_80gb();
    const DeviceType v100 = v100_pcie_32gb();
    LinkLevel pcie = level("pcie", kPcieGen4, kPcieLatency);
    pcie.per_device.emplace(v100.name, LinkSpeed{kPcieGen3, kPcieLatency});
    return Cluster("mixed-a100-v100 x1", {a100, v100}, {Node{{{a100.name, 4}, {v100.name, 4}}}}, {pcie});
  }
  // DGX A100 nodes first (ranks 0 .. 8*ceil(n/2)-1), then DGX-1V nodes; each node keeps
  // its own NVLink and NIC share, so a group crossing both kinds moves at the V100 pace.
  const DeviceType a100 = a100_sxm4_80gb();
  const DeviceType v100 = v100_sxm2_32gb();
  const int a100_nodes = (nodes + 1) / 2;
  std::vector<Node> node_list(static_cast<std::size_t>(a100_nodes), Node::uniform(a100.name, 8));
  node_list.resize(static_cast<std::size_t>(nodes), Node::uniform(v100.name, 8));
  LinkLevel nvlink = level("nvlink", kNvlink3, kNvlinkLatency);
  nvlink.per_device.emplace(v100.name, LinkSpeed{kNvlink2CubeMesh, kNvlinkLatency});
  LinkLevel infiniband = level("infiniband", kHdrPerGpu, kInfinibandLatency);
  infiniband.per_device.emplace(v100.name, LinkSpeed{kEdrPerGpu, kInfinibandLatency});
  return Cluster(fmt::format("mixed-a100-v100 x{}", nodes), {a100, v100}, std::move(node_list), {nvlink, infiniband});
}

Cluster cpu(int processes) {
  const DeviceType device = cpu_process();
  return Cluster(fmt::format("cpu ({} process{})", processes, processes == 1 ? "" : "es"), {device},
                 {Node::uniform(device.name, processes)}, {level("loopback", kLoopbackBandwidth, kLoopbackLatency, kLoopbackCallOverhead)});
}

struct Preset {
  std::string_view name;
  Cluster (*build)(int nodes);
};

// Sorted by name: preset_names() lists them in this order.
constexpr Preset kPresets[] = {
    {"cpu", cpu},        {"dgx-a100", dgx_a100}, {"dgx-h100", dgx_h100}, {"mixed-a100-v100", mixed_a100_v100},
    {"v100", dgx1_v100},
};

}  // namespace

Cluster preset(std::string_view name, int nodes) {
  for (const Preset& p : kPresets) {
    if (p.name != name) continue;
    const std::string_view unit = name == "cpu" ? "process" : "node";
    if (nodes < 1) {
      throw support::ValidationError(fmt::format("nodes: preset '{}' needs at least 1 {}, got {}", name, unit, nodes));
    }
    // The node list is built before Cluster checks the world size: refuse absurd counts
    // here rather than allocate them.
    if (nodes > kMaxPresetNodes) {
      throw support::ValidationError(
          fmt::format("nodes: preset '{}' takes at most {} {}s, got {}", name, kMaxPresetNodes, unit, nodes));
    }
    return p.build(nodes);
  }
  std::string known;
  for (const Preset& p : kPresets) known += fmt::format("{}{}", known.empty() ? "" : ", ", p.name);
  throw support::ValidationError(fmt::format("unknown cluster preset '{}' (known: {})", name, known));
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

std::vector<DeviceType> known_device_types() {
  return {a100_sxm4_80gb(), a100_pcie_80gb(), h100_sxm5_80gb(), v100_sxm2_32gb(), v100_pcie_32gb(), cpu_process()};
}

}  // namespace shardwise::cost
