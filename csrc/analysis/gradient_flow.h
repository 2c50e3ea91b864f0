// Which values a gradient reaches: floating parameters, and every floating value computed
// from one (autograd's requires_grad, on the captured graph). Inputs never need one.
// One definition for the readers that ask: the sharding search's facts, the saved-tensor
// tally, and the rewrite's regather marks (whether backward reads a weight at all).
#pragma once

#include <vector>

#include "ir/graph.h"

namespace shardwise::analysis {

// Per value id: true where backward computes a gradient for it.
std::vector<bool> gradient_flow(const ir::Graph& graph);

// Per input of `node`: does it need a gradient (`flow` from gradient_flow)?
std::vector<bool> operand_gradients(const ir::Node& node, const std::vector<bool>& flow);

// Whether some input of `node` other than operand `operand` needs a gradient: a product's
// backward reads an operand only to make its partners' gradients.
bool partner_needs_gradient(const ir::Node& node, std::size_t operand, const std::vector<bool>& flow);

}  // namespace shardwise::analysis
