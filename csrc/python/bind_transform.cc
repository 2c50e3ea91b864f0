// Bindings of the rewrite passes (csrc/transform): the rank program as Python dicts.
#include <pybind11/stl.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "analysis/batch_dim.h"
#include "analysis/flops.h"
#include "analysis/repeated_blocks.h"
#include "ops/distributed_kernels.h"
#include "ops/node_rule.h"
#include "plan/plan.h"
#include "search/stage_assignment.h"
#include "python/bindings.h"
#include "python/ir_dicts.h"
#include "support/error.h"
#include <fmt/format.h>
#include "ir/parser.h"
#include "ir/printer.h"
#include "transform/fp8_axes.h"
#include "transform/job_groups.h"
#include "transform/job_program.h"
#include "transform/pipeline_job.h"
#include "transform/job_rank_graph.h"
#include "transform/rank_passes.h"
#include "transform/rank_graph.h"
#include "transform/spmd_rewrite.h"
#include "transform/stage_rank_graph.h"

namespace py = pybind11;

namespace shardwise::python {
namespace {

using py::literals::operator""_a;

py::list spec_texts(const search::ShardingSpec& spec) {
  py::list out;
  for (const auto& p : spec) out.append(p.str());
  return out;
}

py::list actions(const std::vector<transform::ReshardAction>& steps) {
  py::list out;
  for (const auto& a : steps) {
    out.append(py::dict("kind"_a = std::string(transform::reshard_kind_name(a.kind)), "axis"_a = a.axis,
                        "dim"_a = a.dim, "groups"_a = a.groups, "concat_dim"_a = a.concat_dim, "reduce"_a = a.reduce,
                        "scale_power"_a = a.scale_power, "ratios"_a = a.ratios, "text"_a = a.str()));
  }
  return out;
}

std::int64_t step_unit_group(const ir::Node& step) {
  auto it = step.attrs.find("unit_group");
  const auto* group = it == step.attrs.end() ? nullptr : std::get_if<std::int64_t>(&it->second);
  return group != nullptr ? *group : -1;
}

// An operand as the rewrite gives it: the value it names, its placements as produced and as
// the reader needs it, and whether its gradient flows. How the rank graph runs it (its
// region) the lowering reads off the graph it lowers (rank_ir_operands).
py::dict operand(const transform::OperandRewrite& op) {
  return py::dict("value"_a = op.value, "produced"_a = spec_texts(op.produced),
                  "required"_a = spec_texts(op.required), "gradient"_a = op.gradient);
}

// The overlap mark of a region's steps (rank_graph.h: "exposed", "forward", "backward",
// "matmul"): its first forward step's, else its first backward step's; "" without steps.
std::string region_overlap(const ir::Graph& rank_graph, const transform::StepRegion& region) {
  const std::vector<ir::NodeId>& steps = region.forward.empty() ? region.backward : region.forward;
  if (steps.empty()) return "";
  const std::string* mark = transform::step_overlap(rank_graph.node(steps.front()));
  return mark != nullptr ? *mark : "";
}

// How a rank graph reads `read` (a call's operand, or a graph output). Its resharding region is the chain of step nodes that ends at `read`
// (rank_graph.h: region_ending_at), whose end value is the region's id (readers of one region
// share one reshard), from the value it starts at; its steps as the runtime runs them
// (forward in order, backward in the order the gradient runs them); and the marks on them: a
// parameter's gather run beside forward (prefetched) or gathered again in backward with its
// unit group, its gradient's reduce-scatter issued beside backward with its unit group
// (search/parameter_collectives.h); and how its steps overlap (their `overlap` mark: "matmul",
// a ring inside a contraction, which the runtime's emitter of that feature reads with the
// call's marks: collective_matmul.h). An all-reduce beside a weight gradient is the reader's
// mark (async_gradients.h), which the runtime's emitter reads off the call.
py::dict region_operand(const ir::Graph& rank_graph, ir::ValueId read) {
  const transform::StepRegion region = transform::region_ending_at(rank_graph, read);
  const bool parameter = rank_graph.value(region.source).role == ir::ValueRole::Parameter;
  auto marked = [](const ir::Node& step, search::ParameterOverlap overlap) {
    const std::string* mark = transform::step_overlap(step);
    return mark != nullptr && *mark == search::parameter_overlap_name(overlap);
  };
  std::vector<transform::ReshardAction> forward, backward;
  bool regather = false, prefetch = false, scatter = false;
  std::int64_t gather_group = -1, scatter_group = -1;
  for (ir::NodeId id : region.forward) {
    const ir::Node& step = rank_graph.node(id);
    forward.push_back(transform::step_action(step));
    regather = regather || step.attrs.contains("regather");
    prefetch = prefetch || (parameter && marked(step, search::ParameterOverlap::BesideForward));
    gather_group = std::max(gather_group, step_unit_group(step));
  }
  for (auto it = region.backward.rbegin(); it != region.backward.rend(); ++it) {
    const ir::Node& step = rank_graph.node(*it);
    backward.push_back(transform::step_action(step));
    scatter = scatter || (parameter && marked(step, search::ParameterOverlap::BesideBackward));
    scatter_group = std::max(scatter_group, step_unit_group(step));
  }
  py::dict d;
  d["value"] = rank_graph.value(region.source).name;
  d["region"] = rank_graph.value(read).name;
  d["forward"] = actions(forward);
  d["backward"] = actions(backward);
  d["regather"] = regather;
  d["prefetch"] = prefetch;
  d["gather_group"] = gather_group;
  d["scatter_in_backward"] = scatter;
  d["scatter_group"] = scatter_group;
  d["overlap"] = region_overlap(rank_graph, region);
  return d;
}

// The operands of each node of a rank graph that is no resharding step, by the node's first
// output, and of its outputs, as region_operand reads them: what the lowering runs between
// the calls of the graph it lowers (a rank program's, or a pipeline stage's).
py::dict rank_ir_operands(const ir::Graph& rank_graph) {
  py::dict calls, writes;
  for (const ir::Node& node : rank_graph.nodes()) {
    // A state write-back (rank_graph.h): how it reads the value it writes, by that value's name.
    if (node.op == "shardwise::write_state" && node.inputs.size() == 2)
      writes[py::str(rank_graph.value(node.inputs[1]).name)] = region_operand(rank_graph, node.inputs[1]);
    if (node.outputs.empty() || transform::is_step_node(node)) continue;
    py::list inputs;
    for (ir::ValueId in : node.inputs) inputs.append(region_operand(rank_graph, in));
    calls[py::str(rank_graph.value(node.outputs[0]).name)] = inputs;
  }
  py::list outputs;
  for (ir::ValueId out : rank_graph.outputs()) outputs.append(region_operand(rank_graph, out));
  py::dict d;
  d["calls"] = calls;
  d["writes"] = writes;
  d["outputs"] = outputs;
  return d;
}

// The sharding a rank program is made for, and the rewrite's options: `plan_json` empty is
// every value replicated on a one-rank mesh (the whole graph, as one device runs it).
std::pair<plan::Sharding, transform::RewriteOptions> rewrite_inputs(const ir::Graph& graph, const std::string& plan_json,
                                                                  const std::vector<std::string>& whole_nodes,
                                                                  const std::vector<std::string>& lookup_ops,
                                                                  bool adapt_to_shapes,
                                                                  plan::Recompute recompute = plan::Recompute::None,
                                                                  bool* fp8 = nullptr,
                                                                  std::int64_t micro_batches = 1) {
  plan::Plan p;
  if (plan_json.empty()) {
    p.sharding = transform::replicated_sharding(graph, recompute);  // a stage of one rank recomputes as its plan says
  } else {
    p = plan::plan_from_json_string(plan_json);
    if (fp8 != nullptr) *fp8 = p.precision == "fp8";  // its linears run in float8 (analysis/fp8_linears.h)
    // The plan's strategies name sizes at its global batch; a graph captured at another
    // batch would fail later on some node with a message about that node's sizes.
    const std::int64_t captured = analysis::input_batch(graph);
    if (!adapt_to_shapes && captured > 0 && p.global_batch > 0 && captured != p.global_batch)
      throw support::ValidationError(
          "rank_program: the graph was captured at batch " + std::to_string(captured) +
          " but the plan is for global batch " + std::to_string(p.global_batch) +
          "; capture the model at the global batch (shardwise.parallelize does)");
  }
  if (!p.sharding) throw support::ValidationError("rank_program: the plan has no sharding section");
  transform::RewriteOptions options;
  options.whole_nodes = {whole_nodes.begin(), whole_nodes.end()};
  options.lookup_ops = {lookup_ops.begin(), lookup_ops.end()};
  options.adapt_to_shapes = adapt_to_shapes;
  if (micro_batches < 1)
    throw support::ValidationError("rank_program: micro_batches " + std::to_string(micro_batches) + " (at least 1)");
  options.micro_batches = micro_batches;
  return {*p.sharding, options};
}

std::vector<std::string> lookup_kernel_ops() {
  return {ops::lookup_kernel_ops().begin(), ops::lookup_kernel_ops().end()};
}

// Contiguous pipeline stages of a graph (the binding's docstring).
py::dict pipeline_stages(const ir::Graph& graph, int stages, const std::vector<int>& layers_per_stage) {
  search::StageAssignment assignment = search::assign_stages(graph, stages, layers_per_stage);
  py::dict out;
  py::list names;
  for (const ir::Node& node : graph.nodes())
    names.append(node.outputs.empty() ? std::string() : graph.value(node.outputs[0]).name);
  out["nodes"] = names;
  out["stage_of_node"] = assignment.stage_of_node;
  out["stage_cost"] = assignment.stage_cost;
  // What each stage takes and hands on is its rank IR's (rank_program's stage_rank_irs:
  // the rank program cut by this assignment, transform/stage_rank_graph.h).
  return out;
}

// The groups a job makes, as the runtime makes them (runtime/groups.py): {kind, ranks, block,
// axis, channel (sender, receiver, gradient), leaf, whole}, in the order every rank makes them.
py::list job_group_dicts(const std::vector<transform::JobGroup>& groups) {
  py::list out;
  for (const transform::JobGroup& g : groups)
    out.append(py::dict(py::arg("kind") = transform::job_group_kind_name(g.kind), py::arg("ranks") = g.ranks,
                        py::arg("block") = g.block, py::arg("axis") = g.axis,
                        py::arg("channel") = py::make_tuple(g.channel.sender, g.channel.receiver, g.channel.gradient),
                        py::arg("leaf") = g.leaf, py::arg("whole") = g.whole));
  return out;
}

// A leaf of the program: its placement, gradient and the axes it is copied on.
py::dict leaf_dict(const transform::LeafRewrite& l) {
  py::dict d;
  d["value"] = l.value;
  d["placement"] = spec_texts(l.placement);
  d["gradient"] = spec_texts(l.gradient);
  d["reduce_axes"] = l.reduce_axes;
  // The axes the leaf is whole on (Replicate): its copies, and the axes ZeRO may shard it over.
  std::vector<int> replicated;
  for (std::size_t a = 0; a < l.placement.size(); ++a)
    if (l.placement[a].is_replicate()) replicated.push_back(static_cast<int>(a));
  d["replicated_axes"] = replicated;
  return d;
}

// A node of the program as the lowering reads it: its call, how it runs and its operands.
// `rank_ir`, `call`: the rank graph and the node's call in it, whose marks the feature passes
// set (transform/rank_passes.h).
py::dict node_dict(const ir::Graph& graph, const transform::NodeRewrite& n, const ir::Graph& rank_ir,
                   const ir::Node& call) {
  py::dict d;
  d["node"] = n.node;
  // The call's first output in the rank graph (the node's own name, or `<out>.sum` / `<out>.share`
  // where the rank graph follows the call with a counted mean or an uneven share's scale).
  d["call"] = rank_ir.value(call.outputs.at(0)).name;
  d["op"] = n.op;
  // The rank's call, whole: its attributes (the op's non-tensor arguments by schema
  // name, local shape arguments at this rank's sizes) and its operands' global shapes.
  // The lowering builds the call from these alone (python/shardwise/_aten_call.py). How it runs
  // (whole, a kernel and its block, recomputed, drawn as one device, in FP8) the lowering reads
  // off the call in the rank IR (rank_graph.h's marks).
  const ir::Node& captured = graph.node(n.node);
  py::dict attrs;
  for (const auto& [name, value] : n.attrs) attrs[py::str(name)] = attr_to_python(value);
  d["attrs"] = attrs;
  py::list input_shapes;
  for (ir::ValueId in : captured.inputs) input_shapes.append(graph.value(in).type.shape);
  d["input_shapes"] = input_shapes;
  if (n.counted) {
    py::dict c;
    c["shares"] = n.counted->shares;
    c["target"] = n.counted->target;
    c["weight"] = n.counted->weight;
    d["counted"] = c;
  } else {
    d["counted"] = py::none();
  }
  py::list ins, outs;
  if (call.inputs.size() != n.inputs.size())
    throw support::ValidationError(fmt::format("rank_program: '{}' reads {} operands in the rank graph, {} in the program",
                                               n.op, call.inputs.size(), n.inputs.size()));
  for (const auto& op : n.inputs) ins.append(operand(op));
  for (const auto& o : n.outputs) {
    py::dict od;
    od["value"] = o.value;
    od["produced"] = spec_texts(o.produced);
    od["local_shape"] = o.local_shape;
    outs.append(od);
  }
  d["inputs"] = ins;
  d["outputs"] = outs;
  return d;
}

// One rank's program as the job runs it, as the runtime's lowering reads it (the binding's
// docstring).
py::dict rank_program_dict(const ir::Graph& graph, const std::string& plan_json, int rank,
                           const std::vector<std::string>& whole_nodes, const std::vector<std::string>& lookup_ops,
                           bool adapt_to_shapes, const std::string& recompute_name, bool fp8,
                           std::int64_t micro_batches, int stages, const std::vector<int>& layers_per_stage,
                           bool fused_accumulation, bool split_backward) {
  const plan::Recompute recompute = plan::recompute_from_name(recompute_name);
  if (recompute != plan::Recompute::None && !plan_json.empty())
    throw support::ValidationError("rank_program: recompute= is for the replicated program (plan_json \"\"); "
                                   "a plan's sharding says its own");
  // A plan in fp8 runs its linears in float8; a replicated program (a pipeline stage on
  // one rank) is told by fp8=.
  bool fp8_plan = false;
  auto [sharding, options] =
      rewrite_inputs(graph, plan_json, whole_nodes, lookup_ops, adapt_to_shapes, recompute, &fp8_plan,
                     micro_batches);
  options.fp8 = fp8 || fp8_plan;  // the rank graph marks the FP8 linears (rank_graph.h)
  // The rank graph's program as the job runs it: nodes whose local call the ops' shape
  // rules refuse on any rank's block run whole on every rank (job_rank_graph.h).
  // (the function the job's program hash is made by: transform/job_program.h)
  const transform::RankProgramGraphs made = transform::build_rank_program(
      graph, sharding, rank, options, {stages, layers_per_stage, {split_backward, fused_accumulation}});
  const transform::RankGraph& rank_ir = made.rank;
  const transform::RankProgram& program = rank_ir.program;
  py::list leaves, nodes, outputs;
  std::size_t fp8_linears = 0;
  for (const auto& l : program.leaves) leaves.append(leaf_dict(l));
  for (std::size_t i = 0; i < program.nodes.size(); ++i) {
    const ir::Node& call = rank_ir.graph.node(rank_ir.nodes.at(i));
    if (transform::marked_fp8_axes(call)) ++fp8_linears;
    nodes.append(node_dict(graph, program.nodes[i], rank_ir.graph, call));
  }
  for (const auto& o : program.outputs) outputs.append(operand(o));
  // Never a silent run in the model's dtype under a plan that says fp8.
  if (options.fp8 && fp8_linears == 0)
    throw support::ValidationError(
        "fp8: the plan's precision is fp8 but no node of the model runs in float8 (an FP8 linear is a linear, "
        "addmm or mm of a float32 or bfloat16 input by a weight parameter whose dims are multiples of 16: "
        "csrc/analysis/fp8_linears.h); plan it in the model's precision");
  py::dict out;
  out["mesh"] = program.mesh;
  const std::string printed = ir::print_graph(rank_ir.graph);
  out["rank_ir"] = printed;  // the same program in the IR (rank_graph.h)
  // A pipelined program: each stage's part of it (transform/stage_rank_graph.h: the stage of
  // every node the assignment the planner priced, search/stage_assignment.h) after the stage
  // passes (rank_passes.h), printed. The passes' marks are on its nodes (where backward splits
  // into B and W, and the weight values sent: transform/weight_gradient_split.h; the calls that
  // accumulate their weight gradient in place: transform/fused_weight_accumulation.h), which the
  // lowering reads as it walks each stage's IR.
  std::vector<std::string> stage_irs;
  for (const ir::Graph& stage : made.stages) stage_irs.push_back(ir::print_graph(stage));
  out["stage_rank_irs"] = stage_irs;
  out["hash"] = transform::hex_hash(transform::printed_program_hash(printed, stage_irs));  // (program_hash's)
  out["rank"] = program.rank;
  out["whole"] = rank_ir.whole;  // the nodes run whole (their calls marked shardwise.whole)
  out["leaves"] = leaves;
  out["nodes"] = nodes;
  out["outputs"] = outputs;
  return out;
}

// The resharding regions of a printed rank graph (rank_graph.h: step_regions), as the
// runtime's lowering names their steps: {value, forward, backward (in the order their
// gradient runs them), reader (the first output of the region's first reader, "" for a
// graph output)}.
py::list rank_ir_regions(const std::string& text) {
  const ir::Graph graph = ir::parse_graph(text);
  py::list out;
  for (const transform::StepRegion& region : transform::step_regions(graph)) {
    py::dict d;
    d["value"] = graph.value(region.source).name;
    std::vector<std::string> forward, backward;
    for (ir::NodeId id : region.forward) forward.push_back(transform::step_action(graph.node(id)).str());
    for (auto it = region.backward.rbegin(); it != region.backward.rend(); ++it)
      backward.push_back(transform::step_action(graph.node(*it)).str());
    d["forward"] = forward;
    d["backward"] = backward;
    const std::vector<ir::NodeId> readers = graph.users(transform::region_end(graph, region));
    d["reader"] = readers.empty() || graph.node(readers[0]).outputs.empty()
                      ? std::string()
                      : graph.value(graph.node(readers[0]).outputs[0]).name;
    out.append(d);
  }
  return out;
}

}  // namespace

void bind_transform(py::module_& m) {
  m.def(
      "step_ops",
      &transform::step_ops,
      "The ops of a rank graph's resharding step nodes (csrc/transform/rank_graph.h: step_action).");
  m.def("rank_ir_operands", &rank_ir_operands, py::arg("graph"),
        "How a rank graph (_C.Graph of a rank IR: a program's or a pipeline stage's) runs the operands of each "
        "node that is no resharding step, by its first output, and its outputs: {calls: {name: [operand]}, "
        "writes: {value: operand} (each state write-back's value, by its name), outputs: [operand]}, each "
        "operand {value (the region's source), region (its id: the value its last step gives), forward, backward (typed steps), regather, prefetch, gather_group, scatter_in_backward, "
        "scatter_group, overlap (the steps' overlap mark)}.");
  m.def("rank_ir_regions", &rank_ir_regions, py::arg("text"),
        "The resharding regions of a printed rank graph (csrc/transform/rank_graph.h: step_regions), each "
        "{value, forward, backward, reader}, its steps named as the lowering names them.");
  m.def(
      "program_hash",
      [](const ir::Graph& graph, const std::string& plan_json, int rank) {
        const plan::Plan p = plan::plan_from_json_string(plan_json);
        py::gil_scoped_release release;
        return transform::hex_hash(transform::program_hash(transform::job_program(graph, p, rank)));
      },
      py::arg("graph"), py::arg("plan_json"), py::arg("rank"),
      "The hash of the program one rank runs under a complete plan (transform/job_program.h: its rank graph "
      "and, pipelined, each stage's graph after the stage passes; plan.h: programs).");
  m.def("programs_hash", &transform::combined_programs_hash, py::arg("per_rank"),
        "Every rank's program hash, in rank order, as the plan's `programs`.");
  m.def(
      "plan_programs",
      [](const ir::Graph& graph, const std::string& plan_json) {
        const plan::Plan p = plan::plan_from_json_string(plan_json);
        py::gil_scoped_release release;
        return transform::plan_programs_hash(graph, p);
      },
      py::arg("graph"), py::arg("plan_json"),
      "The hash of every rank's program under a complete plan (transform/job_program.h; plan.h: programs).");
  m.def("pipeline_stages", &pipeline_stages,
        py::arg("graph"), py::arg("stages"), py::arg("layers_per_stage") = std::vector<int>{},
        "Contiguous pipeline stages of a graph (csrc/search/stage_assignment.h: balanced by forward FLOPs, or the "
        "given layers per stage): {nodes, stage_of_node, stage_cost}, the assignment rank_program makes itself "
        "when it cuts.");
  m.def("axis_groups", &transform::mesh_axis_groups,
        py::arg("mesh"), "Every axis' groups of mesh ranks (transform/job_groups.h: mesh_axis_groups), in creation order.");
  // A pipeline job (transform/pipeline_job.h) and the groups it makes beyond the DeviceMesh's
  // (transform/job_groups.h): blocks are the pipeline ranks' global ranks, meshes their
  // sub-meshes, layouts their layout numbers.
  m.def(
      "pipeline_job",
      [](const std::string& plan_json, int world, int rank) {
        const transform::PipelineJob job =
            transform::make_pipeline_job(plan::plan_from_json_string(plan_json), world, rank);
        py::list actions;  // the executor's form, as Simulation.action_list gives it
        for (const schedule::Action& a : job.actions)
          actions.append(py::make_tuple(std::string(schedule::action_kind_code(a.kind)), a.micro_batch, a.stage,
                                        a.peer));
        py::list channels;
        for (const schedule::P2PChannel& c : job.channels)
          channels.append(py::make_tuple(c.sender, c.receiver, c.gradient));
        return py::dict(py::arg("ranks") = job.blocks.ranks, py::arg("meshes") = job.blocks.meshes,
                        py::arg("layouts") = job.blocks.layouts, py::arg("pipeline_rank") = job.pipeline_rank,
                        py::arg("local") = job.local, py::arg("micro_batches") = job.micro_batches,
                        py::arg("stage_ranks") = job.stage_ranks, py::arg("actions") = actions,
                        py::arg("split_backward") = job.split_backward, py::arg("channels") = channels,
                        py::arg("groups") = job_group_dicts(job.groups));
      },
      py::arg("plan_json"), py::arg("world"), py::arg("rank"),
      "The pipeline job `rank` runs (transform/pipeline_job.h): {ranks, meshes, layouts (every pipeline rank's "
      "block), pipeline_rank, local (this rank's block and place in it), micro_batches, stage_ranks, actions "
      "((kind, micro_batch, stage, peer), this pipeline rank's), split_backward, channels, groups (every group "
      "beyond the DeviceMesh's, in the order every rank makes them)}.");
  m.def(
      "shared_leaf_groups",
      [](const std::vector<std::vector<int>>& blocks, const std::vector<std::vector<int>>& meshes,
         const std::vector<int>& layouts, const std::map<std::string, std::vector<int>>& owners) {
        std::map<std::string, std::set<int>> readers;
        for (const auto& [leaf, ranks] : owners) readers[leaf] = {ranks.begin(), ranks.end()};
        return job_group_dicts(transform::shared_leaf_groups({blocks, meshes, layouts}, readers));
      },
      py::arg("blocks"), py::arg("meshes"), py::arg("layouts"), py::arg("owners"),
      "The groups summing the gradients of leaves several pipeline ranks read (owners: leaf -> pipeline ranks), "
      "leaves in name order (transform/job_groups.h).");
  m.def(
      "reshard_actions",
      [](const std::vector<std::string>& from, const std::vector<std::string>& to) {
        search::ShardingSpec a, b;
        for (const auto& t : from) a.push_back(search::parse_placement(t));
        for (const auto& t : to) b.push_back(search::parse_placement(t));
        return actions(transform::reshard_actions(a, b));
      },
      py::arg("from_placements"), py::arg("to_placements"),
      "The steps turning one placement into another (csrc/transform/reshard_actions.h).");
  m.def("rank_program", &rank_program_dict,
        py::arg("graph"), py::arg("plan_json"), py::arg("rank"), py::arg("whole_nodes") = std::vector<std::string>{},
        py::arg("lookup_ops") = lookup_kernel_ops(), py::arg("adapt_to_shapes") = false, py::arg("recompute") = "none",
        py::arg("fp8") = false, py::arg("micro_batches") = 1, py::arg("stages") = 0,
        py::arg("layers_per_stage") = std::vector<int>{}, py::arg("fused_accumulation") = false,
        py::arg("split_backward") = false,
        "One rank's program of a searched plan as the job runs it (csrc/transform/spmd_rewrite.h; "
        "job_rank_graph.h: a node any rank runs whole runs whole on every rank); plan_json \"\": replicated, "
        "each repeated block recomputed as recompute= says (\"none\", \"full\", \"selective\"); its FP8 linears "
        "(analysis/fp8_linears.h) marked with their amax axes where the plan's precision is fp8, or where fp8=True "
        "for a replicated program; micro_batches: the step's (a counted mean's share of the step's count); "
        "stages > 0: also the program cut into that many pipeline stages (search/stage_assignment.h: the "
        "layers_per_stage given, else balanced by forward FLOPs; transform/stage_rank_graph.h), printed, as "
        "stage_rank_irs, after the stage passes (transform/rank_passes.h: "
        "split_backward, a schedule's B/W split; fused_accumulation, the plan's), their marks on its nodes; hash: "
        "the program's (transform/job_program.h), as program_hash gives it for the plan's own program.");
  m.def(
      "rank_graph",
      [](const ir::Graph& graph, const std::string& plan_json, int rank, const std::vector<std::string>& whole_nodes,
         const std::vector<std::string>& lookup_ops, bool adapt_to_shapes) {
        auto [sharding, options] = rewrite_inputs(graph, plan_json, whole_nodes, lookup_ops, adapt_to_shapes);
        transform::RankGraph out = transform::job_rank_graph(graph, sharding, rank, options);
        if (!adapt_to_shapes) transform::verify_rank_graph(out.graph, graph, sharding, rank);
        py::dict d;
        d["text"] = ir::print_graph(out.graph);
        d["whole"] = out.whole;
        return d;
      },
      py::arg("graph"), py::arg("plan_json"), py::arg("rank"), py::arg("whole_nodes") = std::vector<std::string>{},
      py::arg("lookup_ops") = lookup_kernel_ops(), py::arg("adapt_to_shapes") = false,
      "One rank's program as a graph of the IR, collectives as nodes (csrc/transform/rank_graph.h), as the job "
      "runs it (job_rank_graph.h), "
      "verified against the plan: {text, whole}.");
}

}  // namespace shardwise::python
