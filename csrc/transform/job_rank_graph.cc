#include "transform/job_rank_graph.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "support/error.h"
#include "transform/local_shard.h"

namespace shardwise::transform {

namespace {

using Texts = std::vector<std::string>;
using Shape = std::vector<std::int64_t>;

// Each value's shape and the texts its blocks follow: its placement, where a Shard of its
// batch dim has no ratios of its own on an axis where the inputs' batch has some, with those
// (spmd_rewrite.cc spreads them so). Values alike in both appear once.
std::set<std::pair<Shape, Texts>> blocked_values(const ir::Graph& global, const plan::Sharding& sharding) {
  const std::size_t axes = sharding.mesh.size();
  std::vector<std::string> batch_ratios(axes);  // the "[...]" of the inputs' batch Shard, per axis
  for (ir::ValueId in : global.inputs()) {
    const ir::Value& v = global.value(in);
    auto it = sharding.placements.find(v.name);
    if (it == sharding.placements.end() || !v.type.batch_dim) continue;
    const std::string shard = fmt::format("S({})[", *v.type.batch_dim);
    for (std::size_t a = 0; a < axes && a < it->second.size(); ++a)
      if (it->second[a].starts_with(shard)) batch_ratios[a] = it->second[a].substr(shard.size() - 1);
  }
  std::set<std::pair<Shape, Texts>> out;
  for (const ir::Value& v : global.values()) {
    auto it = sharding.placements.find(v.name);
    if (it == sharding.placements.end() || it->second.size() != axes) continue;
    Texts texts = it->second;
    for (std::size_t a = 0; a < axes && v.type.batch_dim; ++a)
      if (!batch_ratios[a].empty() && texts[a] == fmt::format("S({})", *v.type.batch_dim)) texts[a] += batch_ratios[a];
    out.emplace(v.type.shape, std::move(texts));
  }
  return out;
}

// The local shape of every value on `rank`, in blocked_values' order (a placement that does
// not divide its shape leaves an empty shape: the rewrite adapts or refuses it alike on every
// coordinate that fails).
std::vector<Shape> block_sizes(const std::set<std::pair<Shape, Texts>>& values, const std::vector<int>& mesh,
                               int rank) {
  std::vector<Shape> sizes;
  for (const auto& [shape, texts] : values) {
    try {
      sizes.push_back(local_shard(shape, texts, mesh, rank).shape);
    } catch (const support::ValidationError&) {
      sizes.emplace_back();
    }
  }
  return sizes;
}

}  // namespace

std::vector<int> whole_node_ranks(const ir::Graph& global, const plan::Sharding& sharding, int rank) {
  const std::vector<int>& mesh = sharding.mesh;
  std::vector<std::size_t> uneven;  // the axes some placement splits with ratios
  for (std::size_t a = 0; a < mesh.size(); ++a)
    for (const auto& [name, spec] : sharding.placements)
      if (a < spec.size() && spec[a].find('[') != std::string::npos) {
        uneven.push_back(a);
        break;
      }
  std::vector<int> stride(mesh.size(), 1), coordinate(mesh.size(), 0);
  for (std::size_t a = mesh.size(); a-- > 0;) {
    if (a + 1 < mesh.size()) stride[a] = stride[a + 1] * mesh[a + 1];
    coordinate[a] = (rank / stride[a]) % mesh[a];
  }
  const auto at = [&](int r, std::size_t a, int k) { return r + (k - coordinate[a]) * stride[a]; };
  std::vector<int> ranks{rank};
  if (uneven.size() == 1) {  // one rank per distinct set of block sizes along the axis
    const std::size_t a = uneven.front();
    const auto values = blocked_values(global, sharding);
    std::map<std::vector<Shape>, int> classes{{block_sizes(values, mesh, rank), rank}};
    for (int k = 0; k < mesh[a]; ++k) {
      const int r = at(rank, a, k);
      if (classes.emplace(block_sizes(values, mesh, r), r).second) ranks.push_back(r);
    }
  } else {
    for (std::size_t a : uneven) {  // every combination: the axes' blocks may depend on each other
      std::vector<int> more;
      for (int r : ranks)
        for (int k = 0; k < mesh[a]; ++k) more.push_back(at(r, a, k));
      ranks = std::move(more);
    }
  }
  std::sort(ranks.begin(), ranks.end());
  return ranks;
}

RankGraph job_rank_graph(const ir::Graph& global, const plan::Sharding& sharding, int rank,
                         const RewriteOptions& options) {
  const std::vector<int> ranks = whole_node_ranks(global, sharding, rank);
  RewriteOptions opts = options;
  // Each round builds every representative's graph with the union so far; it ends when they
  // all run the same nodes whole. The union only grows and is bounded by the nodes.
  for (std::size_t round = 0;; ++round) {
    std::optional<RankGraph> own;
    std::set<std::string> seen;
    bool alike = true;
    std::optional<std::set<std::string>> first;
    for (int r : ranks) {
      RankGraph graph = rank_graph(global, sharding, r, opts);
      const std::set<std::string> whole(graph.whole.begin(), graph.whole.end());
      alike = alike && (!first || whole == *first);
      if (!first) first = whole;
      seen.insert(whole.begin(), whole.end());
      if (r == rank) own = std::move(graph);
    }
    if (alike) return std::move(*own);
    if (round > global.nodes().size())
      throw support::ValidationError(
          fmt::format("rewrite: rank {}: the ranks {} still run different nodes whole after {} rounds", rank,
                      fmt::join(ranks, ","), round));
    opts.whole_nodes.insert(seen.begin(), seen.end());
  }
}

}  // namespace shardwise::transform
