#include "transform/job_groups.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>

#include "support/error.h"
#include "transform/rank_graph.h"

namespace shardwise::transform {

namespace {

JobGroup group_of(JobGroupKind kind, std::vector<int> ranks = {}) {
  JobGroup g;
  g.kind = kind;
  g.ranks = std::move(ranks);
  return g;
}

}  // namespace

std::vector<std::vector<std::vector<int>>> mesh_axis_groups(const std::vector<int>& mesh) {
  int world = 1;
  for (int size : mesh) {
    if (size < 1) throw support::ValidationError(fmt::format("axis_groups: a mesh axis of size {}", size));
    world *= size;
  }
  std::vector<std::vector<std::vector<int>>> out(mesh.size());
  for (std::size_t a = 0; a < mesh.size(); ++a) {
    std::set<std::vector<int>> seen;
    for (int r = 0; r < world; ++r) {
      std::vector<int> group;
      for (std::int64_t member : axis_group(mesh, static_cast<int>(a), r)) group.push_back(static_cast<int>(member));
      if (seen.insert(group).second) out[a].push_back(std::move(group));
    }
  }
  return out;
}

const char* job_group_kind_name(JobGroupKind kind) {
  switch (kind) {
    case JobGroupKind::Axis: return "axis";
    case JobGroupKind::SubMesh: return "sub_mesh";
    case JobGroupKind::Channel: return "channel";
    case JobGroupKind::SharedLeaf: return "shared_leaf";
  }
  return "?";
}

PipelineBlocks pipeline_blocks(const plan::Plan& plan) {
  PipelineBlocks blocks;
  // (the sub-mesh and, on more than one rank with stage_meshes, its layout) of each number
  std::vector<std::pair<std::vector<int>, std::optional<plan::Sharding>>> seen;
  for (int s = 0; s < plan.pipeline; ++s) {
    blocks.ranks.push_back(plan.stage_ranks(s));
    blocks.meshes.push_back(plan.stage_mesh(s));
    std::optional<plan::Sharding> layout;
    if (!plan.stage_meshes.empty() && plan.stage_size(s) > 1 && !plan.stage_shardings.empty())
      layout = plan.stage_shardings.at(static_cast<std::size_t>(s));
    std::pair<std::vector<int>, std::optional<plan::Sharding>> key{plan.stage_mesh(s), std::move(layout)};
    if (plan.stage_meshes.empty()) key = {};
    auto at = std::find(seen.begin(), seen.end(), key);
    blocks.layouts.push_back(static_cast<int>(at - seen.begin()));
    if (at == seen.end()) seen.push_back(std::move(key));
  }
  check_blocks(blocks);
  return blocks;
}

void check_blocks(const PipelineBlocks& blocks) {
  const std::size_t p = blocks.ranks.size();
  if (p == 0) throw support::ValidationError("job groups: a pipeline of no blocks");
  if (blocks.meshes.size() != p || (!blocks.layouts.empty() && blocks.layouts.size() != p))
    throw support::ValidationError(fmt::format("job groups: {} blocks of ranks, {} sub-meshes, {} layouts", p,
                                               blocks.meshes.size(), blocks.layouts.size()));
  std::set<int> seen;
  for (std::size_t q = 0; q < p; ++q) {
    int size = 1;
    for (int s : blocks.meshes[q]) size *= s;
    if (blocks.ranks[q].empty() || size != static_cast<int>(blocks.ranks[q].size()))
      throw support::ValidationError(fmt::format("job groups: pipeline rank {}'s block holds ranks {}, its sub-mesh "
                                                 "{} has {}", q, blocks.ranks[q], blocks.meshes[q], size));
    for (int r : blocks.ranks[q])
      if (r < 0 || !seen.insert(r).second)
        throw support::ValidationError(fmt::format("job groups: rank {} is in two blocks, or negative (pipeline "
                                                   "rank {})", r, q));
  }
}

std::vector<JobGroup> sub_mesh_groups(const PipelineBlocks& blocks) {
  check_blocks(blocks);
  std::vector<JobGroup> out;
  for (std::size_t q = 0; q < blocks.ranks.size(); ++q) {
    const std::vector<int>& ranks = blocks.ranks[q];
    if (ranks.size() < 2) continue;
    const auto axes = mesh_axis_groups(blocks.meshes[q]);
    for (std::size_t a = 0; a < axes.size(); ++a)
      for (const std::vector<int>& local : axes[a]) {
        JobGroup g = group_of(JobGroupKind::Axis);
        g.block = static_cast<int>(q);
        g.axis = static_cast<int>(a);
        for (int r : local) g.ranks.push_back(ranks[static_cast<std::size_t>(r)]);
        out.push_back(std::move(g));
      }
    JobGroup whole = group_of(JobGroupKind::SubMesh, ranks);
    whole.block = static_cast<int>(q);
    out.push_back(std::move(whole));
  }
  return out;
}

std::vector<JobGroup> channel_groups(const PipelineBlocks& blocks, const std::vector<schedule::P2PChannel>& channels) {
  check_blocks(blocks);
  const int p = static_cast<int>(blocks.ranks.size());
  std::vector<JobGroup> out;
  for (const schedule::P2PChannel& c : channels) {
    if (c.sender < 0 || c.sender >= p || c.receiver < 0 || c.receiver >= p || c.sender == c.receiver)
      throw support::ValidationError(fmt::format("job groups: a channel from pipeline rank {} to {} in a pipeline "
                                                 "of {}", c.sender, c.receiver, p));
    const std::vector<int>& senders = blocks.ranks[static_cast<std::size_t>(c.sender)];
    const std::vector<int>& receivers = blocks.ranks[static_cast<std::size_t>(c.receiver)];
    for (std::size_t k = 0; k < receivers.size(); ++k) {
      JobGroup g = group_of(JobGroupKind::Channel, {senders[k % senders.size()], receivers[k]});
      g.channel = c;
      out.push_back(std::move(g));
    }
  }
  return out;
}

std::vector<JobGroup> shared_leaf_groups(const PipelineBlocks& blocks,
                                         const std::map<std::string, std::set<int>>& owners) {
  check_blocks(blocks);
  const int p = static_cast<int>(blocks.ranks.size());
  auto layout = [&](int q) { return blocks.layouts.empty() ? 0 : blocks.layouts[static_cast<std::size_t>(q)]; };
  std::vector<JobGroup> out;
  for (const auto& [leaf, readers] : owners) {  // (a std::map: leaves in name order)
    for (int q : readers)
      if (q < 0 || q >= p)
        throw support::ValidationError(fmt::format("job groups: leaf {} is read on pipeline rank {} of {}", leaf,
                                                   q, p));
    if (readers.size() < 2) continue;
    const int first = *readers.begin();
    bool one_layout = true;
    for (int q : readers) one_layout = one_layout && layout(q) == layout(first);
    if (one_layout) {
      const std::size_t size = blocks.ranks[static_cast<std::size_t>(first)].size();
      for (std::size_t coordinate = 0; coordinate < size; ++coordinate) {
        JobGroup g = group_of(JobGroupKind::SharedLeaf);
        g.leaf = leaf;
        for (int q : readers) {
          const std::vector<int>& block = blocks.ranks[static_cast<std::size_t>(q)];
          if (block.size() != size)
            throw support::ValidationError(fmt::format("job groups: pipeline ranks {} and {} share a layout number "
                                                       "but hold {} and {} ranks", first, q, size, block.size()));
          g.ranks.push_back(block[coordinate]);
        }
        out.push_back(std::move(g));
      }
    } else {
      JobGroup g = group_of(JobGroupKind::SharedLeaf);
      g.leaf = leaf;
      g.whole = true;
      for (int q : readers)
        for (int r : blocks.ranks[static_cast<std::size_t>(q)]) g.ranks.push_back(r);
      out.push_back(std::move(g));
    }
  }
  return out;
}

}  // namespace shardwise::transform
