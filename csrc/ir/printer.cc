#include "ir/printer.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <utility>

namespace shardwise::ir {
namespace {

// Each character quote_string escapes as a backslash and a letter, with that letter.
constexpr std::array<std::pair<char, char>, 7> kEscapes = {{
    {'"', '"'},
    {'\\', '\\'},
    {'\n', 'n'},
    {'\t', 't'},
    {'\r', 'r'},
    {'\b', 'b'},
    {'\f', 'f'},
}};

bool is_alnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

template <typename Pred>
bool all_of_nonempty(std::string_view text, Pred pred) {
  return !text.empty() && std::all_of(text.begin(), text.end(), pred);
}

std::string op_str(std::string_view op) {
  // `return` would read back as the return statement of a zero-output node line.
  if (op != "return" && all_of_nonempty(op, is_op_name_char)) return std::string(op);
  return quote_string(op);
}

std::string key_str(std::string_view key) {
  if (all_of_nonempty(key, is_module_path_char)) return std::string(key);
  return quote_string(key);
}

std::string decl_str(const Graph& graph, ValueId id) {
  const Value& v = graph.value(id);
  return fmt::format("{}: {}", value_ref(v.name), v.type.str());
}

}  // namespace

bool is_value_name_char(char c) { return is_alnum(c) || c == '_' || c == '.' || c == '-'; }
bool is_op_name_char(char c) { return is_alnum(c) || c == '_' || c == ':' || c == '.'; }
bool is_module_path_char(char c) { return is_alnum(c) || c == '_' || c == '.'; }

std::optional<char> escape_letter(char c) {
  for (const auto& [plain, letter] : kEscapes)
    if (plain == c) return letter;
  return std::nullopt;
}

std::optional<char> unescaped_char(char letter) {
  for (const auto& [plain, escaped] : kEscapes)
    if (escaped == letter) return plain;
  return std::nullopt;
}

std::string quote_string(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (const std::optional<char> letter = escape_letter(c)) {
      out += '\\';
      out += *letter;
    } else if (u < 0x20 || u == 0x7f) {
      // Other control characters are escaped so a printed line never breaks or
      // hides a byte; bytes >= 0x80 (UTF-8) pass through.
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(u));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string value_ref(std::string_view name) {
  if (all_of_nonempty(name, is_value_name_char)) return fmt::format("%{}", name);
  // Built by appends: `"%" + std::string&&` trips GCC 12's false -Wrestrict (bug 105329).
  std::string out = "%";
  out += quote_string(name);
  return out;
}

std::string print_node(const Graph& graph, NodeId id) {
  const Node& node = graph.node(id);
  std::string out;
  for (std::size_t i = 0; i < node.outputs.size(); ++i) {
    if (i) out += ", ";
    out += decl_str(graph, node.outputs[i]);
  }
  if (!node.outputs.empty()) out += " = ";
  out += op_str(node.op);
  out += '(';
  for (std::size_t i = 0; i < node.inputs.size(); ++i) {
    if (i) out += ", ";
    out += value_ref(graph.value(node.inputs[i]).name);
  }
  out += ')';
  if (!node.attrs.empty()) {
    out += " {";
    bool first = true;
    for (const auto& [key, value] : node.attrs) {
      if (!first) out += ", ";
      first = false;
      out += key_str(key);
      out += '=';
      out += attr_str(value);
    }
    out += '}';
  }
  if (!node.module_path.empty()) {
    out += " @";
    out += all_of_nonempty(node.module_path, is_module_path_char) ? node.module_path
                                                                   : quote_string(node.module_path);
  }
  return out;
}

std::string print_graph(const Graph& graph) {
  std::string out = "graph(";
  for (std::size_t i = 0; i < graph.inputs().size(); ++i) {
    if (i) out += ", ";
    out += decl_str(graph, graph.inputs()[i]);
  }
  out += ") {\n";

  // Inputs with ids 0..leading_inputs-1 are created by the header when parsed; any
  // later input needs a body line at its id to come back with the same id.
  std::size_t leading_inputs = 0;
  while (leading_inputs < graph.values().size() &&
         graph.values()[leading_inputs].role == ValueRole::Input) {
    ++leading_inputs;
  }

  NodeId next_node = 0;  // nodes before it are printed
  const auto num_nodes = static_cast<NodeId>(graph.nodes().size());
  auto print_nodes_before = [&](NodeId end) {
    for (; next_node < end; ++next_node) out += fmt::format("  {}\n", print_node(graph, next_node));
  };

  for (const Value& v : graph.values()) {
    if (v.role == ValueRole::Activation) {
      if (v.output_index != 0 || !v.producer) continue;
      // Nodes before this producer that are still unprinted have no outputs.
      print_nodes_before(*v.producer + 1);
    } else if (v.role != ValueRole::Input || static_cast<std::size_t>(v.id) >= leading_inputs) {
      out += fmt::format("  {} {}\n", decl_str(graph, v.id), role_name(v.role));
    }
  }
  print_nodes_before(num_nodes);

  out += "  return (";
  for (std::size_t i = 0; i < graph.outputs().size(); ++i) {
    if (i) out += ", ";
    out += value_ref(graph.value(graph.outputs()[i]).name);
  }
  out += ")\n}\n";
  return out;
}

}  // namespace shardwise::ir
