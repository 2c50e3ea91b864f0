// The core IR: a Graph owns Values (tensors) and Nodes (ops) in topological order.
//
// Contract:
//  - ValueId / NodeId are dense indices into values() / nodes(), assigned in order
//    of creation; a node's inputs are created before the node (topological order
//    by construction).
//  - Every value has a unique, non-empty name. Parameters and buffers are named
//    by their fully qualified name in the nn.Module ("transformer.h.0.attn.c_attn.weight");
//    inputs by their forward() argument name; activations by the capture's name.
//  - Leaf values (role Input / Parameter / Buffer / Constant) have no producer;
//    Activations have exactly one producer node.
//  - inputs() lists the Input-role values in the order forward() takes them.
//  - module_path of a node is the dotted path of the nn.Module that ran it
//    ("" for the root module).
//
// Worked example (text form, see ir/printer.h):
//   graph(%x: f32[b2,16]) {
//     %fc.weight: f32[4,16] parameter
//     %fc.bias: f32[4] parameter
//     %linear: f32[b2,4] = aten::linear(%x, %fc.weight, %fc.bias) @fc
//     return (%linear)
//   }
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ir/attribute.h"
#include "ir/tensor_type.h"

namespace shardwise::ir {

using ValueId = std::int32_t;
using NodeId = std::int32_t;

enum class ValueRole : std::uint8_t { Input, Parameter, Buffer, Constant, Activation };

std::string_view role_name(ValueRole role);  // "input", "parameter", ...
std::optional<ValueRole> parse_role(std::string_view name);

struct Value {
  ValueId id = -1;
  std::string name;
  TensorType type;
  ValueRole role = ValueRole::Activation;
  std::optional<NodeId> producer;  // set for activations only
  int output_index = 0;            // which output of the producer
};

struct Node {
  NodeId id = -1;
  std::string op;                 // "aten::linear", "aten::add.Tensor" (overload kept unless "default")
  std::vector<ValueId> inputs;    // tensor operands, in schema order (missing optionals omitted)
  std::vector<ValueId> outputs;
  Attributes attrs;               // non-tensor arguments by schema name
  std::string module_path;        // "" = root module
};

struct OutputSpec {
  std::string name;
  TensorType type;
};

class Graph {
 public:
  // Adds a leaf value (Input, Parameter, Buffer or Constant). Inputs are appended
  // to inputs(). Throws ValidationError on a duplicate name or the Activation role.
  ValueId add_value(std::string name, TensorType type, ValueRole role);

  // Adds a node whose outputs are new Activation values. Throws ValidationError
  // (naming the op and module path) if an input id does not exist or an output
  // name is taken.
  NodeId add_node(std::string op, std::vector<ValueId> inputs, std::vector<OutputSpec> outputs,
                  Attributes attrs = {}, std::string module_path = {});

  void set_outputs(std::vector<ValueId> outputs);

  const Value& value(ValueId id) const { return values_.at(static_cast<std::size_t>(id)); }
  const Node& node(NodeId id) const { return nodes_.at(static_cast<std::size_t>(id)); }
  // Mutable access for passes that annotate (e.g. batch-dimension propagation).
  // Changing a name through it is not allowed (names are indexed).
  TensorType& mutable_type(ValueId id) { return values_.at(static_cast<std::size_t>(id)).type; }
  // For passes that mark nodes (e.g. transform/collective_matmul.h): a node's attributes.
  Attributes& mutable_attrs(NodeId id) { return nodes_.at(static_cast<std::size_t>(id)).attrs; }

  const std::vector<Value>& values() const { return values_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<ValueId>& inputs() const { return inputs_; }
  const std::vector<ValueId>& outputs() const { return outputs_; }

  std::optional<ValueId> find_value(std::string_view name) const;
  // Nodes that read `id`, in node order (computed on demand: O(nodes)).
  std::vector<NodeId> users(ValueId id) const;
  // Every value's users (users(id) for each id, indexed by value), in O(nodes + edges).
  std::vector<std::vector<NodeId>> users_by_value() const;

  friend bool operator==(const Graph& a, const Graph& b);

 private:
  std::vector<Value> values_;
  std::vector<Node> nodes_;
  std::vector<ValueId> inputs_;
  std::vector<ValueId> outputs_;
  std::unordered_map<std::string, ValueId> by_name_;
};

bool operator==(const Value& a, const Value& b);
bool operator==(const Node& a, const Node& b);

}  // namespace shardwise::ir
