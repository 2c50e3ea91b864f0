#include "ir/verifier.h"

#include <fmt/format.h>

#include <string>
#include <unordered_map>

#include "ir/printer.h"
#include "support/error.h"

namespace shardwise::ir {
namespace {

class Verifier {
 public:
  Verifier(const std::vector<Value>& values, const std::vector<Node>& nodes, const std::vector<ValueId>& inputs,
           const std::vector<ValueId>& outputs)
      : values_(values), nodes_(nodes), inputs_(inputs), outputs_(outputs) {}

  void run() {
    // Order matters: later checks index values / nodes through ids the earlier
    // checks have proven in range and consistent.
    check_values();
    check_nodes();
    check_producers();
    check_topological_order();
    check_graph_inputs();
    check_graph_outputs();
  }

 private:
  bool valid_value(ValueId id) const { return id >= 0 && static_cast<std::size_t>(id) < values_.size(); }
  bool valid_node(NodeId id) const { return id >= 0 && static_cast<std::size_t>(id) < nodes_.size(); }

  std::string value_desc(std::size_t index) const {
    return fmt::format("value {} {}", index, value_ref(values_[index].name));
  }

  std::string node_desc(std::size_t index) const {
    const Node& n = nodes_[index];
    if (n.module_path.empty()) return fmt::format("node {} ({}) at the root module", index, n.op);
    return fmt::format("node {} ({}) at module '{}'", index, n.op, n.module_path);
  }

  [[noreturn]] static void fail(const std::string& where, std::string_view what) {
    throw support::ValidationError(fmt::format("{}: {}", where, what));
  }

  void check_values() {
    std::unordered_map<std::string_view, std::size_t> seen;
    for (std::size_t i = 0; i < values_.size(); ++i) {
      const Value& v = values_[i];
      if (v.id != static_cast<ValueId>(i)) fail(value_desc(i), fmt::format("has id {} at position {}", v.id, i));
      if (v.name.empty()) fail(value_desc(i), "has an empty name");
      auto [it, inserted] = seen.emplace(v.name, i);
      if (!inserted) fail(value_desc(i), fmt::format("duplicates the name of value {}", it->second));
      const TensorType& t = v.type;
      if (t.batch_dim && (*t.batch_dim < 0 || *t.batch_dim >= t.rank())) {
        fail(value_desc(i), fmt::format("batch_dim {} is out of range for {} (rank {})", *t.batch_dim, t.str(),
                                        t.rank()));
      }
      for (std::size_t d = 0; d < t.shape.size(); ++d) {
        if (t.shape[d] < 0) fail(value_desc(i), fmt::format("dimension {} of {} is negative", d, t.str()));
      }
      if (v.role == ValueRole::Activation) {
        if (!v.producer) fail(value_desc(i), "is an activation without a producer node");
        if (!valid_node(*v.producer)) fail(value_desc(i), fmt::format("has producer node {}, which does not exist", *v.producer));
      } else {
        if (v.producer) {
          fail(value_desc(i), fmt::format("is a leaf ({}) but has producer node {}", role_name(v.role), *v.producer));
        }
        if (v.output_index != 0) {
          fail(value_desc(i), fmt::format("is a leaf ({}) but has output_index {}", role_name(v.role), v.output_index));
        }
      }
    }
  }

  void check_nodes() {
    ValueId last_output = -1;
    for (std::size_t n = 0; n < nodes_.size(); ++n) {
      const Node& node = nodes_[n];
      if (node.id != static_cast<NodeId>(n)) fail(node_desc(n), fmt::format("has id {} at position {}", node.id, n));
      if (node.op.empty()) fail(node_desc(n), "has an empty op name");
      for (const auto& [key, value] : node.attrs) {
        if (key.empty()) fail(node_desc(n), "has an attribute with an empty name");
      }
      for (std::size_t i = 0; i < node.inputs.size(); ++i) {
        if (!valid_value(node.inputs[i])) {
          fail(node_desc(n), fmt::format("operand {} is value id {}, which does not exist", i, node.inputs[i]));
        }
      }
      for (std::size_t k = 0; k < node.outputs.size(); ++k) {
        const ValueId out = node.outputs[k];
        if (!valid_value(out)) fail(node_desc(n), fmt::format("output {} is value id {}, which does not exist", k, out));
        const Value& v = values_[static_cast<std::size_t>(out)];
        if (v.role != ValueRole::Activation) {
          fail(node_desc(n), fmt::format("output {} is {}, a leaf ({}) rather than an activation", k, value_desc(out),
                                         role_name(v.role)));
        }
        if (v.producer != static_cast<NodeId>(n) || v.output_index != static_cast<int>(k)) {
          fail(node_desc(n), fmt::format("output {} is {}, whose producer is node {} output {}", k, value_desc(out),
                                         v.producer ? *v.producer : -1, v.output_index));
        }
        // Outputs are created together, after those of every earlier node: the
        // printer and the JSON writer rely on it to keep ids across a round trip.
        const ValueId expected_min = k == 0 ? last_output + 1 : node.outputs[k - 1] + 1;
        if ((k == 0 && out < expected_min) || (k > 0 && out != expected_min)) {
          fail(node_desc(n), fmt::format("output {} has id {}: outputs must be consecutive ids, after the outputs of "
                                         "earlier nodes",
                                         k, out));
        }
      }
      if (!node.outputs.empty()) last_output = node.outputs.back();
    }
  }

  // Every activation is listed by its producer (the converse of check_nodes).
  void check_producers() {
    for (std::size_t i = 0; i < values_.size(); ++i) {
      const Value& v = values_[i];
      if (v.role != ValueRole::Activation) continue;
      const Node& p = nodes_[static_cast<std::size_t>(*v.producer)];
      const auto k = static_cast<std::size_t>(v.output_index);
      if (v.output_index < 0 || k >= p.outputs.size() || p.outputs[k] != static_cast<ValueId>(i)) {
        fail(value_desc(i), fmt::format("names node {} output {} as its producer, but that node does not list it",
                                        *v.producer, v.output_index));
      }
    }
  }

  // An operand must exist before its node is created. A node with outputs is created
  // just before its first output; one without outputs no later than the next node
  // with outputs.
  void check_topological_order() {
    ValueId created_before = static_cast<ValueId>(values_.size());
    for (std::size_t r = nodes_.size(); r-- > 0;) {
      const Node& node = nodes_[r];
      if (!node.outputs.empty()) created_before = node.outputs.front();
      for (std::size_t i = 0; i < node.inputs.size(); ++i) {
        const ValueId in = node.inputs[i];
        if (in >= created_before) {
          const Value& v = values_[static_cast<std::size_t>(in)];
          const std::string by = v.producer ? fmt::format(" (produced by node {})", *v.producer) : "";
          fail(node_desc(r), fmt::format("operand {} is {}{}, which is defined after the node", i, value_desc(in), by));
        }
      }
    }
  }

  void check_graph_inputs() {
    std::size_t next = 0;
    for (std::size_t i = 0; i < values_.size(); ++i) {
      if (values_[i].role != ValueRole::Input) continue;
      if (next >= inputs_.size() || inputs_[next] != static_cast<ValueId>(i)) {
        fail(value_desc(i), fmt::format("is an input but is not graph input {} (inputs() must list the input values "
                                        "in id order)",
                                        next));
      }
      ++next;
    }
    if (next != inputs_.size()) {
      const ValueId extra = inputs_[next];
      if (!valid_value(extra)) fail("graph inputs", fmt::format("input {} is value id {}, which does not exist", next, extra));
      fail("graph inputs", fmt::format("input {} is {}, which is a {} rather than an input", next,
                                       value_desc(static_cast<std::size_t>(extra)),
                                       role_name(values_[static_cast<std::size_t>(extra)].role)));
    }
  }

  void check_graph_outputs() {
    for (std::size_t i = 0; i < outputs_.size(); ++i) {
      if (!valid_value(outputs_[i])) {
        fail("graph outputs", fmt::format("output {} is value id {}, which does not exist", i, outputs_[i]));
      }
    }
  }

  const std::vector<Value>& values_;
  const std::vector<Node>& nodes_;
  const std::vector<ValueId>& inputs_;
  const std::vector<ValueId>& outputs_;
};

}  // namespace

void verify_graph_parts(const std::vector<Value>& values, const std::vector<Node>& nodes,
                        const std::vector<ValueId>& inputs, const std::vector<ValueId>& outputs) {
  Verifier(values, nodes, inputs, outputs).run();
}

void verify_graph(const Graph& graph) {
  verify_graph_parts(graph.values(), graph.nodes(), graph.inputs(), graph.outputs());
  for (const Value& v : graph.values()) {
    if (graph.find_value(v.name) != v.id) {
      throw support::ValidationError(
          fmt::format("value {} {}: the name index does not map the name to this value", v.id, value_ref(v.name)));
    }
  }
}

}  // namespace shardwise::ir
