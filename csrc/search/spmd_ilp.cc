// solve_ilp: the SPMD problem as a 0-1 integer programme, solved by HiGHS.
#include <fmt/format.h>

#include <Highs.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "search/choice_presolve.h"
#include "search/spmd_problem.h"
#include "support/error.h"

namespace shardwise::search {

namespace {

// The edges of the reduced problem merged per node pair (parallel edges add up), oriented
// lower id first, so the programme has one set of pair variables per pair.
struct PairCost {
  int a = 0;
  int b = 0;
  std::vector<double> cost;  // cost[c_a * choices(b) + c_b]
};

std::vector<PairCost> merge_edges(const SpmdProblem& problem) {
  std::map<std::pair<int, int>, std::size_t> index;
  std::vector<PairCost> pairs;
  for (const ChoiceEdge& edge : problem.edges) {
    const int a = std::min(edge.a, edge.b);
    const int b = std::max(edge.a, edge.b);
    const std::size_t ka = problem.nodes[static_cast<std::size_t>(a)].cost.size();
    const std::size_t kb = problem.nodes[static_cast<std::size_t>(b)].cost.size();
    auto [it, inserted] = index.emplace(std::make_pair(a, b), pairs.size());
    if (inserted) pairs.push_back(PairCost{a, b, std::vector<double>(ka * kb, 0.0)});
    PairCost& pair = pairs[it->second];
    const std::size_t edge_cols = problem.nodes[static_cast<std::size_t>(edge.b)].cost.size();
    for (std::size_t ca = 0; ca < ka; ++ca) {
      for (std::size_t cb = 0; cb < kb; ++cb) {
        pair.cost[ca * kb + cb] += edge.a == a ? edge.cost[ca * edge_cols + cb] : edge.cost[cb * edge_cols + ca];
      }
    }
  }
  return pairs;
}

// A constant finite matrix does not move the argmin: the pair needs no variables.
bool is_constant(const PairCost& pair) {
  return std::all_of(pair.cost.begin(), pair.cost.end(),
                     [&](double c) { return std::isfinite(c) && c == pair.cost.front(); });
}

SpmdSolution evaluate(const SpmdProblem& problem, std::vector<int> choice) {
  SpmdSolution s;
  s.choice = std::move(choice);
  s.cost = total_cost(problem, s.choice);
  s.memory = total_memory(problem, s.choice);
  s.feasible = std::isfinite(s.cost) && s.memory <= problem.memory_limit;
  s.optimal = false;
  s.solver = "ilp";
  return s;
}

// Whether `a` is a strictly better answer than `b`: feasible beats infeasible, then cost;
// between infeasible answers the smaller memory (the least-memory fallback rule).
bool strictly_better(const SpmdSolution& a, const SpmdSolution& b) {
  if (a.feasible != b.feasible) return a.feasible;
  if (a.feasible) return a.cost < b.cost;
  return a.memory < b.memory;
}

// The integer programme of the reduced problem. Columns: x (binary) per node choice that
// is allowed, then y (continuous in [0, 1]) per allowed pair of each coupled node pair.
class IlpModel {
 public:
  explicit IlpModel(const SpmdProblem& problem) {
    const std::size_t n = problem.nodes.size();
    const bool limited = std::isfinite(problem.memory_limit);
    x_.resize(n);
    for (std::size_t v = 0; v < n; ++v) {
      const ChoiceNode& node = problem.nodes[v];
      x_[v].assign(node.cost.size(), -1);
      bool any = false;
      for (std::size_t c = 0; c < node.cost.size(); ++c) {
        // An infinite memory can never fit a finite limit: such a choice is not allowed.
        if (!std::isfinite(node.cost[c]) || (limited && !std::isfinite(node.memory[c]))) continue;
        x_[v][c] = add_column(node.cost[c], true);
        any = true;
      }
      if (!any) empty_node_ = true;
    }
    if (empty_node_) return;

    for (std::size_t v = 0; v < n; ++v) {
      std::vector<std::pair<int, double>> row;
      for (int col : x_[v]) {
        if (col >= 0) row.emplace_back(col, 1.0);
      }
      add_row(row, 1.0, 1.0);
    }

    for (const PairCost& pair : merge_edges(problem)) {
      if (is_constant(pair)) continue;
      const auto& xa = x_[static_cast<std::size_t>(pair.a)];
      const auto& xb = x_[static_cast<std::size_t>(pair.b)];
      // Marginals: sum_cb y[ca][cb] = x_a[ca] and sum_ca y[ca][cb] = x_b[cb]. A pair left out
      // (+inf) then rules out that combination of the two x's.
      std::vector<std::vector<std::pair<int, double>>> row_a(xa.size());
      std::vector<std::vector<std::pair<int, double>>> row_b(xb.size());
      for (std::size_t ca = 0; ca < xa.size(); ++ca) {
        for (std::size_t cb = 0; cb < xb.size(); ++cb) {
          const double c = pair.cost[ca * xb.size() + cb];
          if (xa[ca] < 0 || xb[cb] < 0 || !std::isfinite(c)) continue;
          const int y = add_column(c, false);
          row_a[ca].emplace_back(y, 1.0);
          row_b[cb].emplace_back(y, 1.0);
        }
      }
      for (std::size_t ca = 0; ca < xa.size(); ++ca) {
        if (xa[ca] < 0) continue;
        row_a[ca].emplace_back(xa[ca], -1.0);
        add_row(row_a[ca], 0.0, 0.0);
      }
      for (std::size_t cb = 0; cb < xb.size(); ++cb) {
        if (xb[cb] < 0) continue;
        row_b[cb].emplace_back(xb[cb], -1.0);
        add_row(row_b[cb], 0.0, 0.0);
      }
    }

    if (limited) {
      // Scaled by the largest coefficient: byte counts are large, and the solver's tolerances
      // are absolute. The answer's fit is checked again, unscaled, on the original problem.
      double scale = 0;
      for (std::size_t v = 0; v < n; ++v) {
        for (std::size_t c = 0; c < x_[v].size(); ++c) {
          if (x_[v][c] >= 0) scale = std::max(scale, problem.nodes[v].memory[c]);
        }
      }
      if (scale > 0) {
        std::vector<std::pair<int, double>> row;
        for (std::size_t v = 0; v < n; ++v) {
          for (std::size_t c = 0; c < x_[v].size(); ++c) {
            const double m = problem.nodes[v].memory[c];
            if (x_[v][c] >= 0 && m > 0) row.emplace_back(x_[v][c], m / scale);
          }
        }
        add_row(row, -kHighsInf, problem.memory_limit / scale);
      } else if (problem.memory_limit < 0) {
        empty_node_ = true;  // nothing takes memory, yet the limit is below zero
      }
    }
  }

  // True when some node has no allowed choice: the programme is infeasible as it stands.
  bool trivially_infeasible() const { return empty_node_; }

  int x(int node, int choice) const { return x_[static_cast<std::size_t>(node)][static_cast<std::size_t>(choice)]; }

  // The programme as HiGHS's model (column-wise, every column in [0, 1]).
  HighsLp model() const {
    HighsLp lp;
    lp.num_col_ = static_cast<HighsInt>(objective_.size());
    lp.num_row_ = static_cast<HighsInt>(row_lower_.size());
    lp.sense_ = ObjSense::kMinimize;
    lp.col_cost_ = objective_;
    lp.col_lower_.assign(objective_.size(), 0.0);
    lp.col_upper_.assign(objective_.size(), 1.0);
    lp.row_lower_ = row_lower_;
    lp.row_upper_ = row_upper_;
    std::vector<HighsInt>& start = lp.a_matrix_.start_;
    start.assign(objective_.size() + 1, 0);
    for (const auto& [row, col, value] : entries_) ++start[static_cast<std::size_t>(col) + 1];
    for (std::size_t c = 0; c < objective_.size(); ++c) start[c + 1] += start[c];
    lp.a_matrix_.format_ = MatrixFormat::kColwise;
    lp.a_matrix_.index_.resize(entries_.size());
    lp.a_matrix_.value_.resize(entries_.size());
    std::vector<HighsInt> fill(start.begin(), start.end() - 1);
    for (const auto& [row, col, v] : entries_) {
      const auto at = static_cast<std::size_t>(fill[static_cast<std::size_t>(col)]++);
      lp.a_matrix_.index_[at] = row;
      lp.a_matrix_.value_[at] = v;
    }
    lp.integrality_.resize(objective_.size());
    for (std::size_t c = 0; c < objective_.size(); ++c) {
      lp.integrality_[c] = integer_[c] ? HighsVarType::kInteger : HighsVarType::kContinuous;
    }
    return lp;
  }

  // The choice per node of a solution vector: the x closest to 1 (the lower choice on ties).
  std::vector<int> read_choice(const double* solution) const {
    std::vector<int> choice(x_.size(), 0);
    for (std::size_t v = 0; v < x_.size(); ++v) {
      double best = -1;
      for (std::size_t c = 0; c < x_[v].size(); ++c) {
        const int col = x_[v][c];
        if (col >= 0 && solution[col] > best) {
          best = solution[col];
          choice[v] = static_cast<int>(c);
        }
      }
    }
    return choice;
  }

 private:
  struct Entry {
    int row;
    int col;
    double value;
  };

  int add_column(double cost, bool integer) {
    objective_.push_back(cost);
    integer_.push_back(integer);
    return static_cast<int>(objective_.size()) - 1;
  }

  void add_row(const std::vector<std::pair<int, double>>& row, double lower, double upper) {
    const int r = static_cast<int>(row_lower_.size());
    for (const auto& [col, value] : row) entries_.push_back(Entry{r, col, value});
    row_lower_.push_back(lower);
    row_upper_.push_back(upper);
  }

  std::vector<std::vector<int>> x_;  // node, choice -> column or -1
  std::vector<double> objective_;
  std::vector<bool> integer_;
  std::vector<Entry> entries_;
  std::vector<double> row_lower_;
  std::vector<double> row_upper_;
  bool empty_node_ = false;
};

}  // namespace

SpmdSolution solve_ilp(const SpmdProblem& problem, const IlpOptions& options, const SpmdSolution* start) {
  validate(problem);
  if (start != nullptr && start->choice.size() != problem.nodes.size()) {
    throw support::ValidationError(fmt::format("spmd problem: the ILP start assigns {} nodes, the problem has {}",
                                               start->choice.size(), problem.nodes.size()));
  }
  std::vector<int> fixed;
  std::vector<int> kept;
  const SpmdProblem reduced = detail::fold_single_choice_nodes(problem, fixed, kept);

  // The start's cost and memory are recomputed rather than trusted.
  SpmdSolution start_solution;
  if (start != nullptr) start_solution = evaluate(problem, start->choice);

  // No programme to solve or no solution to it: the start, else solve_fast's answer (its
  // least-memory assignment when nothing fits).
  auto fallback = [&] {
    SpmdSolution s = start != nullptr ? start_solution : solve_fast(problem);
    s.solver = "ilp";
    s.optimal = false;
    return s;
  };

  if (reduced.nodes.empty()) {
    SpmdSolution s = evaluate(problem, fixed);
    s.optimal = s.feasible;  // the presolve left nothing to choose
    return s;
  }

  const IlpModel ilp(reduced);
  if (ilp.trivially_infeasible()) return fallback();

  // One thread: HiGHS's MIP search, and so the answer, is then deterministic. The gaps are
  // zero so "optimal" means optimal.
  Highs highs;
  highs.setOptionValue("output_flag", false);
  highs.setOptionValue("threads", 1);
  highs.setOptionValue("mip_rel_gap", 0.0);
  highs.setOptionValue("mip_abs_gap", 1e-10);
  if (options.max_seconds > 0) highs.setOptionValue("time_limit", options.max_seconds);
  if (highs.passModel(ilp.model()) == HighsStatus::kError) {
    throw support::Error("spmd problem: HiGHS refused the integer programme (a malformed model)");
  }

  // A MIP start: the start's x columns only, which HiGHS completes (the pair columns follow
  // from them). Only a start that fits is offered, and only one whose folded nodes agree
  // with the presolve (otherwise its cost is infinite anyway).
  if (start != nullptr && start_solution.feasible) {
    std::vector<HighsInt> columns;
    bool usable = true;
    for (std::size_t v = 0; v < fixed.size() && usable; ++v) {
      if (fixed[v] >= 0 && start->choice[v] != fixed[v]) usable = false;
    }
    for (std::size_t i = 0; i < kept.size() && usable; ++i) {
      const int col = ilp.x(static_cast<int>(i), start->choice[static_cast<std::size_t>(kept[i])]);
      if (col < 0) usable = false;
      columns.push_back(col);
    }
    if (usable) {
      const std::vector<double> ones(columns.size(), 1.0);
      highs.setSolution(static_cast<HighsInt>(columns.size()), columns.data(), ones.data());
    }
  }

  highs.run();
  const HighsModelStatus status = highs.getModelStatus();
  const HighsSolution& solution = highs.getSolution();
  const bool has_solution = highs.getInfo().primal_solution_status == kSolutionStatusFeasible && solution.value_valid;
  if (!has_solution) return fallback();
  const bool proven_optimal = status == HighsModelStatus::kOptimal;
  SpmdSolution answer = evaluate(problem, detail::expand_choice(fixed, kept, ilp.read_choice(solution.col_value.data())));

  answer.optimal = proven_optimal && answer.feasible;
  if (start != nullptr && strictly_better(start_solution, answer)) {
    // Only rounding (or a time limit) can put the solver behind its own start; the start is
    // then at least as good as its proven optimum.
    const bool optimal = answer.optimal;
    answer = start_solution;
    answer.optimal = optimal;
  }
  return answer;
}

}  // namespace shardwise::search
