#include "ir/json.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "support/error.h"
#include "support/json_text.h"

namespace shardwise::ir {
namespace {

using nlohmann::json;

constexpr std::string_view kFormat = "shardwise.graph";
constexpr int kVersion = 1;

// ---- writing -------------------------------------------------------------------

json double_to_json(double d) {
  // JSON has no inf / nan (nlohmann would write null, which reads back as none).
  if (std::isnan(d)) return json{{"float", "nan"}};
  if (std::isinf(d)) return json{{"float", d > 0 ? "inf" : "-inf"}};
  return d;
}

json attr_to_json(const AttrValue& value) {
  return std::visit(
      [](const auto& v) -> json {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, NoneAttr>) {
          return nullptr;
        } else if constexpr (std::is_same_v<T, double>) {
          return double_to_json(v);
        } else if constexpr (std::is_same_v<T, std::vector<double>>) {
          json out = json::array();
          for (double d : v) out.push_back(double_to_json(d));
          return out;
        } else {
          return v;  // bool, int64, string, int list map directly
        }
      },
      value);
}

void put_type(json& out, const TensorType& type) {
  out["dtype"] = dtype_name(type.dtype);
  out["shape"] = type.shape;
  out["batch_dim"] = type.batch_dim ? json(*type.batch_dim) : json(nullptr);
}

// ---- reading -------------------------------------------------------------------

[[noreturn]] void fail(const std::string& path, std::string_view what) {
  throw support::ParseError(fmt::format("{}: {}", path, what));
}

std::string_view kind(const json& j) { return j.type_name(); }

const json& require(const json& obj, const char* key, const std::string& path) {
  auto it = obj.find(key);
  if (it == obj.end()) fail(path, fmt::format("missing \"{}\"", key));
  return *it;
}

// nullptr when absent or null.
const json* optional_field(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

const json& require_object(const json& j, const std::string& path) {
  if (!j.is_object()) fail(path, fmt::format("expected an object, found {}", kind(j)));
  return j;
}

const json& require_array(const json& j, const std::string& path) {
  if (!j.is_array()) fail(path, fmt::format("expected an array, found {}", kind(j)));
  return j;
}

std::string get_string(const json& j, const std::string& path) {
  if (!j.is_string()) fail(path, fmt::format("expected a string, found {}", kind(j)));
  return j.get<std::string>();
}

std::int64_t get_int(const json& j, const std::string& path) {
  if (j.is_number_unsigned()) {
    const auto u = j.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      fail(path, fmt::format("integer {} is out of range", u));
    }
    return static_cast<std::int64_t>(u);
  }
  if (!j.is_number_integer()) fail(path, fmt::format("expected an integer, found {}", kind(j)));
  return j.get<std::int64_t>();
}

TensorType get_type(const json& obj, const std::string& path) {
  TensorType type;
  const std::string dtype = get_string(require(obj, "dtype", path), path + ".dtype");
  if (auto d = parse_dtype(dtype)) {
    type.dtype = *d;
  } else {
    fail(path + ".dtype", fmt::format("unknown dtype \"{}\"", dtype));
  }
  const json& shape = require_array(require(obj, "shape", path), path + ".shape");
  for (std::size_t i = 0; i < shape.size(); ++i) {
    type.shape.push_back(get_int(shape[i], fmt::format("{}.shape[{}]", path, i)));
  }
  if (const json* b = optional_field(obj, "batch_dim")) {
    const std::int64_t dim = get_int(*b, path + ".batch_dim");
    if (dim < 0 || dim >= type.rank()) {
      fail(path + ".batch_dim", fmt::format("batch_dim {} is out of range for rank {}", dim, type.rank()));
    }
    type.batch_dim = static_cast<int>(dim);
  }
  return type;
}

// A double written by double_to_json, or nullopt when `j` is not one.
std::optional<double> get_double(const json& j, const std::string& path) {
  if (j.is_number_float()) return j.get<double>();
  if (j.is_number()) return std::nullopt;
  if (j.is_object() && j.size() == 1 && j.contains("float") && j["float"].is_string()) {
    const auto& s = j["float"].get_ref<const std::string&>();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
    if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
    fail(path, fmt::format("unknown special float \"{}\" (expected \"inf\", \"-inf\" or \"nan\")", s));
  }
  fail(path, fmt::format("unsupported attribute value of JSON type {}", kind(j)));
}

AttrValue attr_from_json(const json& j, const std::string& path) {
  switch (j.type()) {
    case json::value_t::null: return NoneAttr{};
    case json::value_t::boolean: return j.get<bool>();
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return get_int(j, path);
    case json::value_t::string: return j.get<std::string>();
    case json::value_t::array: {
      bool any_double = false;
      for (std::size_t i = 0; i < j.size(); ++i) {
        const std::string item_path = fmt::format("{}[{}]", path, i);
        if (j[i].is_number_integer()) {
          get_int(j[i], item_path);  // range check
        } else if (j[i].is_number_float() || j[i].is_object()) {
          get_double(j[i], item_path);  // validates the special-float object
          any_double = true;
        } else {
          fail(item_path, fmt::format("a list attribute holds numbers only, found {}", kind(j[i])));
        }
      }
      if (!any_double) {
        std::vector<std::int64_t> ints;
        for (std::size_t i = 0; i < j.size(); ++i) ints.push_back(get_int(j[i], path));
        return ints;
      }
      std::vector<double> doubles;
      for (std::size_t i = 0; i < j.size(); ++i) {
        if (auto d = get_double(j[i], path)) {
          doubles.push_back(*d);
        } else {
          doubles.push_back(static_cast<double>(get_int(j[i], path)));
        }
      }
      return doubles;
    }
    default:
      if (auto d = get_double(j, path)) return *d;
      fail(path, fmt::format("unsupported attribute value of JSON type {}", kind(j)));
  }
}

struct LeafEntry {
  std::string path;
  std::string name;
  TensorType type;
  ValueRole role = ValueRole::Parameter;
  std::optional<std::int64_t> id;
};

LeafEntry leaf_from_json(const json& entry, const std::string& path) {
  require_object(entry, path);
  LeafEntry leaf;
  leaf.path = path;
  leaf.name = get_string(require(entry, "name", path), path + ".name");
  leaf.type = get_type(entry, path);
  const std::string role = get_string(require(entry, "role", path), path + ".role");
  const auto r = parse_role(role);
  if (!r || *r == ValueRole::Activation) {
    fail(path + ".role",
         fmt::format("unknown leaf role \"{}\" (expected input, parameter, buffer or constant; activations are "
                     "node outputs)",
                     role));
  }
  leaf.role = *r;
  if (const json* id = optional_field(entry, "id")) leaf.id = get_int(*id, path + ".id");
  return leaf;
}

class GraphReader {
 public:
  explicit GraphReader(const json& root) : root_(root) {}

  Graph read() {
    require_object(root_, "graph");
    const std::string format = get_string(require(root_, "format", "graph"), "format");
    if (format != kFormat) fail("format", fmt::format("expected \"{}\", found \"{}\"", kFormat, format));
    const std::int64_t version = get_int(require(root_, "version", "graph"), "version");
    if (version != kVersion) fail("version", fmt::format("unsupported version {} (this build reads {})", version, kVersion));

    const json& values = require_array(require(root_, "values", "graph"), "values");
    const json& nodes = require_array(require(root_, "nodes", "graph"), "nodes");
    const json& outputs = require_array(require(root_, "outputs", "graph"), "outputs");

    std::vector<LeafEntry> leaves;
    for (std::size_t i = 0; i < values.size(); ++i) leaves.push_back(leaf_from_json(values[i], fmt::format("values[{}]", i)));
    const bool have_ids = !leaves.empty() && leaves.front().id.has_value();
    for (const LeafEntry& leaf : leaves) {
      if (leaf.id.has_value() != have_ids) fail(leaf.path, "\"id\" must be given on every value entry or on none");
    }

    // Merge leaves and nodes back into creation order: a leaf goes where its id says.
    std::size_t li = 0;
    std::size_t ni = 0;
    while (li < leaves.size() || ni < nodes.size()) {
      bool take_leaf = li < leaves.size();
      if (take_leaf && have_ids && ni < nodes.size()) {
        const auto created = static_cast<std::int64_t>(graph_.values().size());
        take_leaf = *leaves[li].id <= created;  // a smaller id fails below with a clear message
      }
      if (take_leaf) {
        add_leaf(leaves[li++], have_ids);
      } else {
        add_node(nodes[ni], fmt::format("nodes[{}]", ni));
        ++ni;
      }
    }

    std::vector<ValueId> outs;
    for (std::size_t i = 0; i < outputs.size(); ++i) outs.push_back(resolve(outputs[i], fmt::format("outputs[{}]", i)));
    graph_.set_outputs(std::move(outs));
    return std::move(graph_);
  }

 private:
  void add_leaf(const LeafEntry& leaf, bool check_id) {
    const auto created = static_cast<std::int64_t>(graph_.values().size());
    if (check_id && *leaf.id != created) {
      fail(leaf.path + ".id", fmt::format("id {} does not fit: {} values (leaves and node outputs before it) come "
                                          "first, so its id must be {}",
                                          *leaf.id, created, created));
    }
    try {
      graph_.add_value(leaf.name, leaf.type, leaf.role);
    } catch (const support::ValidationError& e) {
      fail(leaf.path, e.what());
    }
  }

  void add_node(const json& entry, const std::string& path) {
    require_object(entry, path);
    const std::string op = get_string(require(entry, "op", path), path + ".op");
    if (op.empty()) fail(path + ".op", "empty op name");

    std::vector<ValueId> inputs;
    const json& ins = require_array(require(entry, "inputs", path), path + ".inputs");
    for (std::size_t i = 0; i < ins.size(); ++i) inputs.push_back(resolve(ins[i], fmt::format("{}.inputs[{}]", path, i)));

    std::vector<OutputSpec> outputs;
    const json& outs = require_array(require(entry, "outputs", path), path + ".outputs");
    for (std::size_t i = 0; i < outs.size(); ++i) {
      const std::string out_path = fmt::format("{}.outputs[{}]", path, i);
      require_object(outs[i], out_path);
      outputs.push_back(OutputSpec{get_string(require(outs[i], "name", out_path), out_path + ".name"),
                                   get_type(outs[i], out_path)});
    }

    Attributes attrs;
    if (const json* a = optional_field(entry, "attrs")) {
      require_object(*a, path + ".attrs");
      for (const auto& [key, value] : a->items()) {
        attrs.emplace(key, attr_from_json(value, fmt::format("{}.attrs.{}", path, key)));
      }
    }
    std::string module;
    if (const json* m = optional_field(entry, "module")) module = get_string(*m, path + ".module");

    try {
      graph_.add_node(op, std::move(inputs), std::move(outputs), std::move(attrs), std::move(module));
    } catch (const support::ValidationError& e) {
      fail(path, e.what());
    }
  }

  ValueId resolve(const json& ref, const std::string& path) const {
    const std::string name = get_string(ref, path);
    if (auto id = graph_.find_value(name)) return *id;
    fail(path, fmt::format("undefined value '{}' (values are defined by \"values\" entries or node outputs before "
                           "their first use)",
                           name));
  }

  const json& root_;
  Graph graph_;
};

}  // namespace

json graph_to_json(const Graph& graph) {
  json values = json::array();
  for (const Value& v : graph.values()) {
    if (v.role == ValueRole::Activation) continue;
    json entry = {{"id", v.id}, {"name", v.name}, {"role", role_name(v.role)}};
    put_type(entry, v.type);
    values.push_back(std::move(entry));
  }
  json nodes = json::array();
  for (const Node& n : graph.nodes()) {
    json inputs = json::array();
    for (ValueId in : n.inputs) inputs.push_back(graph.value(in).name);
    json outputs = json::array();
    for (ValueId out : n.outputs) {
      json o = {{"name", graph.value(out).name}};
      put_type(o, graph.value(out).type);
      outputs.push_back(std::move(o));
    }
    json attrs = json::object();
    for (const auto& [key, value] : n.attrs) attrs[key] = attr_to_json(value);
    nodes.push_back(json{{"op", n.op}, {"inputs", std::move(inputs)}, {"outputs", std::move(outputs)},
                         {"attrs", std::move(attrs)}, {"module", n.module_path}});
  }
  json outputs = json::array();
  for (ValueId out : graph.outputs()) outputs.push_back(graph.value(out).name);
  return json{{"format", kFormat},          {"version", kVersion}, {"values", std::move(values)},
              {"nodes", std::move(nodes)}, {"outputs", std::move(outputs)}};
}

Graph graph_from_json(const json& j) {
  return support::with_json_parse_errors("graph JSON", [&] { return GraphReader(j).read(); });
}

std::string graph_to_json_string(const Graph& graph, int indent) {
  return support::dump_json(graph_to_json(graph), indent, "graph");
}

Graph graph_from_json_string(std::string_view text) {
  return graph_from_json(support::parse_json(text, "invalid JSON"));
}

}  // namespace shardwise::ir
