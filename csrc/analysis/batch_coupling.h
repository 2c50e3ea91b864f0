// Does a graph compute the same step when its batch is split into micro-batches?
//
// A plan with micro-batches (pipeline stages, or gradient accumulation on one stage) runs the
// graph once per micro-batch and adds the gradients. That is the whole batch's step exactly
// when every row of the batch is computed on its own and the rows meet only in linear
// reductions (a sum, a mean over rows or tokens, a mean the data counts) on the way to the loss:
// then the loss of the batch is the sum of the micro-batches' (a sum) or their mean (a mean over
// equal micro-batches), and so are the gradients. Anything that lets one row see the others
// couples the batch: a statistic over the batch dim (batch norm in training mode, a max, a
// variance, a softmax over rows), a nonlinear function of a value reduced over the batch (a
// router's load-balancing loss: a product of two means over the tokens; a loss divided by the
// micro-batch's own count), values joined or indexed along the batch dim, an op with no
// dimension rule reading batch data, and writes into a buffer, which m micro-batches make m
// times (batch norm's num_batches_tracked).
//
// How: every value gets a state, from the graph's inputs (their batch_dim, ir/tensor_type.h)
// through each node's dimension rule (ops/dim_rule.h) in graph order:
//   Independent  no batch data reaches it (parameters, constants, shapes)
//   Rows         dim `dim` holds the batch as a block: `outer` elements of other indices are
//                major to it within that dim, so [b, s] -> [b s] keeps it and [s, b] ->
//                [s b] holds it at outer s
//   Sum, Mean    reduced over the batch: the batch's value is the micro-batches' sum / mean
//   Coupled      none of these; the site where it started is recorded
// A node's Rows operands name one index of its rule (the one holding the batch at their
// `outer`): spatial, the outputs carrying it are Rows; reduced with sum or mean, they are Sum or
// Mean (cross entropy's counted mean is a Mean: the runtime divides each micro-batch's sum by
// the whole batch's count, runtime/counted.py); anything else couples. Sum and Mean operands
// pass only through ops linear in them (ops::OpSpec::additive, linear_in) with every other
// operand Independent, or, for additive ops, all of one kind.
//
// The batch must be at least 2 rows (a size-1 dim has no index to follow: ops/dim_rule.h);
// with fewer, or with no input carrying a batch dim, nothing is followed (batch 0 or 1 in the
// result, no sites) and the caller captures at 2 rows to ask.
//
// Worked example: x: f32[b4,8] -> linear -> batch_norm(training) -> linear -> cross_entropy
//   sites {"aten::batch_norm", "batch_norm", "bn", "normalises over the batch dim ..."};
// without the batch norm: loss Mean, no sites; with reduction="sum": loss Sum.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ops/op_table.h"

namespace shardwise::analysis {

// How the micro-batches' values of the graph's first output (the loss) make the batch's.
enum class LossCombination : std::uint8_t { Sum, Mean };
std::string_view loss_combination_name(LossCombination combination);  // "sum", "mean"

// Where the graph couples the rows of its batch.
struct CouplingSite {
  std::string op;           // "aten::batch_norm"
  std::string node;         // its first output's name
  std::string module_path;  // "" = the root module
  std::string reason;       // what it does to the batch, for an error message

  friend bool operator==(const CouplingSite&, const CouplingSite&) = default;
};

struct BatchCoupling {
  std::int64_t batch = 0;          // the rows followed (the first batch input's); < 2: not followed
  LossCombination loss = LossCombination::Mean;  // a loss that does not depend on the batch: Mean
  std::vector<CouplingSite> sites;  // in graph order, each coupled value's origin once

  bool coupled() const { return !sites.empty(); }
  // "aten::batch_norm in module 'bn' (node 'batch_norm') normalises over ...; and 1 more" (a node of
  // the root module: "in the top-level module")
  std::string describe(std::size_t at_most = 2) const;
};

BatchCoupling batch_coupling(const ops::OpTable& table, const ir::Graph& graph);

}  // namespace shardwise::analysis
