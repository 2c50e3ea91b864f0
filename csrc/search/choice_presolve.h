// The single-choice presolve both SPMD solvers run first (spmd_fast.cc, spmd_ilp.cc);
// defined in spmd_problem.cc. Internal to csrc/search: the public contract stays
// spmd_problem.h.
//
// fold_single_choice_nodes folds every node left with one allowed (finite-cost) choice,
// or with a single choice at all, to a fixed point: its cost and memory become constants,
// each edge to an unfolded neighbour a cost on that neighbour's choices, and its memory is
// taken off the limit. On return `fixed` holds every node's choice (-1 for kept nodes) and
// `kept` the original ids of the reduced problem's nodes, in order.
// expand_choice maps a reduced problem's assignment back to one of the original problem.
#pragma once

#include <span>
#include <vector>

#include "search/spmd_problem.h"

namespace shardwise::search::detail {

SpmdProblem fold_single_choice_nodes(const SpmdProblem& problem, std::vector<int>& fixed, std::vector<int>& kept);
std::vector<int> expand_choice(std::span<const int> fixed, std::span<const int> kept,
                               std::span<const int> reduced_choice);

}  // namespace shardwise::search::detail
