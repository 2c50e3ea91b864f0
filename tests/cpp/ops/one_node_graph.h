// Test helper: a graph holding one node, its inputs as Input values "in0", "in1", ... and
// its outputs named "out0", "out1", ...
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "ir/graph.h"

namespace shardwise::ops::testing {

inline ir::TensorType f32(std::vector<std::int64_t> shape) {
  return ir::TensorType{ir::DType::F32, std::move(shape), {}};
}
inline ir::TensorType i64(std::vector<std::int64_t> shape) {
  return ir::TensorType{ir::DType::I64, std::move(shape), {}};
}
inline ir::TensorType c64(std::vector<std::int64_t> shape) {
  return ir::TensorType{ir::DType::C64, std::move(shape), {}};
}
inline ir::TensorType boolean(std::vector<std::int64_t> shape) {
  return ir::TensorType{ir::DType::Bool, std::move(shape), {}};
}

struct OneNodeGraph {
  ir::Graph graph;
  ir::NodeId id = -1;

  const ir::Node& node() const { return graph.node(id); }
};

inline OneNodeGraph one_node(std::string op, std::vector<ir::TensorType> inputs, std::vector<ir::TensorType> outputs,
                             ir::Attributes attrs = {}, std::string module_path = "block") {
  OneNodeGraph out;
  std::vector<ir::ValueId> ins;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    ins.push_back(out.graph.add_value("in" + std::to_string(i), std::move(inputs[i]), ir::ValueRole::Input));
  }
  std::vector<ir::OutputSpec> outs;
  for (std::size_t o = 0; o < outputs.size(); ++o) outs.push_back({"out" + std::to_string(o), std::move(outputs[o])});
  out.id = out.graph.add_node(std::move(op), std::move(ins), std::move(outs), std::move(attrs), std::move(module_path));
  return out;
}

}  // namespace shardwise::ops::testing
