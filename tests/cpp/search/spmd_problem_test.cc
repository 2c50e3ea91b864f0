#include "search/spmd_problem.h"

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "support/error.h"

namespace shardwise::search {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

SpmdProblem worked_example() {
  SpmdProblem p;
  p.nodes = {{"a", {1, 2}, {0, 0}}, {"b", {3, 0}, {0, 0}}};
  p.edges = {{0, 1, {0, 5, 5, 0}}};
  return p;
}

struct BruteForce {
  bool feasible = false;
  double cost = kInf;          // cheapest feasible
  double least_memory = kInf;  // least memory of a finite-cost assignment
};

// Every assignment, in the order of an odometer on the choice vector.
BruteForce brute_force(const SpmdProblem& p) {
  BruteForce best;
  std::vector<int> choice(p.nodes.size(), 0);
  while (true) {
    const double cost = total_cost(p, choice);
    const double memory = total_memory(p, choice);
    if (std::isfinite(cost)) {
      best.least_memory = std::min(best.least_memory, memory);
      if (memory <= p.memory_limit && cost < best.cost) {
        best.cost = cost;
        best.feasible = true;
      }
    }
    std::size_t v = 0;
    while (v < choice.size() && ++choice[v] == static_cast<int>(p.nodes[v].cost.size())) choice[v++] = 0;
    if (v == choice.size()) break;
  }
  return best;
}

// 6-9 nodes of 2-4 choices, edges in both index orders, a few forbidden (+inf) entries and
// a memory limit somewhere between the least and the most a node-wise choice can take.
SpmdProblem random_problem(std::mt19937& rng) {
  std::uniform_int_distribution<int> node_count(6, 9);
  std::uniform_int_distribution<int> choice_count(2, 4);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  SpmdProblem p;
  const int n = node_count(rng);
  double least = 0;
  double most = 0;
  for (int v = 0; v < n; ++v) {
    const int k = choice_count(rng);
    ChoiceNode node{"n" + std::to_string(v), {}, {}};
    for (int c = 0; c < k; ++c) {
      node.cost.push_back(unit(rng) < 0.1 ? kInf : std::round(unit(rng) * 100) / 10);
      node.memory.push_back(std::round(unit(rng) * 10));
    }
    least += *std::min_element(node.memory.begin(), node.memory.end());
    most += *std::max_element(node.memory.begin(), node.memory.end());
    p.nodes.push_back(std::move(node));
  }
  std::uniform_int_distribution<int> pick(0, n - 1);
  const int edges = n + n / 2;
  for (int e = 0; e < edges; ++e) {
    const int a = pick(rng);
    int b = pick(rng);
    if (a == b) b = (a + 1) % n;
    ChoiceEdge edge{a, b, {}};
    const std::size_t size =
        p.nodes[static_cast<std::size_t>(a)].cost.size() * p.nodes[static_cast<std::size_t>(b)].cost.size();
    for (std::size_t k = 0; k < size; ++k) {
      edge.cost.push_back(unit(rng) < 0.05 ? kInf : std::round(unit(rng) * 50) / 10);
    }
    p.edges.push_back(std::move(edge));
  }
  p.memory_limit = least + std::round(unit(rng) * (most - least));
  return p;
}

// A chain-like problem with skips, shaped like a sharding search: node i feeds i+1 and two
// nodes in three also feed a node 2-8 further on; edges are written in either index order.
// Choice 0 replicates, 1-2 shard two ways, 3-4 four ways: sharding divides the memory (the
// node's own size, 10 to 1000) and adds communication to the cost; changing sharding along
// an edge costs a resharding proportional to the tensor (0 when the choices agree). The
// limit sits `tightness` of the way from the least to the most memory.
SpmdProblem large_problem(int nodes, unsigned seed, double tightness) {
  constexpr int kChoices = 5;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  SpmdProblem p;
  double least = 0;
  double most = 0;
  std::vector<double> tensor(static_cast<std::size_t>(nodes));
  for (int v = 0; v < nodes; ++v) {
    ChoiceNode node{"n" + std::to_string(v), {}, {}};
    const double compute = 1.0 + 3.0 * unit(rng);
    const double bytes = std::round(10.0 * std::pow(100.0, unit(rng)));
    tensor[static_cast<std::size_t>(v)] = 0.2 + unit(rng);
    for (int c = 0; c < kChoices; ++c) {
      const double degree = c == 0 ? 1 : (c <= 2 ? 2 : 4);
      node.cost.push_back(compute * (1 + 0.15 * c * (0.5 + unit(rng))));
      node.memory.push_back(std::round(bytes / degree + (c % 2) * bytes * 0.1));
    }
    least += *std::min_element(node.memory.begin(), node.memory.end());
    most += *std::max_element(node.memory.begin(), node.memory.end());
    p.nodes.push_back(std::move(node));
  }
  auto add_edge = [&](int from, int to) {
    std::vector<double> cost(kChoices * kChoices);
    for (int x = 0; x < kChoices; ++x) {
      for (int y = 0; y < kChoices; ++y) {
        cost[static_cast<std::size_t>(x * kChoices + y)] =
            x == y ? 0.0 : tensor[static_cast<std::size_t>(from)] * (0.5 + unit(rng));
      }
    }
    if (unit(rng) < 0.5) {
      p.edges.push_back({from, to, cost});
      return;
    }
    std::vector<double> transposed(cost.size());
    for (int x = 0; x < kChoices; ++x) {
      for (int y = 0; y < kChoices; ++y) {
        transposed[static_cast<std::size_t>(y * kChoices + x)] = cost[static_cast<std::size_t>(x * kChoices + y)];
      }
    }
    p.edges.push_back({to, from, transposed});
  };
  std::uniform_int_distribution<int> skip(2, 8);
  for (int v = 0; v + 1 < nodes; ++v) {
    add_edge(v, v + 1);
    if (v % 3 != 2 && v + 2 < nodes) add_edge(v, std::min(nodes - 1, v + skip(rng)));
  }
  p.memory_limit = least + tightness * (most - least);
  return p;
}

void expect_consistent(const SpmdProblem& p, const SpmdSolution& s) {
  ASSERT_EQ(s.choice.size(), p.nodes.size());
  EXPECT_EQ(s.cost, total_cost(p, s.choice));
  EXPECT_EQ(s.memory, total_memory(p, s.choice));
  EXPECT_EQ(s.feasible, std::isfinite(s.cost) && s.memory <= p.memory_limit);
}

void expect_validation_error(const SpmdProblem& p, const std::string& needle) {
  try {
    validate(p);
    ADD_FAILURE() << "no error; expected one naming " << needle;
  } catch (const support::ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(SpmdProblemTest, WorkedExample) {
  const SpmdProblem p = worked_example();
  const SpmdSolution fast = solve_fast(p);
  EXPECT_EQ(fast.choice, (std::vector<int>{1, 1}));
  EXPECT_EQ(fast.cost, 2);
  EXPECT_TRUE(fast.feasible);
  EXPECT_FALSE(fast.optimal);
  EXPECT_EQ(fast.solver, "fast");
  const SpmdSolution ilp = solve_ilp(p);
  EXPECT_EQ(ilp.choice, (std::vector<int>{1, 1}));
  EXPECT_EQ(ilp.cost, 2);
  EXPECT_TRUE(ilp.feasible);
  EXPECT_TRUE(ilp.optimal);
  EXPECT_EQ(ilp.solver, "ilp");
  const SpmdSolution started = solve_ilp(p, {}, &fast);
  EXPECT_EQ(started.choice, (std::vector<int>{1, 1}));
}

TEST(SpmdProblemTest, TotalCostAndMemory) {
  SpmdProblem p = worked_example();
  p.nodes[0].memory = {4, 1};
  p.nodes[1].memory = {2, 8};
  // Edge given in the other index order: cost[choice_b * 2 + choice_a].
  p.edges.push_back({1, 0, {0, 7, 0, 0}});
  const std::vector<int> choice{1, 0};
  EXPECT_EQ(total_cost(p, choice), 2 + 3 + 5 + 7);
  EXPECT_EQ(total_memory(p, choice), 1 + 2);
  EXPECT_THROW(total_cost(p, std::vector<int>{0}), support::ValidationError);
  EXPECT_THROW(total_memory(p, std::vector<int>{0, 2}), support::ValidationError);
}

TEST(SpmdProblemTest, ValidateRejectsMalformedProblems) {
  EXPECT_NO_THROW(validate(worked_example()));
  {
    SpmdProblem p = worked_example();
    p.nodes[1].cost.clear();
    p.nodes[1].memory.clear();
    expect_validation_error(p, "node 1 ('b') has no choices");
  }
  {
    SpmdProblem p = worked_example();
    p.nodes[0].memory = {0};
    expect_validation_error(p, "node 0 ('a')");
  }
  {
    SpmdProblem p = worked_example();
    p.nodes[1].cost[0] = -1;
    expect_validation_error(p, "node 1 ('b')");
  }
  {
    SpmdProblem p = worked_example();
    p.nodes[0].memory[1] = std::nan("");
    expect_validation_error(p, "node 0 ('a')");
  }
  {
    SpmdProblem p = worked_example();
    p.edges[0].cost = {0, 5, 5};
    expect_validation_error(p, "edge 0 (node 0 ('a') -> node 1 ('b')) has 3 costs");
  }
  {
    SpmdProblem p = worked_example();
    p.edges[0].cost[2] = std::nan("");
    expect_validation_error(p, "edge 0 (node 0 ('a') -> node 1 ('b'))");
  }
  {
    SpmdProblem p = worked_example();
    p.edges[0].cost[3] = -0.5;
    expect_validation_error(p, "edge 0 (node 0 ('a') -> node 1 ('b'))");
  }
  {
    SpmdProblem p = worked_example();
    p.edges[0] = {1, 1, {0, 0, 0, 0}};
    expect_validation_error(p, "edge 0 joins node 1 ('b') to itself");
  }
  {
    SpmdProblem p = worked_example();
    p.edges[0].b = 2;
    expect_validation_error(p, "edge 0 joins nodes 0 and 2, out of range");
  }
  {
    SpmdProblem p = worked_example();
    p.edges[0].a = -1;
    expect_validation_error(p, "edge 0 joins nodes -1 and 1, out of range");
  }
  {
    // The solvers validate first.
    SpmdProblem p = worked_example();
    p.nodes[0].cost.push_back(1);
    EXPECT_THROW(solve_fast(p), support::ValidationError);
    EXPECT_THROW(solve_ilp(p), support::ValidationError);
  }
}

TEST(SpmdFastTest, ChainIsExactAndMatchesBruteForce) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (int trial = 0; trial < 5; ++trial) {
    SpmdProblem p;
    const int n = 11;
    const int k = 3;
    for (int v = 0; v < n; ++v) {
      ChoiceNode node{"c" + std::to_string(v), {}, std::vector<double>(k, 1.0)};
      for (int c = 0; c < k; ++c) node.cost.push_back(std::round(unit(rng) * 100) / 10);
      p.nodes.push_back(std::move(node));
    }
    for (int v = 0; v + 1 < n; ++v) {
      ChoiceEdge edge{v % 2 == 0 ? v : v + 1, v % 2 == 0 ? v + 1 : v, {}};
      for (int c = 0; c < k * k; ++c) edge.cost.push_back(std::round(unit(rng) * 80) / 10);
      p.edges.push_back(std::move(edge));
    }
    const BruteForce best = brute_force(p);
    // The frontier is one node of 3 choices: a beam of 3 already holds every state.
    const SpmdSolution fast = solve_fast(p, {.beam_width = 3});
    expect_consistent(p, fast);
    EXPECT_TRUE(fast.feasible);
    EXPECT_NEAR(fast.cost, best.cost, 1e-9) << "trial " << trial;
    const SpmdSolution ilp = solve_ilp(p);
    EXPECT_NEAR(ilp.cost, best.cost, 1e-9) << "trial " << trial;
    EXPECT_TRUE(ilp.optimal);
  }
}

// Nodes read by a hub: `readers` nodes of 2 choices in a chain, each also joined to the
// hub, which sits last (first == false) or first (first == true) in the sweep order; every
// third reader also reads a node 2 or 3 back. With the hub last, every reader stays in the
// forward sweep's frontier until the hub (the reverse sweep's shape for a leaf read at every
// step of an unrolled loop), while the skip edges end along the way (entries dropped, states
// falling together).
SpmdProblem hub_problem(int readers, bool first, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  SpmdProblem p;
  const int hub = first ? 0 : readers;
  const int offset = first ? 1 : 0;
  for (int v = 0; v <= readers; ++v) {
    const int k = v == hub ? 3 : 2;
    ChoiceNode node{"h" + std::to_string(v), {}, std::vector<double>(static_cast<std::size_t>(k), 1.0)};
    for (int c = 0; c < k; ++c) node.cost.push_back(std::round(unit(rng) * 100) / 10);
    p.nodes.push_back(std::move(node));
  }
  auto add = [&](int a, int b) {
    ChoiceEdge edge{a, b, {}};
    const std::size_t size =
        p.nodes[static_cast<std::size_t>(a)].cost.size() * p.nodes[static_cast<std::size_t>(b)].cost.size();
    for (std::size_t c = 0; c < size; ++c) edge.cost.push_back(std::round(unit(rng) * 60) / 10);
    p.edges.push_back(std::move(edge));
  };
  for (int r = 0; r < readers; ++r) {
    const int v = r + offset;
    if (r % 2 == 0) add(v, hub); else add(hub, v);
    if (r + 1 < readers) add(v, v + 1);
    if (r % 3 == 2) add(v - 2 - (r % 2), v);
  }
  return p;
}

TEST(SpmdFastTest, WideFrontiersAreExactAndMatchBruteForce) {
  // Readers of one hub, the hub last or first: the sweeps' frontier holds up to 11 nodes of
  // 2 choices (2048 assignments; a beam of 4096 keeps them all, so each sweep is exact) and
  // entries leave it along the way; the beam's answer is the optimum either way.
  for (bool first : {false, true}) {
    for (unsigned seed = 1; seed <= 4; ++seed) {
      const SpmdProblem p = hub_problem(11, first, seed);
      const BruteForce best = brute_force(p);
      SCOPED_TRACE(fmt::format("hub {}, seed {}", first ? "first" : "last", seed));
      for (bool both : {false, true}) {
        const SpmdSolution fast = solve_fast(p, {.beam_width = 4096, .both_directions = both});
        expect_consistent(p, fast);
        EXPECT_TRUE(fast.feasible);
        EXPECT_EQ(fast.cost, total_cost(p, fast.choice));
        EXPECT_NEAR(fast.cost, best.cost, 1e-9);
      }
      // A narrow beam is not exact, but stays a consistent, deterministic answer.
      const SpmdSolution narrow = solve_fast(p, {.beam_width = 5});
      expect_consistent(p, narrow);
      EXPECT_GE(narrow.cost, best.cost - 1e-9);
      EXPECT_EQ(solve_fast(p, {.beam_width = 5}).choice, narrow.choice);
    }
  }
}

TEST(SpmdFastTest, AMemoGivesAnAnswerAgainOnlyForTheSameProblem) {
  const SpmdProblem p = large_problem(60, 9, 0.6);
  const SpmdSolution plain = solve_fast(p);
  FastSolveMemo memo;
  FastOptions options;
  options.memo = &memo;
  const SpmdSolution first = solve_fast(p, options);
  EXPECT_EQ(memo.solved(), 1);
  EXPECT_EQ(memo.reused(), 0);
  const SpmdSolution again = solve_fast(p, options);
  EXPECT_EQ(memo.solved(), 1);
  EXPECT_EQ(memo.reused(), 1);
  for (const SpmdSolution* s : {&first, &again}) {
    EXPECT_EQ(s->choice, plain.choice);
    EXPECT_EQ(s->cost, plain.cost);
    EXPECT_EQ(s->memory, plain.memory);
    EXPECT_EQ(s->feasible, plain.feasible);
    EXPECT_EQ(s->solver, plain.solver);
  }
  // Names are not part of the problem the solver sees.
  SpmdProblem renamed = p;
  for (ChoiceNode& node : renamed.nodes) node.name += "'";
  solve_fast(renamed, options);
  EXPECT_EQ(memo.reused(), 2);
  // Anything the answer depends on makes another problem: a cost, a memory size, the limit,
  // an edge's cost or endpoints, the beam, the seeds, the directions.
  SpmdProblem cost = p;
  cost.nodes[17].cost[2] = std::nextafter(cost.nodes[17].cost[2], kInf);
  SpmdProblem memory = p;
  memory.nodes[3].memory[0] += 1;
  SpmdProblem limit = p;
  limit.memory_limit = std::nextafter(limit.memory_limit, 0.0);
  SpmdProblem edge = p;
  edge.edges[40].cost[6] += 0.5;
  for (const SpmdProblem* other : {&cost, &memory, &limit, &edge}) {
    const int solved = memo.solved();
    const SpmdSolution s = solve_fast(*other, options);
    EXPECT_EQ(memo.solved(), solved + 1);
    const SpmdSolution unmemoised = solve_fast(*other);
    EXPECT_EQ(s.choice, unmemoised.choice);
    EXPECT_EQ(s.cost, unmemoised.cost);
  }
  FastOptions narrow = options;
  narrow.beam_width = 8;
  FastOptions seeded = options;
  seeded.seeds = {std::vector<int>(p.nodes.size(), 0)};
  FastOptions forward = options;
  forward.both_directions = false;
  for (const FastOptions* other : {&narrow, &seeded, &forward}) {
    const int solved = memo.solved();
    solve_fast(p, *other);
    EXPECT_EQ(memo.solved(), solved + 1);
    solve_fast(p, *other);
    EXPECT_EQ(memo.solved(), solved + 1);
  }
  EXPECT_EQ(memo.reused(), 5);
}

TEST(SpmdSolversTest, RandomSmallProblemsMatchBruteForce) {
  std::mt19937 rng(20240611);
  int feasible = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const SpmdProblem p = random_problem(rng);
    const BruteForce best = brute_force(p);
    const SpmdSolution fast = solve_fast(p);
    const SpmdSolution ilp = solve_ilp(p);
    const SpmdSolution started = solve_ilp(p, {}, &fast);
    SCOPED_TRACE("trial " + std::to_string(trial));
    expect_consistent(p, fast);
    expect_consistent(p, ilp);
    expect_consistent(p, started);
    EXPECT_EQ(fast.feasible, best.feasible);
    EXPECT_EQ(ilp.feasible, best.feasible);
    EXPECT_EQ(started.feasible, best.feasible);
    if (best.feasible) {
      ++feasible;
      EXPECT_GE(fast.cost, best.cost - 1e-9);
      EXPECT_NEAR(ilp.cost, best.cost, 1e-9);
      EXPECT_NEAR(started.cost, best.cost, 1e-9);
      EXPECT_TRUE(ilp.optimal);
      EXPECT_LE(started.cost, fast.cost);
    } else if (std::isfinite(best.least_memory)) {
      // Nothing fits: both report the least memory of a finite-cost assignment.
      EXPECT_EQ(fast.memory, best.least_memory);
      EXPECT_EQ(ilp.memory, best.least_memory);
    }
  }
  // The generator must exercise both outcomes.
  EXPECT_GT(feasible, 30);
  EXPECT_LT(feasible, 60);
}

TEST(SpmdIlpTest, NeverWorseThanStart) {
  std::mt19937 rng(99);
  for (int trial = 0; trial < 20; ++trial) {
    const SpmdProblem p = random_problem(rng);
    const SpmdSolution fast = solve_fast(p, {.beam_width = 2});
    const SpmdSolution ilp = solve_ilp(p, {}, &fast);
    SCOPED_TRACE("trial " + std::to_string(trial));
    expect_consistent(p, ilp);
    if (fast.feasible) {
      EXPECT_TRUE(ilp.feasible);
      EXPECT_LE(ilp.cost, fast.cost);
    }
  }
  // A start the solver cannot use (a folded node disagrees with the presolve) is still honoured.
  SpmdProblem p = worked_example();
  SpmdSolution start;
  start.choice = {1, 1};
  start.cost = 123;  // recomputed, not trusted
  const SpmdSolution ilp = solve_ilp(p, {}, &start);
  EXPECT_EQ(ilp.choice, (std::vector<int>{1, 1}));
  EXPECT_EQ(ilp.cost, 2);
  start.choice = {0};
  EXPECT_THROW(solve_ilp(p, {}, &start), support::ValidationError);
}

TEST(SpmdSolversTest, InfeasibleMemoryReturnsLeastMemory) {
  SpmdProblem p;
  p.nodes = {{"a", {1, 5, 2}, {10, 4, 6}}, {"b", {1, 3}, {10, 5}}, {"c", {2, 1, kInf}, {3, 8, 1}}};
  p.edges = {{0, 1, {0, 1, 1, 0, 2, 2}}, {2, 0, {0, 1, 1, 1, 0, 1, 1, 1, 0}}};
  p.memory_limit = 11;  // the least memory with finite cost is 4 + 5 + 3 = 12
  const SpmdSolution fast = solve_fast(p);
  expect_consistent(p, fast);
  EXPECT_FALSE(fast.feasible);
  EXPECT_EQ(fast.memory, 12);
  EXPECT_EQ(fast.choice, (std::vector<int>{1, 1, 0}));
  const SpmdSolution ilp = solve_ilp(p);
  expect_consistent(p, ilp);
  EXPECT_FALSE(ilp.feasible);
  EXPECT_FALSE(ilp.optimal);
  EXPECT_EQ(ilp.memory, 12);
  const SpmdSolution started = solve_ilp(p, {}, &fast);
  EXPECT_FALSE(started.feasible);
  EXPECT_EQ(started.choice, fast.choice);

  // One more byte and it fits, at the only fitting assignment.
  p.memory_limit = 12;
  EXPECT_TRUE(solve_fast(p).feasible);
  EXPECT_EQ(solve_ilp(p).choice, (std::vector<int>{1, 1, 0}));
  // A looser limit: the bisection finds the cheapest fit (brute force agrees).
  p.memory_limit = 19;
  const BruteForce best = brute_force(p);
  EXPECT_EQ(solve_fast(p).cost, best.cost);
  EXPECT_EQ(solve_ilp(p).cost, best.cost);
}

TEST(SpmdSolversTest, SingleChoicePresolve) {
  // "fixed" has one choice, "forced" one finite choice; the +inf edge entries from them
  // leave "pinned" with one allowed choice in turn. Only "free" is left to choose.
  SpmdProblem p;
  p.nodes = {{"free", {1, 1, 4}, {1, 2, 3}},
             {"fixed", {2}, {5}},
             {"forced", {kInf, 3, kInf}, {1, 1, 1}},
             {"pinned", {0, 0}, {0, 7}}};
  p.edges = {{1, 3, {kInf, 0}},                    // fixed -> pinned: pinned must take choice 1
             {3, 0, {5, 5, 5, 0, 2, 1}},           // pinned (a) x free (b)
             {0, 2, {0, 9, 0, 1, 0, 2, 3, 0, 0}},  // free (a) x forced (b)
             {2, 1, {0, 4, 0}}};                   // forced (a) x fixed (b)
  // free=0: 1 + 0 + 9 = 10; free=1: 1 + 2 + 0 = 3; free=2: 4 + 1 + 0 = 5 (plus 2 + 3 + 4 fixed).
  const BruteForce best = brute_force(p);
  ASSERT_TRUE(best.feasible);
  for (const SpmdSolution& s : {solve_fast(p), solve_ilp(p)}) {
    expect_consistent(p, s);
    EXPECT_EQ(s.choice, (std::vector<int>{1, 0, 1, 1}));
    EXPECT_EQ(s.cost, best.cost);
    EXPECT_EQ(s.cost, 3 + 2 + 3 + 4);
  }
  // Everything folded: nothing is left for the solver.
  p.nodes[0] = {"free", {1}, {1}};
  p.edges[1].cost = {5, 0};
  p.edges[2].cost = {0, 1, 0};
  const SpmdSolution ilp = solve_ilp(p);
  EXPECT_EQ(ilp.choice, (std::vector<int>{0, 0, 1, 1}));
  EXPECT_TRUE(ilp.optimal);
  EXPECT_EQ(solve_fast(p).choice, ilp.choice);
  // The memory of the folded nodes counts against the limit.
  p.memory_limit = 13;
  EXPECT_FALSE(solve_fast(p).feasible);
  EXPECT_FALSE(solve_ilp(p).feasible);
}

TEST(SpmdSolversTest, NoFiniteAssignment) {
  SpmdProblem p = worked_example();
  p.edges[0].cost = {kInf, kInf, kInf, kInf};
  const SpmdSolution fast = solve_fast(p);
  expect_consistent(p, fast);
  EXPECT_FALSE(fast.feasible);
  const SpmdSolution ilp = solve_ilp(p);
  expect_consistent(p, ilp);
  EXPECT_FALSE(ilp.feasible);

  // "u" is folded for its one finite choice, which folding "f" then makes infinite too.
  SpmdProblem q;
  q.nodes = {{"f", {1}, {1}}, {"u", {kInf, 1}, {1, 1}}, {"w", {1, 2}, {1, 1}}};
  q.edges = {{0, 1, {0, kInf}}, {1, 2, {0, 1, 1, 0}}};
  for (const SpmdSolution& s : {solve_fast(q), solve_ilp(q)}) {
    expect_consistent(q, s);
    EXPECT_FALSE(s.feasible);
    EXPECT_EQ(s.choice[0], 0);
    EXPECT_EQ(s.choice[1], 1);
  }
}

TEST(SpmdFastTest, PolishFillsMemoryTheLagrangianLeaves) {
  // Four nodes with the same trade-off all switch at the same multiplier: the Lagrangian
  // alone gives all-sharded (cost 8, memory 20) under a limit of 30; the best fit shards two.
  SpmdProblem p;
  for (int v = 0; v < 4; ++v) p.nodes.push_back({"l" + std::to_string(v), {1, 2}, {10, 5}});
  p.memory_limit = 30;
  const SpmdSolution fast = solve_fast(p);
  expect_consistent(p, fast);
  EXPECT_TRUE(fast.feasible);
  EXPECT_EQ(fast.cost, 6);
  EXPECT_EQ(fast.cost, brute_force(p).cost);
  EXPECT_EQ(fast.memory, 30);
}

TEST(SpmdFastTest, SeedsRecoverWhatANarrowBeamPrunes) {
  // A chain whose neighbours pay 10 to disagree. a's cheap choice leads a beam of one to
  // a = b = 0, then c = 1 (its 0 costs 100): 10, a local optimum no single-node move leaves.
  // All ones costs 1.
  SpmdProblem p;
  p.nodes = {{"a", {0, 1}, {0, 0}}, {"b", {0, 0}, {0, 0}}, {"c", {100, 0}, {0, 0}}};
  p.edges = {{0, 1, {0, 10, 10, 0}}, {1, 2, {0, 10, 10, 0}}};
  FastOptions narrow{1, {}, false};  // one direction: the backward sweep alone would find it
  EXPECT_DOUBLE_EQ(solve_fast(p, narrow).cost, 10);
  narrow.seeds = {{1, 1, 1}};
  SpmdSolution seeded = solve_fast(p, narrow);
  EXPECT_DOUBLE_EQ(seeded.cost, 1);
  EXPECT_EQ(seeded.choice, (std::vector<int>{1, 1, 1}));
  // A worse seed never makes the answer worse.
  narrow.seeds = {{0, 0, 0}};
  EXPECT_DOUBLE_EQ(solve_fast(p, narrow).cost, 10);
  // A seed over the memory limit is repaired, then improved: b must be 0 now.
  p.nodes[1].memory = {0, 5};
  p.memory_limit = 1;
  narrow.seeds = {{1, 1, 1}};
  SpmdSolution repaired = solve_fast(p, narrow);
  EXPECT_TRUE(repaired.feasible);
  EXPECT_DOUBLE_EQ(repaired.cost, 10);
  // seeds_only: the first seed as a start: as it is when over the limit (for a caller that
  // makes room elsewhere), improved by local moves when it fits; a seed is required.
  FastOptions start_only{1, {{1, 1, 1}}, false, true};
  SpmdSolution as_is = solve_fast(p, start_only);
  EXPECT_EQ(as_is.choice, (std::vector<int>{1, 1, 1}));
  EXPECT_FALSE(as_is.feasible);
  start_only.seeds = {{1, 0, 0}};
  EXPECT_EQ(solve_fast(p, start_only).choice, (std::vector<int>{0, 0, 1}));  // c to 1, then a to 0
  start_only.seeds.clear();
  EXPECT_THROW(solve_fast(p, start_only), support::ValidationError);
  // Malformed seeds are named.
  narrow.seeds = {{1, 1}};
  EXPECT_THROW(solve_fast(p, narrow), support::ValidationError);
  narrow.seeds = {{1, 2, 1}};
  EXPECT_THROW(solve_fast(p, narrow), support::ValidationError);
}

TEST(SpmdSolversTest, Deterministic) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 5; ++trial) {
    const SpmdProblem p = random_problem(rng);
    const SpmdSolution a = solve_fast(p, {.beam_width = 4});
    const SpmdSolution b = solve_fast(p, {.beam_width = 4});
    EXPECT_EQ(a.choice, b.choice);
    EXPECT_EQ(a.cost, b.cost);
    const SpmdSolution c = solve_ilp(p, {}, &a);
    const SpmdSolution d = solve_ilp(p, {}, &b);
    EXPECT_EQ(c.choice, d.choice);
    EXPECT_EQ(c.cost, d.cost);
  }
  const SpmdProblem big = large_problem(120, 3, 0.7);
  const SpmdSolution a = solve_fast(big);
  const SpmdSolution b = solve_fast(big);
  EXPECT_EQ(a.choice, b.choice);
  EXPECT_EQ(solve_ilp(big, {}, &a).choice, solve_ilp(big, {}, &b).choice);
}

TEST(SpmdIlpTest, Silent) {
  const SpmdProblem p = large_problem(40, 11, 0.5);
  testing::internal::CaptureStdout();
  const SpmdSolution fast = solve_fast(p);
  const SpmdSolution ilp = solve_ilp(p, {}, &fast);
  SpmdProblem infeasible = p;
  infeasible.memory_limit = 1;
  const SpmdSolution none = solve_ilp(infeasible);
  const SpmdSolution none_started = solve_ilp(infeasible, {}, &fast);
  const SpmdSolution limited = solve_ilp(p, {.max_seconds = 5}, &fast);
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "");
  EXPECT_TRUE(ilp.feasible);
  EXPECT_FALSE(none.feasible);
  EXPECT_FALSE(none_started.feasible);
  EXPECT_TRUE(limited.feasible);
}

TEST(SpmdSolversTest, LargeProblem) {
  // 300 nodes, 5 choices, ~500 edges, a memory limit that binds. Nodes of different sizes
  // trade cost for memory at different rates; when every node has the same rate (random
  // costs on one memory ladder) the programme is a hard multiple-choice knapsack and the solver
  // needs minutes to prove its optimum (pass IlpOptions::max_seconds there).
  const SpmdProblem p = large_problem(300, 42, 0.7);
  ASSERT_GE(p.edges.size(), 490u);
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  const SpmdSolution fast = solve_fast(p);
  const auto t1 = Clock::now();
  const SpmdSolution ilp = solve_ilp(p, {}, &fast);
  const auto t2 = Clock::now();
  const double fast_s = std::chrono::duration<double>(t1 - t0).count();
  const double ilp_s = std::chrono::duration<double>(t2 - t1).count();
  std::printf("[ timing ] %zu nodes, %zu edges: solve_fast %.3f s (cost %.6f), solve_ilp %.3f s (cost %.6f%s)\n",
              p.nodes.size(), p.edges.size(), fast_s, fast.cost, ilp_s, ilp.cost, ilp.optimal ? ", optimal" : "");
  expect_consistent(p, fast);
  expect_consistent(p, ilp);
  EXPECT_TRUE(fast.feasible);
  EXPECT_TRUE(ilp.feasible);
  EXPECT_LE(ilp.cost, fast.cost);
  EXPECT_TRUE(ilp.optimal);
  // The times are printed, not asserted (targets 1 s and 20 s): a shared machine or a
  // sanitizer build must not turn a correct solve into a failure.
}

}  // namespace
}  // namespace shardwise::search
