#include "cost/collective_cost.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "support/enum_names.h"
#include "support/error.h"

namespace shardwise::cost {
namespace {

constexpr auto kKindNames = support::enum_names<CollectiveKind>({
    {CollectiveKind::AllReduce, "all_reduce"}, {CollectiveKind::AllGather, "all_gather"},
    {CollectiveKind::ReduceScatter, "reduce_scatter"}, {CollectiveKind::AllToAll, "all_to_all"},
    {CollectiveKind::Broadcast, "broadcast"}, {CollectiveKind::SendRecv, "send_recv"},
});
constexpr auto kAlgorithmNames = support::enum_names<Algorithm>(
    {{Algorithm::Auto, "auto"}, {Algorithm::Ring, "ring"}, {Algorithm::Hierarchical, "hierarchical"}});

// One flat ring (or pairwise exchange) of n ranks over a link of speed s.
double ring_time(CollectiveKind kind, int n, double bytes, LinkSpeed s) {
  const double steps = n - 1;
  const double share = steps / n;  // fraction of the buffer each rank sends in one pass
  switch (kind) {
    case CollectiveKind::AllReduce:
      return 2 * share * bytes / s.bandwidth + 2 * steps * s.latency;
    case CollectiveKind::AllGather:
    case CollectiveKind::ReduceScatter:
    case CollectiveKind::AllToAll:
      return share * bytes / s.bandwidth + steps * s.latency;
    // Pipelined: the root streams chunks round the ring, so the whole buffer crosses each
    // link once and the last rank waits n-1 hops for the first chunk.
    case CollectiveKind::Broadcast:
      return bytes / s.bandwidth + steps * s.latency;
    case CollectiveKind::SendRecv:
      return bytes / s.bandwidth + s.latency;
  }
  return 0;
}

// A ring over `ranks`, at the speed of the outermost level they span.
double flat_ring(const Cluster& cluster, CollectiveKind kind, std::span<const int> ranks, double bytes) {
  const int level = cluster.span_of(ranks).level;
  return ring_time(kind, static_cast<int>(ranks.size()), bytes, cluster.link_speed(level, ranks));
}

// Several rings running at once: the phase ends with the slowest.
double slowest_ring(const Cluster& cluster, CollectiveKind kind, const std::vector<std::vector<int>>& rings,
                    double bytes) {
  double worst = 0;
  for (const auto& ring : rings) worst = std::max(worst, flat_ring(cluster, kind, ring, bytes));
  return worst;
}

// The two-level algorithm, or nullopt where it does not apply (see the header).
std::optional<double> hierarchical_time(const Cluster& cluster, CollectiveKind kind, std::span<const int> ranks,
                                        const GroupSpan& span, double bytes) {
  const bool has_form = kind == CollectiveKind::AllReduce || kind == CollectiveKind::AllGather ||
                        kind == CollectiveKind::ReduceScatter || kind == CollectiveKind::Broadcast;
  if (!has_form || span.nodes < 2 || span.devices_per_node < 2 || !span.uniform) return std::nullopt;

  // Sorted ranks are node-major: cut them into one list per node, then take the j-th rank
  // of every node as inter-node ring j.
  std::vector<int> sorted(ranks.begin(), ranks.end());
  std::sort(sorted.begin(), sorted.end());
  const auto k = static_cast<std::size_t>(span.devices_per_node);
  std::vector<std::vector<int>> inside(static_cast<std::size_t>(span.nodes));
  std::vector<std::vector<int>> across(k);
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    inside[i / k].push_back(sorted[i]);
    across[i % k].push_back(sorted[i]);
  }
  const double chunk = bytes / static_cast<double>(k);
  switch (kind) {
    case CollectiveKind::AllReduce:
      return slowest_ring(cluster, CollectiveKind::ReduceScatter, inside, bytes) +
             slowest_ring(cluster, CollectiveKind::AllReduce, across, chunk) +
             slowest_ring(cluster, CollectiveKind::AllGather, inside, bytes);
    case CollectiveKind::AllGather:
      return slowest_ring(cluster, CollectiveKind::AllGather, across, chunk) +
             slowest_ring(cluster, CollectiveKind::AllGather, inside, bytes);
    case CollectiveKind::ReduceScatter:
      return slowest_ring(cluster, CollectiveKind::ReduceScatter, inside, bytes) +
             slowest_ring(cluster, CollectiveKind::ReduceScatter, across, chunk);
    case CollectiveKind::Broadcast:
      // The root's column carries the inter-node broadcast; which column that is depends
      // on the root, so price the slowest.
      return slowest_ring(cluster, CollectiveKind::Broadcast, across, bytes) +
             slowest_ring(cluster, CollectiveKind::Broadcast, inside, bytes);
    default:
      return std::nullopt;
  }
}

}  // namespace

std::string_view collective_kind_name(CollectiveKind kind) { return kKindNames.name(kind); }

std::optional<CollectiveKind> parse_collective_kind(std::string_view name) { return kKindNames.parse(name); }

CollectiveKind collective_kind_from_name(std::string_view name) {
  if (auto k = parse_collective_kind(name)) return *k;
  throw support::ValidationError(fmt::format("unknown collective '{}' (known: {})", name, kKindNames.known()));
}

std::string_view algorithm_name(Algorithm algorithm) { return kAlgorithmNames.name(algorithm); }

std::optional<Algorithm> parse_algorithm(std::string_view name) { return kAlgorithmNames.parse(name); }

Algorithm algorithm_from_name(std::string_view name) {
  if (auto a = parse_algorithm(name)) return *a;
  throw support::ValidationError(
      fmt::format("unknown collective algorithm '{}' (known: {})", name, kAlgorithmNames.known()));
}

CollectiveEstimate AlphaBetaCollectiveCost::do_estimate(CollectiveKind kind, std::span<const int> ranks,
                                                        std::int64_t bytes, Algorithm algorithm) const {
  return estimate_collective(*cluster_, kind, ranks, bytes, algorithm);
}

CollectiveEstimate estimate_collective(const Cluster& cluster, CollectiveKind kind, std::span<const int> ranks,
                                       std::int64_t bytes, Algorithm algorithm) {
  // Check the arguments before the early returns, so a bad call fails whatever its size.
  const GroupSpan span = cluster.span_of(ranks);
  if (bytes < 0) throw support::ValidationError(fmt::format("bytes: must be >= 0, got {}", bytes));
  if (kind == CollectiveKind::SendRecv && ranks.size() > 2) {
    throw support::ValidationError(fmt::format("send_recv: takes 2 ranks (source, destination), got {}", ranks.size()));
  }
  if (ranks.size() == 1 || bytes == 0) return {0.0, Algorithm::Ring};

  const auto b = static_cast<double>(bytes);
  // One call, whichever algorithm runs it: the outermost level's overhead, once.
  const double call = cluster.links()[static_cast<std::size_t>(span.level)].call_overhead;
  const double ring = ring_time(kind, static_cast<int>(ranks.size()), b, cluster.link_speed(span.level, ranks));
  if (algorithm == Algorithm::Ring) return {call + ring, Algorithm::Ring};
  const std::optional<double> hierarchical = hierarchical_time(cluster, kind, ranks, span, b);
  if (!hierarchical) return {call + ring, Algorithm::Ring};
  if (algorithm == Algorithm::Hierarchical || *hierarchical < ring)
    return {call + *hierarchical, Algorithm::Hierarchical};
  return {call + ring, Algorithm::Ring};
}

double collective_time(const Cluster& cluster, CollectiveKind kind, std::span<const int> ranks, std::int64_t bytes,
                       Algorithm algorithm) {
  return estimate_collective(cluster, kind, ranks, bytes, algorithm).seconds;
}

}  // namespace shardwise::cost
