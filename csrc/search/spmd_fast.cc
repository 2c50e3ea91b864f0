// solve_fast: a beam dynamic programme over the node order, with a Lagrange multiplier on memory,
// and a greedy single-node polish of the answer (never worse, still deterministic).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "search/choice_presolve.h"
#include "search/spmd_problem.h"
#include "support/error.h"

namespace shardwise::search {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// What one sweep minimises, lexicographically: (primary, secondary). Node choice scores
// are given per node and choice; an edge's cost goes to the primary key (Lagrangian sweeps)
// or to the secondary one (the least-memory sweep, where +inf still forbids the pair).
struct Weights {
  std::vector<std::vector<double>> primary;
  std::vector<std::vector<double>> secondary;
  bool edge_cost_primary = true;
};

// An edge priced when its later endpoint is decided.
struct IncomingEdge {
  const std::vector<double>* cost = nullptr;
  int frontier_pos = 0;     // where the earlier endpoint sits in the frontier before this node
  bool later_is_a = false;  // whether this node is the edge's `a` (row index of the matrix)
  int stride = 0;           // choices(b)
};

struct NodePlan {
  std::vector<IncomingEdge> incoming;
  // The frontier after this node, each entry read from the frontier before it (its position)
  // or -1 for this node itself.
  std::vector<int> next_source;
};

std::uint64_t mix(std::uint64_t h, std::uint64_t v) {
  h ^= v + 0x9E3779B97F4A7C15ULL + (h << 6) + (h >> 2);
  return h * 0xBF58476D1CE4E5B9ULL;
}

class BeamSweep {
 public:
  BeamSweep(const SpmdProblem& problem, int beam_width) : problem_(problem), beam_width_(beam_width) {
    const int n = static_cast<int>(problem.nodes.size());
    std::vector<int> last(problem.nodes.size());
    for (int v = 0; v < n; ++v) last[static_cast<std::size_t>(v)] = v;
    for (const ChoiceEdge& e : problem.edges) {
      last[static_cast<std::size_t>(e.a)] = std::max(last[static_cast<std::size_t>(e.a)], e.b);
      last[static_cast<std::size_t>(e.b)] = std::max(last[static_cast<std::size_t>(e.b)], e.a);
    }
    std::vector<std::vector<const ChoiceEdge*>> ending(problem.nodes.size());
    for (const ChoiceEdge& e : problem.edges) ending[static_cast<std::size_t>(std::max(e.a, e.b))].push_back(&e);

    plans_.resize(problem.nodes.size());
    std::vector<int> frontier;                            // sorted node ids
    std::vector<int> position(problem.nodes.size(), -1);  // node -> index in `frontier`
    for (int i = 0; i < n; ++i) {
      NodePlan& plan = plans_[static_cast<std::size_t>(i)];
      for (const ChoiceEdge* e : ending[static_cast<std::size_t>(i)]) {
        const int other = e->a == i ? e->b : e->a;
        plan.incoming.push_back(
            IncomingEdge{&e->cost, position[static_cast<std::size_t>(other)], e->a == i,
                         static_cast<int>(problem.nodes[static_cast<std::size_t>(e->b)].cost.size())});
      }
      std::vector<int> next;
      for (int u : frontier) {
        if (last[static_cast<std::size_t>(u)] > i) {
          next.push_back(u);
          plan.next_source.push_back(position[static_cast<std::size_t>(u)]);
        }
      }
      if (last[static_cast<std::size_t>(i)] > i) {
        next.push_back(i);
        plan.next_source.push_back(-1);
      }
      for (int u : frontier) position[static_cast<std::size_t>(u)] = -1;
      frontier = std::move(next);
      for (std::size_t k = 0; k < frontier.size(); ++k)
        position[static_cast<std::size_t>(frontier[k])] = static_cast<int>(k);
    }
  }

  // The best assignment the beam finds under `weights`. States are kept in lexicographic
  // order of their choices so far (a state's rank is its index), so a candidate's order is
  // (parent, choice): ties in the score then go to the lexicographically first assignment.
  std::vector<int> run(const Weights& weights) const {
    const std::size_t n = problem_.nodes.size();
    std::vector<std::vector<int>> parent_of(n);
    std::vector<std::vector<int>> choice_of(n);

    std::size_t width = 0;  // frontier size of the current states
    std::vector<int> keys;  // current states' frontier assignments, `width` each
    std::vector<double> p{0.0};
    std::vector<double> q{0.0};

    std::vector<int> cand_keys;
    std::vector<double> cand_p;
    std::vector<double> cand_q;
    std::vector<int> cand_parent;
    std::vector<int> cand_choice;
    std::vector<std::uint64_t> cand_hash;
    std::vector<int> table;
    std::vector<int> scratch;

    for (std::size_t i = 0; i < n; ++i) {
      const NodePlan& plan = plans_[i];
      const std::size_t next_width = plan.next_source.size();
      const auto k = static_cast<int>(problem_.nodes[i].cost.size());
      const std::size_t states = p.size();
      std::size_t capacity = 1;
      while (capacity < 2 * states * static_cast<std::size_t>(k)) capacity <<= 1;
      scratch.resize(next_width);

      // Forbidden (+inf) candidates are dropped unless nothing else is left, so that
      // a problem with no finite assignment still yields one.
      for (bool finite_only : {true, false}) {
        cand_keys.clear();
        cand_p.clear();
        cand_q.clear();
        cand_parent.clear();
        cand_choice.clear();
        cand_hash.clear();
        table.assign(capacity, -1);
        for (std::size_t s = 0; s < states; ++s) {
          const int* key = keys.data() + s * width;
          for (int c = 0; c < k; ++c) {
            double dp = weights.primary[i][static_cast<std::size_t>(c)];
            double dq = weights.secondary[i][static_cast<std::size_t>(c)];
            for (const IncomingEdge& in : plan.incoming) {
              const int other = key[in.frontier_pos];
              const double e =
                  (*in.cost)[static_cast<std::size_t>(in.later_is_a ? c * in.stride + other : other * in.stride + c)];
              if (weights.edge_cost_primary) {
                dp += e;
              } else {
                if (std::isinf(e)) dp = kInf;
                dq += e;
              }
            }
            const double np = p[s] + dp;
            const double nq = q[s] + dq;
            if (finite_only && std::isinf(np)) continue;
            std::uint64_t h = 0x243F6A8885A308D3ULL;
            for (std::size_t j = 0; j < next_width; ++j) {
              const int src = plan.next_source[j];
              scratch[j] = src < 0 ? c : key[src];
              h = mix(h, static_cast<std::uint64_t>(scratch[j]));
            }
            std::size_t slot = h & (capacity - 1);
            int found = -1;
            while (table[slot] >= 0) {
              const auto m = static_cast<std::size_t>(table[slot]);
              if (cand_hash[m] == h && std::equal(scratch.begin(), scratch.end(),
                                                  cand_keys.begin() + static_cast<std::ptrdiff_t>(m * next_width))) {
                found = table[slot];
                break;
              }
              slot = (slot + 1) & (capacity - 1);
            }
            if (found >= 0) {
              // Same frontier: the futures are the same, keep the better (earlier on ties).
              const auto m = static_cast<std::size_t>(found);
              if (np < cand_p[m] || (np == cand_p[m] && nq < cand_q[m])) {
                cand_p[m] = np;
                cand_q[m] = nq;
                cand_parent[m] = static_cast<int>(s);
                cand_choice[m] = c;
              }
              continue;
            }
            table[slot] = static_cast<int>(cand_p.size());
            cand_keys.insert(cand_keys.end(), scratch.begin(), scratch.end());
            cand_p.push_back(np);
            cand_q.push_back(nq);
            cand_parent.push_back(static_cast<int>(s));
            cand_choice.push_back(c);
            cand_hash.push_back(h);
          }
        }
        if (!cand_p.empty()) break;
      }

      std::vector<int> order(cand_p.size());
      for (std::size_t m = 0; m < order.size(); ++m) order[m] = static_cast<int>(m);
      auto lex = [&](int x, int y) {
        const auto sx = static_cast<std::size_t>(x);
        const auto sy = static_cast<std::size_t>(y);
        if (cand_parent[sx] != cand_parent[sy]) return cand_parent[sx] < cand_parent[sy];
        return cand_choice[sx] < cand_choice[sy];
      };
      if (order.size() > static_cast<std::size_t>(beam_width_)) {
        auto better = [&](int x, int y) {
          const auto sx = static_cast<std::size_t>(x);
          const auto sy = static_cast<std::size_t>(y);
          if (cand_p[sx] != cand_p[sy]) return cand_p[sx] < cand_p[sy];
          if (cand_q[sx] != cand_q[sy]) return cand_q[sx] < cand_q[sy];
          return lex(x, y);
        };
        std::nth_element(order.begin(), order.begin() + beam_width_, order.end(), better);
        order.resize(static_cast<std::size_t>(beam_width_));
      }
      std::sort(order.begin(), order.end(), lex);

      std::vector<int> next_keys(order.size() * next_width);
      std::vector<double> next_p(order.size());
      std::vector<double> next_q(order.size());
      parent_of[i].resize(order.size());
      choice_of[i].resize(order.size());
      for (std::size_t r = 0; r < order.size(); ++r) {
        const auto m = static_cast<std::size_t>(order[r]);
        std::copy_n(cand_keys.begin() + static_cast<std::ptrdiff_t>(m * next_width), next_width,
                    next_keys.begin() + static_cast<std::ptrdiff_t>(r * next_width));
        next_p[r] = cand_p[m];
        next_q[r] = cand_q[m];
        parent_of[i][r] = cand_parent[m];
        choice_of[i][r] = cand_choice[m];
      }
      keys = std::move(next_keys);
      p = std::move(next_p);
      q = std::move(next_q);
      width = next_width;
    }

    std::vector<int> choice(n);
    if (n == 0) return choice;
    std::size_t best = 0;
    for (std::size_t s = 1; s < p.size(); ++s) {
      if (p[s] < p[best] || (p[s] == p[best] && q[s] < q[best])) best = s;
    }
    for (std::size_t i = n; i-- > 0;) {
      choice[i] = choice_of[i][best];
      best = static_cast<std::size_t>(parent_of[i][best]);
    }
    return choice;
  }

 private:
  const SpmdProblem& problem_;
  int beam_width_;
  std::vector<NodePlan> plans_;
};

// cost + lambda * memory, edges at their cost. lambda == 0 is exact (no 0 * inf).
Weights lagrangian(const SpmdProblem& problem, double lambda) {
  Weights w;
  w.edge_cost_primary = true;
  for (const ChoiceNode& node : problem.nodes) {
    std::vector<double> p(node.cost.size());
    for (std::size_t c = 0; c < p.size(); ++c)
      p[c] = lambda > 0 ? node.cost[c] + lambda * node.memory[c] : node.cost[c];
    w.primary.push_back(std::move(p));
    w.secondary.emplace_back(node.cost.size(), 0.0);
  }
  return w;
}

// Least memory among finite-cost assignments, cost breaking ties.
Weights least_memory(const SpmdProblem& problem) {
  Weights w;
  w.edge_cost_primary = false;
  for (const ChoiceNode& node : problem.nodes) {
    std::vector<double> p(node.cost.size());
    for (std::size_t c = 0; c < p.size(); ++c) p[c] = std::isinf(node.cost[c]) ? kInf : node.memory[c];
    w.primary.push_back(std::move(p));
    w.secondary.push_back(node.cost);
  }
  return w;
}

// Single-node moves on an assignment of the (reduced) problem: what the Lagrangian leaves
// behind when one multiplier cannot tell nodes with the same cost/memory trade-off apart
// (all switch at the same lambda, leaving memory unused or overshooting the limit).
class LocalSearch {
 public:
  explicit LocalSearch(const SpmdProblem& problem) : problem_(problem), incident_(problem.nodes.size()) {
    for (std::size_t e = 0; e < problem.edges.size(); ++e) {
      incident_[static_cast<std::size_t>(problem.edges[e].a)].push_back(static_cast<int>(e));
      incident_[static_cast<std::size_t>(problem.edges[e].b)].push_back(static_cast<int>(e));
    }
  }

  // Brings `choice` within the memory limit: each step takes the move with the least cost
  // added per byte saved (the first such move on ties). Returns false when no move saves
  // memory at a finite cost before the assignment fits.
  bool repair(std::vector<int>& choice) const {
    double memory = total(choice);
    while (memory > problem_.memory_limit) {
      int best_v = -1;
      int best_c = 0;
      double best_rate = kInf;
      double best_saved = 0;
      for (std::size_t v = 0; v < choice.size(); ++v) {
        const ChoiceNode& node = problem_.nodes[v];
        const double here = local_cost(choice, v, choice[v]);
        for (std::size_t c = 0; c < node.cost.size(); ++c) {
          const double saved = node.memory[static_cast<std::size_t>(choice[v])] - node.memory[c];
          if (!(saved > 0)) continue;
          const double there = local_cost(choice, v, static_cast<int>(c));
          if (std::isinf(there)) continue;
          const double rate = std::isinf(here) ? -kInf : (there - here) / saved;
          if (rate < best_rate) {
            best_rate = rate;
            best_v = static_cast<int>(v);
            best_c = static_cast<int>(c);
            best_saved = saved;
          }
        }
      }
      if (best_v < 0) return false;
      choice[static_cast<std::size_t>(best_v)] = best_c;
      memory -= best_saved;
    }
    return true;
  }

  // Steepest descent on cost among moves that keep the assignment within the limit (the
  // first best move on ties); stops at a local optimum.
  void improve(std::vector<int>& choice) const {
    double memory = total(choice);
    const std::size_t max_moves = 64 * choice.size() + 64;
    for (std::size_t move = 0; move < max_moves; ++move) {
      int best_v = -1;
      int best_c = 0;
      double best_gain = 0;
      double best_added = 0;
      for (std::size_t v = 0; v < choice.size(); ++v) {
        const ChoiceNode& node = problem_.nodes[v];
        const double here = local_cost(choice, v, choice[v]);
        if (std::isinf(here)) continue;
        for (std::size_t c = 0; c < node.cost.size(); ++c) {
          if (static_cast<int>(c) == choice[v]) continue;
          const double added = node.memory[c] - node.memory[static_cast<std::size_t>(choice[v])];
          if (!(memory + added <= problem_.memory_limit)) continue;
          const double gain = here - local_cost(choice, v, static_cast<int>(c));
          // Relative threshold: rounding alone must not make two equal assignments alternate.
          if (gain > best_gain && gain > 1e-12 * here) {
            best_gain = gain;
            best_v = static_cast<int>(v);
            best_c = static_cast<int>(c);
            best_added = added;
          }
        }
      }
      if (best_v < 0) return;
      choice[static_cast<std::size_t>(best_v)] = best_c;
      memory += best_added;
    }
  }

 private:
  double total(const std::vector<int>& choice) const {
    double memory = 0;
    for (std::size_t v = 0; v < choice.size(); ++v)
      memory += problem_.nodes[v].memory[static_cast<std::size_t>(choice[v])];
    return memory;
  }

  // The cost that depends on node v's choice: its own and that of its edges.
  double local_cost(const std::vector<int>& choice, std::size_t v, int c) const {
    double cost = problem_.nodes[v].cost[static_cast<std::size_t>(c)];
    for (int e : incident_[v]) {
      const ChoiceEdge& edge = problem_.edges[static_cast<std::size_t>(e)];
      const auto cols = problem_.nodes[static_cast<std::size_t>(edge.b)].cost.size();
      const auto ca =
          static_cast<std::size_t>(edge.a == static_cast<int>(v) ? c : choice[static_cast<std::size_t>(edge.a)]);
      const auto cb =
          static_cast<std::size_t>(edge.b == static_cast<int>(v) ? c : choice[static_cast<std::size_t>(edge.b)]);
      cost += edge.cost[ca * cols + cb];
    }
    return cost;
  }

  const SpmdProblem& problem_;
  std::vector<std::vector<int>> incident_;
};

}  // namespace

SpmdSolution solve_fast(const SpmdProblem& problem, const FastOptions& options) {
  validate(problem);
  if (options.beam_width < 1) {
    throw support::ValidationError(
        fmt::format("spmd problem: solve_fast needs a beam width of at least 1, got {}", options.beam_width));
  }
  std::vector<int> fixed;
  std::vector<int> kept;
  const SpmdProblem reduced = detail::fold_single_choice_nodes(problem, fixed, kept);
  const BeamSweep sweep(reduced, options.beam_width);
  const LocalSearch local(reduced);

  // Every candidate is judged on the original problem, so feasibility is decided exactly
  // as the caller will check it.
  struct Candidate {
    std::vector<int> reduced;
    SpmdSolution solution;
  };
  auto evaluate = [&](std::vector<int> reduced_choice) {
    Candidate candidate;
    SpmdSolution& s = candidate.solution;
    s.choice = detail::expand_choice(fixed, kept, reduced_choice);
    s.cost = total_cost(problem, s.choice);
    s.memory = total_memory(problem, s.choice);
    s.feasible = std::isfinite(s.cost) && s.memory <= problem.memory_limit;
    s.optimal = false;
    s.solver = "fast";
    candidate.reduced = std::move(reduced_choice);
    return candidate;
  };
  auto fits = [&](const Candidate& c) { return c.solution.memory <= problem.memory_limit; };
  // The better of the two by true cost; a polished one only replaces a feasible original.
  auto polish = [&](Candidate best, const Candidate* overshoot) {
    std::vector<std::vector<int>> starts{best.reduced};
    if (overshoot != nullptr) {
      std::vector<int> repaired = overshoot->reduced;
      if (local.repair(repaired)) starts.push_back(std::move(repaired));
    }
    for (std::vector<int>& start : starts) {
      local.improve(start);
      Candidate c = evaluate(std::move(start));
      if (c.solution.feasible && (!best.solution.feasible || c.solution.cost < best.solution.cost)) best = std::move(c);
    }
    return std::move(best.solution);
  };

  // The beam under the Lagrangian on memory, polished.
  auto beam_solution = [&]() -> SpmdSolution {
    Candidate unconstrained = evaluate(sweep.run(lagrangian(reduced, 0.0)));
    if (fits(unconstrained))
      return unconstrained.solution.feasible ? polish(std::move(unconstrained), nullptr)
                                             : std::move(unconstrained.solution);

    Candidate smallest = evaluate(sweep.run(least_memory(reduced)));
    if (!smallest.solution.feasible) return std::move(smallest.solution);
    if (smallest.solution.cost <= unconstrained.solution.cost) return polish(std::move(smallest), nullptr);

    // The cheapest fit lies between lambda = 0 (too big) and lambda = inf (the least-memory
    // answer). Bisect geometrically around the slope between the two, whose scale follows the
    // units of cost and memory; outside [slope / 1e9, slope * 1e9] the answers are taken to be
    // the two ends.
    const double extra_cost = smallest.solution.cost - unconstrained.solution.cost;
    const double saved_memory = std::isfinite(unconstrained.solution.memory)
                                    ? unconstrained.solution.memory - smallest.solution.memory
                                    : std::max(std::abs(problem.memory_limit), 1.0);
    const double slope = extra_cost / saved_memory;
    double lo = std::max(slope * 1e-9, std::numeric_limits<double>::min());
    double hi = std::max(slope * 1e9, lo * 2);
    Candidate best = std::move(smallest);
    Candidate overshoot = std::move(unconstrained);  // the probe at `lo`: cheap but too big
    // A multiplier within 0.1% of the breakpoint is as good as the breakpoint: the polish
    // below settles what it leaves (16 probes instead of 40).
    for (int iteration = 0; iteration < 40 && hi > lo * (1 + 1e-3); ++iteration) {
      const double mid = std::sqrt(lo) * std::sqrt(hi);
      Candidate probe = evaluate(sweep.run(lagrangian(reduced, mid)));
      if (fits(probe)) {
        hi = mid;
        if (probe.solution.feasible && probe.solution.cost < best.solution.cost) best = std::move(probe);
      } else {
        lo = mid;
        overshoot = std::move(probe);
      }
    }
    return polish(std::move(best), &overshoot);
  };

  if (options.seeds_only && options.seeds.empty())
    throw support::ValidationError("spmd problem: solve_fast with seeds_only needs a seed");
  // Seeds are checked before any work: bad input is an error, not a wasted sweep.
  std::vector<std::vector<int>> seeds;
  for (const std::vector<int>& seed : options.seeds) {
    if (seed.size() != problem.nodes.size())
      throw support::ValidationError(fmt::format("spmd problem: a seed of {} choices for {} nodes", seed.size(),
                                                 problem.nodes.size()));
    std::vector<int> start(kept.size());
    for (std::size_t i = 0; i < kept.size(); ++i) {
      const int c = seed[static_cast<std::size_t>(kept[i])];
      if (c < 0 || static_cast<std::size_t>(c) >= reduced.nodes[i].cost.size())
        throw support::ValidationError(
            fmt::format("spmd problem: seed choice {} out of range at node '{}'", c, reduced.nodes[i].name));
      start[i] = c;
    }
    seeds.push_back(std::move(start));
  }
  SpmdSolution beam;
  if (!options.seeds_only) beam = beam_solution();
  if (options.both_directions && !options.seeds_only && reduced.nodes.size() > 1) {
    // The reduced problem with its nodes in reverse order (already presolved).
    const std::size_t n = reduced.nodes.size();
    SpmdProblem backward;
    backward.memory_limit = reduced.memory_limit;
    for (std::size_t i = 0; i < n; ++i) backward.nodes.push_back(reduced.nodes[n - 1 - i]);
    for (const ChoiceEdge& e : reduced.edges)
      backward.edges.push_back({static_cast<int>(n) - 1 - e.a, static_cast<int>(n) - 1 - e.b, e.cost});
    const SpmdSolution back = solve_fast(backward, FastOptions{options.beam_width, {}, false});
    std::vector<int> start(n);
    for (std::size_t i = 0; i < n; ++i) start[i] = back.choice[n - 1 - i];
    seeds.push_back(std::move(start));
  }
  for (std::vector<int>& start : seeds) {
    if (options.seeds_only) {
      if (fits(evaluate(start))) local.improve(start);
      return evaluate(std::move(start)).solution;
    }
    if (!fits(evaluate(start)) && !local.repair(start)) continue;
    local.improve(start);
    Candidate c = evaluate(std::move(start));
    if (c.solution.feasible && (!beam.feasible || c.solution.cost < beam.cost)) beam = std::move(c.solution);
  }
  return beam;
}

}  // namespace shardwise::search
