// The machines a plan runs on: device types, nodes, and the hierarchy of links between
// devices. A Cluster is a plain, immutable value: built once (from code, a preset or a
// JSON file), validated on construction, compared with ==, written to and read from JSON.
//
// Vocabulary
//  - DeviceType: one kind of device (a GPU model, or one CPU process): dense peak FLOP/s
//    per precision, memory capacity (bytes) and memory bandwidth (bytes/s).
//  - Node: one machine. It holds one or more runs of identical devices (DeviceRun), nearly
//    always a single run ("8 x a100-sxm4-80gb"); several device types across the cluster
//    (or inside one node) make it heterogeneous.
//  - Ranks are numbered node-major: node 0's devices first, run by run, then node 1's, and
//    so on. With uniform nodes of d devices, rank r lives on node r / d.
//  - LinkLevel: the link hierarchy, innermost first (NVLink / NVSwitch, PCIe), outermost
//    last (InfiniBand / RoCE between nodes).
//      * Every level but the last connects devices inside one node: a group of `span`
//        consecutive devices of the node (local indices [0, span), [span, 2 span), ...),
//        or the whole node when span is 0. Inner spans grow outwards, each divides the
//        next, and the last inner level covers the whole node (span 0).
//      * The last level connects nodes. With a single level it connects everything: a flat
//        network, or one machine.
//      * bandwidth is per device and per direction: the bytes/s one device can push through
//        that level while its peers do the same (e.g. its share of the node's NICs);
//        latency is the time of one step (one hop of a ring). per_device overrides both for
//        a device type: a V100 node's NVLink is slower than an A100 node's.
//      * call_overhead (optional, 0 by default) is what one collective call costs whatever
//        its ranks and bytes: the library's launch and its hand-off between threads and
//        ranks. It is what makes two collectives dearer than one of the same ring steps
//        and bytes (an all-gather plus a reduce-scatter against an all-reduce). Gloo over
//        loopback pays about 0.2 ms per call here (the "cpu" preset); the GPU presets leave
//        it 0 (their per-step latency was set on all-reduce timings that include it).
//  - The level a set of ranks spans is the innermost level one of whose groups holds them
//    all: the link their traffic must cross. A collective over them is bounded by that
//    level's slowest member (smallest bandwidth, largest latency): LinkSpeed of the group.
//
// JSON (version 1; cluster_to_json writes exactly this, cluster_from_json reads it back to
// an equal Cluster; "format", "version", "name", "span", "per_device" and "call_overhead" are optional,
// unknown keys are an error so a misspelt field in a hand-written file is caught):
//   {"format": "shardwise.cluster", "version": 1, "name": "dgx-a100 x2",
//    "device_types": [{"name": "a100-sxm4-80gb",
//                      "peak_flops": {"f32": 1.95e13, "tf32": 1.56e14, "bf16": 3.12e14, "f16": 3.12e14},
//                      "memory_bytes": 85899345920, "memory_bandwidth": 2.039e12}],
//    "nodes": [{"device": "a100-sxm4-80gb", "count": 8},                   one run
//              {"device": "cpu", "count": 4, "compute_alone": 2.0,           ranks sharing cores
//               "overlap_interference": 1.1},
//              {"devices": [{"device": "a100-pcie-80gb", "count": 4},      several runs
//                           {"device": "v100-pcie-32gb", "count": 4}]}],
//    "links": [{"name": "nvswitch", "bandwidth": 3.0e11, "latency": 3.0e-6},
//              {"name": "infiniband", "bandwidth": 2.5e10, "latency": 7.0e-6,
//               "per_device": {"v100-sxm2-32gb": {"bandwidth": 6.25e9, "latency": 7.0e-6}}}]}
//  Mixed fleets, read but not written (cluster_to_json writes each node and each type in
//  full): a node kind with how many of it ("repeat"), and a device type as another kind's
//  profile ("like" a type listed before it or in the presets' catalogue, FLOP/s and memory
//  bandwidth times "speed"; any figure given as well overrides): a degraded or throttled
//  device, a partly failed node.
//    "device_types": [{"name": "a100-half", "like": "a100-sxm4-80gb", "speed": 0.5}],
//    "nodes": [{"repeat": 3, "device": "a100-sxm4-80gb", "count": 8},
//              {"devices": [{"device": "a100-sxm4-80gb", "count": 7}, {"device": "a100-half", "count": 1}]}]
//
// Errors: malformed JSON text, a missing field, a wrong JSON type or an unknown key ->
// support::ParseError; a value that cannot describe hardware (bandwidth <= 0, latency < 0,
// count < 1, peak FLOP/s <= 0, memory <= 0, an unknown device type, spans that do not
// nest) -> support::ValidationError, from the constructor. Both name the JSON path and
// the bad value: "nodes[2].device: unknown device type 'A200' (known: a100-sxm4-80gb)".
//
// Worked example (two DGX A100 nodes):
//   Cluster c = preset("dgx-a100", 2);              // cost/cluster_presets.h
//   c.world_size();                                 // 16
//   c.node_of(9);  c.local_rank(9);                 // 1, 1
//   c.device_of(9).peak_flops.bf16;                 // 3.12e14
//   std::vector<int> tp = {0, 1, 2, 3};
//   c.span_of(tp);                                  // {level 0, nodes 1, devices_per_node 4, uniform}
//   std::vector<int> dp = {0, 8};
//   c.span_of(dp);                                  // {level 1, nodes 2, devices_per_node 1, uniform}
//   c.link_speed(1, dp);                            // {2.5e10 bytes/s, 7e-6 s}
//   Cluster same = cluster_from_json_string(cluster_to_json_string(c));   // same == c
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace shardwise::cost {

// The arithmetic a device runs matrix products in. TF32 is f32 storage computed on tensor
// cores at reduced precision: a mode, not a storage dtype, hence not an ir::DType. FP8 is a
// plan's "linears in float8, the rest in the model's dtype" (analysis/fp8_linears.h): its
// linears' two float8 products run at the fp8 peak, everything else at its dtype's
// (cost::high_precision).
enum class Precision : std::uint8_t { F32, TF32, BF16, F16, FP8 };

// The precisions every device lists a peak for (older devices run them at some rate).
inline constexpr std::array<Precision, 4> kAllPrecisions = {Precision::F32, Precision::TF32, Precision::BF16,
                                                            Precision::F16};
// The ones a device may lack: FP8 needs its own matrix units (H100 / H200 / Ada; not A100 or V100).
inline constexpr std::array<Precision, 1> kOptionalPrecisions = {Precision::FP8};

// "f32", "tf32", "bf16", "f16", "fp8" (the JSON keys of peak_flops).
std::string_view precision_name(Precision precision);
std::optional<Precision> parse_precision(std::string_view name);

// Dense (no structured sparsity) peak FLOP/s; a multiply-add counts 2. A device with no
// hardware for a precision lists the rate it really runs at (V100 bf16 = its f32 rate).
struct PeakFlops {
  double f32 = 0;
  double tf32 = 0;
  double bf16 = 0;
  double f16 = 0;
  double fp8 = 0;  // 0: no FP8 matrix units (the JSON key is then absent)

  double at(Precision precision) const;
  friend bool operator==(const PeakFlops&, const PeakFlops&) = default;
};

struct DeviceType {
  std::string name;               // unique in a cluster, e.g. "a100-sxm4-80gb"
  PeakFlops peak_flops;           // FLOP/s
  std::int64_t memory_bytes = 0;  // capacity
  double memory_bandwidth = 0;    // bytes/s

  friend bool operator==(const DeviceType&, const DeviceType&) = default;
};

// `count` identical devices of type `device` (a DeviceType name).
struct DeviceRun {
  std::string device;
  int count = 0;

  friend bool operator==(const DeviceRun&, const DeviceRun&) = default;
};

struct Node {
  std::vector<DeviceRun> devices;  // local ranks run by run, in this order
  // How many times faster one of the node's ranks computes while the node's other ranks
  // idle than at its device's peak_flops, which is its rate while every rank computes.
  // 1 (the default) for devices of their own (GPUs). Ranks that share one machine's cores
  // (CPU processes, Cluster.detect on CPU) run faster while a pipeline's other stages wait:
  // with c cores, r ranks and t threads each, min(t, c) / (c / r). The node's ranks
  // together never compute more than r ranks at peak_flops (cost/plan_cost.h).
  double compute_alone = 1.0;
  // What each second of a collective run beside compute on the node's ranks adds to the
  // step (>= 0; 0: hidden for free, 1: as if run alone after the compute). Unset: the
  // constant kOverlapInterference (cost/constants.h: NCCL's kernels beside GEMMs). Measured
  // by Cluster.detect(measure_links=True) for CPU processes, whose collectives' threads take
  // the cores the compute needs (Gloo on 2 cores measured 0.8 to 1.4 with 2 and 4
  // processes: an all-reduce beside GEMMs hides nothing of itself).
  std::optional<double> overlap_interference = std::nullopt;

  // The usual node: `count` devices of one type.
  static Node uniform(std::string device, int count);
  int device_count() const;

  friend bool operator==(const Node&, const Node&) = default;
};

struct LinkSpeed {
  double bandwidth = 0;  // bytes/s, per device and per direction
  double latency = 0;    // s per step

  friend bool operator==(const LinkSpeed&, const LinkSpeed&) = default;
};

struct LinkLevel {
  std::string name;  // "nvswitch", "pcie", "infiniband", ...
  int span = 0;      // inner levels: consecutive devices per group, 0 = the whole node; outermost: 0
  double bandwidth = 0;
  double latency = 0;
  std::map<std::string, LinkSpeed, std::less<>> per_device;  // device type name -> its own speed
  double call_overhead = 0;  // s per collective call, whatever its ranks and bytes

  // This level's speed for one device type: its per_device entry, else the default.
  LinkSpeed speed_for(std::string_view device) const;

  friend bool operator==(const LinkLevel&, const LinkLevel&) = default;
};

// What a set of ranks covers; see Cluster::span_of.
struct GroupSpan {
  int level = 0;             // index into Cluster::links(): the outermost link the group crosses
  int nodes = 0;             // distinct nodes holding a rank of the group
  int devices_per_node = 0;  // the most ranks of the group on any one node
  bool uniform = true;       // every covered node holds exactly devices_per_node of them

  friend bool operator==(const GroupSpan&, const GroupSpan&) = default;
};

class Cluster;
// The overlap interference a step on `cluster` pays (Node::overlap_interference): the largest
// of its nodes', each unset one counting as kOverlapInterference.
double overlap_interference(const Cluster& cluster);

class Cluster {
 public:
  // Throws support::ValidationError naming the JSON path of the first bad value.
  Cluster(std::string name, std::vector<DeviceType> device_types, std::vector<Node> nodes,
          std::vector<LinkLevel> links);

  const std::string& name() const { return name_; }
  const std::vector<DeviceType>& device_types() const { return device_types_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<LinkLevel>& links() const { return links_; }

  int world_size() const { return static_cast<int>(rank_node_.size()); }
  int num_nodes() const { return static_cast<int>(nodes_.size()); }
  // Ranks on each node, in node order: what a launcher starts on each (torchrun --nnodes,
  // --nproc-per-node).
  std::vector<int> ranks_per_node() const;
  // True when the nodes use more than one device type.
  bool heterogeneous() const;

  // Rank queries; a rank outside [0, world_size) is a ValidationError.
  const DeviceType& device_of(int rank) const;
  // The slowest type (peak FLOP/s at `precision`) of ranks [first, first + count): what sets
  // the pace of a pipeline stage's block of ranks; the first of equals.
  const DeviceType& slowest_device(int first, int count, Precision precision) const;
  // Throws ValidationError naming `who` and the first device type with no peak at `precision`
  // (FP8 on an A100): a plan in that precision cannot run there, and is not priced as if it could.
  void require_precision(Precision precision, std::string_view who) const;
  int node_of(int rank) const;
  int local_rank(int rank) const;  // index of the rank inside its node
  // First rank of a node (ranks of node n: first_rank(n) .. first_rank(n) + device_count - 1).
  int first_rank(int node) const;
  // The DeviceType called `name`, or nullptr.
  const DeviceType* find_device_type(std::string_view name) const;

  // The outermost level a set of ranks spans and the nodes it covers. Ranks in any order;
  // an empty set, a duplicate or an out-of-range rank is a ValidationError.
  GroupSpan span_of(std::span<const int> ranks) const;
  // The speed of `level` for the group: the smallest bandwidth and the largest latency
  // over the device types of its ranks (a ring moves at the pace of its slowest member).
  LinkSpeed link_speed(int level, std::span<const int> ranks) const;

  // One line per part, for people: "dgx-a100 x2: 16 ranks on 2 nodes ..." (not parsed).
  std::string summary() const;

  // Compares what was given to the constructor; the rank tables follow from it.
  friend bool operator==(const Cluster& a, const Cluster& b) {
    return a.name_ == b.name_ && a.device_types_ == b.device_types_ && a.nodes_ == b.nodes_ && a.links_ == b.links_;
  }

 private:
  void check_rank(int rank) const;
  int group_at(int level, int rank) const;  // id of the level's group holding the rank

  std::string name_;
  std::vector<DeviceType> device_types_;
  std::vector<Node> nodes_;
  std::vector<LinkLevel> links_;
  // Per rank: node, index inside the node, index into device_types_.
  std::vector<int> rank_node_;
  std::vector<int> rank_local_;
  std::vector<int> rank_device_;
  std::vector<int> node_first_rank_;
};

// The cluster of its first `count` ranks: whole nodes, then the first devices of the next,
// with the same device types and links. Under Megatron's rank layout that is one pipeline
// stage's sub-mesh (or, count = t, its tensor ranks). ValidationError unless 1 <= count <=
// world size.
Cluster first_ranks(const Cluster& cluster, int count);
// The cluster of ranks [first, first + count), as first_ranks makes it (a pipeline stage's
// sub-mesh of its own size: plan.h's stage_meshes). ValidationError outside the world.
Cluster rank_range(const Cluster& cluster, int first, int count);

// JSON (schema above). Only <nlohmann/json_fwd.hpp> is included here; a caller that
// touches the nlohmann::json includes <nlohmann/json.hpp> itself.
nlohmann::json cluster_to_json(const Cluster& cluster);
Cluster cluster_from_json(const nlohmann::json& json);
// indent < 0: one line; otherwise pretty-printed with that many spaces.
std::string cluster_to_json_string(const Cluster& cluster, int indent = -1);
Cluster cluster_from_json_string(std::string_view text);

}  // namespace shardwise::cost
