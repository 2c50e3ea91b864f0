// The SPMD search as a plain discrete optimisation problem, and its two solvers.
//
// Every choice node picks one of its choices (a sharding strategy of a node, a placement
// of a parameter or input); an edge prices each pair of choices of its two nodes (the
// resharding between a producer's output and a consumer's input, forward and backward).
//
//   minimise   sum_v cost_v[c_v] + sum_e cost_e[c_a(e)][c_b(e)]
//   subject to sum_v memory_v[c_v] <= memory_limit
//
// The builder (search/spmd_builder.h) folds repeated blocks into one set of choice nodes
// (costs multiplied by the number of blocks), so edges may join any two distinct nodes in
// either index order; the node order is still the order the solvers sweep in. A cost of
// +infinity forbids a choice or pair. Costs and memory are finite or +inf, never negative
// or NaN.
//
// Solvers, same problem, same objective:
//  - solve_fast: a sweep over the nodes in index order (and another in reverse order,
//    FastOptions::both_directions) keeping the best `beam_width`
//    partial assignments (a dynamic programme over the "frontier": decided nodes with an
//    edge to an undecided one; exact when the frontier's assignments never exceed the
//    beam), the memory limit handled by a Lagrange multiplier on memory found by bisection.
//    O(nodes x beam x choices x frontier edges). Deterministic: ties go to the lower choice
//    index, lexicographically from the first node.
//  - solve_ilp: the integer programme above with the standard linearisation of the edge
//    products (x binary per node choice, y >= 0 per edge pair, sum_b y_ab = x_a,
//    sum_a y_ab = x_b), solved by HiGHS (one thread, so deterministic), started from
//    `start` when given (normally solve_fast's answer), so it is never worse than that start.
//    Returns the proven optimum unless options.max_seconds stops HiGHS first (then the best
//    found, `optimal` false).
//  Both first fold away nodes with a single allowed choice (their edges become node costs).
//
// Worked example (two nodes, two choices each, an edge that charges 5 for disagreeing):
//   SpmdProblem p;
//   p.nodes = {{"a", {1, 2}, {0, 0}}, {"b", {3, 0}, {0, 0}}};
//   p.edges = {{0, 1, {0, 5, 5, 0}}};
//   solve_fast(p).choice == {1, 1};  cost 2 (a:2 + b:0 + edge 0)
//   solve_ilp(p).choice == {1, 1}
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

namespace shardwise::search {

struct ChoiceNode {
  std::string name;            // for errors and reports
  std::vector<double> cost;    // one per choice (seconds per step)
  std::vector<double> memory;  // one per choice (bytes per rank)
};

struct ChoiceEdge {
  int a = 0;                 // node ids, a != b
  int b = 0;
  std::vector<double> cost;  // row-major: cost[choice_a * choices(b) + choice_b]
};

struct SpmdProblem {
  std::vector<ChoiceNode> nodes;
  std::vector<ChoiceEdge> edges;
  double memory_limit = std::numeric_limits<double>::infinity();
};

struct SpmdSolution {
  std::vector<int> choice;  // one per node
  double cost = 0;          // objective (total_cost)
  double memory = 0;        // total_memory
  bool feasible = false;    // finite cost and memory within the limit
  bool optimal = false;     // proven optimal (ILP), never claimed by solve_fast
  std::string solver;       // "fast" or "ilp"
};

// Throws support::ValidationError naming the node or edge: no choices, cost and memory of
// different lengths, a negative or NaN value, an edge whose matrix size is not
// choices(a) x choices(b), a == b, or a node id out of range.
void validate(const SpmdProblem& problem);

double total_cost(const SpmdProblem& problem, std::span<const int> choice);
double total_memory(const SpmdProblem& problem, std::span<const int> choice);

// Assignments the fast solver's beam keeps per step: its default, and the sharding model's
// and the SPMD search's (they pass theirs on to it).
inline constexpr int kBeamWidth = 256;

class FastSolveMemo;

struct FastOptions {
  int beam_width = kBeamWidth;
  // Whole assignments (one choice per node) the solver also starts from: each is brought
  // within memory, improved by single-node moves and kept when it beats the beam's answer.
  // The SPMD search passes the axis' current decisions (so a coordinate-descent pass never
  // makes the axis worse) and pure data parallelism (a baseline the beam's myopic pruning
  // can lose early in the sweep).
  std::vector<std::vector<int>> seeds;
  // Also sweep the nodes in reverse order and start from that answer too: a beam prunes
  // myopically, and what it cannot see coming differs by direction.
  bool both_directions = true;
  // Skip the beam: the answer is the first seed, improved by local moves when it fits and
  // returned as it is (feasible false) when it does not: a start for a caller that will
  // make room elsewhere (the SPMD search's data-parallel start).
  bool seeds_only = false;
  // Where solve_fast looks its answer up first and keeps it after (none: always solves).
  FastSolveMemo* memo = nullptr;
};

// solve_fast's answers, kept for the problems a caller meets again. The SPMD search builds
// the same axis problem more than once: under a mesh searched with and without
// recomputation where recomputing changes nothing on that axis, and in descents whose
// passes meet the other axis' decisions as an earlier descent left them (GPT-2, Llama and
// RWKV: a third to a half of a search's problems). Exact: an answer is given again only for
// a problem equal bit for bit in every node's costs and memory, every edge and the memory
// limit, under the same beam width, seeds and options (the names aside, which only errors
// show), so it is the answer solve_fast would compute again. Holds a copy of each problem it
// keeps, for as long as it lives (one search); not thread-safe.
class FastSolveMemo {
 public:
  // The kept answer to `problem` under `options`, or null; counts a reuse when found.
  const SpmdSolution* find(const SpmdProblem& problem, const FastOptions& options);
  void keep(const SpmdProblem& problem, const FastOptions& options, const SpmdSolution& solution);
  int solved() const { return static_cast<int>(entries_.size()); }  // problems solved and kept
  int reused() const { return reused_; }                            // answers given again

 private:
  struct Entry {
    std::uint64_t hash = 0;
    SpmdProblem problem;  // names cleared
    FastOptions options;  // memo cleared
    SpmdSolution solution;
  };
  std::vector<Entry> entries_;
  int reused_ = 0;
};

struct IlpOptions {
  double max_seconds = 0;  // 0 = no limit (deterministic); > 0 may stop early
};

// When no assignment fits in memory, both return the least-memory assignment they found
// with feasible = false.
SpmdSolution solve_fast(const SpmdProblem& problem, const FastOptions& options = {});
SpmdSolution solve_ilp(const SpmdProblem& problem, const IlpOptions& options = {},
                       const SpmdSolution* start = nullptr);

}  // namespace shardwise::search
