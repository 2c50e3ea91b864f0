// What a rule is instantiated against: one node's tensor operands and attributes.
//
// Two modes:
//   check mode  (outputs_known)   the node's output types are given; the rule is built to
//                                 describe them and dim_rule_for checks every dim.
//   infer mode  (!outputs_known)  only the inputs are known; the rule builds the outputs'
//                                 dims itself from the inputs and attributes, or gives up
//                                 (nullopt) when they do not determine them.
#pragma once

#include <cstdint>
#include <vector>

#include "ir/attribute.h"
#include "ir/tensor_type.h"

namespace shardwise::ops {

using Shape = std::vector<std::int64_t>;

struct RuleOperands {
  std::vector<const ir::TensorType*> inputs;
  std::vector<const ir::TensorType*> outputs;  // empty in infer mode
  bool outputs_known = true;
  int output_count = 0;                   // the node's number of outputs, in both modes
  const ir::Attributes* attrs = nullptr;  // never null once built

  const Shape& input_shape(std::size_t i) const { return inputs.at(i)->shape; }
  int input_rank(std::size_t i) const { return inputs.at(i)->rank(); }
  // Null in infer mode.
  const Shape* output_shape(std::size_t i) const { return outputs_known ? &outputs.at(i)->shape : nullptr; }
};

}  // namespace shardwise::ops
