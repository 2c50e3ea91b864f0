#include "transform/local_shard.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "search/placement.h"
#include "support/error.h"

namespace shardwise::transform {
namespace {

using support::ValidationError;

std::vector<IndexRun> to_runs(const std::vector<std::int64_t>& indices) {
  std::vector<IndexRun> runs;
  for (std::int64_t i : indices) {
    if (!runs.empty() && runs.back().second == i) {
      runs.back().second = i + 1;
    } else {
      runs.emplace_back(i, i + 1);
    }
  }
  return runs;
}

// Block k of n consecutive blocks of `held`, at the given boundaries.
std::vector<std::int64_t> block(const std::vector<std::int64_t>& held, std::int64_t begin, std::int64_t end) {
  return {held.begin() + begin, held.begin() + end};
}

}  // namespace

std::pair<std::int64_t, std::int64_t> block_bounds(std::int64_t length, int n, int k,
                                                   const std::vector<double>& ratios) {
  if (n < 1 || k < 0 || k >= n || length < 0)
    throw ValidationError(fmt::format("block bounds: block {} of {} over {} elements", k, n, length));
  if (ratios.empty()) {
    if (length % n != 0)
      throw ValidationError(fmt::format("block bounds: {} elements do not split into {} equal blocks", length, n));
    return {k * (length / n), (k + 1) * (length / n)};
  }
  if (ratios.size() != static_cast<std::size_t>(n))
    throw ValidationError(fmt::format("block bounds: {} ratios for {} blocks", ratios.size(), n));
  double before = 0;
  for (int r = 0; r < k; ++r) before += ratios[static_cast<std::size_t>(r)];
  const double through = before + ratios[static_cast<std::size_t>(k)];
  const auto at = [length](double share) {
    return std::clamp<std::int64_t>(std::llround(share * static_cast<double>(length)), 0, length);
  };
  const std::int64_t begin = at(before);
  const std::int64_t end = k == n - 1 ? length : at(through);
  return {begin, std::max(begin, end)};
}

LocalShard local_shard(const std::vector<std::int64_t>& shape, const std::vector<std::string>& placements,
                       const std::vector<int>& mesh, int rank) {
  if (placements.size() != mesh.size())
    throw ValidationError(
        fmt::format("local shard: {} placements for a mesh of {} axes", placements.size(), mesh.size()));
  int world = 1;
  for (int size : mesh) {
    if (size < 1) throw ValidationError(fmt::format("local shard: mesh axis of size {}", size));
    world *= size;
  }
  if (rank < 0 || rank >= world)
    throw ValidationError(fmt::format("local shard: rank {} outside a mesh of {} ranks", rank, world));

  std::vector<std::vector<std::int64_t>> held(shape.size());
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] < 0) throw ValidationError(fmt::format("local shard: dim {} of size {}", d, shape[d]));
    for (std::int64_t i = 0; i < shape[d]; ++i) held[d].push_back(i);
  }

  LocalShard out;
  for (std::size_t a = 0; a < mesh.size(); ++a) {
    int stride = 1;
    for (std::size_t b = a + 1; b < mesh.size(); ++b) stride *= mesh[b];
    const int n = mesh[a];
    const int k = (rank / stride) % n;
    const search::Placement p = search::parse_placement(placements[a]);
    if (p.is_partial()) out.partial = true;
    if (!p.is_shard()) continue;
    if (p.dim < 0 || static_cast<std::size_t>(p.dim) >= shape.size())
      throw ValidationError(fmt::format("local shard: {} on axis {} for a tensor of {} dims", placements[a], a,
                                        shape.size()));
    auto& indices = held[static_cast<std::size_t>(p.dim)];
    const auto length = static_cast<std::int64_t>(indices.size());
    if (!p.ratios.empty()) {
      if (p.ratios.size() != static_cast<std::size_t>(n))
        throw ValidationError(fmt::format("local shard: {} on axis {} of {} ranks: one ratio per rank", placements[a],
                                          a, n));
      const auto [begin, end] = block_bounds(length, n, k, p.ratios);
      indices = block(indices, begin, end);
      continue;
    }
    const std::int64_t groups = p.groups;
    if (groups < 1 || length % (groups * n) != 0)
      throw ValidationError(fmt::format("local shard: {} on axis {}: dim {} holds {} elements here, not a multiple of "
                                        "{} groups x {} ranks",
                                        placements[a], a, p.dim, length, groups, n));
    const std::int64_t group_length = length / groups;
    const auto [begin, end] = block_bounds(group_length, n, k, {});
    std::vector<std::int64_t> kept;
    for (std::int64_t g = 0; g < groups; ++g) {
      const auto first = indices.begin() + g * group_length;
      kept.insert(kept.end(), first + begin, first + end);
    }
    indices = std::move(kept);
  }
  for (const auto& indices : held) {
    out.dims.push_back(to_runs(indices));
    out.shape.push_back(static_cast<std::int64_t>(indices.size()));
  }
  return out;
}

}  // namespace shardwise::transform
