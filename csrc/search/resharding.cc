#include "search/resharding.h"

#include <fmt/format.h>

#include <cmath>
#include <vector>

#include "support/error.h"

namespace shardwise::search {
namespace {

// Two shares are the same data when they agree to this; ratios come from a balance search
// and parse_placement already accepts sums off by 1e-9.
constexpr double kRatioTolerance = 1e-9;

// Each rank's share of the dim: the ratios, or n equal shares for an even shard.
std::vector<double> shares(const Placement& p, int axis_size) {
  if (!p.ratios.empty()) return p.ratios;
  return std::vector<double>(static_cast<std::size_t>(axis_size), 1.0 / axis_size);
}

bool same_shares(const Placement& a, const Placement& b, int axis_size) {
  const auto x = shares(a, axis_size), y = shares(b, axis_size);
  if (x.size() != y.size()) return false;
  for (std::size_t r = 0; r < x.size(); ++r) {
    if (std::abs(x[r] - y[r]) > kRatioTolerance) return false;
  }
  return true;
}

}  // namespace

std::optional<ReshardStep> reshard_step(const Placement& from, const Placement& to, std::int64_t tensor_bytes,
                                        int axis_size) {
  if (axis_size < 1) throw support::ValidationError(fmt::format("axis size {} must be at least 1", axis_size));
  if (tensor_bytes < 0) throw support::ValidationError(fmt::format("tensor bytes {} are negative", tensor_bytes));
  using cost::CollectiveKind;
  const std::int64_t b = tensor_bytes;
  switch (from.kind) {
    case PlacementKind::Replicate:
      // Every rank holds everything: slicing or keeping one rank's copy as the partial
      // (the others zeroing theirs) needs no traffic.
      return std::nullopt;
    case PlacementKind::Shard:
      if (to.is_replicate() || to.is_partial()) {
        // To Partial: gather, then every rank but one zeroes its copy locally.
        return ReshardStep{CollectiveKind::AllGather, b};
      }
      if (to.dim == from.dim && to.groups == from.groups && same_shares(from, to, axis_size)) return std::nullopt;
      // Uneven or strided (grouped) blocks, and a change of grouping on one dim, take no
      // all-to-all (transform/reshard_actions.h): gathered, then cut, as the runtime runs them.
      if (!from.ratios.empty() || !to.ratios.empty() || from.groups != 1 || to.groups != 1 || to.dim == from.dim)
        return ReshardStep{CollectiveKind::AllGather, b};
      // AllToAll's bytes are each rank's buffer: its 1/n of the tensor (collective_cost.h).
      return ReshardStep{CollectiveKind::AllToAll, b / axis_size};
    case PlacementKind::Partial:
      if (to.is_replicate()) return ReshardStep{CollectiveKind::AllReduce, b};
      // ... and no reduce-scatter for uneven blocks or a mean (Gloo has no average: the
      // rewrite all-reduces it whole and divides): all-reduced, then cut.
      if (to.is_shard())
        return ReshardStep{to.ratios.empty() && from.reduction != ops::Reduction::Mean ? CollectiveKind::ReduceScatter
                                                                                      : CollectiveKind::AllReduce,
                           b};
      if (to.reduction == from.reduction) return std::nullopt;
      // A sum and a mean differ by the factor n: each rank rescales its own.
      if ((from.reduction == ops::Reduction::Sum || from.reduction == ops::Reduction::Mean) &&
          (to.reduction == ops::Reduction::Sum || to.reduction == ops::Reduction::Mean))
        return std::nullopt;
      // Another reduction needs the true value first; every rank then holds it, which is a
      // valid partial of any reduction once the others are neutralised locally.
      return ReshardStep{CollectiveKind::AllReduce, b};
  }
  return std::nullopt;
}

double reshard_time(const cost::CostModel& model, const cost::Cluster& cluster, std::span<const int> axis_ranks,
                    const Placement& from, const Placement& to, std::int64_t tensor_bytes) {
  const auto step = reshard_step(from, to, tensor_bytes, static_cast<int>(axis_ranks.size()));
  if (!step) return 0.0;
  return model.collective_time(cluster, step->kind, axis_ranks, step->bytes, cost::Algorithm::Auto);
}

}  // namespace shardwise::search
