#include "analysis/summary_table.h"

#include <fmt/format.h>

#include <algorithm>
#include <initializer_list>
#include <map>
#include <string_view>
#include <unordered_map>

#include "analysis/activation_bytes.h"
#include "analysis/flops.h"
#include "analysis/parameter_stats.h"
#include "analysis/repeated_blocks.h"
#include "analysis/unknown_ops.h"

namespace shardwise::analysis {
namespace {

constexpr std::size_t kTopOps = 10;

std::string percent(std::int64_t part, std::int64_t whole) {
  return whole == 0 ? "-" : fmt::format("{:.1f}%", 100.0 * static_cast<double>(part) / static_cast<double>(whole));
}

std::string top_level(std::string_view path) {
  if (path.empty()) return "<root>";
  return std::string(path.substr(0, path.find('.')));
}

}  // namespace

namespace {

// A unit a count is shown in from `from` up: the count over `per`, `decimals` places.
struct Unit {
  double from, per;
  std::string_view suffix;
  int decimals = 2;
};

// `n` in the first of `units` (largest first) it reaches, else whole with `plain` after it.
std::string in_units(std::int64_t n, std::initializer_list<Unit> units, std::string_view plain) {
  const double v = static_cast<double>(n);
  for (const Unit& unit : units)
    if (v >= unit.from) return fmt::format("{:.{}f}{}", v / unit.per, unit.decimals, unit.suffix);
  return fmt::format("{}{}", n, plain);
}

}  // namespace

std::string human_count(std::int64_t n) {
  return in_units(n, {{1e9, 1e9, "B"}, {1e6, 1e6, "M"}, {1e4, 1e3, "K", 1}}, "");
}

std::string human_flops(std::int64_t flops) {
  return in_units(flops, {{1e12, 1e12, " TFLOPs"}, {1e9, 1e9, " GFLOPs"}, {1e6, 1e6, " MFLOPs"}, {1e3, 1e3, " KFLOPs"}},
                  " FLOPs");
}

std::string human_bytes(std::int64_t bytes) {
  constexpr double kKiB = 1024.0, kMiB = kKiB * 1024, kGiB = kMiB * 1024;
  return in_units(bytes, {{kGiB, kGiB, " GiB"}, {kMiB, kMiB, " MiB"}, {kKiB, kKiB, " KiB"}}, " B");
}

std::string summary_table(const ops::OpTable& table, const ir::Graph& graph) {
  const auto flops = forward_flops(table, graph);
  const auto params = parameter_stats(graph);
  const auto bytes = activation_bytes(graph);
  std::int64_t activations = 0;
  for (auto b : bytes) activations += b;

  std::string out = "graph summary\n";
  out += fmt::format("  {:<15} {}\n", "nodes", graph.nodes().size());
  out += fmt::format("  {:<15} {}  ({})\n", "parameters", human_count(params.parameters),
                     human_bytes(params.parameter_bytes));
  out += fmt::format("  {:<15} {}  ({})\n", "buffers", human_count(params.buffers), human_bytes(params.buffer_bytes));
  out += fmt::format("  {:<15} {}  (matmul {}, {})\n", "forward", human_flops(flops.total),
                     human_flops(flops.matmul_total), percent(flops.matmul_total, flops.total));
  out += fmt::format("  {:<15} {}  (all node outputs)\n", "activations", human_bytes(activations));

  const auto groups = find_repeated_blocks(graph);
  out += "\nrepeated blocks\n";
  if (groups.empty()) {
    out += "  (none)\n";
  } else {
    out += fmt::format("  {:<30} {:>5}  {:>10}  {}\n", "parent", "count", "nodes each", "members");
    for (const auto& g : groups) {
      const std::string members = g.module_paths.size() == 2
                                      ? fmt::format("{}, {}", g.module_paths.front(), g.module_paths.back())
                                      : fmt::format("{} .. {}", g.module_paths.front(), g.module_paths.back());
      out += fmt::format("  {:<30} {:>5}  {:>10}  {}\n", g.parent.empty() ? "<root>" : g.parent, g.module_paths.size(),
                         g.nodes.front().size(), members);
    }
  }

  // Top ops by FLOPs.
  struct OpRow {
    std::int64_t flops = 0;
    int nodes = 0;
  };
  std::unordered_map<std::string, OpRow> by_op;
  for (const auto& node : graph.nodes()) {
    auto& row = by_op[node.op];
    row.flops += flops.per_node[static_cast<std::size_t>(node.id)];
    ++row.nodes;
  }
  std::vector<std::pair<std::string, OpRow>> ops(by_op.begin(), by_op.end());
  std::sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) {
    return a.second.flops != b.second.flops ? a.second.flops > b.second.flops : a.first < b.first;
  });
  out += "\ntop ops by FLOPs\n";
  out += fmt::format("  {:<45} {:>6}  {:>14}  {:>6}\n", "op", "nodes", "FLOPs", "share");
  for (std::size_t i = 0; i < ops.size() && i < kTopOps && ops[i].second.flops > 0; ++i) {
    out += fmt::format("  {:<45} {:>6}  {:>14}  {:>6}\n", ops[i].first, ops[i].second.nodes,
                       human_flops(ops[i].second.flops), percent(ops[i].second.flops, flops.total));
  }

  const auto unknown = unknown_ops(table, graph);
  out += "\nunknown ops (no dimension rule: replicated)\n";
  if (unknown.empty()) {
    out += "  (none)\n";
  } else {
    out += fmt::format("  {:<45} {:>6}  {}\n", "op", "nodes", "first module");
    for (const auto& u : unknown) {
      out += fmt::format("  {:<45} {:>6}  {}\n", u.op, u.count, u.module_path.empty() ? "<root>" : u.module_path);
    }
  }

  // Per top-level module, in order of first node (modules with parameters only, last).
  struct ModuleRow {
    std::int64_t parameters = 0;
    std::int64_t flops = 0;
    int nodes = 0;
  };
  std::vector<std::string> order;
  std::map<std::string, ModuleRow> modules;
  auto row = [&](const std::string& name) -> ModuleRow& {
    auto [it, inserted] = modules.emplace(name, ModuleRow{});
    if (inserted) order.push_back(name);
    return it->second;
  };
  for (const auto& node : graph.nodes()) {
    auto& r = row(top_level(node.module_path));
    r.flops += flops.per_node[static_cast<std::size_t>(node.id)];
    ++r.nodes;
  }
  for (const auto& value : graph.values()) {
    if (value.role == ir::ValueRole::Parameter) row(top_level(value.name)).parameters += value.type.numel();
  }
  out += "\nmodules\n";
  out += fmt::format("  {:<30} {:>10}  {:>14}  {:>6}\n", "module", "params", "FLOPs", "nodes");
  for (const auto& name : order) {
    const auto& r = modules.at(name);
    out +=
        fmt::format("  {:<30} {:>10}  {:>14}  {:>6}\n", name, human_count(r.parameters), human_flops(r.flops), r.nodes);
  }
  return out;
}

}  // namespace shardwise::analysis
