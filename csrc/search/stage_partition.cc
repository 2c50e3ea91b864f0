#include "search/stage_partition.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <map>
#include <set>
#include <utility>

#include "analysis/repeated_blocks.h"
#include "support/error.h"

namespace shardwise::search {
namespace {

using support::ValidationError;

struct ValueFlow {
  int key = 0;  // dedup key (value id, or a unique negative key)
  int value = -1;
  std::string name;
  int producer = 0;
  double bytes = 0.0;
  std::vector<int> readers;  // sorted, unique
};

// Groups edges by value, in order of first appearance.
std::vector<ValueFlow> value_flows(const StagePartitionProblem& p) {
  std::vector<ValueFlow> flows;
  std::map<int, std::size_t> index;
  for (std::size_t e = 0; e < p.edges.size(); ++e) {
    const Edge& edge = p.edges[e];
    const int n = static_cast<int>(p.node_cost.size());
    if (edge.from_node < 0 || edge.to_node >= n || edge.from_node >= edge.to_node) {
      throw ValidationError(fmt::format("stage partition: edge {} ({} -> {}) is not a forward edge between nodes 0..{}",
                                        e, edge.from_node, edge.to_node, n - 1));
    }
    const int key = edge.value >= 0 ? edge.value : -static_cast<int>(e) - 1;
    auto [it, inserted] = index.emplace(key, flows.size());
    if (inserted) {
      flows.push_back(ValueFlow{key, edge.value, edge.value_name, edge.from_node, edge.bytes, {}});
    }
    ValueFlow& flow = flows[it->second];
    if (flow.producer != edge.from_node) {
      throw ValidationError(fmt::format("stage partition: value {} ('{}') has two producers, nodes {} and {}",
                                        edge.value, edge.value_name, flow.producer, edge.from_node));
    }
    flow.readers.push_back(edge.to_node);
  }
  for (auto& flow : flows) {
    std::sort(flow.readers.begin(), flow.readers.end());
    flow.readers.erase(std::unique(flow.readers.begin(), flow.readers.end()), flow.readers.end());
  }
  return flows;
}

struct Best {
  double bottleneck = std::numeric_limits<double>::infinity();
  double bytes = std::numeric_limits<double>::infinity();
  int from = -1;  // previous position index
};

bool better(double bottleneck, double bytes, const Best& than) {
  if (bottleneck != than.bottleneck) return bottleneck < than.bottleneck;
  return bytes < than.bytes;
}

}  // namespace

StagePartitionProblem problem_from_graph(const ir::Graph& graph, std::vector<double> node_cost,
                                         std::vector<double> node_memory) {
  const std::size_t n = graph.nodes().size();
  if (node_cost.size() != n || node_memory.size() != n) {
    throw ValidationError(fmt::format("stage partition: the graph has {} nodes but {} costs and {} memory sizes", n,
                                      node_cost.size(), node_memory.size()));
  }
  StagePartitionProblem problem;
  problem.node_cost = std::move(node_cost);
  problem.node_memory = std::move(node_memory);
  for (const ir::Node& node : graph.nodes()) {
    std::set<ir::ValueId> seen;
    for (const ir::ValueId v : node.inputs) {
      const ir::Value& value = graph.value(v);
      if (value.role != ir::ValueRole::Activation || !value.producer || !seen.insert(v).second) continue;
      problem.edges.push_back(Edge{*value.producer, node.id, static_cast<double>(value.type.bytes()), v, value.name});
    }
  }
  return problem;
}

std::vector<int> block_boundary_cuts(const ir::Graph& graph) {
  std::set<int> cuts;
  const int n = static_cast<int>(graph.nodes().size());
  for (const auto& group : analysis::find_repeated_blocks(graph)) {
    for (const auto& block : group.nodes) {
      if (block.empty()) continue;
      cuts.insert(block.front());
      cuts.insert(block.back() + 1);
    }
  }
  std::vector<int> out;
  for (const int c : cuts) {
    if (c >= 1 && c <= n - 1) out.push_back(c);
  }
  return out;
}

StagePartition partition_stages(const StagePartitionProblem& p) {
  const int n = static_cast<int>(p.node_cost.size());
  const int stages = p.stages;
  if (p.node_memory.size() != p.node_cost.size()) {
    throw ValidationError(
        fmt::format("stage partition: {} node costs but {} memory sizes", p.node_cost.size(), p.node_memory.size()));
  }
  if (stages < 1) throw ValidationError(fmt::format("stage partition: stages must be >= 1, got {}", stages));

  // Candidate positions: 0, the allowed cuts, n.
  std::vector<int> pos{0};
  if (p.cut_candidates.empty()) {
    for (int c = 1; c < n; ++c) pos.push_back(c);
  } else {
    std::vector<int> cands = p.cut_candidates;
    std::sort(cands.begin(), cands.end());
    cands.erase(std::unique(cands.begin(), cands.end()), cands.end());
    for (const int c : cands) {
      if (c < 1 || c >= n) {
        throw ValidationError(fmt::format("stage partition: cut candidate {} outside [1, {}]", c, n - 1));
      }
      pos.push_back(c);
    }
  }
  pos.push_back(n);
  const int m = static_cast<int>(pos.size());
  if (n < 1 || m - 1 < stages) {
    throw ValidationError(fmt::format("stage partition: cannot cut {} nodes ({} allowed cut positions) into {} stages",
                                      n, m - 2, stages));
  }

  // Prefix sums.
  std::vector<double> cost_prefix(static_cast<std::size_t>(n) + 1, 0.0);
  std::vector<double> mem_prefix(static_cast<std::size_t>(n) + 1, 0.0);
  for (int i = 0; i < n; ++i) {
    cost_prefix[static_cast<std::size_t>(i) + 1] =
        cost_prefix[static_cast<std::size_t>(i)] + p.node_cost[static_cast<std::size_t>(i)];
    mem_prefix[static_cast<std::size_t>(i) + 1] =
        mem_prefix[static_cast<std::size_t>(i)] + p.node_memory[static_cast<std::size_t>(i)];
  }
  // Bytes crossing each cut position c (values produced before c, read at or after c).
  const auto flows = value_flows(p);
  std::vector<double> cut_bytes(static_cast<std::size_t>(n) + 2, 0.0);
  {
    std::vector<double> diff(static_cast<std::size_t>(n) + 2, 0.0);
    for (const auto& flow : flows) {
      diff[static_cast<std::size_t>(flow.producer) + 1] += flow.bytes;
      diff[static_cast<std::size_t>(flow.readers.back()) + 1] -= flow.bytes;
    }
    double running = 0.0;
    for (int c = 0; c <= n; ++c) {
      running += diff[static_cast<std::size_t>(c)];
      cut_bytes[static_cast<std::size_t>(c)] = running;
    }
    cut_bytes[0] = 0.0;
  }
  const bool comm = p.bandwidth > 0.0 && std::isfinite(p.bandwidth);
  auto stage_time = [&](int a, int b) {
    const double compute = cost_prefix[static_cast<std::size_t>(pos[static_cast<std::size_t>(b)])] -
                           cost_prefix[static_cast<std::size_t>(pos[static_cast<std::size_t>(a)])];
    const double recv = cut_bytes[static_cast<std::size_t>(pos[static_cast<std::size_t>(a)])];
    return compute + (comm ? recv / p.bandwidth : 0.0);
  };
  auto stage_mem = [&](int a, int b) {
    return mem_prefix[static_cast<std::size_t>(pos[static_cast<std::size_t>(b)])] -
           mem_prefix[static_cast<std::size_t>(pos[static_cast<std::size_t>(a)])];
  };

  // dp[k][b]: best split of positions [0, b) into k+1 stages.
  const auto um = static_cast<std::size_t>(m);
  std::vector<std::vector<Best>> dp(static_cast<std::size_t>(stages), std::vector<Best>(um));
  for (int b = 1; b < m; ++b) {
    if (stage_mem(0, b) <= p.memory_limit) dp[0][static_cast<std::size_t>(b)] = Best{stage_time(0, b), 0.0, 0};
  }
  for (int k = 1; k < stages; ++k) {
    auto& prev = dp[static_cast<std::size_t>(k) - 1];
    auto& cur = dp[static_cast<std::size_t>(k)];
    for (int b = k + 1; b < m; ++b) {
      Best best;
      for (int a = k; a < b; ++a) {
        const Best& left = prev[static_cast<std::size_t>(a)];
        if (left.from < 0 || stage_mem(a, b) > p.memory_limit) continue;
        const double bottleneck = std::max(left.bottleneck, stage_time(a, b));
        const double bytes = left.bytes + cut_bytes[static_cast<std::size_t>(pos[static_cast<std::size_t>(a)])];
        if (better(bottleneck, bytes, best)) best = Best{bottleneck, bytes, a};
      }
      cur[static_cast<std::size_t>(b)] = best;
    }
  }
  const Best& final_best = dp[static_cast<std::size_t>(stages) - 1][um - 1];
  if (final_best.from < 0) {
    // Smallest achievable max stage memory (min-max DP over the same positions).
    const double inf = std::numeric_limits<double>::infinity();
    std::vector<double> memo(um, inf);
    for (int b = 1; b < m; ++b) memo[static_cast<std::size_t>(b)] = stage_mem(0, b);
    for (int k = 1; k < stages; ++k) {
      std::vector<double> next(um, inf);
      for (int b = k + 1; b < m; ++b) {
        for (int a = k; a < b; ++a) {
          next[static_cast<std::size_t>(b)] =
              std::min(next[static_cast<std::size_t>(b)], std::max(memo[static_cast<std::size_t>(a)], stage_mem(a, b)));
        }
      }
      memo = std::move(next);
    }
    throw ValidationError(fmt::format(
        "stage partition: no cut of {} nodes into {} stages fits the memory limit {} per stage; the best cut needs {} "
        "per stage",
        n, stages, p.memory_limit, memo[um - 1]));
  }

  // Reconstruct.
  std::vector<int> bounds(static_cast<std::size_t>(stages) + 1);
  bounds[static_cast<std::size_t>(stages)] = m - 1;
  for (int k = stages - 1, b = m - 1; k >= 0; --k) {
    b = dp[static_cast<std::size_t>(k)][static_cast<std::size_t>(b)].from;
    bounds[static_cast<std::size_t>(k)] = b;
  }
  StagePartition result;
  result.stage_of_node.assign(static_cast<std::size_t>(n), 0);
  for (int k = 0; k < stages; ++k) {
    const int a = bounds[static_cast<std::size_t>(k)], b = bounds[static_cast<std::size_t>(k) + 1];
    if (k > 0) result.cuts.push_back(pos[static_cast<std::size_t>(a)]);
    for (int i = pos[static_cast<std::size_t>(a)]; i < pos[static_cast<std::size_t>(b)]; ++i) {
      result.stage_of_node[static_cast<std::size_t>(i)] = k;
    }
    result.stage_cost.push_back(cost_prefix[static_cast<std::size_t>(pos[static_cast<std::size_t>(b)])] -
                                cost_prefix[static_cast<std::size_t>(pos[static_cast<std::size_t>(a)])]);
    result.stage_memory.push_back(stage_mem(a, b));
    result.stage_recv_bytes.push_back(cut_bytes[static_cast<std::size_t>(pos[static_cast<std::size_t>(a)])]);
  }
  result.bottleneck = final_best.bottleneck;
  for (const auto& flow : flows) {
    const int from = result.stage_of_node[static_cast<std::size_t>(flow.producer)];
    std::set<int> to_stages;
    for (const int r : flow.readers) {
      const int s = result.stage_of_node[static_cast<std::size_t>(r)];
      if (s > from) to_stages.insert(s);
    }
    for (const int s : to_stages)
      result.cross_edges.push_back(CrossStageEdge{flow.value, flow.name, from, s, flow.bytes});
  }
  return result;
}

}  // namespace shardwise::search
