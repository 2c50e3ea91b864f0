#include "transform/rank_graph.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <optional>
#include <set>

#include "ops/distributed_kernels.h"
#include "ops/node_rule.h"
#include "ops/op_table.h"
#include "search/parameter_collectives.h"
#include "search/placement.h"
#include "support/error.h"
#include "transform/fp8_axes.h"
#include "transform/local_shard.h"

namespace shardwise::transform {
namespace {

using search::Placement;
using search::ShardingSpec;
using support::ValidationError;
using Shape = std::vector<std::int64_t>;

constexpr std::string_view kWholeAttr = "shardwise.whole";
constexpr std::string_view kRecomputeAttr = "shardwise.recompute";
constexpr std::string_view kRecomputeKeepsAttr = "shardwise.recompute_keeps";
constexpr std::string_view kOneDeviceRandomAttr = "shardwise.one_device_random";
// The capture's mark on a call that writes operands in place (batch norm's running
// statistics): {shardwise.writes=[i, ...]}, their positions among its operands.
constexpr std::string_view kWritesAttr = "shardwise.writes";
constexpr std::string_view kWriteStateOp = "shardwise::write_state";
// The steps of a state write-back carry {write_back=true}: a region of their own, which the
// region of the call's read (the value they start at) does not continue into.
constexpr std::string_view kWriteBackAttr = "write_back";
// A collective run inside a contraction, as a ring (transform/collective_matmul.h marks it).
constexpr std::string_view kMatmulOverlap = "matmul";

// A collective's overlap mark: where `overlap` says it runs.
std::string overlap_mark(search::ParameterOverlap overlap) { return std::string(search::parameter_overlap_name(overlap)); }

std::vector<std::string> texts(const ShardingSpec& spec) {
  std::vector<std::string> out;
  for (const auto& p : spec) out.push_back(p.str());
  return out;
}

// The placement of a value after one resharding step on it (reshard_actions.h's table).
void apply_step(ShardingSpec& spec, const ReshardAction& step) {
  Placement& p = spec[static_cast<std::size_t>(step.axis)];
  switch (step.kind) {
    case ReshardKind::AllGather:
    case ReshardKind::AllReduce: p = Placement::replicate(); break;
    case ReshardKind::ReduceScatter: p = Placement::shard(step.dim, step.groups); break;
    case ReshardKind::AllToAll: p = Placement::shard(step.dim); break;
    case ReshardKind::Slice:
      p = Placement::shard(step.dim, step.groups);
      p.ratios = step.ratios;
      break;
    case ReshardKind::ZeroOthers: p = Placement::partial(); break;
    case ReshardKind::Scale:
      p = Placement::partial(step.scale_power < 0 ? ops::Reduction::Sum : ops::Reduction::Mean);
      break;
  }
}

// A step that moves no data between ranks (a slice, zeroing others, a scale): no overlap mark.
bool is_local(const ReshardAction& step) {
  return step.kind == ReshardKind::Slice || step.kind == ReshardKind::ZeroOthers || step.kind == ReshardKind::Scale;
}

ir::Attributes step_attrs(const ReshardAction& step, const std::vector<int>& mesh, int rank, bool backward) {
  ir::Attributes a;
  a["axis"] = std::int64_t{step.axis};
  a["group"] = axis_group(mesh, step.axis, rank);
  switch (step.kind) {
    case ReshardKind::AllGather:
    case ReshardKind::ReduceScatter:
    case ReshardKind::Slice:
      a["dim"] = std::int64_t{step.dim};
      if (step.groups > 1) a["groups"] = step.groups;
      if (!step.ratios.empty()) a["ratios"] = step.ratios;
      break;
    case ReshardKind::AllReduce: a["reduce"] = step.reduce; break;
    case ReshardKind::AllToAll:
      a["dim"] = std::int64_t{step.dim};
      a["concat_dim"] = std::int64_t{step.concat_dim};
      break;
    case ReshardKind::ZeroOthers: break;
    case ReshardKind::Scale: a["power"] = std::int64_t{step.scale_power}; break;
  }
  if (backward) a["pass"] = std::string("backward");
  return a;
}

// Emits a rank program (leaves, then nodes, then outputs) into an ir::Graph.
class GraphEmitter {
 public:
  GraphEmitter(const ir::Graph& global, const plan::Sharding& sharding, int rank, bool fp8)
      : global_(global), sharding_(sharding), rank_(rank), fp8_(fp8) {}

  ir::Graph take() { return std::move(graph_); }
  std::vector<std::string> whole;

  void leaf(const LeafRewrite& leaf) {
    const ir::Value& v = global_value(leaf.value);
    ir::TensorType type = v.type;
    type.shape = leaf.local_shape;
    graph_.add_value(v.name, type, v.role);
    leaf_placements_.emplace(leaf.value, leaf.placement);
    if (!leaf.reduce_axes.empty()) reductions_.push_back(leaf);
  }

  std::vector<ir::NodeId> nodes;  // each rewritten node's node (its call) in the graph

  void node(const NodeRewrite& rw) {
    const ir::Node& node = global_.node(rw.node);
    std::vector<ir::ValueId> inputs;
    for (const OperandRewrite& op : rw.inputs) inputs.push_back(resharded(op, node.module_path));
    std::vector<Shape> global_out, local_out;
    for (std::size_t o = 0; o < node.outputs.size(); ++o) {
      global_out.push_back(global_.value(node.outputs[o]).type.shape);
      local_out.push_back(rw.outputs[o].local_shape);
    }
    // The overload the rank calls (an arange's block: arange.start_step, whose shape rule
    // reads its start; the captured arange(end) would read only its end).
    std::string op = rw.op.empty() ? node.op : rw.op;
    ir::Attributes attrs = rw.attrs;
    if (rw.recompute_block >= 0) attrs[std::string(kRecomputeAttr)] = std::int64_t{rw.recompute_block};
    if (rw.recompute_keeps) attrs[std::string(kRecomputeKeepsAttr)] = true;
    if (rw.one_device_random) attrs[std::string(kOneDeviceRandomAttr)] = true;
    if (const auto axes = fp8_ ? fp8_axes(global_, rw) : std::nullopt) {
      attrs[std::string(kFp8KAxesAttr)] = std::vector<std::int64_t>(axes->k_axes.begin(), axes->k_axes.end());
      attrs[std::string(kFp8NAxesAttr)] = std::vector<std::int64_t>(axes->n_axes.begin(), axes->n_axes.end());
      if (axes->float8_weight) attrs[std::string(kFp8Float8WeightAttr)] = true;
    }
    if (rw.mode == NodeMode::Whole) {
      attrs[std::string(kWholeAttr)] = true;
      whole.push_back(global_.value(node.outputs[0]).name);
    }
    if (rw.mode == NodeMode::Lookup) {
      // The table's rows this rank holds: its block of dim 0 (one run: the vocabulary is cut
      // in consecutive blocks).
      op = "shardwise::embedding_lookup";
      attrs["start"] = rw.kernel_start;
      attrs["stop"] = rw.kernel_stop;
    }
    if (rw.mode == NodeMode::Statistics) {
      // The kernel over input 0's dim split on statistics_axis: this rank's block [start,
      // stop) of it (a vocabulary kernel's classes), and the dim's whole size (the count a
      // norm's mean divides by).
      const std::vector<std::int64_t>& shape = global_.value(node.inputs[0]).type.shape;
      op = rw.kernel;
      attrs["axis"] = std::int64_t{rw.statistics_axis};
      attrs["dim"] = std::int64_t{rw.statistics_dim};
      attrs["size"] = shape.at(static_cast<std::size_t>(rw.statistics_dim));
      attrs["start"] = rw.kernel_start;
      attrs["stop"] = rw.kernel_stop;
    }
    const bool counted = rw.counted && rw.counted->shares > 1;  // its reduction is sum (spmd_rewrite.h)
    std::vector<ir::OutputSpec> outputs;
    for (std::size_t o = 0; o < node.outputs.size(); ++o) {
      const ir::Value& v = global_.value(node.outputs[o]);
      ir::TensorType type = v.type;
      type.shape = local_out[o];
      std::string name = v.name;
      if (counted && o == 0) name = fresh(name + ".sum");
      if (rw.outputs[o].scale != 1.0) name = fresh(name + ".share");
      outputs.push_back({name, type});
    }
    const ir::NodeId id = graph_.add_node(op, inputs, outputs, attrs, node.module_path);
    nodes.push_back(id);
    for (std::size_t o = 0; o < node.outputs.size(); ++o) {
      const ir::Value& v = global_.value(node.outputs[o]);
      ir::ValueId out = graph_.node(id).outputs[o];
      if (counted && o == 0) {
        const ir::ValueId count =
            graph_.add_value(fresh(v.name + ".count"), ir::TensorType{ir::DType::I64, {}, std::nullopt},
                             ir::ValueRole::Input);
        out = single(graph_.add_node("shardwise::counted_mean", {out, count},
                                     {{rw.outputs[o].scale != 1.0 ? fresh(v.name + ".counted") : v.name,
                                       graph_.value(out).type}},
                                     {{"shares", std::int64_t{rw.counted->shares}}}, node.module_path));
      }
      if (rw.outputs[o].scale != 1.0)
        out = single(graph_.add_node("aten::mul.Scalar", {out}, {{v.name, graph_.value(out).type}},
                                     {{"other", rw.outputs[o].scale}}, node.module_path));
      (void)out;
    }
    write_back_state(node, rw, inputs, attrs);
  }

  void output(const OperandRewrite& out) { outputs_.push_back(resharded(out, "")); }

  void finish() {
    graph_.set_outputs(outputs_);
    for (const LeafRewrite& leaf : reductions_) {
      std::vector<std::int64_t> axes(leaf.reduce_axes.begin(), leaf.reduce_axes.end());
      const auto overlap = search::parameter_overlap_name(search::gradient_reduction_overlap(search::Placement::replicate()));
      graph_.add_node("shardwise::reduce_gradient", {*graph_.find_value(leaf.value)}, {},
                      {{"axes", axes}, {"overlap", std::string(overlap)}, {"reduce", std::string("sum")}}, "");
    }
  }

 private:
  ir::ValueId single(ir::NodeId id) const { return graph_.node(id).outputs[0]; }

  // The node of forward step `step` on `value` (held in `spec`, which becomes the step's
  // result), named `name`, its output at the local shape of `whole`'s new placement.
  ir::ValueId add_forward_step(ir::ValueId value, ShardingSpec& spec, const Shape& whole, const ReshardAction& step,
                               ir::Attributes attrs, std::string name, const std::string& module) {
    apply_step(spec, step);
    ir::TensorType type = graph_.value(value).type;
    type.shape = local_shard(whole, texts(spec), sharding_.mesh, rank_).shape;
    return single(graph_.add_node(fmt::format("shardwise::{}", reshard_kind_name(step.kind)), {value},
                                  {{std::move(name), type}}, std::move(attrs), module));
  }

  // A call that writes a leaf operand in place (the capture's {shardwise.writes}: batch norm's
  // running statistics) writes the copy it read, `read[i]`; the leaf becomes that copy: the
  // steps from the placement the call read it in back to the leaf's (a channel block
  // all-gathered), marked {write_back=true}, then shardwise::write_state(%leaf, %written),
  // in the call's recomputed block (the runtime writes once, not again in backward). A
  // Partial read has no state to write back: refused. Where the call read the leaf itself,
  // write_state(%leaf, %leaf): the write is already in place.
  void write_back_state(const ir::Node& node, const NodeRewrite& rw, const std::vector<ir::ValueId>& read,
                        const ir::Attributes& call_attrs) {
    auto marked = node.attrs.find(std::string(kWritesAttr));
    if (marked == node.attrs.end()) return;
    const auto* positions = std::get_if<std::vector<std::int64_t>>(&marked->second);
    if (positions == nullptr)  // a write the rank graph cannot place is refused, never dropped
      throw ValidationError(fmt::format("rewrite: {} node '{}': {}={} is not a list of operand positions", node.op,
                                        global_.value(node.outputs.at(0)).name, kWritesAttr,
                                        ir::attr_str(marked->second)));
    for (std::int64_t i : *positions) {
      if (i < 0 || static_cast<std::size_t>(i) >= rw.inputs.size())
        throw ValidationError(fmt::format("rewrite: rank {}: {} node '{}' writes operand {} of {}", rank_, node.op,
                                          global_.value(node.outputs.at(0)).name, i, rw.inputs.size()));
      const OperandRewrite& op = rw.inputs[static_cast<std::size_t>(i)];
      auto leaf = leaf_placements_.find(op.value);
      if (leaf == leaf_placements_.end()) continue;  // an activation's write: a new value in the IR
      for (const Placement& p : op.required)
        if (p.is_partial())
          throw ValidationError(fmt::format("rewrite: rank {}: {} node '{}' writes '{}' in place as a partial sum "
                                            "([{}]); a buffer's update must be read whole or as a block",
                                            rank_, node.op, global_.value(node.outputs.at(0)).name, op.value,
                                            fmt::join(texts(op.required), ", ")));
      ShardingSpec spec = op.required;
      ir::ValueId value = read[static_cast<std::size_t>(i)];
      int k = 0;
      for (const ReshardAction& step : reshard_actions(op.required, leaf->second)) {
        ir::Attributes attrs = step_attrs(step, sharding_.mesh, rank_, false);
        if (!is_local(step)) attrs["overlap"] = overlap_mark(search::ParameterOverlap::Exposed);
        attrs[std::string(kWriteBackAttr)] = true;
        value = add_forward_step(value, spec, global_value(op.value).type.shape, step, std::move(attrs),
                                 fresh(fmt::format("{}.w{}", op.value, ++k)), node.module_path);
      }
      ir::Attributes attrs;
      if (auto block = call_attrs.find(std::string(kRecomputeAttr)); block != call_attrs.end())
        attrs.insert(*block);
      graph_.add_node(std::string(kWriteStateOp), {*graph_.find_value(op.value), value}, {}, std::move(attrs),
                      node.module_path);
    }
  }

  // `name`, or `name_1`, `name_2`, ... when the rank graph or the model already has a value
  // of that name (the rank graph adds names of its own: `.r1`, `.sum`, `.count`).
  std::string fresh(const std::string& name) const {
    std::string out = name;
    for (int k = 1; graph_.find_value(out) || global_.find_value(out); ++k) out = fmt::format("{}_{}", name, k);
    return out;
  }

  const ir::Value& global_value(const std::string& name) const {
    return global_.value(*global_.find_value(name));
  }

  // The value `op` reads: the producer's, or the last node of its resharding region (the
  // region's nodes carry the module path of the first reader that needs it).
  ir::ValueId resharded(const OperandRewrite& op, const std::string& module) {
    const ir::ValueId source = *graph_.find_value(op.value);
    if (op.forward.empty() && op.backward.empty()) return source;
    const std::string key = resharding_region_key(op);
    if (auto it = regions_.find(key); it != regions_.end()) return it->second;
    const int k = ++reshardings_[op.value];
    const std::string base = fresh(fmt::format("{}.r{}", op.value, k));
    const ir::Value& global = global_value(op.value);
    const std::size_t steps = op.forward.size() + op.backward.size();
    std::size_t emitted = 0;
    auto name = [&] { return ++emitted == steps ? base : fresh(fmt::format("{}.s{}", base, emitted)); };
    ShardingSpec spec = op.produced;
    ir::ValueId value = source;
    // A parameter's collectives carry where the runtime runs them, the mark the search
    // prices (search/parameter_collectives.h).
    const bool parameter = global.role == ir::ValueRole::Parameter;
    for (const ReshardAction& step : op.forward) {
      ir::Attributes attrs = step_attrs(step, sharding_.mesh, rank_, false);
      if (!is_local(step))
        attrs["overlap"] = overlap_mark(parameter ? op.gather : search::activation_collective_overlap());
      if (op.regather) attrs["regather"] = true;
      // One flattened collective with the other members of its unit group (parameter_collectives.h).
      if (!is_local(step) && parameter && op.gather_group >= 0) attrs["unit_group"] = std::int64_t{op.gather_group};
      value = add_forward_step(value, spec, global.type.shape, step, std::move(attrs), name(), module);
    }
    for (auto it = op.backward.rbegin(); it != op.backward.rend(); ++it) {
      ir::Attributes attrs = step_attrs(*it, sharding_.mesh, rank_, true);
      // A parameter gradient's step at its read runs there, in backward (a reduce-scatter to
      // the shard, issued asynchronously where op.scatter says so); a gradient left Partial is
      // reduced in buckets (reduce_gradient, below). An activation's gradient step runs in its
      // producer's backward, blocking (the async-gradient pass marks those it runs beside a
      // weight gradient: transform/async_gradients.h).
      if (!is_local(*it))
        attrs["overlap"] = overlap_mark(parameter ? op.scatter : search::activation_collective_overlap());
      if (!is_local(*it) && parameter && op.scatter_group >= 0) attrs["unit_group"] = std::int64_t{op.scatter_group};
      value = single(graph_.add_node(fmt::format("shardwise::{}", reshard_kind_name(it->kind)), {value},
                                     {{name(), graph_.value(value).type}}, std::move(attrs), module));
    }
    regions_.emplace(std::move(key), value);
    return value;
  }

  const ir::Graph& global_;
  const plan::Sharding& sharding_;
  int rank_;
  bool fp8_;
  ir::Graph graph_;
  std::vector<ir::ValueId> outputs_;
  std::vector<LeafRewrite> reductions_;
  std::map<std::string, ShardingSpec> leaf_placements_;
  std::map<std::string, int> reshardings_;
  std::map<std::string, ir::ValueId> regions_;  // by value and step texts
};

// Local nodes whose op's shape rule, on the rank graph, refuses them or gives other shapes.
std::vector<std::string> failing_local_calls(const ir::Graph& local) {
  std::vector<std::string> failing;
  const ops::OpTable& table = ops::OpTable::builtin();
  for (const ir::Node& node : local.nodes()) {
    if (node.outputs.empty() || node.op.starts_with("shardwise::") || node.attrs.contains(kWholeAttr)) continue;
    bool fits = true;
    try {
      if (ops::dim_rule_for(table, local, node))
        if (auto inferred = ops::infer_output_shapes(table, local, node))
          for (std::size_t o = 0; o < inferred->size() && o < node.outputs.size(); ++o)
            fits = fits && local.value(node.outputs[o]).type.shape == (*inferred)[o];
    } catch (const ValidationError&) {
      fits = false;
    }
    if (!fits) failing.push_back(local.value(node.outputs[0]).name);
  }
  return failing;
}

std::optional<int> mesh_size(const ir::Attributes& attrs, const std::vector<int>& mesh, std::string_view what) {
  auto it = attrs.find("axis");
  if (it == attrs.end() || !std::holds_alternative<std::int64_t>(it->second)) return std::nullopt;
  const auto axis = std::get<std::int64_t>(it->second);
  if (axis < 0 || axis >= static_cast<std::int64_t>(mesh.size()))
    throw ValidationError(fmt::format("{}: axis {} outside the mesh [{}]", what, axis, fmt::join(mesh, ",")));
  return mesh[static_cast<std::size_t>(axis)];
}

std::int64_t int_attr(const ir::Attributes& attrs, const std::string& key, std::int64_t fallback) {
  auto it = attrs.find(key);
  return it != attrs.end() && std::holds_alternative<std::int64_t>(it->second) ? std::get<std::int64_t>(it->second)
                                                                                : fallback;
}

}  // namespace

std::vector<std::int64_t> axis_group(const std::vector<int>& mesh, int axis, int rank) {
  std::int64_t stride = 1;
  for (std::size_t b = static_cast<std::size_t>(axis) + 1; b < mesh.size(); ++b) stride *= mesh[b];
  const std::int64_t n = mesh[static_cast<std::size_t>(axis)];
  const std::int64_t k = (rank / stride) % n;
  std::vector<std::int64_t> group;
  for (std::int64_t j = 0; j < n; ++j) group.push_back(rank + (j - k) * stride);
  return group;
}

RankGraph rank_graph(const ir::Graph& global, const plan::Sharding& sharding, int rank, const RewriteOptions& options) {
  RewriteOptions opts = options;
  // Each round runs whole the local calls the last one found not to fit; a node run whole
  // changes only what its readers receive (Replicate, cut by a slice), so this ends.
  for (std::size_t round = 0;; ++round) {
    RankProgram program = rank_program(global, sharding, rank, opts);
    GraphEmitter emitter(global, sharding, rank, opts.fp8);
    for (const LeafRewrite& leaf : program.leaves) emitter.leaf(leaf);
    for (const NodeRewrite& node : program.nodes) emitter.node(node);
    for (const OperandRewrite& output : program.outputs) emitter.output(output);
    emitter.finish();
    RankGraph out{emitter.take(), sharding.mesh, rank, std::move(emitter.whole), std::move(program),
                  std::move(emitter.nodes)};
    const std::vector<std::string> failing = failing_local_calls(out.graph);
    if (failing.empty()) return out;
    if (round > global.nodes().size())
      throw ValidationError(fmt::format("rewrite: rank {}: local calls still do not fit after running {} nodes whole",
                                        rank, out.whole.size()));
    opts.whole_nodes.insert(failing.begin(), failing.end());
  }
}

void verify_rank_graph(const ir::Graph& local, const ir::Graph& global, const plan::Sharding& sharding, int rank) {
  const auto where = [&](std::string_view what) { return fmt::format("rank graph of rank {}: {}", rank, what); };
  const auto placement_of = [&](const std::string& name) -> std::optional<std::vector<std::string>> {
    auto it = sharding.placements.find(name);
    if (it == sharding.placements.end()) return std::nullopt;
    return it->second;
  };
  bool uneven = false;
  for (const auto& [name, spec] : sharding.placements)
    for (const auto& text : spec) uneven = uneven || text.find('[') != std::string::npos;

  for (const ir::Value& g : global.values()) {
    const auto found = local.find_value(g.name);
    if (!found) {
      if (g.producer) continue;  // checked below, through its node
      throw ValidationError(where(fmt::format("the {} '{}' is missing", ir::role_name(g.role), g.name)));
    }
    const ir::Value& l = local.value(*found);
    if (l.type.dtype != g.type.dtype)
      throw ValidationError(where(fmt::format("'{}' is {} but the model's is {}", g.name, l.type.str(), g.type.str())));
    if (!g.producer && l.role != g.role)
      throw ValidationError(where(fmt::format("'{}' is a {} but the model's is a {}", g.name, ir::role_name(l.role),
                                              ir::role_name(g.role))));
    const auto placement = placement_of(g.name);
    if (!placement || (g.producer && uneven)) continue;
    Shape expected = local_shard(g.type.shape, *placement, sharding.mesh, rank).shape;
    if (g.producer && l.producer && local.node(*l.producer).attrs.contains(kWholeAttr)) expected = g.type.shape;
    if (l.type.shape != expected)
      throw ValidationError(where(fmt::format("'{}' is [{}] but its placement [{}] on mesh [{}] gives [{}]", g.name,
                                              fmt::join(l.type.shape, ","), fmt::join(*placement, ", "),
                                              fmt::join(sharding.mesh, ","), fmt::join(expected, ","))));
  }

  const ops::OpTable& table = ops::OpTable::builtin();
  for (const ir::Node& node : local.nodes()) {
    const std::string what = node.outputs.empty()
                                 ? fmt::format("{} of '{}'", node.op, local.value(node.inputs.at(0)).name)
                                 : fmt::format("{} node '{}'", node.op, local.value(node.outputs[0]).name);
    static const std::set<std::string, std::less<>> kernels = {
        "shardwise::embedding_lookup", "shardwise::counted_mean", "shardwise::reduce_gradient",
        "shardwise::recv", "shardwise::send", std::string(kWriteStateOp)};
    if (!node.op.starts_with("shardwise::") || kernels.contains(node.op) || ops::is_statistics_kernel(node.op)) {
      if (node.op.starts_with("shardwise::")) continue;
      try {
        if (!ops::dim_rule_for(table, local, node)) continue;
      } catch (const ValidationError& e) {
        throw ValidationError(where(e.what()));
      }
      const auto inferred = ops::infer_output_shapes(table, local, node);
      if (!inferred) continue;
      for (std::size_t o = 0; o < inferred->size() && o < node.outputs.size(); ++o)
        if (local.value(node.outputs[o]).type.shape != (*inferred)[o])
          throw ValidationError(where(fmt::format("{}: output {} is [{}] but its operands and attributes give [{}]",
                                                  what, o, fmt::join(local.value(node.outputs[o]).type.shape, ","),
                                                  fmt::join((*inferred)[o], ","))));
      continue;
    }
    // A resharding step.
    const std::optional<int> n = mesh_size(node.attrs, sharding.mesh, where(what));
    if (!n || node.inputs.size() != 1 || node.outputs.size() != 1)
      throw ValidationError(where(fmt::format("{}: a resharding step takes one operand, gives one value and names "
                                              "its mesh axis", what)));
    const auto axis = static_cast<int>(std::get<std::int64_t>(node.attrs.at("axis")));
    auto group = node.attrs.find("group");
    if (group == node.attrs.end() ||
        std::get_if<std::vector<std::int64_t>>(&group->second) == nullptr ||
        std::get<std::vector<std::int64_t>>(group->second) != axis_group(sharding.mesh, axis, rank))
      throw ValidationError(where(fmt::format("{}: its group is not rank {}'s on mesh axis {} ([{}])", what, rank, axis,
                                              fmt::join(axis_group(sharding.mesh, axis, rank), ","))));
    const Shape& in = local.value(node.inputs[0]).type.shape;
    const Shape& out = local.value(node.outputs[0]).type.shape;
    Shape expected = in;
    const bool backward = node.attrs.contains("pass");
    const std::string kind = node.op.substr(std::string_view("shardwise::").size());
    if (kind == "all_gather" || kind == "reduce_scatter" || kind == "all_reduce" || kind == "all_to_all") {
      // Each collective says where it runs (search/parameter_collectives.h), the mark the
      // search priced it by; a collective without one was priced by no rule.
      const std::string* name = step_overlap(node);
      if (name == nullptr ||
          (*name != "exposed" && *name != "forward" && *name != "backward" && *name != kMatmulOverlap))
        throw ValidationError(where(fmt::format("{}: a collective without its overlap mark (exposed, forward, "
                                                "backward or matmul)", what)));
    }
    const std::int64_t dim = int_attr(node.attrs, "dim", -1);
    const bool ratios = node.attrs.contains("ratios");
    auto dim_ok = [&](std::int64_t d) {
      if (d < 0 || d >= static_cast<std::int64_t>(in.size()))
        throw ValidationError(where(fmt::format("{}: dim {} outside its operand's [{}]", what, d, fmt::join(in, ","))));
      return static_cast<std::size_t>(d);
    };
    if (!backward && !ratios) {
      if (kind == "all_gather") {
        expected[dim_ok(dim)] *= *n;
      } else if (kind == "reduce_scatter" || kind == "slice") {
        expected[dim_ok(dim)] /= *n;
      } else if (kind == "all_to_all") {
        expected[dim_ok(dim)] /= *n;
        expected[dim_ok(int_attr(node.attrs, "concat_dim", -1))] *= *n;
      } else if (kind != "all_reduce" && kind != "zero_others" && kind != "scale") {
        throw ValidationError(where(fmt::format("{}: unknown resharding step", what)));
      }
    }
    if (!backward && ratios) {  // uneven blocks: only the cut dim changes
      const std::size_t d = dim_ok(dim);
      Shape a = in, b = out;
      a[d] = b[d] = 0;
      if (a != b)
        throw ValidationError(where(fmt::format("{}: an uneven step changes dims other than {}: [{}] -> [{}]", what,
                                                dim, fmt::join(in, ","), fmt::join(out, ","))));
      continue;
    }
    if (out != expected)
      throw ValidationError(where(fmt::format("{}: gives [{}] from [{}] but {} ranks make [{}]", what,
                                              fmt::join(out, ","), fmt::join(in, ","), *n, fmt::join(expected, ","))));
  }
}

bool is_step_node(const ir::Node& node) {
  return node.op.starts_with("shardwise::") && node.inputs.size() == 1 && node.outputs.size() == 1 &&
         node.attrs.contains("axis") && node.attrs.contains("group");
}

namespace {

// A step node's op -> its kind (the GraphEmitter names them "shardwise::<reshard_kind_name>").
const std::map<std::string, ReshardKind, std::less<>>& step_kinds() {
  static const std::map<std::string, ReshardKind, std::less<>> kinds = {
      {"shardwise::all_gather", ReshardKind::AllGather},   {"shardwise::reduce_scatter", ReshardKind::ReduceScatter},
      {"shardwise::all_reduce", ReshardKind::AllReduce},   {"shardwise::all_to_all", ReshardKind::AllToAll},
      {"shardwise::slice", ReshardKind::Slice},            {"shardwise::zero_others", ReshardKind::ZeroOthers},
      {"shardwise::scale", ReshardKind::Scale}};
  return kinds;
}

}  // namespace

std::vector<std::string> step_ops() {
  std::vector<std::string> out;
  for (const auto& [op, kind] : step_kinds()) out.push_back(op);
  return out;
}

ReshardAction step_action(const ir::Node& step) {
  const auto& kinds = step_kinds();
  auto kind = kinds.find(step.op);
  if (kind == kinds.end() || !is_step_node(step))
    throw ValidationError(fmt::format("{} is not a resharding step (rank_graph.h)", step.op));
  ReshardAction a;
  a.kind = kind->second;
  a.axis = static_cast<int>(int_attr(step.attrs, "axis", 0));
  a.dim = static_cast<int>(int_attr(step.attrs, "dim", -1));
  a.groups = int_attr(step.attrs, "groups", 1);
  a.concat_dim = static_cast<int>(int_attr(step.attrs, "concat_dim", -1));
  a.scale_power = static_cast<int>(int_attr(step.attrs, "power", 0));
  if (auto it = step.attrs.find("reduce"); it != step.attrs.end()) a.reduce = std::get<std::string>(it->second);
  if (auto it = step.attrs.find("ratios"); it != step.attrs.end()) {
    if (const auto* shares = std::get_if<std::vector<double>>(&it->second)) a.ratios = *shares;
    if (const auto* whole = std::get_if<std::vector<std::int64_t>>(&it->second)) a.ratios.assign(whole->begin(), whole->end());
  }
  return a;
}

bool is_write_back_step(const ir::Node& node) {
  return is_step_node(node) && node.attrs.contains(std::string(kWriteBackAttr));
}

namespace {

// Whether step `next`, reading what `previous` gives, is in its region: both steps, of one
// kind (a read's, or a state write-back's, which starts at the value its call read).
bool continues_region(const ir::Node& previous, const ir::Node& next) {
  return is_step_node(previous) && is_step_node(next) && is_write_back_step(previous) == is_write_back_step(next);
}

}  // namespace

StepRegion region_ending_at(const ir::Graph& rank_graph, ir::ValueId value) {
  std::vector<ir::NodeId> chain;
  ir::ValueId v = value;
  const ir::Node* next = nullptr;  // the step after `node` in the region, once there is one
  while (const auto producer = rank_graph.value(v).producer) {
    const ir::Node& node = rank_graph.node(*producer);
    if (!is_step_node(node) || (next != nullptr && !continues_region(node, *next))) break;
    next = &node;
    chain.insert(chain.begin(), *producer);
    v = node.inputs[0];
  }
  StepRegion region{v, {}, {}};
  for (ir::NodeId id : chain)
    (rank_graph.node(id).attrs.contains("pass") ? region.backward : region.forward).push_back(id);
  return region;
}

const std::string* step_overlap(const ir::Node& step) {
  auto it = step.attrs.find("overlap");
  return it == step.attrs.end() ? nullptr : std::get_if<std::string>(&it->second);
}

ir::ValueId region_end(const ir::Graph& rank_graph, const StepRegion& region) {
  return rank_graph.node(region.backward.empty() ? region.forward.back() : region.backward.back()).outputs[0];
}

std::vector<StepRegion> step_regions(const ir::Graph& rank_graph) {
  // The region's last step: no step reads its value.
  std::vector<bool> continued(rank_graph.values().size(), false);
  for (const ir::Node& node : rank_graph.nodes()) {
    const auto producer = is_step_node(node) ? rank_graph.value(node.inputs[0]).producer : std::nullopt;
    if (producer && continues_region(rank_graph.node(*producer), node))
      continued[static_cast<std::size_t>(node.inputs[0])] = true;
  }
  std::vector<StepRegion> out;
  for (const ir::Node& node : rank_graph.nodes())
    if (is_step_node(node) && !continued[static_cast<std::size_t>(node.outputs[0])])
      out.push_back(region_ending_at(rank_graph, node.outputs[0]));
  return out;
}

std::string resharding_region_key(const OperandRewrite& op) {
  std::string key = op.value;
  for (const ReshardAction& step : op.forward) key += "|" + step.str();
  if (op.regather) key += "|regather";
  key += fmt::format("|{}|{}|{}|{}", search::parameter_overlap_name(op.gather),
                     search::parameter_overlap_name(op.scatter), op.gather_group, op.scatter_group);
  key += "|backward";
  for (const ReshardAction& step : op.backward) key += "|" + step.str();
  return key;
}

}  // namespace shardwise::transform
