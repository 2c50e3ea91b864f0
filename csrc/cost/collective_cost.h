// How long a collective takes on a Cluster: the alpha-beta model, behind an interface
// (CollectiveCostModel) so a profiled model can replace it without touching its callers.
//
// `bytes` is one number per call, always the size of a whole buffer, never a per-step
// chunk:
//   AllReduce       the buffer every rank holds (input = output)
//   AllGather       the gathered OUTPUT (each rank contributes bytes / n)
//   ReduceScatter   the INPUT every rank holds (each rank ends with bytes / n)
//   AllToAll        each rank's buffer (input = output size; it keeps 1/n, sends the rest).
//                   Resharding Shard(i) -> Shard(j) a tensor of logical size T: bytes = T / n.
//   Broadcast       the root's buffer, received whole by every rank
//   SendRecv        the message from ranks[0] to ranks[1]
// With n ranks, B bytes, and bw / a the bandwidth and latency of the link the group
// crosses (Cluster::span_of, Cluster::link_speed: the outermost level it spans, at the
// pace of its slowest member):
//   Ring          AllReduce                  2(n-1)/n * B/bw + 2(n-1) a
//                 AllGather, ReduceScatter   (n-1)/n * B/bw + (n-1) a
//                 AllToAll (pairwise)        (n-1)/n * B/bw + (n-1) a
//                 Broadcast (pipelined)      B/bw + (n-1) a
//                 SendRecv                   B/bw + a
//   Hierarchical  for a group covering m >= 2 nodes with the same k >= 2 ranks on each:
//                 AllReduce     reduce-scatter inside each node (k ranks, B), all-reduce
//                               across nodes on B/k (k concurrent rings, one per local
//                               index, each device using its own NIC share), all-gather
//                               inside each node (B)
//                 AllGather     all-gather across nodes (B/k), then inside nodes (B)
//                 ReduceScatter inside nodes (B), then across nodes (B/k)
//                 Broadcast     across nodes (m ranks, B), then inside nodes (k ranks, B)
//                 A phase inside nodes uses each node's own innermost level holding its k
//                 ranks; concurrent rings cost the slowest of them.
//                 AllToAll and SendRecv have no hierarchical form.
//   Auto          the faster of the two (Ring on a tie or where Hierarchical does not apply).
// Each call adds the outermost level's call_overhead once (cost/cluster.h; 0 on the GPU
// presets), whatever the algorithm: two collectives cost two of it, one all-reduce one.
// An explicit Hierarchical that does not apply falls back to Ring; the estimate says which
// algorithm it priced. A group of one rank, or zero bytes, costs 0 (NCCL returns at once).
//
// Errors (support::ValidationError): an empty group, a duplicate or out-of-range rank,
// bytes < 0, SendRecv over more than 2 ranks.
//
// Worked example (preset "dgx-a100", 2 nodes: NVSwitch 300 GB/s, 3 us; IB 25 GB/s, 7 us):
//   std::vector<int> node0 = {0, 1, 2, 3, 4, 5, 6, 7};
//   collective_time(c, CollectiveKind::AllReduce, node0, 1 << 30);
//     ring on NVSwitch: 2*7/8 * 2^30 / 3e11 + 14 * 3e-6 = 6.305 ms
//   std::vector<int> all(16); std::iota(all.begin(), all.end(), 0);
//   estimate_collective(c, CollectiveKind::AllReduce, all, 1 << 30);
//     ring on IB:    2*15/16 * 2^30 / 2.5e10 + 30 * 7e-6   = 80.74 ms
//     hierarchical:  2 * (7/8 * 2^30 / 3e11 + 7 * 3e-6)    =  6.31 ms inside nodes
//                    + 2*1/2 * 2^27 / 2.5e10 + 2 * 7e-6     =  5.38 ms across nodes
//     -> {11.69 ms, Algorithm::Hierarchical}
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "cost/cluster.h"

namespace shardwise::cost {

enum class CollectiveKind : std::uint8_t { AllReduce, AllGather, ReduceScatter, AllToAll, Broadcast, SendRecv };
enum class Algorithm : std::uint8_t { Auto, Ring, Hierarchical };

// "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv".
std::string_view collective_kind_name(CollectiveKind kind);
std::optional<CollectiveKind> parse_collective_kind(std::string_view name);
// As parse_collective_kind, but an unknown name is a ValidationError listing the known ones.
CollectiveKind collective_kind_from_name(std::string_view name);

// "auto", "ring", "hierarchical".
std::string_view algorithm_name(Algorithm algorithm);
std::optional<Algorithm> parse_algorithm(std::string_view name);
Algorithm algorithm_from_name(std::string_view name);

struct CollectiveEstimate {
  double seconds = 0;
  Algorithm algorithm = Algorithm::Ring;  // the one priced: never Auto

  friend bool operator==(const CollectiveEstimate&, const CollectiveEstimate&) = default;
};

// The interface the search and the schedule simulator call. Implementations override
// do_estimate; callers use estimate / time (non-virtual, so the default argument is the
// same whoever implements it).
class CollectiveCostModel {
 public:
  virtual ~CollectiveCostModel() = default;

  CollectiveEstimate estimate(CollectiveKind kind, std::span<const int> ranks, std::int64_t bytes,
                              Algorithm algorithm = Algorithm::Auto) const {
    return do_estimate(kind, ranks, bytes, algorithm);
  }
  double time(CollectiveKind kind, std::span<const int> ranks, std::int64_t bytes,
              Algorithm algorithm = Algorithm::Auto) const {
    return do_estimate(kind, ranks, bytes, algorithm).seconds;
  }

 protected:
  virtual CollectiveEstimate do_estimate(CollectiveKind kind, std::span<const int> ranks, std::int64_t bytes,
                                         Algorithm algorithm) const = 0;
};

// The alpha-beta model above. Keeps a reference: the cluster must outlive it.
class AlphaBetaCollectiveCost final : public CollectiveCostModel {
 public:
  explicit AlphaBetaCollectiveCost(const Cluster& cluster) : cluster_(&cluster) {}
  explicit AlphaBetaCollectiveCost(Cluster&&) = delete;  // would dangle

  const Cluster& cluster() const { return *cluster_; }

 private:
  CollectiveEstimate do_estimate(CollectiveKind kind, std::span<const int> ranks, std::int64_t bytes,
                                 Algorithm algorithm) const override;

  const Cluster* cluster_;
};

// The alpha-beta model as free functions.
CollectiveEstimate estimate_collective(const Cluster& cluster, CollectiveKind kind, std::span<const int> ranks,
                                       std::int64_t bytes, Algorithm algorithm = Algorithm::Auto);
double collective_time(const Cluster& cluster, CollectiveKind kind, std::span<const int> ranks, std::int64_t bytes,
                       Algorithm algorithm = Algorithm::Auto);

}  // namespace shardwise::cost
