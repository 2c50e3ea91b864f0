#include "analysis/repeated_blocks.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <string_view>
#include <unordered_map>

namespace shardwise::analysis {
namespace {

// splitmix64's finaliser: combines fingerprint parts so that order matters and nearby
// values spread.
std::uint64_t mix(std::uint64_t h, std::uint64_t v) {
  std::uint64_t z = h + 0x9e3779b97f4a7c15ULL + v;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::uint64_t hash_text(std::string_view text) { return std::hash<std::string_view>{}(text); }

// Tags keep the kinds of operand apart in the fingerprint.
enum OperandTag : std::uint64_t { kInside = 1, kOwnParameter, kOuterParameter, kExternal };

struct Module {
  std::string path;
  int parent = -1;
  int depth = 0;  // root 0, "transformer" 1, "transformer.h" 2, ...
  std::vector<ir::NodeId> nodes;
};

// Module paths as a tree; every prefix of a path a node runs under is a module.
class ModuleTree {
 public:
  ModuleTree() { modules_.push_back(Module{"", -1, 0, {}}); }

  // The modules from the top level down to `path` itself (empty for the root).
  const std::vector<int>& chain(const std::string& path) {
    auto it = chains_.find(path);
    if (it != chains_.end()) return it->second;
    std::vector<int> out;
    int parent = 0;
    std::size_t start = 0;
    while (!path.empty()) {
      const auto dot = path.find('.', start);
      const std::string prefix = path.substr(0, dot);
      auto [found, inserted] = by_path_.emplace(prefix, static_cast<int>(modules_.size()));
      if (inserted)
        modules_.push_back(Module{prefix, parent, modules_[static_cast<std::size_t>(parent)].depth + 1, {}});
      parent = found->second;
      out.push_back(parent);
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    return chains_.emplace(path, std::move(out)).first->second;
  }

  std::vector<Module>& modules() { return modules_; }

 private:
  std::vector<Module> modules_;
  std::unordered_map<std::string, int> by_path_;
  std::unordered_map<std::string, std::vector<int>> chains_;
};

class BlockFinder {
 public:
  explicit BlockFinder(const ir::Graph& graph) : graph_(graph) {}

  std::vector<RepeatedBlockGroup> run() {
    index_nodes();
    auto& modules = tree_.modules();
    // Fingerprint every block, then bucket siblings by (parent, fingerprint).
    std::vector<std::vector<std::uint64_t>> prints(modules.size());
    std::map<std::pair<int, std::uint64_t>, std::vector<int>> buckets;
    for (std::size_t m = 1; m < modules.size(); ++m) {
      if (modules[m].nodes.empty()) continue;
      prints[m] = fingerprint(static_cast<int>(m));
      std::uint64_t h = prints[m].size();
      for (auto p : prints[m]) h = mix(h, p);
      buckets[{modules[m].parent, h}].push_back(static_cast<int>(m));
    }
    // A bucket may hold unequal blocks if two hashes collide: split it by exact comparison.
    std::vector<std::vector<int>> groups;
    for (auto& [key, members] : buckets) {
      std::vector<std::vector<int>> exact;
      for (int m : members) {
        auto same = std::find_if(exact.begin(), exact.end(), [&](const std::vector<int>& g) {
          return prints[static_cast<std::size_t>(g.front())] == prints[static_cast<std::size_t>(m)];
        });
        if (same == exact.end()) {
          exact.push_back({m});
        } else {
          same->push_back(m);
        }
      }
      for (auto& g : exact) {
        if (g.size() >= 2) groups.push_back(std::move(g));
      }
    }
    return maximal(groups);
  }

 private:
  void index_nodes() {
    const auto& nodes = graph_.nodes();
    chains_.resize(nodes.size());
    positions_.resize(nodes.size());
    static_hash_.resize(nodes.size());
    for (const auto& node : nodes) {
      const auto n = static_cast<std::size_t>(node.id);
      chains_[n] = &tree_.chain(node.module_path);
      for (int m : *chains_[n]) {
        auto& block = tree_.modules()[static_cast<std::size_t>(m)].nodes;
        positions_[n].push_back(static_cast<int>(block.size()));
        block.push_back(node.id);
      }
      // What a node is, wherever it sits: op, attributes, output types.
      std::uint64_t h = mix(hash_text(node.op), node.inputs.size());
      for (const auto& [name, value] : node.attrs) h = mix(mix(h, hash_text(name)), hash_text(ir::attr_str(value)));
      for (auto out : node.outputs) h = mix(h, type_hash(out));
      static_hash_[n] = h;
    }
  }

  std::uint64_t type_hash(ir::ValueId id) {
    auto [it, inserted] = type_hashes_.emplace(id, 0);
    if (inserted) it->second = hash_text(graph_.value(id).type.str());
    return it->second;
  }

  std::vector<std::uint64_t> fingerprint(int m) {
    const Module& module = tree_.modules()[static_cast<std::size_t>(m)];
    const auto level = static_cast<std::size_t>(module.depth - 1);  // index into chains
    const std::string own_prefix = module.path + ".";
    std::vector<std::uint64_t> out;
    out.reserve(module.nodes.size());
    std::unordered_map<ir::ValueId, std::uint64_t> externals;
    for (auto id : module.nodes) {
      const ir::Node& node = graph_.node(id);
      const auto n = static_cast<std::size_t>(id);
      std::uint64_t h = static_hash_[n];
      h = mix(h, hash_text(std::string_view(node.module_path).substr(module.path.size())));
      for (auto in : node.inputs) {
        const ir::Value& value = graph_.value(in);
        if (value.producer) {
          const auto p = static_cast<std::size_t>(*value.producer);
          const auto& chain = *chains_[p];
          if (chain.size() > level && chain[level] == m) {
            h = mix(mix(mix(h, kInside), static_cast<std::uint64_t>(positions_[p][level])),
                    static_cast<std::uint64_t>(value.output_index));
            continue;
          }
        }
        const bool weight = value.role == ir::ValueRole::Parameter || value.role == ir::ValueRole::Buffer;
        if (weight && value.name.starts_with(own_prefix)) {
          h = mix(mix(mix(h, kOwnParameter), hash_text(std::string_view(value.name).substr(own_prefix.size()))),
                  type_hash(in));
        } else if (weight) {
          h = mix(mix(h, kOuterParameter), hash_text(value.name));
        } else {
          // Data from outside (a graph input for the first layer, the previous layer's output
          // for the others) is told apart by type and order of first use, not by role.
          const auto k = externals.emplace(in, externals.size()).first->second;
          h = mix(mix(mix(h, kExternal), k), type_hash(in));
        }
      }
      out.push_back(h);
    }
    return out;
  }

  // Drops groups nested in a member of a shallower group; orders by first node.
  std::vector<RepeatedBlockGroup> maximal(std::vector<std::vector<int>>& groups) {
    auto& modules = tree_.modules();
    auto first_node = [&](int m) { return modules[static_cast<std::size_t>(m)].nodes.front(); };
    for (auto& g : groups) std::sort(g.begin(), g.end(), [&](int a, int b) { return first_node(a) < first_node(b); });
    std::sort(groups.begin(), groups.end(), [&](const std::vector<int>& a, const std::vector<int>& b) {
      const int da = modules[static_cast<std::size_t>(a.front())].depth;
      const int db = modules[static_cast<std::size_t>(b.front())].depth;
      return da != db ? da < db : first_node(a.front()) < first_node(b.front());
    });
    std::vector<bool> covered(modules.size(), false);
    std::vector<std::vector<int>> kept;
    for (const auto& g : groups) {
      bool nested = false;
      for (int m = modules[static_cast<std::size_t>(g.front())].parent; m > 0 && !nested;
           m = modules[static_cast<std::size_t>(m)].parent) {
        nested = covered[static_cast<std::size_t>(m)];
      }
      if (nested) continue;
      for (int m : g) covered[static_cast<std::size_t>(m)] = true;
      kept.push_back(g);
    }
    std::sort(kept.begin(), kept.end(), [&](const std::vector<int>& a, const std::vector<int>& b) {
      return first_node(a.front()) < first_node(b.front());
    });
    std::vector<RepeatedBlockGroup> out;
    for (const auto& g : kept) {
      RepeatedBlockGroup group;
      group.parent = modules[static_cast<std::size_t>(modules[static_cast<std::size_t>(g.front())].parent)].path;
      for (int m : g) {
        group.module_paths.push_back(modules[static_cast<std::size_t>(m)].path);
        group.nodes.push_back(modules[static_cast<std::size_t>(m)].nodes);
      }
      out.push_back(std::move(group));
    }
    return out;
  }

  const ir::Graph& graph_;
  ModuleTree tree_;
  std::vector<const std::vector<int>*> chains_;  // per node: its modules, top level first
  std::vector<std::vector<int>> positions_;      // per node: its index in each of those blocks
  std::vector<std::uint64_t> static_hash_;       // per node
  std::unordered_map<ir::ValueId, std::uint64_t> type_hashes_;
};

}  // namespace

std::vector<RepeatedBlockGroup> find_repeated_blocks(const ir::Graph& graph) { return BlockFinder(graph).run(); }

const RepeatedBlockGroup* largest_group(const std::vector<RepeatedBlockGroup>& groups) {
  const RepeatedBlockGroup* largest = nullptr;
  std::size_t best = 0;
  for (const auto& g : groups) {
    std::size_t size = 0;
    for (const auto& b : g.nodes) size += b.size();
    if (size > best) best = size, largest = &g;
  }
  return largest;
}

ir::ValueId block_checkpoint(const ir::Graph& graph, const std::vector<ir::NodeId>& block) {
  const std::set<ir::NodeId> inside(block.begin(), block.end());
  ir::ValueId largest = -1;
  for (ir::NodeId id : block)
    for (ir::ValueId in : graph.node(id).inputs) {
      const ir::Value& v = graph.value(in);
      if (!v.producer || inside.contains(*v.producer)) continue;
      if (largest < 0 || v.type.numel() > graph.value(largest).type.numel()) largest = in;
    }
  return largest;
}

}  // namespace shardwise::analysis
