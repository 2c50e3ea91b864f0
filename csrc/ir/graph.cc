#include "ir/graph.h"

#include <fmt/format.h>

#include <array>
#include <string_view>
#include <unordered_set>

#include "support/error.h"

namespace shardwise::ir {
namespace {

constexpr std::array<std::string_view, 5> kRoleNames{"input", "parameter", "buffer", "constant",
                                                     "activation"};

}  // namespace

std::string_view role_name(ValueRole role) { return kRoleNames.at(static_cast<std::size_t>(role)); }

std::optional<ValueRole> parse_role(std::string_view name) {
  for (std::size_t i = 0; i < kRoleNames.size(); ++i) {
    if (kRoleNames[i] == name) return static_cast<ValueRole>(i);
  }
  return std::nullopt;
}

ValueId Graph::add_value(std::string name, TensorType type, ValueRole role) {
  if (role == ValueRole::Activation) {
    throw support::ValidationError(
        fmt::format("value '{}': activations are created by add_node, not add_value", name));
  }
  if (name.empty()) throw support::ValidationError("a value needs a non-empty name");
  if (by_name_.count(name)) {
    throw support::ValidationError(fmt::format("duplicate value name '{}'", name));
  }
  const auto id = static_cast<ValueId>(values_.size());
  by_name_.emplace(name, id);
  values_.push_back(Value{id, std::move(name), std::move(type), role, std::nullopt, 0});
  if (role == ValueRole::Input) inputs_.push_back(id);
  return id;
}

NodeId Graph::add_node(std::string op, std::vector<ValueId> inputs, std::vector<OutputSpec> outputs,
                       Attributes attrs, std::string module_path) {
  const auto id = static_cast<NodeId>(nodes_.size());
  for (auto in : inputs) {
    if (in < 0 || static_cast<std::size_t>(in) >= values_.size()) {
      throw support::ValidationError(fmt::format("node {} ({}) at module '{}': input value id {} does not exist",
                                                 id, op, module_path, in));
    }
  }
  // Output names must also differ from each other: two outputs called "chunk.0" were
  // both added, breaking name uniqueness (by_name_ kept the first; the printed text did
  // not parse back). Found by fuzzing the JSON reader (tests/fuzz/graph_json_fuzz.cc).
  std::unordered_set<std::string_view> new_names;
  for (const auto& out : outputs) {
    if (out.name.empty() || by_name_.count(out.name) || !new_names.insert(out.name).second) {
      throw support::ValidationError(fmt::format("node {} ({}) at module '{}': output name '{}' is {}", id, op,
                                                 module_path, out.name, out.name.empty() ? "empty" : "taken"));
    }
  }
  Node node{id, std::move(op), std::move(inputs), {}, std::move(attrs), std::move(module_path)};
  int index = 0;
  for (auto& out : outputs) {
    const auto vid = static_cast<ValueId>(values_.size());
    by_name_.emplace(out.name, vid);
    values_.push_back(Value{vid, std::move(out.name), std::move(out.type), ValueRole::Activation, id, index++});
    node.outputs.push_back(vid);
  }
  nodes_.push_back(std::move(node));
  return id;
}

void Graph::set_outputs(std::vector<ValueId> outputs) {
  for (auto out : outputs) {
    if (out < 0 || static_cast<std::size_t>(out) >= values_.size()) {
      throw support::ValidationError(fmt::format("graph output value id {} does not exist", out));
    }
  }
  outputs_ = std::move(outputs);
}

std::optional<ValueId> Graph::find_value(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

std::vector<std::vector<NodeId>> Graph::users_by_value() const {
  std::vector<std::vector<NodeId>> out(values_.size());
  for (const auto& node : nodes_)
    for (auto in : node.inputs) {
      auto& users = out[static_cast<std::size_t>(in)];
      if (users.empty() || users.back() != node.id) users.push_back(node.id);  // a node reading it twice: once
    }
  return out;
}

std::vector<NodeId> Graph::users(ValueId id) const {
  std::vector<NodeId> out;
  for (const auto& node : nodes_) {
    for (auto in : node.inputs) {
      if (in == id) {
        out.push_back(node.id);
        break;
      }
    }
  }
  return out;
}

bool operator==(const Value& a, const Value& b) {
  return a.id == b.id && a.name == b.name && a.type == b.type && a.role == b.role && a.producer == b.producer &&
         a.output_index == b.output_index;
}

bool operator==(const Node& a, const Node& b) {
  return a.id == b.id && a.op == b.op && a.inputs == b.inputs && a.outputs == b.outputs && a.attrs == b.attrs &&
         a.module_path == b.module_path;
}

bool operator==(const Graph& a, const Graph& b) {
  return a.values_ == b.values_ && a.nodes_ == b.nodes_ && a.inputs_ == b.inputs_ && a.outputs_ == b.outputs_;
}

}  // namespace shardwise::ir
