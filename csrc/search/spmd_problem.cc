#include "search/spmd_problem.h"

#include <fmt/format.h>

#include <cmath>
#include <cstddef>
#include <deque>
#include <limits>
#include <string>
#include <vector>

#include "search/choice_presolve.h"
#include "support/error.h"

namespace shardwise::search {

namespace {

using support::ValidationError;

constexpr double kInf = std::numeric_limits<double>::infinity();

bool bad_value(double v) { return std::isnan(v) || v < 0; }

std::string node_label(const SpmdProblem& problem, int v) {
  return fmt::format("node {} ('{}')", v, problem.nodes[static_cast<std::size_t>(v)].name);
}

int choices(const SpmdProblem& problem, int v) {
  return static_cast<int>(problem.nodes[static_cast<std::size_t>(v)].cost.size());
}

void check_choice(const SpmdProblem& problem, std::span<const int> choice) {
  if (choice.size() != problem.nodes.size()) {
    throw ValidationError(fmt::format("spmd problem: an assignment of {} choices for a problem of {} nodes",
                                      choice.size(), problem.nodes.size()));
  }
  for (std::size_t v = 0; v < choice.size(); ++v) {
    const int n = choices(problem, static_cast<int>(v));
    if (choice[v] < 0 || choice[v] >= n) {
      throw ValidationError(fmt::format("spmd problem: {} is assigned choice {} but has {} choices",
                                        node_label(problem, static_cast<int>(v)), choice[v], n));
    }
  }
}

}  // namespace

void validate(const SpmdProblem& problem) {
  const int n = static_cast<int>(problem.nodes.size());
  for (int v = 0; v < n; ++v) {
    const ChoiceNode& node = problem.nodes[static_cast<std::size_t>(v)];
    if (node.cost.empty()) {
      throw ValidationError(fmt::format("spmd problem: {} has no choices", node_label(problem, v)));
    }
    if (node.memory.size() != node.cost.size()) {
      throw ValidationError(fmt::format("spmd problem: {} has {} costs but {} memory sizes", node_label(problem, v),
                                        node.cost.size(), node.memory.size()));
    }
    for (std::size_t c = 0; c < node.cost.size(); ++c) {
      if (bad_value(node.cost[c])) {
        throw ValidationError(fmt::format("spmd problem: {} has cost {} for choice {} (negative or NaN)",
                                          node_label(problem, v), node.cost[c], c));
      }
      if (bad_value(node.memory[c])) {
        throw ValidationError(fmt::format("spmd problem: {} has memory {} for choice {} (negative or NaN)",
                                          node_label(problem, v), node.memory[c], c));
      }
    }
  }
  for (std::size_t e = 0; e < problem.edges.size(); ++e) {
    const ChoiceEdge& edge = problem.edges[e];
    if (edge.a < 0 || edge.a >= n || edge.b < 0 || edge.b >= n) {
      throw ValidationError(
          fmt::format("spmd problem: edge {} joins nodes {} and {}, out of range for {} nodes", e, edge.a, edge.b, n));
    }
    if (edge.a == edge.b) {
      throw ValidationError(fmt::format("spmd problem: edge {} joins {} to itself", e, node_label(problem, edge.a)));
    }
    const std::size_t rows = problem.nodes[static_cast<std::size_t>(edge.a)].cost.size();
    const std::size_t cols = problem.nodes[static_cast<std::size_t>(edge.b)].cost.size();
    if (edge.cost.size() != rows * cols) {
      throw ValidationError(fmt::format("spmd problem: edge {} ({} -> {}) has {} costs, expected {} x {}", e,
                                        node_label(problem, edge.a), node_label(problem, edge.b), edge.cost.size(),
                                        rows, cols));
    }
    for (std::size_t k = 0; k < edge.cost.size(); ++k) {
      if (bad_value(edge.cost[k])) {
        throw ValidationError(
            fmt::format("spmd problem: edge {} ({} -> {}) has cost {} for pair ({}, {}) (negative or NaN)", e,
                        node_label(problem, edge.a), node_label(problem, edge.b), edge.cost[k], k / cols, k % cols));
      }
    }
  }
  if (std::isnan(problem.memory_limit)) {
    throw ValidationError("spmd problem: the memory limit is NaN");
  }
}

double total_cost(const SpmdProblem& problem, std::span<const int> choice) {
  check_choice(problem, choice);
  double total = 0;
  for (std::size_t v = 0; v < problem.nodes.size(); ++v) {
    total += problem.nodes[v].cost[static_cast<std::size_t>(choice[v])];
  }
  for (const ChoiceEdge& edge : problem.edges) {
    const auto cols = static_cast<std::size_t>(choices(problem, edge.b));
    const auto ca = static_cast<std::size_t>(choice[static_cast<std::size_t>(edge.a)]);
    const auto cb = static_cast<std::size_t>(choice[static_cast<std::size_t>(edge.b)]);
    total += edge.cost[ca * cols + cb];
  }
  return total;
}

double total_memory(const SpmdProblem& problem, std::span<const int> choice) {
  check_choice(problem, choice);
  double total = 0;
  for (std::size_t v = 0; v < problem.nodes.size(); ++v) {
    total += problem.nodes[v].memory[static_cast<std::size_t>(choice[v])];
  }
  return total;
}

namespace detail {

// Folds every node left with one allowed (finite-cost) choice, or with a single choice at all:
// its node cost and memory become constants, and each edge to an unfolded neighbour becomes
// a cost on that neighbour's choices. That can leave the neighbour with one allowed choice
// in turn, so the fold runs to a fixed point. The constants are not carried: both solvers
// report total_cost/total_memory of the expanded assignment, and a constant does not move
// the argmin. The memory the folded nodes take is taken off the limit.
SpmdProblem fold_single_choice_nodes(const SpmdProblem& problem, std::vector<int>& fixed, std::vector<int>& kept) {
  const int n = static_cast<int>(problem.nodes.size());
  std::vector<std::vector<double>> cost(problem.nodes.size());
  for (int v = 0; v < n; ++v) cost[static_cast<std::size_t>(v)] = problem.nodes[static_cast<std::size_t>(v)].cost;
  std::vector<std::vector<int>> incident(problem.nodes.size());
  for (std::size_t e = 0; e < problem.edges.size(); ++e) {
    incident[static_cast<std::size_t>(problem.edges[e].a)].push_back(static_cast<int>(e));
    incident[static_cast<std::size_t>(problem.edges[e].b)].push_back(static_cast<int>(e));
  }

  // The only allowed choice of v, or -1 when it has none or several.
  auto single_choice = [&](int v) {
    const auto& c = cost[static_cast<std::size_t>(v)];
    if (c.size() == 1) return 0;
    int found = -1;
    for (std::size_t k = 0; k < c.size(); ++k) {
      if (std::isfinite(c[k])) {
        if (found >= 0) return -1;
        found = static_cast<int>(k);
      }
    }
    return found;
  };

  // A node's choice is taken when it is queued: folding a neighbour can still make that
  // choice infinite (no allowed choice left), and then every assignment costs +inf anyway.
  fixed.assign(problem.nodes.size(), -1);
  std::deque<int> queue;
  std::vector<int> queued(problem.nodes.size(), -1);
  for (int v = 0; v < n; ++v) {
    const int k = single_choice(v);
    if (k >= 0) {
      queue.push_back(v);
      queued[static_cast<std::size_t>(v)] = k;
    }
  }
  while (!queue.empty()) {
    const int u = queue.front();
    queue.pop_front();
    const int k = queued[static_cast<std::size_t>(u)];
    fixed[static_cast<std::size_t>(u)] = k;
    for (int e : incident[static_cast<std::size_t>(u)]) {
      const ChoiceEdge& edge = problem.edges[static_cast<std::size_t>(e)];
      const int w = edge.a == u ? edge.b : edge.a;
      if (fixed[static_cast<std::size_t>(w)] >= 0) continue;
      auto& wc = cost[static_cast<std::size_t>(w)];
      const std::size_t cols = problem.nodes[static_cast<std::size_t>(edge.b)].cost.size();
      for (std::size_t c = 0; c < wc.size(); ++c) {
        wc[c] += edge.a == u ? edge.cost[static_cast<std::size_t>(k) * cols + c]
                             : edge.cost[c * cols + static_cast<std::size_t>(k)];
      }
      if (queued[static_cast<std::size_t>(w)] < 0) {
        const int kw = single_choice(w);
        if (kw >= 0) {
          queue.push_back(w);
          queued[static_cast<std::size_t>(w)] = kw;
        }
      }
    }
  }

  SpmdProblem reduced;
  kept.clear();
  std::vector<int> index(problem.nodes.size(), -1);
  double fixed_memory = 0;
  for (int v = 0; v < n; ++v) {
    const auto sv = static_cast<std::size_t>(v);
    if (fixed[sv] >= 0) {
      fixed_memory += problem.nodes[sv].memory[static_cast<std::size_t>(fixed[sv])];
      continue;
    }
    index[sv] = static_cast<int>(kept.size());
    kept.push_back(v);
    reduced.nodes.push_back(ChoiceNode{problem.nodes[sv].name, std::move(cost[sv]), problem.nodes[sv].memory});
  }
  for (const ChoiceEdge& edge : problem.edges) {
    const int a = index[static_cast<std::size_t>(edge.a)];
    const int b = index[static_cast<std::size_t>(edge.b)];
    if (a >= 0 && b >= 0) reduced.edges.push_back(ChoiceEdge{a, b, edge.cost});
  }
  // inf - inf would be NaN: an unlimited budget stays unlimited whatever the folded nodes take.
  reduced.memory_limit =
      std::isinf(problem.memory_limit) && problem.memory_limit > 0 ? kInf : problem.memory_limit - fixed_memory;
  return reduced;
}

std::vector<int> expand_choice(std::span<const int> fixed, std::span<const int> kept,
                               std::span<const int> reduced_choice) {
  std::vector<int> choice(fixed.begin(), fixed.end());
  for (std::size_t i = 0; i < kept.size(); ++i) choice[static_cast<std::size_t>(kept[i])] = reduced_choice[i];
  return choice;
}

}  // namespace detail
}  // namespace shardwise::search
