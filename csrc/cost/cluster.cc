#include "cost/cluster.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <utility>

#include "cost/cluster_presets.h"
#include "cost/constants.h"
#include "support/enum_names.h"
#include "support/error.h"
#include "support/json_text.h"

namespace shardwise::cost {
namespace {

using nlohmann::json;

constexpr std::string_view kFormat = "shardwise.cluster";
constexpr int kVersion = 1;
// Rank tables are vectors of the world size: a typo such as "count": 1000000000 should be
// an error, not an allocation of gigabytes. 2^24 ranks is far beyond any real cluster.
constexpr std::int64_t kMaxWorldSize = std::int64_t{1} << 24;

// Every precision: kAllPrecisions' (first line) and kOptionalPrecisions'.
constexpr auto kPrecisionNames = support::enum_names<Precision>({
    {Precision::F32, "f32"}, {Precision::TF32, "tf32"}, {Precision::BF16, "bf16"}, {Precision::F16, "f16"},
    {Precision::FP8, "fp8"},
});

// ---- validation ------------------------------------------------------------------

[[noreturn]] void invalid(std::string_view path, std::string_view what) {
  throw support::ValidationError(fmt::format("{}: {}", path, what));
}

bool positive_finite(double x) { return std::isfinite(x) && x > 0; }

void check_speed(const std::string& path, double bandwidth, double latency) {
  if (!positive_finite(bandwidth)) {
    invalid(path + ".bandwidth", fmt::format("bandwidth must be positive and finite bytes/s, got {}", bandwidth));
  }
  if (!std::isfinite(latency) || latency < 0) {
    invalid(path + ".latency", fmt::format("latency must be finite seconds >= 0, got {}", latency));
  }
}

std::string known_types(const std::vector<DeviceType>& types) {
  std::string out;
  for (const auto& t : types) out += fmt::format("{}{}", out.empty() ? "" : ", ", t.name);
  return out;
}

// Path of a node's run in the JSON form cluster_to_json writes: a one-run node is the
// compact {"device", "count"} object itself.
std::string run_path(const Node& node, std::size_t n, std::size_t r) {
  return node.devices.size() == 1 ? fmt::format("nodes[{}]", n) : fmt::format("nodes[{}].devices[{}]", n, r);
}

// ---- JSON reading ----------------------------------------------------------------

[[noreturn]] void fail(std::string_view path, std::string_view what) {
  throw support::ParseError(fmt::format("{}: {}", path, what));
}

const json& require_object(const json& j, std::string_view path) {
  if (!j.is_object()) fail(path, fmt::format("expected an object, found {}", j.type_name()));
  return j;
}

const json& require_array(const json& j, std::string_view path) {
  if (!j.is_array()) fail(path, fmt::format("expected an array, found {}", j.type_name()));
  return j;
}

// Rejects keys outside `allowed`: a misspelt optional key in a hand-written file would
// otherwise be silently ignored.
void check_keys(const json& obj, std::string_view path, std::initializer_list<std::string_view> allowed) {
  for (const auto& [key, value] : obj.items()) {
    if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) continue;
    std::string expected;
    for (auto a : allowed) expected += fmt::format("{}\"{}\"", expected.empty() ? "" : ", ", a);
    fail(path, fmt::format("unknown key \"{}\" (expected {})", key, expected));
  }
}

const json& require(const json& obj, std::string_view key, std::string_view path) {
  auto it = obj.find(key);
  if (it == obj.end()) fail(path, fmt::format("missing \"{}\"", key));
  return *it;
}

std::string get_string(const json& j, std::string_view path) {
  if (!j.is_string()) fail(path, fmt::format("expected a string, found {}", j.type_name()));
  return j.get<std::string>();
}

double get_number(const json& j, std::string_view path) {
  if (!j.is_number()) fail(path, fmt::format("expected a number, found {}", j.type_name()));
  return j.get<double>();
}

// An integer; an integral float (80e9 in a hand-written file) is accepted too.
std::int64_t get_int64(const json& j, std::string_view path) {
  if (j.is_number_unsigned()) {
    const auto u = j.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      fail(path, fmt::format("integer {} is out of range", u));
    }
    return static_cast<std::int64_t>(u);
  }
  if (j.is_number_integer()) return j.get<std::int64_t>();
  if (j.is_number_float()) {
    const double d = j.get<double>();
    // 2^63 itself is out of range; every double below it converts exactly.
    if (d == std::trunc(d) && std::abs(d) < 9.2233720368547758e18) return static_cast<std::int64_t>(d);
    fail(path, fmt::format("expected an integer, found {}", d));
  }
  fail(path, fmt::format("expected an integer, found {}", j.type_name()));
}

int get_int(const json& j, std::string_view path) {
  const std::int64_t v = get_int64(j, path);
  if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) {
    fail(path, fmt::format("integer {} is out of range", v));
  }
  return static_cast<int>(v);
}

// A device type in full, or as another kind's profile: {"name", "like", "speed"} takes the
// figures of `like` (a type listed before it, else the presets' catalogue) with its FLOP/s
// and memory bandwidth times `speed` (a degraded or throttled device: 0.5 runs at half its
// kind's pace); any figure also given overrides the profile's (memory_bytes: a device with
// less usable memory).
DeviceType read_device_type(const json& j, const std::string& path, const std::vector<DeviceType>& before) {
  require_object(j, path);
  check_keys(j, path, {"name", "like", "speed", "peak_flops", "memory_bytes", "memory_bandwidth"});
  DeviceType t;
  const bool profile = j.contains("like");
  if (profile) {
    const std::string like = get_string(j["like"], path + ".like");
    std::vector<DeviceType> known = before;
    for (DeviceType& type : known_device_types()) known.push_back(std::move(type));
    auto found = std::find_if(known.begin(), known.end(), [&](const DeviceType& k) { return k.name == like; });
    if (found == known.end()) {
      std::vector<std::string> names;
      for (const DeviceType& k : known) names.push_back(k.name);
      fail(path + ".like", fmt::format("unknown device type '{}' (known: {})", like, fmt::join(names, ", ")));
    }
    t = *found;
    const double speed = j.contains("speed") ? get_number(j["speed"], path + ".speed") : 1.0;
    if (!(speed > 0)) fail(path + ".speed", fmt::format("speed must be > 0, got {}", speed));
    for (double* flops : {&t.peak_flops.f32, &t.peak_flops.tf32, &t.peak_flops.bf16, &t.peak_flops.f16,
                          &t.peak_flops.fp8})
      *flops *= speed;
    t.memory_bandwidth *= speed;
  } else if (j.contains("speed")) {
    fail(path + ".speed", "speed scales the figures of the type named by \"like\"; give \"like\" too");
  }
  t.name = get_string(require(j, "name", path), path + ".name");
  const std::string flops_path = path + ".peak_flops";
  if (!profile || j.contains("peak_flops")) {
    const json& flops = require_object(require(j, "peak_flops", path), flops_path);
    check_keys(flops, flops_path, {"f32", "tf32", "bf16", "f16", "fp8"});
    t.peak_flops.f32 = get_number(require(flops, "f32", flops_path), flops_path + ".f32");
    t.peak_flops.tf32 = get_number(require(flops, "tf32", flops_path), flops_path + ".tf32");
    t.peak_flops.bf16 = get_number(require(flops, "bf16", flops_path), flops_path + ".bf16");
    t.peak_flops.f16 = get_number(require(flops, "f16", flops_path), flops_path + ".f16");
    // Optional: a device without FP8 matrix units leaves it out (0).
    t.peak_flops.fp8 = flops.contains("fp8") ? get_number(flops["fp8"], flops_path + ".fp8") : 0.0;
  }
  if (!profile || j.contains("memory_bytes"))
    t.memory_bytes = get_int64(require(j, "memory_bytes", path), path + ".memory_bytes");
  if (!profile || j.contains("memory_bandwidth"))
    t.memory_bandwidth = get_number(require(j, "memory_bandwidth", path), path + ".memory_bandwidth");
  return t;
}

DeviceRun read_run(const json& j, const std::string& path, std::initializer_list<std::string_view> allowed) {
  check_keys(j, path, allowed);
  return DeviceRun{get_string(require(j, "device", path), path + ".device"),
                   get_int(require(j, "count", path), path + ".count")};
}

// One node, or `repeat` alike ({"repeat": 4, "device": ..., "count": 8}: a node kind and
// how many of it the cluster has).
std::vector<Node> read_nodes(const json& j, const std::string& path) {
  require_object(j, path);
  int repeat = 1;
  if (auto it = j.find("repeat"); it != j.end()) {
    repeat = get_int(*it, path + ".repeat");
    if (repeat < 1) fail(path + ".repeat", fmt::format("a node kind repeats at least once, got {}", repeat));
  }
  Node node;
  if (!j.contains("devices")) {
    node = Node{{read_run(j, path, {"device", "count", "repeat", "compute_alone", "overlap_interference"})}};
  } else {
    if (j.contains("device") || j.contains("count")) {
      fail(path, "give either \"device\" and \"count\" (one run) or \"devices\" (a list of runs), not both");
    }
    check_keys(j, path, {"devices", "repeat", "compute_alone", "overlap_interference"});
    const std::string runs_path = path + ".devices";
    const json& runs = require_array(j["devices"], runs_path);
    for (std::size_t r = 0; r < runs.size(); ++r) {
      const std::string p = fmt::format("{}[{}]", runs_path, r);
      node.devices.push_back(read_run(require_object(runs[r], p), p, {"device", "count"}));
    }
  }
  if (auto it = j.find("compute_alone"); it != j.end()) {
    node.compute_alone = get_number(*it, path + ".compute_alone");
  }
  if (auto it = j.find("overlap_interference"); it != j.end()) {
    node.overlap_interference = get_number(*it, path + ".overlap_interference");
  }
  // Before the nodes are made: a typo of a count must not allocate a billion of them.
  std::int64_t devices = 0;
  for (const DeviceRun& run : node.devices) devices += std::max(1, run.count);
  if (static_cast<std::int64_t>(repeat) * std::max<std::int64_t>(devices, 1) > kMaxWorldSize)
    fail(path + ".repeat", fmt::format("the cluster would exceed {} ranks", kMaxWorldSize));
  return std::vector<Node>(static_cast<std::size_t>(repeat), node);
}

LinkSpeed read_speed(const json& j, const std::string& path) {
  require_object(j, path);
  check_keys(j, path, {"bandwidth", "latency"});
  return LinkSpeed{get_number(require(j, "bandwidth", path), path + ".bandwidth"),
                   get_number(require(j, "latency", path), path + ".latency")};
}

LinkLevel read_link(const json& j, const std::string& path) {
  require_object(j, path);
  check_keys(j, path, {"name", "span", "bandwidth", "latency", "per_device", "call_overhead"});
  LinkLevel level;
  level.name = get_string(require(j, "name", path), path + ".name");
  if (auto it = j.find("span"); it != j.end()) level.span = get_int(*it, path + ".span");
  level.bandwidth = get_number(require(j, "bandwidth", path), path + ".bandwidth");
  level.latency = get_number(require(j, "latency", path), path + ".latency");
  if (auto it = j.find("call_overhead"); it != j.end()) level.call_overhead = get_number(*it, path + ".call_overhead");
  if (auto it = j.find("per_device"); it != j.end()) {
    const std::string per_path = path + ".per_device";
    for (const auto& [device, speed] : require_object(*it, per_path).items()) {
      level.per_device.emplace(device, read_speed(speed, fmt::format("{}.{}", per_path, device)));
    }
  }
  return level;
}

template <typename T, typename Read>
std::vector<T> read_list(const json& root, std::string_view key, Read read) {
  const std::string path(key);
  const json& list = require_array(require(root, key, "cluster"), path);
  std::vector<T> out;
  for (std::size_t i = 0; i < list.size(); ++i) out.push_back(read(list[i], fmt::format("{}[{}]", path, i)));
  return out;
}

// ---- summary -----------------------------------------------------------------------

std::string describe_node(const Node& node) {
  std::string out;
  for (const auto& run : node.devices) out += fmt::format("{}{} {}", out.empty() ? "" : " + ", run.count, run.device);
  return out;
}

std::string describe_speed(double bandwidth, double latency) {
  return fmt::format("{:g} GB/s {:g} us", bandwidth / 1e9, latency * 1e6);
}

}  // namespace

// ---- small value types ---------------------------------------------------------------

std::string_view precision_name(Precision precision) { return kPrecisionNames.name(precision); }

std::optional<Precision> parse_precision(std::string_view name) { return kPrecisionNames.parse(name); }

double PeakFlops::at(Precision precision) const {
  switch (precision) {
    case Precision::F32:
      return f32;
    case Precision::TF32:
      return tf32;
    case Precision::BF16:
      return bf16;
    case Precision::F16:
      return f16;
    case Precision::FP8:
      return fp8;
  }
  return 0;
}

Node Node::uniform(std::string device, int count) { return Node{{DeviceRun{std::move(device), count}}}; }

int Node::device_count() const {
  int n = 0;
  for (const auto& run : devices) n += run.count;
  return n;
}

LinkSpeed LinkLevel::speed_for(std::string_view device) const {
  if (auto it = per_device.find(device); it != per_device.end()) return it->second;
  return LinkSpeed{bandwidth, latency};
}

// ---- Cluster ---------------------------------------------------------------------------

Cluster::Cluster(std::string name, std::vector<DeviceType> device_types, std::vector<Node> nodes,
                 std::vector<LinkLevel> links)
    : name_(std::move(name)),
      device_types_(std::move(device_types)),
      nodes_(std::move(nodes)),
      links_(std::move(links)) {
  if (device_types_.empty()) invalid("device_types", "a cluster needs at least one device type");
  for (std::size_t i = 0; i < device_types_.size(); ++i) {
    const DeviceType& t = device_types_[i];
    const std::string path = fmt::format("device_types[{}]", i);
    if (t.name.empty()) invalid(path + ".name", "a device type needs a name");
    for (std::size_t j = 0; j < i; ++j) {
      if (device_types_[j].name == t.name) {
        invalid(path + ".name", fmt::format("duplicate device type '{}' (also device_types[{}])", t.name, j));
      }
    }
    for (Precision p : kAllPrecisions) {
      const double v = t.peak_flops.at(p);
      if (!positive_finite(v)) {
        invalid(fmt::format("{}.peak_flops.{}", path, precision_name(p)),
                fmt::format("peak FLOP/s must be positive and finite, got {}", v));
      }
    }
    for (Precision p : kOptionalPrecisions) {
      const double v = t.peak_flops.at(p);
      if (!(v == 0 || positive_finite(v))) {
        invalid(fmt::format("{}.peak_flops.{}", path, precision_name(p)),
                fmt::format("peak FLOP/s must be positive and finite (or absent: no such units), got {}", v));
      }
    }
    if (t.memory_bytes <= 0) {
      invalid(path + ".memory_bytes", fmt::format("memory must be positive bytes, got {}", t.memory_bytes));
    }
    if (!positive_finite(t.memory_bandwidth)) {
      invalid(path + ".memory_bandwidth",
              fmt::format("memory bandwidth must be positive and finite bytes/s, got {}", t.memory_bandwidth));
    }
  }

  if (nodes_.empty()) invalid("nodes", "a cluster needs at least one node");
  std::int64_t world = 0;
  for (std::size_t n = 0; n < nodes_.size(); ++n) {
    const Node& node = nodes_[n];
    if (node.devices.empty()) invalid(fmt::format("nodes[{}].devices", n), "a node needs at least one device");
    if (!(node.compute_alone >= 1.0) || !std::isfinite(node.compute_alone)) {
      invalid(fmt::format("nodes[{}].compute_alone", n),
              fmt::format("a rank alone computes at least at its shared rate (>= 1), got {}", node.compute_alone));
    }
    if (node.overlap_interference && !(*node.overlap_interference >= 0 && std::isfinite(*node.overlap_interference))) {
      invalid(fmt::format("nodes[{}].overlap_interference", n),
              fmt::format("a collective beside compute adds a finite share of its time >= 0, got {}",
                          *node.overlap_interference));
    }
    node_first_rank_.push_back(static_cast<int>(world));
    int local = 0;
    for (std::size_t r = 0; r < node.devices.size(); ++r) {
      const DeviceRun& run = node.devices[r];
      const std::string path = run_path(node, n, r);
      const auto type = std::find_if(device_types_.begin(), device_types_.end(),
                                     [&](const DeviceType& t) { return t.name == run.device; });
      if (type == device_types_.end()) {
        invalid(path + ".device",
                fmt::format("unknown device type '{}' (known: {})", run.device, known_types(device_types_)));
      }
      if (run.count < 1) invalid(path + ".count", fmt::format("device count must be at least 1, got {}", run.count));
      world += run.count;
      if (world > kMaxWorldSize) {
        invalid(path + ".count", fmt::format("the cluster would exceed {} ranks", kMaxWorldSize));
      }
      for (int k = 0; k < run.count; ++k) {
        rank_node_.push_back(static_cast<int>(n));
        rank_local_.push_back(local++);
        rank_device_.push_back(static_cast<int>(type - device_types_.begin()));
      }
    }
  }

  if (links_.empty()) invalid("links", "a cluster needs at least one link level");
  const std::size_t last = links_.size() - 1;
  for (std::size_t i = 0; i < links_.size(); ++i) {
    const LinkLevel& level = links_[i];
    const std::string path = fmt::format("links[{}]", i);
    if (level.name.empty()) invalid(path + ".name", "a link level needs a name");
    check_speed(path, level.bandwidth, level.latency);
    if (!std::isfinite(level.call_overhead) || level.call_overhead < 0) {
      invalid(path + ".call_overhead",
              fmt::format("call_overhead must be finite seconds >= 0, got {}", level.call_overhead));
    }
    for (const auto& [device, speed] : level.per_device) {
      const std::string p = fmt::format("{}.per_device.{}", path, device);
      if (find_device_type(device) == nullptr) {
        invalid(p, fmt::format("unknown device type '{}' (known: {})", device, known_types(device_types_)));
      }
      check_speed(p, speed.bandwidth, speed.latency);
    }
    // Spans: [s_0 < s_1 < ... (each dividing the next)], then 0 for the last inner level
    // (the whole node), then 0 for the outermost level (all nodes). Groups then nest.
    const std::string span_path = path + ".span";
    if (i == last) {
      if (level.span != 0) {
        invalid(span_path,
                fmt::format("the outermost level connects nodes and takes no span (0 or absent), got {}", level.span));
      }
    } else if (i + 1 == last) {
      if (level.span != 0) {
        invalid(span_path,
                fmt::format("the last level inside a node must cover the whole node (span 0 or absent), got {}",
                            level.span));
      }
    } else {
      if (level.span < 1) {
        invalid(span_path, fmt::format("an inner level below the whole-node level needs a span of at least 1, got {}",
                                       level.span));
      }
      if (i > 0) {
        const int previous = links_[i - 1].span;
        if (level.span <= previous || level.span % previous != 0) {
          invalid(span_path, fmt::format("spans must nest: {} is not a larger multiple of links[{}].span = {}",
                                         level.span, i - 1, previous));
        }
      }
    }
  }
}

bool Cluster::heterogeneous() const {
  return std::any_of(rank_device_.begin(), rank_device_.end(), [&](int d) { return d != rank_device_.front(); });
}

void Cluster::check_rank(int rank) const {
  if (rank < 0 || rank >= world_size()) {
    throw support::ValidationError(
        fmt::format("rank {} is out of range for a cluster of {} ranks", rank, world_size()));
  }
}

const DeviceType& Cluster::device_of(int rank) const {
  check_rank(rank);
  return device_types_[static_cast<std::size_t>(rank_device_[static_cast<std::size_t>(rank)])];
}

const DeviceType& Cluster::slowest_device(int first, int count, Precision precision) const {
  if (count < 1) throw support::ValidationError(fmt::format("slowest_device: {} ranks", count));
  const DeviceType* slowest = &device_of(first);
  for (int r = first + 1; r < first + count; ++r) {
    const DeviceType& type = device_of(r);
    if (type.peak_flops.at(precision) < slowest->peak_flops.at(precision)) slowest = &type;
  }
  return *slowest;
}

void Cluster::require_precision(Precision precision, std::string_view who) const {
  for (const Node& node : nodes_) {
    for (const DeviceRun& run : node.devices) {
      const DeviceType& type = *find_device_type(run.device);  // the constructor checked every run
      if (type.peak_flops.at(precision) > 0) continue;
      throw support::ValidationError(fmt::format(
          "{}: precision '{}' needs {} matrix units, and device type '{}' has none (its peak_flops lists no '{}'; "
          "H100, H200 and Ada GPUs have them, A100 and V100 do not); choose bf16 there, or give the device's '{}' "
          "peak if it has them",
          who, precision_name(precision), precision == Precision::FP8 ? "FP8" : precision_name(precision), type.name,
          precision_name(precision), precision_name(precision)));
    }
  }
}

std::vector<int> Cluster::ranks_per_node() const {
  std::vector<int> out;
  out.reserve(nodes_.size());
  for (const Node& node : nodes_) out.push_back(node.device_count());
  return out;
}

int Cluster::node_of(int rank) const {
  check_rank(rank);
  return rank_node_[static_cast<std::size_t>(rank)];
}

int Cluster::local_rank(int rank) const {
  check_rank(rank);
  return rank_local_[static_cast<std::size_t>(rank)];
}

int Cluster::first_rank(int node) const {
  if (node < 0 || node >= num_nodes()) {
    throw support::ValidationError(fmt::format("node {} is out of range for a cluster of {} nodes", node, num_nodes()));
  }
  return node_first_rank_[static_cast<std::size_t>(node)];
}

const DeviceType* Cluster::find_device_type(std::string_view name) const {
  for (const auto& t : device_types_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

int Cluster::group_at(int level, int rank) const {
  const auto r = static_cast<std::size_t>(rank);
  if (level == static_cast<int>(links_.size()) - 1) return 0;
  const int span = links_[static_cast<std::size_t>(level)].span;
  if (span == 0) return rank_node_[r];
  // Group g of node n holds local indices [g*span, (g+1)*span). Its id first_rank(n) + g
  // is unique: g < device_count(n), so the ids of node n stay below first_rank(n + 1).
  return node_first_rank_[static_cast<std::size_t>(rank_node_[r])] + rank_local_[r] / span;
}

GroupSpan Cluster::span_of(std::span<const int> ranks) const {
  if (ranks.empty()) throw support::ValidationError("ranks: a group needs at least one rank");
  std::vector<int> sorted(ranks.begin(), ranks.end());
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    check_rank(sorted[i]);
    if (i > 0 && sorted[i] == sorted[i - 1]) {
      throw support::ValidationError(fmt::format("ranks: rank {} appears more than once", sorted[i]));
    }
  }
  GroupSpan span;
  const int levels = static_cast<int>(links_.size());
  for (span.level = 0; span.level + 1 < levels; ++span.level) {
    const int group = group_at(span.level, sorted.front());
    if (std::all_of(sorted.begin(), sorted.end(), [&](int r) { return group_at(span.level, r) == group; })) break;
  }
  // Node-major numbering: sorted ranks visit each node's ranks in one run.
  int run = 0;
  int smallest = std::numeric_limits<int>::max();
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    ++run;
    const bool run_ends = i + 1 == sorted.size() || node_of(sorted[i + 1]) != node_of(sorted[i]);
    if (run_ends) {
      ++span.nodes;
      span.devices_per_node = std::max(span.devices_per_node, run);
      smallest = std::min(smallest, run);
      run = 0;
    }
  }
  span.uniform = smallest == span.devices_per_node;
  return span;
}

LinkSpeed Cluster::link_speed(int level, std::span<const int> ranks) const {
  if (level < 0 || level >= static_cast<int>(links_.size())) {
    throw support::ValidationError(
        fmt::format("link level {} is out of range for a hierarchy of {} levels", level, links_.size()));
  }
  if (ranks.empty()) throw support::ValidationError("ranks: a group needs at least one rank");
  const LinkLevel& link = links_[static_cast<std::size_t>(level)];
  LinkSpeed speed{std::numeric_limits<double>::infinity(), 0.0};
  for (int rank : ranks) {
    const LinkSpeed s = link.speed_for(device_of(rank).name);
    speed.bandwidth = std::min(speed.bandwidth, s.bandwidth);
    speed.latency = std::max(speed.latency, s.latency);
  }
  return speed;
}

Cluster first_ranks(const Cluster& cluster, int count) {
  if (count < 1 || count > cluster.world_size())
    throw support::ValidationError(fmt::format("first_ranks: {} ranks of a cluster of {}", count, cluster.world_size()));
  return rank_range(cluster, 0, count);
}

double overlap_interference(const Cluster& cluster) {
  double out = 0;
  for (const Node& node : cluster.nodes()) out = std::max(out, node.overlap_interference.value_or(kOverlapInterference));
  return out;
}

Cluster rank_range(const Cluster& cluster, int first, int count) {
  if (first < 0 || count < 1 || count > cluster.world_size() - first)
    throw support::ValidationError(fmt::format("rank_range: ranks [{}, {}) of a cluster of {}", first,
                                               std::int64_t{first} + count, cluster.world_size()));
  if (first == 0 && count == cluster.world_size()) return cluster;
  std::vector<Node> nodes;
  int skip = first, left = count;
  for (const Node& node : cluster.nodes()) {
    if (left == 0) break;
    Node part;
    part.compute_alone = node.compute_alone;  // the part's ranks still share the node's cores
    part.overlap_interference = node.overlap_interference;
    for (const DeviceRun& run : node.devices) {
      if (left == 0) break;
      const int skipped = std::min(skip, run.count);
      skip -= skipped;
      const int take = std::min(left, run.count - skipped);
      if (take > 0) part.devices.push_back({run.device, take});
      left -= take;
    }
    if (!part.devices.empty()) nodes.push_back(std::move(part));
  }
  // Only the types its ranks use: a search paces itself by the slowest type it is given.
  std::vector<DeviceType> types;
  for (const DeviceType& type : cluster.device_types()) {
    const bool used = std::any_of(nodes.begin(), nodes.end(), [&](const Node& node) {
      return std::any_of(node.devices.begin(), node.devices.end(),
                         [&](const DeviceRun& run) { return run.device == type.name; });
    });
    if (used) types.push_back(type);
  }
  std::vector<LinkLevel> links = cluster.links();
  for (LinkLevel& level : links)
    std::erase_if(level.per_device, [&](const auto& entry) {
      return std::none_of(types.begin(), types.end(), [&](const DeviceType& t) { return t.name == entry.first; });
    });
  const std::string name = first == 0 ? fmt::format("{} (first {} ranks)", cluster.name(), count)
                                      : fmt::format("{} (ranks {}-{})", cluster.name(), first, first + count - 1);
  return Cluster(name, std::move(types), std::move(nodes), std::move(links));
}

std::string Cluster::summary() const {
  std::string nodes;
  // Consecutive equal nodes print once: "2 x [8 a100-sxm4-80gb]".
  for (std::size_t n = 0; n < nodes_.size();) {
    std::size_t m = n;
    while (m < nodes_.size() && nodes_[m] == nodes_[n]) ++m;
    nodes += fmt::format("{}{} x [{}]", nodes.empty() ? "" : ", ", m - n, describe_node(nodes_[n]));
    n = m;
  }
  std::string links;
  for (std::size_t i = 0; i < links_.size(); ++i) {
    const LinkLevel& l = links_[i];
    links += fmt::format("{}{}", i == 0 ? "" : " < ", l.name);
    if (l.span > 0) links += fmt::format(" (groups of {})", l.span);
    links += fmt::format(" {}", describe_speed(l.bandwidth, l.latency));
    if (l.call_overhead > 0) links += fmt::format(" + {:g} us per call", l.call_overhead * 1e6);
    for (const auto& [device, s] : l.per_device) {
      links += fmt::format(" ({}: {})", device, describe_speed(s.bandwidth, s.latency));
    }
  }
  return fmt::format("{}{}{} rank{} on {} node{}: {}; links {}", name_, name_.empty() ? "" : ": ", world_size(),
                     world_size() == 1 ? "" : "s", num_nodes(), num_nodes() == 1 ? "" : "s", nodes, links);
}

// ---- JSON -----------------------------------------------------------------------------

json cluster_to_json(const Cluster& cluster) {
  json types = json::array();
  for (const auto& t : cluster.device_types()) {
    json flops = json::object();
    for (Precision p : kAllPrecisions) flops[std::string(precision_name(p))] = t.peak_flops.at(p);
    for (Precision p : kOptionalPrecisions)
      if (t.peak_flops.at(p) > 0) flops[std::string(precision_name(p))] = t.peak_flops.at(p);
    types.push_back(json{{"name", t.name},
                         {"peak_flops", std::move(flops)},
                         {"memory_bytes", t.memory_bytes},
                         {"memory_bandwidth", t.memory_bandwidth}});
  }
  json nodes = json::array();
  for (const auto& node : cluster.nodes()) {
    json written;
    if (node.devices.size() == 1) {
      written = json{{"device", node.devices.front().device}, {"count", node.devices.front().count}};
    } else {
      json runs = json::array();
      for (const auto& run : node.devices) runs.push_back(json{{"device", run.device}, {"count", run.count}});
      written = json{{"devices", std::move(runs)}};
    }
    if (node.compute_alone != 1.0) written["compute_alone"] = node.compute_alone;
    if (node.overlap_interference) written["overlap_interference"] = *node.overlap_interference;
    nodes.push_back(std::move(written));
  }
  json links = json::array();
  for (const auto& level : cluster.links()) {
    json l{{"name", level.name}, {"bandwidth", level.bandwidth}, {"latency", level.latency}};
    if (level.span != 0) l["span"] = level.span;
    if (level.call_overhead != 0) l["call_overhead"] = level.call_overhead;
    if (!level.per_device.empty()) {
      json per = json::object();
      for (const auto& [device, s] : level.per_device) {
        per[device] = json{{"bandwidth", s.bandwidth}, {"latency", s.latency}};
      }
      l["per_device"] = std::move(per);
    }
    links.push_back(std::move(l));
  }
  return json{{"format", kFormat},         {"version", kVersion},
              {"name", cluster.name()},    {"device_types", std::move(types)},
              {"nodes", std::move(nodes)}, {"links", std::move(links)}};
}

Cluster cluster_from_json(const json& j) {
  return support::with_json_parse_errors("cluster JSON", [&] {
    require_object(j, "cluster");
    check_keys(j, "cluster", {"format", "version", "name", "device_types", "nodes", "links"});
    if (auto it = j.find("format"); it != j.end()) {
      const std::string format = get_string(*it, "format");
      if (format != kFormat) fail("format", fmt::format("expected \"{}\", got \"{}\"", kFormat, format));
    }
    if (auto it = j.find("version"); it != j.end()) {
      const std::int64_t version = get_int64(*it, "version");
      if (version != kVersion)
        fail("version", fmt::format("unsupported version {} (this build reads {})", version, kVersion));
    }
    std::string name;
    if (auto it = j.find("name"); it != j.end()) name = get_string(*it, "name");
    std::vector<DeviceType> types;  // read in order: a profile may be `like` a type listed before it
    const json& type_list = require_array(require(j, "device_types", "cluster"), "device_types");
    for (std::size_t i = 0; i < type_list.size(); ++i)
      types.push_back(read_device_type(type_list[i], fmt::format("device_types[{}]", i), types));
    std::vector<Node> nodes;
    for (const std::vector<Node>& kind : read_list<std::vector<Node>>(j, "nodes", read_nodes))
      nodes.insert(nodes.end(), kind.begin(), kind.end());
    auto links = read_list<LinkLevel>(j, "links", read_link);
    return Cluster(std::move(name), std::move(types), std::move(nodes), std::move(links));
  });
}

std::string cluster_to_json_string(const Cluster& cluster, int indent) {
  return support::dump_json(cluster_to_json(cluster), indent, "cluster");
}

Cluster cluster_from_json_string(std::string_view text) {
  return cluster_from_json(support::parse_json(text, "invalid cluster JSON"));
}

}  // namespace shardwise::cost
