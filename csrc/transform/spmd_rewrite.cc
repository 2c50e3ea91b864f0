#include "transform/spmd_rewrite.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <sstream>
#include <tuple>
#include <variant>

#include "analysis/gradient_flow.h"
#include "analysis/repeated_blocks.h"
#include "analysis/selective_recompute.h"
#include "analysis/state_values.h"
#include "ops/distributed_kernels.h"
#include "ops/node_rule.h"
#include "ops/op_table.h"
#include "ops/random_draws.h"
#include "search/parameter_collectives.h"
#include "search/sharding_strategies.h"
#include "support/enum_names.h"
#include "support/error.h"
#include "transform/fp8_axes.h"
#include "transform/local_shard.h"

namespace shardwise::transform {
namespace {

using search::Placement;
using search::ShardingSpec;
using search::Strategy;
using support::ValidationError;

constexpr auto kNodeModeNames = support::enum_names<NodeMode>({
    {NodeMode::Local, "local"}, {NodeMode::Lookup, "lookup"},
    {NodeMode::Whole, "whole"}, {NodeMode::Statistics, "statistics"},
});

ShardingSpec replicated(std::size_t axes) { return ShardingSpec(axes, Placement::replicate()); }

std::vector<std::string> texts(const ShardingSpec& spec) {
  std::vector<std::string> out;
  for (const auto& p : spec) out.push_back(p.str());
  return out;
}

// The strategy a plan names by `text` ("replicate", "partial", "split n", "split n g3",
// "dispatch t") for
// `node` with `rule` (already local to the other axes' splits) on an axis of n ranks.
Strategy strategy_from_text(const ir::Graph& graph, const ir::Node& node, const std::optional<ops::DimRule>& rule,
                            const std::string& text, int axis, int n, const ops::DimRule* layout = nullptr) {
  auto where = [&] {
    return fmt::format("node '{}' ({}, module '{}') on mesh axis {}", graph.value(node.outputs[0]).name, node.op,
                       node.module_path, axis);
  };
  if (text == "replicate") return search::replicate_strategy(node);
  if (!rule) throw ValidationError(fmt::format("plan: {} has strategy '{}' but no sharding rule", where(), text));
  Strategy s;
  if (text == "partial") {
    s = search::partial_strategy(*rule);
  } else {
    std::istringstream words(text);
    std::string verb, label, groups_text;
    words >> verb >> label >> groups_text;
    std::int64_t groups = 1;
    if (!groups_text.empty()) {
      if (groups_text.size() < 2 || groups_text[0] != 'g')
        throw ValidationError(fmt::format("plan: {}: unreadable strategy '{}'", where(), text));
      groups = std::stoll(groups_text.substr(1));
    }
    const bool dispatch = verb == "dispatch";
    const int index = verb == "split" || dispatch ? rule->find(label) : -1;
    if (index < 0)
      throw ValidationError(fmt::format("plan: {}: strategy '{}' names no index of the rule {}", where(), text,
                                        rule->str()));
    search::StrategyOptions options;
    if (groups > 1) options.strided.emplace_back(rule->indices[static_cast<std::size_t>(index)].size, groups);
    bool found = false;
    for (Strategy& candidate : search::enumerate_strategies(*rule, n, options, layout)) {
      if (candidate.index == index && candidate.groups == groups && candidate.dispatch == dispatch) {
        s = std::move(candidate);
        found = true;
        break;
      }
    }
    if (!found)
      throw ValidationError(fmt::format("plan: {}: strategy '{}' is not legal for the rule {} on {} ranks", where(),
                                        text, rule->str(), n));
  }
  if (s.inputs.size() != node.inputs.size() || s.outputs.size() != node.outputs.size())
    throw ValidationError(fmt::format("plan: {}: strategy '{}' places {} operands, the node has {}", where(), text,
                                      s.inputs.size() + s.outputs.size(), node.inputs.size() + node.outputs.size()));
  return s;
}

class Recorder : public RewriteBuilder {
 public:
  explicit Recorder(RankProgram& program) : program_(program) {}
  void leaf(const LeafRewrite& leaf) override { program_.leaves.push_back(leaf); }
  void node(const NodeRewrite& node) override { program_.nodes.push_back(node); }
  void output(const OperandRewrite& output) override { program_.outputs.push_back(output); }

 private:
  RankProgram& program_;
};

using Shape = std::vector<std::int64_t>;

bool matches_shape(const ir::AttrValue& value, const Shape& shape) {
  const auto* list = std::get_if<std::vector<std::int64_t>>(&value);
  if (!list || list->empty() || list->size() != shape.size()) return false;
  for (std::size_t i = 0; i < shape.size(); ++i)
    if ((*list)[i] != shape[i] && (*list)[i] != -1) return false;
  return true;
}

// The op's attributes with its shape arguments made local (see the header).
ir::Attributes local_attrs(const ir::Attributes& attrs, const std::vector<Shape>& global_out,
                           const std::vector<Shape>& local_out) {
  ir::Attributes out = attrs;
  if (global_out.empty() || global_out == local_out) return out;
  const Shape& g0 = global_out[0];
  const Shape& l0 = local_out[0];
  if (g0 != l0)
    for (const char* key : {"size", "sizes", "shape"}) {
      auto it = out.find(key);
      if (it == out.end() || !matches_shape(it->second, g0)) continue;
      auto& list = std::get<std::vector<std::int64_t>>(it->second);
      for (std::size_t i = 0; i < list.size(); ++i)
        if (list[i] != -1) list[i] = l0[i];
    }
  auto dim_it = out.find("dim");
  if (local_out.size() > 1 && dim_it != out.end() && std::holds_alternative<std::int64_t>(dim_it->second) &&
      !l0.empty()) {
    const auto rank = static_cast<std::int64_t>(l0.size());
    const auto dim = static_cast<std::size_t>(((std::get<std::int64_t>(dim_it->second) % rank) + rank) % rank);
    std::vector<std::int64_t> sizes;
    for (const Shape& o : local_out) sizes.push_back(o[dim]);
    if (auto it = out.find("split_size"); it != out.end() && std::holds_alternative<std::int64_t>(it->second))
      it->second = sizes[0];
    if (auto it = out.find("split_sizes"); it != out.end()) it->second = sizes;
  }
  return out;
}

bool is_arange(const std::string& op) {
  return op == "aten::arange" || op == "aten::arange.start" || op == "aten::arange.start_step";
}

// arange's value at global index i is start + i * step, so the block [lo, hi) of its output
// is arange.start_step(start + lo * step, start + hi * step, step): the local form of an
// arange whose output is split. Integer attributes stay integers (the output's dtype follows
// them when none is given); a floating one makes every bound floating.
ir::Attributes arange_block(const ir::Attributes& attrs, std::int64_t lo, std::int64_t hi) {
  auto number = [&](const char* key, std::int64_t fallback) -> std::variant<std::int64_t, double> {
    auto it = attrs.find(key);
    if (it == attrs.end()) return fallback;
    if (const auto* i = std::get_if<std::int64_t>(&it->second)) return *i;
    if (const auto* d = std::get_if<double>(&it->second)) return *d;
    throw ValidationError(fmt::format("arange's {} is neither an integer nor a float", key));
  };
  const auto start = number("start", 0), step = number("step", 1);
  ir::Attributes out = attrs;
  if (std::holds_alternative<std::int64_t>(start) && std::holds_alternative<std::int64_t>(step)) {
    const std::int64_t s = std::get<std::int64_t>(start), d = std::get<std::int64_t>(step);
    out["start"] = s + lo * d;
    out["end"] = s + hi * d;
    out["step"] = d;
  } else {
    auto real = [](const std::variant<std::int64_t, double>& v) {
      return std::holds_alternative<double>(v) ? std::get<double>(v) : static_cast<double>(std::get<std::int64_t>(v));
    };
    const double s = real(start), d = real(step);
    out["start"] = s + static_cast<double>(lo) * d;
    // The end sits half a step past the last value, so rounding cannot add or drop one.
    out["end"] = s + (static_cast<double>(hi) - 0.5) * d;
    out["step"] = d;
  }
  return out;
}

}  // namespace

std::string_view node_mode_name(NodeMode mode) { return kNodeModeNames.name(mode); }

std::vector<std::vector<Strategy>> resolve_strategies(const ir::Graph& graph, const plan::Sharding& sharding,
                                                      bool adapt_to_shapes) {
  const std::size_t axes = sharding.mesh.size();
  std::vector<std::vector<Strategy>> out;
  for (const ir::Node& node : graph.nodes()) {
    if (node.outputs.empty()) {
      out.emplace_back(axes, search::replicate_strategy(node));
      continue;
    }
    const auto& text = plan::sharding_entry(sharding.strategies, graph.value(node.outputs[0]).name, "strategy", axes);
    const std::optional<ops::DimRule> rule = ops::dim_rule_for(ops::OpTable::builtin(), graph, node);
    // Pass 1 on the whole rule (a split legal on local sizes is legal on whole ones); pass 2
    // on the rule as the other axes' splits leave it, as the search enumerated it, with the
    // shards' groups counted on what the *outer* axes' splits left (enumerate_strategies'
    // `layout`: axis 0 cuts first, so an inner axis' split of a major index does not move
    // an outer axis' blocks).
    // Adapting to other shapes: a strategy that does not split these sizes replicates.
    auto resolve = [&](const std::optional<ops::DimRule>& r, std::size_t a, const ops::DimRule* layout = nullptr) {
      try {
        return strategy_from_text(graph, node, r, text[a], static_cast<int>(a), sharding.mesh[a], layout);
      } catch (const ValidationError&) {
        if (!adapt_to_shapes) throw;
        return search::replicate_strategy(node);
      }
    };
    std::vector<Strategy> first;
    for (std::size_t a = 0; a < axes; ++a) first.push_back(resolve(rule, a));
    if (axes == 1 || !rule) {
      out.push_back(std::move(first));
      continue;
    }
    std::vector<Strategy> second;
    for (std::size_t a = 0; a < axes; ++a) {
      ops::DimRule local = *rule;
      ops::DimRule layout = *rule;
      for (std::size_t b = 0; b < axes; ++b) {
        if (b == a || first[b].partial || first[b].index < 0) continue;
        local = search::local_rule(local, first[b], sharding.mesh[b]);
        if (b < a) layout = search::local_rule(layout, first[b], sharding.mesh[b]);
      }
      second.push_back(first[a].index < 0 && !first[a].partial ? first[a] : resolve(local, a, &layout));
    }
    out.push_back(std::move(second));
  }
  return out;
}

namespace {

using Shape = std::vector<std::int64_t>;

// One rank's rewrite of a graph under a plan's sharding: the state rewrite_spmd's phases
// share, each phase a method, run in the order rewrite_spmd states.
class SpmdRewriter {
 public:
  SpmdRewriter(const ir::Graph& graph, const plan::Sharding& sharding, int rank, const RewriteOptions& options)
      : graph_(graph),
        sharding_(sharding),
        rank_(rank),
        options_(options),
        axes_(sharding.mesh.size()),
        nodes_(graph.nodes()),
        values_(graph.values()),
        rewrites_(nodes_.size()),
        rules_(nodes_.size()),
        grads_(nodes_.size()),
        produced_(values_.size()),
        batch_ratios_(axes_),
        gradient_(values_.size(), false),
        canonical_(values_.size()),
        reduce_axes_(values_.size()) {
    if (axes_ == 0) throw ValidationError("plan: the sharding has an empty mesh");
    int world = 1;
    for (int size : sharding.mesh) world *= size;
    if (rank < 0 || rank >= world)
      throw ValidationError(fmt::format("rewrite: rank {} outside the plan's mesh of {} ranks", rank, world));
    strategies_ = resolve_strategies(graph, sharding, options.adapt_to_shapes);
    for (const ir::Node& node : nodes_)  // made once for both passes over the nodes
      if (!node.outputs.empty())
        rules_[static_cast<std::size_t>(node.id)] = ops::dim_rule_for(ops::OpTable::builtin(), graph, node);
  }

  void place_leaves();
  void rewrite_node(const ir::Node& node);
  void mark_gradients();
  void emit_leaves(RewriteBuilder& builder) const;
  void mark_recompute();
  void plan_operand_steps();
  void emit(RewriteBuilder& builder);

 private:
  Shape local_shape(const ir::Value& v, const ShardingSpec& spec) const {
    return local_shard(v.type.shape, texts(spec), sharding_.mesh, rank_).shape;
  }
  void spread_ratios(ShardingSpec& spec, const ir::Value& v) const;
  bool decide_kernels(const ir::Node& node, NodeRewrite& rw) const;
  bool decide_random(const ir::Node& node, NodeRewrite& rw) const;
  void read_operands(const ir::Node& node, NodeRewrite& rw, bool whole);
  void count_mean(const ir::Node& node, NodeRewrite& rw, bool whole) const;
  double uneven_mean_scale(const ir::Node& node, const NodeRewrite& rw, bool whole) const;
  std::vector<ReshardAction> backward_steps(const ShardingSpec& from, std::size_t value) const;
  void operand_steps(const ir::Node& node, std::size_t i, int unit);
  // Per value: its reads, (node id, operand index).
  using Reads = std::vector<std::vector<std::pair<std::size_t, std::size_t>>>;
  bool read_as_partial_sum(const Reads& reads, std::size_t value, std::size_t axis) const;
  bool reduced_whole(const Reads& reads, std::size_t value, std::size_t axis) const;
  void defer_replicated_reductions(const Reads& reads);
  int group_of(int unit, int kind, int axis, ir::DType dtype) {
    auto [it, fresh] = groups_.emplace(std::tuple{unit, kind, axis, static_cast<int>(dtype)},
                                       static_cast<int>(groups_.size()));
    return it->second;
  }

  const ir::Graph& graph_;
  const plan::Sharding& sharding_;
  const int rank_;
  const RewriteOptions& options_;
  const std::size_t axes_;
  const std::vector<ir::Node>& nodes_;
  const std::vector<ir::Value>& values_;
  std::vector<std::vector<Strategy>> strategies_;
  std::vector<NodeRewrite> rewrites_;
  std::vector<std::optional<ops::DimRule>> rules_;
  std::vector<std::vector<ShardingSpec>> grads_;  // per node, per operand: the reader's gradient
  std::vector<ShardingSpec> produced_;            // per value: the placement it is made in
  std::vector<std::vector<double>> batch_ratios_;  // per axis: the inputs' uneven batch shares
  std::vector<bool> gradient_;                    // per value: it carries a gradient
  std::vector<ShardingSpec> canonical_;           // per value: its gradient's placement
  std::vector<std::vector<int>> reduce_axes_;     // per leaf: the axes its gradient is reduced over after backward
  std::map<std::tuple<int, int, int, int>, int> groups_;  // grouped parameter collectives
};

// The leaves' placements; adapting to other shapes, an input whose placement does not divide
// its shape is replicated on the axes that fail, outermost first. Heterogeneous plans: the
// inputs' uneven batch shares, per axis, given to every Shard of a value's batch dim on that
// axis (the search records them on the inputs only).
void SpmdRewriter::place_leaves() {
  for (const ir::Value& v : values_)
    if (!v.producer) {
      std::vector<Placement> spec;
      for (const auto& text : plan::sharding_entry(sharding_.placements, v.name, "placement", axes_))
        spec.push_back(search::parse_placement(text));
      while (options_.adapt_to_shapes && v.role == ir::ValueRole::Input) {
        try {
          local_shard(v.type.shape, texts(spec), sharding_.mesh, rank_);
          break;
        } catch (const ValidationError&) {
          auto shard = std::find_if(spec.begin(), spec.end(), [](const Placement& p) { return p.is_shard(); });
          if (shard == spec.end()) throw;
          *shard = Placement::replicate();
        }
      }
      produced_[static_cast<std::size_t>(v.id)] = spec;
    }
  batch_ratios_ = input_batch_ratios(graph_, axes_, [&](const ir::Value& v) {
    return &produced_[static_cast<std::size_t>(v.id)];
  });
  for (const ir::Value& v : values_)
    if (!v.producer) spread_ratios(produced_[static_cast<std::size_t>(v.id)], v);
}

void SpmdRewriter::spread_ratios(ShardingSpec& spec, const ir::Value& v) const {
  spread_batch_ratios(spec, v, batch_ratios_);
}

// Whether `node` runs whole for want of a kernel, and otherwise which distributed kernel its
// split takes (a lookup's axes, a statistics kernel's axis, dim and name, set on `rw`).
bool SpmdRewriter::decide_kernels(const ir::Node& node, NodeRewrite& rw) const {
  const auto n = static_cast<std::size_t>(node.id);
  const std::optional<ops::DimRule>& rule = rules_[n];
  bool whole = !node.outputs.empty() && options_.whole_nodes.contains(graph_.value(node.outputs[0]).name);
  for (std::size_t a = 0; a < axes_ && !whole; ++a) {
    const Strategy& s = strategies_[n][a];
    if (s.partial || s.index < 0 || !rule) continue;
    // A creation op's values depend on its block: arange's local form starts at the block
    // (rewrite_node), any other runs whole.
    if (node.inputs.empty() && !is_arange(node.op)) whole = true;
    const ops::Index& index = rule->indices[static_cast<std::size_t>(s.index)];
    if (s.dispatch) {
      // The tokens' rows of input 0 split, each rank's experts theirs: the all-to-all kernel.
      if (rw.statistics_axis >= 0 || s.inputs.empty() || !s.inputs[0].is_shard()) {
        whole = true;
        continue;
      }
      rw.statistics_axis = static_cast<int>(a);
      rw.statistics_dim = s.inputs[0].dim;
      rw.kernel = std::string(ops::kExpertsAllToAll);
      continue;
    }
    if (index.kind != ops::IndexKind::Whole) continue;
    if (index.lookup && options_.lookup_ops.contains(node.op)) {
      rw.lookup_axes.push_back(static_cast<int>(a));
    } else if (const auto ring = ops::ring_kernel(node);
               index.ring && ring && rw.statistics_axis < 0 && !s.inputs.empty() && s.inputs[0].is_shard()) {
      // Ring attention over the query rows' dim; the key and value blocks travel the axis.
      rw.statistics_axis = static_cast<int>(a);
      rw.statistics_dim = s.inputs[0].dim;
      rw.kernel = std::string(*ring);
    } else if (const auto kernel = ops::statistics_kernel(node, options_.statistics_ops);
               index.statistics > 0 && rw.statistics_axis < 0 && kernel && !s.inputs.empty() &&
               s.inputs[0].is_shard() && (s.groups == 1 || !kernel->starts_with("shardwise::vocab_"))) {
      // The vocabulary kernels address this rank's classes as one block [start, stop); the
      // others only sum over what the rank holds, in any layout.
      rw.statistics_axis = static_cast<int>(a);
      rw.statistics_dim = s.inputs[0].dim;
      rw.kernel = std::string(*kernel);
    } else {
      whole = true;  // statistics on a second axis or with no kernel, or a lookup with none
    }
  }
  return whole || (rw.statistics_axis >= 0 && !rw.lookup_axes.empty());
}

// A seeded random op on a block draws as one device only as a dropout's mask or a *_like
// op's values, drawn whole and cut (ops/random_draws.h); any other runs whole. Whether it
// runs whole; `rw.one_device_random` where it is drawn whole and cut.
bool SpmdRewriter::decide_random(const ir::Node& node, NodeRewrite& rw) const {
  bool split = false, partial = false;
  for (std::size_t a = 0; a < axes_; ++a)
    for (const Placement& p : strategies_[static_cast<std::size_t>(node.id)][a].inputs) {
      split = split || (p.is_shard() && sharding_.mesh[a] > 1);
      partial = partial || p.is_partial();
    }
  switch (ops::random_draw(node.op)) {
    case ops::RandomDraw::Mask: rw.one_device_random = split || partial; return false;
    case ops::RandomDraw::Like: rw.one_device_random = split && !partial; return partial;
    default: return split || partial;
  }
}

void SpmdRewriter::read_operands(const ir::Node& node, NodeRewrite& rw, bool whole) {
  const auto n = static_cast<std::size_t>(node.id);
  for (std::size_t i = 0; i < node.inputs.size(); ++i) {
    OperandRewrite op;
    op.value = graph_.value(node.inputs[i]).name;
    ShardingSpec need, grad;
    for (std::size_t a = 0; a < axes_; ++a) {
      need.push_back(whole ? Placement::replicate() : strategies_[n][a].inputs[i]);
      grad.push_back(whole ? Placement::replicate() : strategies_[n][a].input_grads[i]);
    }
    spread_ratios(need, graph_.value(node.inputs[i]));
    spread_ratios(grad, graph_.value(node.inputs[i]));
    op.required = std::move(need);
    rw.inputs.push_back(std::move(op));
    grads_[n].push_back(std::move(grad));
  }
  if (rw.mode == NodeMode::Lookup || rw.mode == NodeMode::Statistics) {  // the kernel's block of the split dim
    const auto dim = static_cast<std::size_t>(rw.mode == NodeMode::Lookup ? 0 : rw.statistics_dim);
    const auto runs = local_shard(graph_.value(node.inputs[0]).type.shape, texts(rw.inputs[0].required),
                                  sharding_.mesh, rank_)
                          .dims.at(dim);
    if (!runs.empty()) {
      rw.kernel_start = runs.front().first;
      rw.kernel_stop = runs.back().second;
    }
  }
}

// A counted mean (ops::CountedMean): the shares of its rows, the step's micro-batches and the
// mesh axes that split them; the runtime divides by the count of the whole batch.
void SpmdRewriter::count_mean(const ir::Node& node, NodeRewrite& rw, bool whole) const {
  const auto n = static_cast<std::size_t>(node.id);
  const std::optional<ops::DimRule>& rule = rules_[n];
  if (!rule || !rule->counted_mean) return;
  CountedRewrite counted{options_.micro_batches, rule->counted_mean->target, rule->counted_mean->weight};
  for (std::size_t a = 0; a < axes_ && !whole; ++a) {
    const Strategy& s = strategies_[n][a];
    if (s.partial || s.index < 0) continue;
    const ops::Index& index = rule->indices[static_cast<std::size_t>(s.index)];
    if (index.kind == ops::IndexKind::Reduced && index.reduction == ops::Reduction::Mean)
      counted.shares *= sharding_.mesh[a];
  }
  rw.counted = counted;
}

// A mean over a batch split into uneven shares: each rank's mean counts its share.
double SpmdRewriter::uneven_mean_scale(const ir::Node& node, const NodeRewrite& rw, bool whole) const {
  const auto n = static_cast<std::size_t>(node.id);
  const std::optional<ops::DimRule>& rule = rules_[n];
  double scale = 1.0;
  for (std::size_t a = 0; a < axes_ && !whole && !rw.counted; ++a) {
    const Strategy& s = strategies_[n][a];
    if (batch_ratios_[a].empty() || s.partial || s.index < 0 || !rule) continue;
    const ops::Index& index = rule->indices[static_cast<std::size_t>(s.index)];
    bool uneven_input = false;
    for (const OperandRewrite& op : rw.inputs) uneven_input = uneven_input || !op.required[a].ratios.empty();
    if (index.kind == ops::IndexKind::Reduced && index.reduction == ops::Reduction::Mean && uneven_input) {
      int stride = 1;
      for (std::size_t b = a + 1; b < axes_; ++b) stride *= sharding_.mesh[b];
      const int k = (rank_ / stride) % sharding_.mesh[a];
      scale *= batch_ratios_[a][static_cast<std::size_t>(k)] * sharding_.mesh[a];
    }
  }
  return scale;
}

// How `node` runs (whole, on a kernel, or local), what it needs of its operands, the local
// call's attributes, and what it leaves.
void SpmdRewriter::rewrite_node(const ir::Node& node) {
  const auto n = static_cast<std::size_t>(node.id);
  NodeRewrite& rw = rewrites_[n];
  rw.node = node.id;
  rw.op = node.op;
  const std::optional<ops::DimRule>& rule = rules_[n];
  bool whole = decide_kernels(node, rw);
  // arange split into one block [lo, hi) per rank; a strided split (several runs) has no
  // single arange and runs whole.
  std::optional<IndexRun> arange_run;
  if (!whole && is_arange(node.op) && node.inputs.empty() && node.outputs.size() == 1 && rule) {
    ShardingSpec spec;
    for (std::size_t a = 0; a < axes_; ++a) spec.push_back(strategies_[n][a].outputs[0]);
    const ir::Value& out = graph_.value(node.outputs[0]);
    const auto runs = local_shard(out.type.shape, texts(spec), sharding_.mesh, rank_).dims;
    if (runs.size() == 1 && runs[0].size() == 1)
      arange_run = runs[0][0];
    else
      whole = true;
  }
  if (!whole && ops::draws(node)) whole = decide_random(node, rw);
  rw.mode = whole                       ? NodeMode::Whole
            : rw.statistics_axis >= 0   ? NodeMode::Statistics
            : rw.lookup_axes.empty()    ? NodeMode::Local
                                        : NodeMode::Lookup;
  if (whole) {
    rw.lookup_axes.clear();
    rw.statistics_axis = -1;
    rw.statistics_dim = -1;
    rw.kernel.clear();
  }
  read_operands(node, rw, whole);
  count_mean(node, rw, whole);
  const double scale = uneven_mean_scale(node, rw, whole);
  for (std::size_t o = 0; o < node.outputs.size(); ++o) {
    ShardingSpec spec;
    for (std::size_t a = 0; a < axes_; ++a)
      spec.push_back(whole ? Placement::replicate() : strategies_[n][a].outputs[o]);
    const ir::Value& out = graph_.value(node.outputs[o]);
    spread_ratios(spec, out);
    produced_[static_cast<std::size_t>(out.id)] = spec;
    rw.outputs.push_back({out.name, spec, local_shape(out, spec), scale});
  }
  rw.attrs = node.attrs;
  if (rw.mode == NodeMode::Local) {
    std::vector<std::vector<std::int64_t>> global_out, local_out;
    for (std::size_t o = 0; o < node.outputs.size(); ++o) {
      global_out.push_back(graph_.value(node.outputs[o]).type.shape);
      local_out.push_back(rw.outputs[o].local_shape);
    }
    rw.attrs = local_attrs(node.attrs, global_out, local_out);
    if (arange_run && global_out != local_out) {
      rw.op = "aten::arange.start_step";
      rw.attrs = arange_block(node.attrs, arange_run->first, arange_run->second);
    }
  }
  if (rw.counted && rw.counted->shares > 1) rw.attrs["reduction"] = std::int64_t{2};  // the sum over its rows
}

// Which values carry gradients (floating parameters and what floating values they reach),
// and their canonical gradient placements: a parameter replicated on an axis whose reads give
// Partial(sum) there keeps its gradient Partial for the engine's bucketed reduction
// (reduced_whole: a tied weight's whole reads add theirs on one rank).
void SpmdRewriter::mark_gradients() {
  gradient_ = analysis::gradient_flow(graph_);
  for (const ir::Value& v : values_) {
    const auto id = static_cast<std::size_t>(v.id);
    for (const Placement& p : produced_[id]) canonical_[id].push_back(search::gradient_placement(p));
  }
  Reads reads(values_.size());
  for (const ir::Node& node : nodes_)
    for (std::size_t i = 0; i < node.inputs.size(); ++i)
      reads[static_cast<std::size_t>(node.inputs[i])].emplace_back(static_cast<std::size_t>(node.id), i);
  defer_replicated_reductions(reads);
  for (const ir::Value& v : values_) {
    const auto id = static_cast<std::size_t>(v.id);
    if (v.producer || !gradient_[id]) continue;
    for (std::size_t a = 0; a < axes_; ++a) {
      if (produced_[id][a].is_replicate() && reduced_whole(reads, id, a)) {
        canonical_[id][a] = Placement::partial();
        reduce_axes_[id].push_back(static_cast<int>(a));
      }
    }
  }
}

// A value made from the model's state alone (analysis/state_values.h), Replicate on an axis
// and made by a node that reads every operand Replicate there, whose readers all give a
// Partial(sum) gradient on that axis keeps that gradient Partial: its producer's backward is
// linear in the gradient and its saved operands are the same on every rank, so the ranks'
// partial gradients sum where they reach a parameter, which the engine reduces in its buckets
// (mark_gradients), as DDP reduces a learned position embedding read as wpe(arange(T)), instead
// of an all-reduce of the value's gradient, exposed in backward. Readers first (reverse node
// order), so a chain of such values passes the Partial gradient up to its parameters. (Values
// made from an input are left alone, though a replicated input is the same on every rank of
// the axis too: the search prices only this case, search/sharding_edges.h.)
void SpmdRewriter::defer_replicated_reductions(const Reads& reads) {
  const std::vector<bool> state = analysis::state_values(graph_);
  const std::vector<ir::ValueId>& outputs = graph_.outputs();
  for (auto node = nodes_.rbegin(); node != nodes_.rend(); ++node) {
    const auto n = static_cast<std::size_t>(node->id);
    if (node->outputs.size() != 1) continue;
    const auto out = static_cast<std::size_t>(node->outputs[0]);
    if (!state[out] || !gradient_[out] ||
        std::find(outputs.begin(), outputs.end(), node->outputs[0]) != outputs.end())
      continue;
    for (std::size_t a = 0; a < axes_; ++a) {
      if (sharding_.mesh[a] <= 1 || !produced_[out][a].is_replicate()) continue;
      bool alike = read_as_partial_sum(reads, out, a);
      for (std::size_t i = 0; i < node->inputs.size() && alike; ++i)
        alike = rewrites_[n].inputs[i].required[a].is_replicate() && grads_[n][i][a].is_replicate();
      if (!alike) continue;
      canonical_[out][a] = Placement::partial();
      for (std::size_t i = 0; i < node->inputs.size(); ++i)
        if (gradient_[static_cast<std::size_t>(node->inputs[i])]) grads_[n][i][a] = Placement::partial();
    }
  }
}

// Whether `value` is read at all and every read gives its gradient Partial(sum) on `axis`.
bool SpmdRewriter::read_as_partial_sum(const Reads& reads, std::size_t value, std::size_t axis) const {
  const auto& of = reads[value];
  return !of.empty() && std::all_of(of.begin(), of.end(), [&](const auto& read) {
    const Placement& g = grads_[read.first][read.second][axis];
    return g.is_partial() && g.reduction == ops::Reduction::Sum;
  });
}

// Whether `value`'s reads give its gradient Partial(sum) on `axis`, some of them, the others
// a whole gradient (Replicate): the sum is then reduced once, whole, in the engine's buckets,
// each whole contribution kept on one rank (its backward step ZeroOthers). A tied embedding
// whose lookup's gradient is whole (its output's gradient gathered) and whose head's is
// Partial had the head's all-reduced at its read instead: the same bytes, exposed in backward,
// where the search prices each read's share of one bucketed reduction
// (search::EdgePricer::reduced_gradient).
bool SpmdRewriter::reduced_whole(const Reads& reads, std::size_t value, std::size_t axis) const {
  bool partial = false;
  for (const auto& [node, operand] : reads[value]) {
    const Placement& g = grads_[node][operand][axis];
    const bool sum = g.is_partial() && g.reduction == ops::Reduction::Sum;
    if (!sum && !g.is_replicate()) return false;
    partial = partial || sum;
  }
  return partial;
}

// The backward steps of an edge: the reader's gradient to the value's canonical one. A value
// that is Partial(mean) on an axis is the mean of the ranks' values, so each rank's share of
// its gradient is the whole gradient over n: a Scale after the steps.
std::vector<ReshardAction> SpmdRewriter::backward_steps(const ShardingSpec& from, std::size_t value) const {
  std::vector<ReshardAction> steps = reshard_actions(from, canonical_[value]);
  for (std::size_t a = 0; a < axes_; ++a) {
    const Placement& p = produced_[value][a];
    if (p.is_partial() && p.reduction == ops::Reduction::Mean) {
      ReshardAction scale;
      scale.kind = ReshardKind::Scale;
      scale.axis = static_cast<int>(a);
      scale.scale_power = -1;
      steps.push_back(scale);
    }
  }
  return steps;
}

void SpmdRewriter::emit_leaves(RewriteBuilder& builder) const {
  for (const ir::Value& v : values_) {
    if (v.producer) continue;
    const auto id = static_cast<std::size_t>(v.id);
    builder.leaf({v.name, produced_[id], local_shape(v, produced_[id]),
                  gradient_[id] ? canonical_[id] : ShardingSpec{}, reduce_axes_[id]});
  }
}

// Recomputation: every instance of every group of repeated blocks (a transformer's layers;
// DeepSeek-V3's dense first layers beside its mixture-of-experts ones) is one checkpointed
// region, numbered in order over the groups, as the search and the evaluator price it
// (search/block_folding.h, cost::checkpoint_outer_blocks: block nodes recompute their forward
// in backward and the block keeps its checkpoint).
void SpmdRewriter::mark_recompute() {
  if (sharding_.recompute == plan::Recompute::None) return;
  // Selective: the nodes whose outputs are kept (none under full recomputation).
  const std::vector<bool> kept = sharding_.recompute == plan::Recompute::Selective
                                     ? analysis::kept_by_selective_recompute(graph_)
                                     : std::vector<bool>(nodes_.size(), false);
  int region = 0;
  for (const analysis::RepeatedBlockGroup& group : analysis::find_repeated_blocks(graph_))
    for (const std::vector<ir::NodeId>& block : group.nodes) {
      for (ir::NodeId id : block) {
        NodeRewrite& rw = rewrites_[static_cast<std::size_t>(id)];
        rw.recompute_block = region;
        rw.recompute_keeps = kept[static_cast<std::size_t>(id)];
      }
      ++region;
    }
}

// Operand i of `node`: its forward and backward steps, whether it is gathered again for
// backward, and how its parameter collectives overlap (grouped per unit, kind, axis, dtype,
// in node order).
void SpmdRewriter::operand_steps(const ir::Node& node, std::size_t i, int unit) {
  const auto n = static_cast<std::size_t>(node.id);
  NodeRewrite& rw = rewrites_[n];
  const std::optional<ops::DimRule>& rule = rules_[n];
  OperandRewrite& op = rw.inputs[i];
  const ir::Value& v = graph_.value(node.inputs[i]);
  const auto id = static_cast<std::size_t>(v.id);
  op.produced = produced_[id];
  // An operand read for its metadata only (new_empty's self) is read as it is held: its
  // dtype and device are every shard's; the search prices no resharding of it (group_edges).
  const bool metadata = rule && rule->reads_metadata_only(i);
  if (metadata) op.required = op.produced;
  op.local_shape = local_shape(v, op.required);
  op.forward = reshard_actions(op.produced, op.required);
  const bool read_by_backward = v.role == ir::ValueRole::Parameter && gathered_for_read(op) &&
                                (!rule || search::backward_reads(*rule, i, analysis::operand_gradients(node, gradient_)));
  // An FP8 linear's backward reads the float8 copy of W^T its forward saved, not W (fp8_axes.h).
  op.float8_saved = read_by_backward && saves_float8_weight(graph_, node, i, options_.fp8);
  op.regather = read_by_backward && rw.recompute_block < 0 && !op.float8_saved;
  if (v.role == ir::ValueRole::Parameter) {
    op.gather = search::forward_gather_overlap(op.produced, op.required, rw.recompute_block >= 0);
    if (op.gather == search::ParameterOverlap::BesideForward &&
        (op.forward.size() != 1 || op.forward[0].kind != ReshardKind::AllGather))
      throw ValidationError(fmt::format("internal: a prefetched gather of '{}' is not one all-gather ({} steps)",
                                        v.name, op.forward.size()));
  }
  op.gradient = gradient_[id] && !metadata;
  if (op.gradient) op.backward = backward_steps(grads_[n][i], id);
  if (op.gradient && v.role == ir::ValueRole::Parameter) {
    op.scatter = search::gradient_scatter_overlap(grads_[n][i], canonical_[id]);
    if (op.scatter == search::ParameterOverlap::BesideBackward &&
        (op.backward.size() != 1 || op.backward[0].kind != ReshardKind::ReduceScatter))
      throw ValidationError(fmt::format("internal: an overlapped gradient step of '{}' is not one reduce-scatter "
                                        "({} steps)", v.name, op.backward.size()));
  }
  if (op.gather == search::ParameterOverlap::BesideForward)
    op.gather_group = group_of(unit, 0, op.forward[0].axis, v.type.dtype);
  if (op.scatter == search::ParameterOverlap::BesideBackward)
    op.scatter_group = group_of(unit, 1, op.backward[0].axis, v.type.dtype);
}

void SpmdRewriter::plan_operand_steps() {
  const std::vector<int> units = search::parameter_units(graph_);
  for (const ir::Node& node : nodes_) {
    for (std::size_t i = 0; i < node.inputs.size(); ++i) {
      try {
        operand_steps(node, i, units[static_cast<std::size_t>(node.id)]);
      } catch (const ValidationError& e) {
        throw ValidationError(fmt::format("rewrite: operand {} ('{}') of node '{}' ({}, module '{}'): {}", i,
                                          graph_.value(node.inputs[i]).name,
                                          graph_.value(node.outputs.empty() ? node.inputs[0] : node.outputs[0]).name,
                                          node.op, node.module_path, e.what()));
      }
    }
  }
}

// The nodes, then the graph's outputs made whole. (Asynchronous gradients and collective
// matmuls are passes over the rank graph: transform/async_gradients.h, collective_matmul.h.)
void SpmdRewriter::emit(RewriteBuilder& builder) {
  for (const NodeRewrite& rw : rewrites_) builder.node(rw);
  for (ir::ValueId out : graph_.outputs()) {
    const ir::Value& v = graph_.value(out);
    const auto id = static_cast<std::size_t>(out);
    OperandRewrite op;
    op.value = v.name;
    op.produced = produced_[id];
    op.required = replicated(axes_);
    op.local_shape = v.type.shape;
    op.forward = reshard_actions(op.produced, op.required);
    op.gradient = gradient_[id];
    if (op.gradient) op.backward = backward_steps(replicated(axes_), id);
    builder.output(op);
  }
}

}  // namespace

bool gathered_for_read(const OperandRewrite& op) {
  return std::any_of(op.forward.begin(), op.forward.end(), [](const ReshardAction& step) {
    return step.kind == ReshardKind::AllGather || step.kind == ReshardKind::AllToAll ||
           step.kind == ReshardKind::AllReduce;
  });
}

std::vector<std::vector<double>> input_batch_ratios(
    const ir::Graph& graph, std::size_t axes,
    const std::function<const ShardingSpec*(const ir::Value&)>& placement_of) {
  std::vector<std::vector<double>> ratios(axes);
  for (ir::ValueId in : graph.inputs()) {
    const ir::Value& v = graph.value(in);
    const ShardingSpec* spec = placement_of(v);
    for (std::size_t a = 0; spec != nullptr && a < axes && a < spec->size(); ++a) {
      const Placement& p = (*spec)[a];
      if (p.is_shard() && !p.ratios.empty() && v.type.batch_dim && p.dim == *v.type.batch_dim) ratios[a] = p.ratios;
    }
  }
  return ratios;
}

void spread_batch_ratios(ShardingSpec& spec, const ir::Value& v, const std::vector<std::vector<double>>& batch_ratios) {
  for (std::size_t a = 0; a < spec.size() && a < batch_ratios.size(); ++a) {
    Placement& p = spec[a];
    if (!batch_ratios[a].empty() && p.is_shard() && p.ratios.empty() && p.groups == 1 && v.type.batch_dim &&
        p.dim == *v.type.batch_dim)
      p.ratios = batch_ratios[a];
  }
}

// The phases in order: the leaves' placements; each node's mode, operands and outputs (in
// node order: a node's operands are placed by then); gradients; the leaves; recomputation
// blocks (before the steps, which read them); each operand's steps; the nodes and outputs.
void rewrite_spmd(const ir::Graph& graph, const plan::Sharding& sharding, int rank, const RewriteOptions& options,
                  RewriteBuilder& builder) {
  SpmdRewriter rewriter(graph, sharding, rank, options);
  rewriter.place_leaves();
  for (const ir::Node& node : graph.nodes()) rewriter.rewrite_node(node);
  rewriter.mark_gradients();
  rewriter.emit_leaves(builder);
  rewriter.mark_recompute();
  rewriter.plan_operand_steps();
  rewriter.emit(builder);
}

RankProgram rank_program(const ir::Graph& graph, const plan::Sharding& sharding, int rank,
                         const RewriteOptions& options) {
  RankProgram program;
  program.mesh = sharding.mesh;
  program.rank = rank;
  Recorder recorder(program);
  rewrite_spmd(graph, sharding, rank, options, recorder);
  return program;
}

}  // namespace shardwise::transform
