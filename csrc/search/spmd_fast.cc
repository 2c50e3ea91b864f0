// solve_fast: a beam dynamic programme over the node order, with a Lagrange multiplier on memory,
// and a greedy single-node polish of the answer (never worse, still deterministic).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
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

// The frontier after a node: the frontier before it with the entries whose last edge ends
// at this node dropped (the rest keep their order, in runs), then the node itself when it
// has an edge to a later node.
struct NodePlan {
  std::vector<IncomingEdge> incoming;
  struct Run {
    int from = 0;    // position in the frontier before this node
    int length = 0;  // entries kept from there, in order
  };
  std::vector<Run> kept;
  std::vector<int> dropped_position;  // entries of the frontier before this node it drops
  std::vector<int> dropped_node;      // and their node ids
  bool stays = false;                 // this node joins the frontier (last)
  std::size_t next_width = 0;         // frontier size after this node
};

// One frontier entry's share of a state's hash: a state's hash is the sum of its entries'
// (node, choice) terms, so dropping an entry or adding one updates it in O(1).
std::uint64_t entry_hash(int node, int choice) {
  std::uint64_t z = (static_cast<std::uint64_t>(static_cast<std::uint32_t>(node)) << 32) ^
                    static_cast<std::uint32_t>(choice);
  z += 0x9E3779B97F4A7C15ULL;  // splitmix64's finaliser
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
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
      for (std::size_t k = 0; k < frontier.size(); ++k) {
        const int u = frontier[k];
        if (last[static_cast<std::size_t>(u)] > i) {
          if (!plan.kept.empty() && plan.kept.back().from + plan.kept.back().length == static_cast<int>(k))
            ++plan.kept.back().length;
          else
            plan.kept.push_back({static_cast<int>(k), 1});
          next.push_back(u);
        } else {
          plan.dropped_position.push_back(static_cast<int>(k));
          plan.dropped_node.push_back(u);
        }
      }
      if (last[static_cast<std::size_t>(i)] > i) {
        next.push_back(i);
        plan.stays = true;
      }
      plan.next_width = next.size();
      for (int u : frontier) position[static_cast<std::size_t>(u)] = -1;
      frontier = std::move(next);
      for (std::size_t k = 0; k < frontier.size(); ++k)
        position[static_cast<std::size_t>(frontier[k])] = static_cast<int>(k);
    }
  }

  // The best assignment the beam finds under `weights`. States are kept in lexicographic
  // order of their choices so far (a state's rank is its index), so a candidate's order is
  // (parent, choice): ties in the score then go to the lexicographically first assignment.
  //
  // A candidate (state, choice) is identified by the frontier it leaves: the entries its
  // state keeps (plan.kept, the same for every choice) and, when this node stays in the
  // frontier, the choice. So the states are first grouped by the entries they keep, and a
  // candidate is then looked up by (group, choice). A state's hash is a sum over its
  // entries, updated for the entries dropped and added, and its frontier is copied in runs,
  // so a node costs O(states x (dropped entries + kept runs) + states x choices x incoming
  // edges) beside the comparisons of states that fall together. Keying every candidate by
  // its whole frontier instead costs O(states x choices x frontier) hashing and copying,
  // which dominates where the frontier is wide (a leaf read at every step of an unrolled
  // loop keeps each of its readers in the reverse sweep's frontier until the leaf: RWKV's
  // per-timestep recurrence, a hundred entries). Same candidates in the same order as that
  // keying, so the same answer.
  std::vector<int> run(const Weights& weights) const {
    const std::size_t n = problem_.nodes.size();
    std::vector<std::vector<int>> parent_of(n);
    std::vector<std::vector<int>> choice_of(n);
    States states;
    Scratch scratch;
    for (std::size_t i = 0; i < n; ++i) {
      const NodePlan& plan = plans_[i];
      const auto k = static_cast<int>(problem_.nodes[i].cost.size());
      group_states(plan, states, scratch);
      collect_candidates(i, k, plan, states, weights, scratch);
      const std::vector<int> order = select_beam(states.p.size(), k, scratch);
      advance(i, plan, order, states, scratch, parent_of[i], choice_of[i]);
    }

    std::vector<int> choice(n);
    if (n == 0) return choice;
    std::size_t best = 0;
    for (std::size_t s = 1; s < states.p.size(); ++s) {
      if (states.p[s] < states.p[best] || (states.p[s] == states.p[best] && states.q[s] < states.q[best])) best = s;
    }
    for (std::size_t i = n; i-- > 0;) {
      choice[i] = choice_of[i][best];
      best = static_cast<std::size_t>(parent_of[i][best]);
    }
    return choice;
  }

 private:
  // The beam after a node, in lexicographic order of the choices so far.
  struct States {
    std::size_t width = 0;                 // frontier size
    std::vector<int> keys;                 // each state's frontier assignment, `width` each
    std::vector<std::uint64_t> hashes{0};  // each state's hash (a sum of entry_hash)
    std::vector<double> p{0.0};
    std::vector<double> q{0.0};
    const int* key_of(std::size_t s) const { return keys.data() + s * width; }
  };
  // One node's work, kept between nodes so that its vectors are allocated once.
  struct Scratch {
    std::vector<double> cand_p;
    std::vector<double> cand_q;
    std::vector<int> cand_parent;
    std::vector<int> cand_choice;
    std::vector<int> group_of;     // per state: its group (states keeping equal entries)
    std::vector<int> group_first;  // per group: its first state
    std::vector<std::uint64_t> group_hash;
    std::vector<int> table;
    std::vector<int> candidate_at;  // per (group, choice), or per group: its candidate, or -1
    std::vector<int> by_lex;        // per (parent, choice): its candidate when in the beam, or -1
    std::vector<double> threshold;
    std::vector<int> tied;
  };

  // Groups the states by the entries they keep past `plan`'s node.
  static void group_states(const NodePlan& plan, const States& states, Scratch& x) {
    const std::size_t count = states.p.size();
    x.group_of.assign(count, 0);
    x.group_first.clear();
    x.group_hash.clear();
    if (plan.dropped_position.empty() || count == 1) {
      // Distinct states keep distinct frontiers: each is its own group.
      for (std::size_t s = 0; s < count; ++s) {
        x.group_of[s] = static_cast<int>(s);
        x.group_first.push_back(static_cast<int>(s));
        x.group_hash.push_back(states.hashes[s]);
      }
      return;
    }
    std::size_t capacity = 1;
    while (capacity < 2 * count) capacity <<= 1;
    x.table.assign(capacity, -1);
    for (std::size_t s = 0; s < count; ++s) {
      const int* key = states.key_of(s);
      std::uint64_t h = states.hashes[s];
      for (std::size_t d = 0; d < plan.dropped_position.size(); ++d)
        h -= entry_hash(plan.dropped_node[d], key[plan.dropped_position[d]]);
      std::size_t slot = (h ^ (h >> 29)) & (capacity - 1);
      int found = -1;
      while (x.table[slot] >= 0) {
        const auto g = static_cast<std::size_t>(x.table[slot]);
        if (x.group_hash[g] == h) {
          const int* other = states.key_of(static_cast<std::size_t>(x.group_first[g]));
          if (std::all_of(plan.kept.begin(), plan.kept.end(), [&](const NodePlan::Run& r) {
                return std::equal(key + r.from, key + r.from + r.length, other + r.from);
              })) {
            found = x.table[slot];
            break;
          }
        }
        slot = (slot + 1) & (capacity - 1);
      }
      if (found < 0) {
        found = static_cast<int>(x.group_first.size());
        x.table[slot] = found;
        x.group_first.push_back(static_cast<int>(s));
        x.group_hash.push_back(h);
      }
      x.group_of[s] = found;
    }
  }

  // Every (state, choice) of node i priced, one candidate per frontier it leaves (the better
  // of those leaving the same one, the earlier on ties). Forbidden (+inf) candidates are
  // dropped unless nothing else is left, so that a problem with no finite assignment still
  // yields one.
  static void collect_candidates(std::size_t i, int k, const NodePlan& plan, const States& states,
                                 const Weights& weights, Scratch& x) {
    const std::size_t per_group = plan.stays ? static_cast<std::size_t>(k) : 1;
    for (bool finite_only : {true, false}) {
      x.cand_p.clear();
      x.cand_q.clear();
      x.cand_parent.clear();
      x.cand_choice.clear();
      x.candidate_at.assign(x.group_first.size() * per_group, -1);
      for (std::size_t s = 0; s < states.p.size(); ++s) {
        const int* key = states.key_of(s);
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
          const double np = states.p[s] + dp;
          const double nq = states.q[s] + dq;
          if (finite_only && std::isinf(np)) continue;
          int& at = x.candidate_at[static_cast<std::size_t>(x.group_of[s]) * per_group +
                                   (plan.stays ? static_cast<std::size_t>(c) : 0)];
          if (at >= 0) {
            // Same frontier: the futures are the same, keep the better (earlier on ties).
            const auto m = static_cast<std::size_t>(at);
            if (np < x.cand_p[m] || (np == x.cand_p[m] && nq < x.cand_q[m])) {
              x.cand_p[m] = np;
              x.cand_q[m] = nq;
              x.cand_parent[m] = static_cast<int>(s);
              x.cand_choice[m] = c;
            }
            continue;
          }
          at = static_cast<int>(x.cand_p.size());
          x.cand_p.push_back(np);
          x.cand_q.push_back(nq);
          x.cand_parent.push_back(static_cast<int>(s));
          x.cand_choice.push_back(c);
        }
      }
      if (!x.cand_p.empty()) break;
    }
  }

  // The beam: the best beam_width candidates by (p, q), ties to the lexicographically first
  // (parent, choice), in that lexicographic order. Selected by the beam_width-th smallest
  // p: every candidate below it is in, and those equal to it compete on (q, order). The
  // same set as ranking every candidate on (p, q, order), without moving records around.
  std::vector<int> select_beam(std::size_t states, int k, Scratch& x) const {
    const auto lex_of = [&](std::size_t m) {
      return static_cast<std::size_t>(x.cand_parent[m]) * static_cast<std::size_t>(k) +
             static_cast<std::size_t>(x.cand_choice[m]);
    };
    const auto beam = static_cast<std::size_t>(beam_width_);
    x.by_lex.assign(states * static_cast<std::size_t>(k), -1);
    if (x.cand_p.size() <= beam) {
      for (std::size_t m = 0; m < x.cand_p.size(); ++m) x.by_lex[lex_of(m)] = static_cast<int>(m);
    } else {
      x.threshold.assign(x.cand_p.begin(), x.cand_p.end());
      std::nth_element(x.threshold.begin(), x.threshold.begin() + static_cast<std::ptrdiff_t>(beam - 1),
                       x.threshold.end());
      const double edge = x.threshold[beam - 1];
      std::size_t taken = 0;
      x.tied.clear();
      for (std::size_t m = 0; m < x.cand_p.size(); ++m) {
        if (x.cand_p[m] < edge) {
          x.by_lex[lex_of(m)] = static_cast<int>(m);
          ++taken;
        } else if (x.cand_p[m] == edge) {
          x.tied.push_back(static_cast<int>(m));
        }
      }
      const std::size_t room = beam - taken;  // >= 1, <= tied.size()
      if (x.tied.size() > room) {
        std::nth_element(x.tied.begin(), x.tied.begin() + static_cast<std::ptrdiff_t>(room - 1), x.tied.end(),
                         [&](int a, int b) {
                           const auto sa = static_cast<std::size_t>(a);
                           const auto sb = static_cast<std::size_t>(b);
                           if (x.cand_q[sa] != x.cand_q[sb]) return x.cand_q[sa] < x.cand_q[sb];
                           return lex_of(sa) < lex_of(sb);
                         });
        x.tied.resize(room);
      }
      for (int m : x.tied) x.by_lex[lex_of(static_cast<std::size_t>(m))] = m;
    }
    std::vector<int> order;
    order.reserve(std::min(beam, x.cand_p.size()));
    for (int m : x.by_lex)
      if (m >= 0) order.push_back(m);
    return order;
  }

  // The states after node i: the beam's candidates in `order`, their frontiers copied in runs
  // and their hashes updated; each one's parent and choice recorded for the walk back.
  static void advance(std::size_t i, const NodePlan& plan, const std::vector<int>& order, States& states,
                      const Scratch& x, std::vector<int>& parent_of, std::vector<int>& choice_of) {
    const std::size_t next_width = plan.next_width;
    std::vector<int> next_keys(order.size() * next_width);
    std::vector<std::uint64_t> next_hashes(order.size());
    std::vector<double> next_p(order.size());
    std::vector<double> next_q(order.size());
    parent_of.resize(order.size());
    choice_of.resize(order.size());
    for (std::size_t r = 0; r < order.size(); ++r) {
      const auto m = static_cast<std::size_t>(order[r]);
      const auto parent = static_cast<std::size_t>(x.cand_parent[m]);
      const int* key = states.key_of(parent);
      int* next_key = next_keys.data() + r * next_width;
      for (const NodePlan::Run& run : plan.kept) next_key = std::copy_n(key + run.from, run.length, next_key);
      std::uint64_t h = x.group_hash[static_cast<std::size_t>(x.group_of[parent])];
      if (plan.stays) {
        *next_key = x.cand_choice[m];
        h += entry_hash(static_cast<int>(i), x.cand_choice[m]);
      }
      next_hashes[r] = h;
      next_p[r] = x.cand_p[m];
      next_q[r] = x.cand_q[m];
      parent_of[r] = x.cand_parent[m];
      choice_of[r] = x.cand_choice[m];
    }
    states.keys = std::move(next_keys);
    states.hashes = std::move(next_hashes);
    states.p = std::move(next_p);
    states.q = std::move(next_q);
    states.width = next_width;
  }

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
  explicit LocalSearch(const SpmdProblem& problem)
      : problem_(problem), incident_(problem.nodes.size()), neighbours_(problem.nodes.size()) {
    for (std::size_t e = 0; e < problem.edges.size(); ++e) {
      const auto a = static_cast<std::size_t>(problem.edges[e].a);
      const auto b = static_cast<std::size_t>(problem.edges[e].b);
      incident_[a].push_back(static_cast<int>(e));
      incident_[b].push_back(static_cast<int>(e));
      neighbours_[a].push_back(static_cast<int>(b));
      neighbours_[b].push_back(static_cast<int>(a));
    }
    for (std::vector<int>& around : neighbours_) {
      std::sort(around.begin(), around.end());
      around.erase(std::unique(around.begin(), around.end()), around.end());
    }
  }

  // Brings `choice` within the memory limit: each step takes the move with the least cost
  // added per byte saved (the first such move on ties: the lowest node, then the lowest
  // choice). Returns false when no move saves memory at a finite cost before the assignment
  // fits. A node's best move depends only on its own choice and its neighbours', so after a
  // move only the moved node and its neighbours are priced again, and a tournament tree over
  // the nodes' best moves finds the step's: O(log n + neighbours) a step, where pricing
  // every node's moves at every step made a repair O(steps x n) (hundreds of steps on a
  // thousand-node problem that cannot fit, each sweep's answer repaired in vain).
  bool repair(std::vector<int>& choice) const {
    double memory = total(choice);
    if (!(memory > problem_.memory_limit)) return true;
    const std::size_t n = choice.size();
    struct Move {
      double rate = kInf;  // +inf: none
      int choice = 0;
      double saved = 0;
    };
    std::vector<Move> best(n);
    auto price = [&](std::size_t v) {
      Move move;
      const ChoiceNode& node = problem_.nodes[v];
      const double here = local_cost(choice, v, choice[v]);
      for (std::size_t c = 0; c < node.cost.size(); ++c) {
        const double saved = node.memory[static_cast<std::size_t>(choice[v])] - node.memory[c];
        if (!(saved > 0)) continue;
        const double there = local_cost(choice, v, static_cast<int>(c));
        if (std::isinf(there)) continue;
        const double rate = std::isinf(here) ? -kInf : (there - here) / saved;
        if (rate < move.rate) move = {rate, static_cast<int>(c), saved};
      }
      best[v] = move;
    };
    // Leaves at [size, size + n); each inner slot holds the better node of its two children
    // (the lower rate, the lower node on ties); -1 for no node.
    std::size_t size = 1;
    while (size < n) size <<= 1;
    std::vector<int> tree(2 * size, -1);
    auto better = [&](int x, int y) {
      if (x < 0) return y;
      if (y < 0) return x;
      const double rx = best[static_cast<std::size_t>(x)].rate;
      const double ry = best[static_cast<std::size_t>(y)].rate;
      return ry < rx ? y : x;  // x < y in the tree's order: x wins ties
    };
    for (std::size_t v = 0; v < n; ++v) {
      price(v);
      tree[size + v] = static_cast<int>(v);
    }
    for (std::size_t t = size; t-- > 1;) tree[t] = better(tree[2 * t], tree[2 * t + 1]);
    auto update = [&](std::size_t v) {
      price(v);
      for (std::size_t t = (size + v) / 2; t >= 1; t /= 2) tree[t] = better(tree[2 * t], tree[2 * t + 1]);
    };
    while (memory > problem_.memory_limit) {
      const int top = tree[1];
      if (top < 0 || !(best[static_cast<std::size_t>(top)].rate < kInf)) return false;
      const auto v = static_cast<std::size_t>(top);
      const Move move = best[v];
      choice[v] = move.choice;
      memory -= move.saved;
      update(v);
      for (int u : neighbours_[v]) update(static_cast<std::size_t>(u));
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
  std::vector<std::vector<int>> neighbours_;  // the nodes sharing an edge with each node, once
};

// The memo's view of a problem and its options: everything solve_fast reads but the names.
std::uint64_t bits(double value) {
  std::uint64_t b = 0;
  std::memcpy(&b, &value, sizeof b);
  return b;
}

std::uint64_t memo_hash(const SpmdProblem& problem, const FastOptions& options) {
  std::uint64_t h = entry_hash(static_cast<int>(problem.nodes.size()), static_cast<int>(problem.edges.size()));
  auto add = [&](std::uint64_t v) { h = (h ^ v) * 0x100000001B3ULL + (h >> 29); };
  for (const ChoiceNode& node : problem.nodes) {
    add(node.cost.size());
    for (double c : node.cost) add(bits(c));
    for (double m : node.memory) add(bits(m));
  }
  for (const ChoiceEdge& e : problem.edges) {
    add(static_cast<std::uint64_t>(e.a) << 32 | static_cast<std::uint32_t>(e.b));
    for (double c : e.cost) add(bits(c));
  }
  add(bits(problem.memory_limit));
  add(static_cast<std::uint64_t>(options.beam_width) << 2 | (options.both_directions ? 2U : 0U) |
      (options.seeds_only ? 1U : 0U));
  for (const std::vector<int>& seed : options.seeds) {
    add(seed.size());
    for (int c : seed) add(static_cast<std::uint64_t>(c));
  }
  return h;
}

bool same_bits(const std::vector<double>& x, const std::vector<double>& y) {
  return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(double)) == 0);
}

bool same_problem(const SpmdProblem& x, const SpmdProblem& y) {
  if (x.nodes.size() != y.nodes.size() || x.edges.size() != y.edges.size() ||
      bits(x.memory_limit) != bits(y.memory_limit))
    return false;
  for (std::size_t v = 0; v < x.nodes.size(); ++v)
    if (!same_bits(x.nodes[v].cost, y.nodes[v].cost) || !same_bits(x.nodes[v].memory, y.nodes[v].memory)) return false;
  for (std::size_t e = 0; e < x.edges.size(); ++e)
    if (x.edges[e].a != y.edges[e].a || x.edges[e].b != y.edges[e].b || !same_bits(x.edges[e].cost, y.edges[e].cost))
      return false;
  return true;
}

bool same_options(const FastOptions& x, const FastOptions& y) {
  return x.beam_width == y.beam_width && x.seeds == y.seeds && x.both_directions == y.both_directions &&
         x.seeds_only == y.seeds_only;
}

SpmdSolution solve_fast_unmemoised(const SpmdProblem& problem, const FastOptions& options);

}  // namespace

const SpmdSolution* FastSolveMemo::find(const SpmdProblem& problem, const FastOptions& options) {
  const std::uint64_t h = memo_hash(problem, options);
  for (const Entry& entry : entries_) {
    if (entry.hash == h && same_options(entry.options, options) && same_problem(entry.problem, problem)) {
      ++reused_;
      return &entry.solution;
    }
  }
  return nullptr;
}

void FastSolveMemo::keep(const SpmdProblem& problem, const FastOptions& options, const SpmdSolution& solution) {
  Entry entry;
  entry.hash = memo_hash(problem, options);
  entry.problem.memory_limit = problem.memory_limit;
  entry.problem.edges = problem.edges;
  entry.problem.nodes.reserve(problem.nodes.size());
  for (const ChoiceNode& node : problem.nodes) entry.problem.nodes.push_back({{}, node.cost, node.memory});
  entry.options = options;
  entry.options.memo = nullptr;
  entry.solution = solution;
  entries_.push_back(std::move(entry));
}

SpmdSolution solve_fast(const SpmdProblem& problem, const FastOptions& options) {
  if (options.memo == nullptr) return solve_fast_unmemoised(problem, options);
  if (const SpmdSolution* kept = options.memo->find(problem, options)) return *kept;
  SpmdSolution solution = solve_fast_unmemoised(problem, options);
  options.memo->keep(problem, options, solution);
  return solution;
}

namespace {

SpmdSolution solve_fast_unmemoised(const SpmdProblem& problem, const FastOptions& options) {
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
  // No assignment fits when the least memory of every node, summed as evaluate() sums an
  // assignment's (in node order: rounding is monotone, so no assignment's sum comes in under
  // it), is over the limit. Then the answer is the least-memory sweep's, as beam_solution()
  // below would return after its unconstrained sweep, and no seed or reverse sweep can beat
  // it (only a feasible start may): one sweep instead of four or more, and no repairs that
  // cannot succeed (the SPMD search on a cluster too small for the model, a refusal).
  const bool nothing_fits = [&] {
    double least = 0;
    for (const ChoiceNode& node : problem.nodes) least += *std::min_element(node.memory.begin(), node.memory.end());
    return least > problem.memory_limit;
  }();
  auto beam_solution = [&]() -> SpmdSolution {
    if (nothing_fits) return evaluate(sweep.run(least_memory(reduced))).solution;
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
  if (nothing_fits && !options.seeds_only) return beam;
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

}  // namespace

}  // namespace shardwise::search
