#include "transform/job_rank_graph.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "search/placement.h"
#include "support/error.h"
#include "transform/spmd_rewrite.h"
#include "transform/local_shard.h"
#include "transform/rank_passes.h"

namespace shardwise::transform {

namespace {

using Texts = std::vector<std::string>;
using Shape = std::vector<std::int64_t>;

// Each value's shape and the texts its blocks follow: its placement, the inputs' uneven batch
// shares spread as the rewrite spreads them (spmd_rewrite.h: spread_batch_ratios). Values
// alike in both appear once.
std::set<std::pair<Shape, Texts>> blocked_values(const ir::Graph& global, const plan::Sharding& sharding) {
  const std::size_t axes = sharding.mesh.size();
  std::map<ir::ValueId, search::ShardingSpec> specs;
  for (const ir::Value& v : global.values()) {
    auto it = sharding.placements.find(v.name);
    if (it == sharding.placements.end() || it->second.size() != axes) continue;
    search::ShardingSpec& spec = specs[v.id];
    for (const std::string& text : it->second) spec.push_back(search::parse_placement(text));
  }
  const auto batch_ratios = input_batch_ratios(global, axes, [&](const ir::Value& v) -> const search::ShardingSpec* {
    auto it = specs.find(v.id);
    return it == specs.end() ? nullptr : &it->second;
  });
  std::set<std::pair<Shape, Texts>> out;
  for (auto& [id, spec] : specs) {
    const ir::Value& v = global.value(id);
    spread_batch_ratios(spec, v, batch_ratios);
    Texts texts;
    for (const search::Placement& p : spec) texts.push_back(p.str());
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
  // Rank r's peers along axis a, in coordinate order (rank_graph.h: axis_group).
  const auto along = [&](int r, std::size_t a) { return axis_group(mesh, static_cast<int>(a), r); };
  std::vector<int> ranks{rank};
  if (uneven.size() == 1) {  // one rank per distinct set of block sizes along the axis
    const std::size_t a = uneven.front();
    const auto values = blocked_values(global, sharding);
    std::map<std::vector<Shape>, int> classes{{block_sizes(values, mesh, rank), rank}};
    for (std::int64_t r : along(rank, a))
      if (classes.emplace(block_sizes(values, mesh, static_cast<int>(r)), static_cast<int>(r)).second)
        ranks.push_back(static_cast<int>(r));
  } else {
    for (std::size_t a : uneven) {  // every combination: the axes' blocks may depend on each other
      std::vector<int> more;
      for (int r : ranks)
        for (std::int64_t peer : along(r, a)) more.push_back(static_cast<int>(peer));
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
    if (alike) {
      run_rank_passes(own->graph, sharding);  // the features the plan switches on (rank_passes.h)
      return std::move(*own);
    }
    if (round > global.nodes().size())
      throw support::ValidationError(
          fmt::format("rewrite: rank {}: the ranks {} still run different nodes whole after {} rounds", rank,
                      fmt::join(ranks, ","), round));
    opts.whole_nodes.insert(seen.begin(), seen.end());
  }
}

}  // namespace shardwise::transform
