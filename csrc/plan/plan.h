// The plan: one plain, serialisable value saying how a model is trained on a cluster — the
// data / tensor / pipeline degrees, batch sizes, pipeline schedule, recomputation, ZeRO stage,
// stage boundaries and precision — plus, once costed, the predicted figures. Searches produce
// it, users write it by hand (shardwise.Plan.manual), every rank checks its hash.
//
// Contract:
//  - world size = data x context x tensor x pipeline. Rank layout (Megatron-LM's): tensor
//    innermost, then context, then data, then pipeline:
//    rank = t_idx + tensor * (c_idx + context * (d_idx + data * p_idx)).
//  - context: ranks that split each row's sequence (context parallelism: ring attention,
//    runtime/ring_attention.py). A stage's mesh is {data x context, tensor}: its first axis
//    holds a micro-batch's micro_batch x data rows, and where it is wider than the rows it
//    splits their sequence (the SPMD search's ring). Written only when > 1 (plans without it
//    keep their hash). validate(): data 1 beside context > 1 (one axis splits either the
//    rows or each row's sequence, not both: a third mesh axis is not run), and no sharding
//    or stage_meshes beside it (an SPMD plan's data axis says it: mesh {c, t}).
//  - expert: ranks that split a mixture of experts' experts (expert parallelism: each holds its
//    block of each layer's experts, the experts op's split, shardwise_moe::experts). 1, or a
//    stage's whole first mesh axis (data x context): the runtime splits the experts over that
//    axis, its tokens gathered before them and their sum reduce-scattered after (the SPMD
//    completion of the stages' layout requires it there, and forbids it there at 1). Written
//    only when > 1. validate(): no sharding or stage_meshes beside it, ZeRO stage 0 or 1.
//  - global_batch = micro_batch x data x num_micro_batches(); validate() rejects a global
//    batch that micro_batch x data does not divide, naming the numbers.
//  - layers_per_stage: empty = balanced (the evaluator splits the repeated blocks evenly);
//    else pipeline x virtual_stages entries (one per model chunk, in pipeline order).
//  - stage_groups: empty = pipeline stage s on the s-th block of data x tensor ranks (the
//    layout above); else a permutation: stage s on block stage_groups[s], ranks
//    [g d t, (g + 1) d t) (a heterogeneous cluster's stages on the devices that suit them:
//    the joint planner searches it). Written only when set (so a plan without it keeps its
//    hash).
//  - stage_meshes: empty = every stage on a {data, tensor} sub-mesh; else one [data, tensor]
//    per pipeline stage (Alpa's inter-op stages: sub-meshes of different sizes). Then the
//    plan's data and tensor are 1 and micro_batch is a whole micro-batch's rows, which stage
//    s splits over its own data width (micro_batch divisible by it); stage s runs on the
//    ranks after the stages before it (stage_groups must be empty), world size = the sum of
//    the stages' d x t; virtual_stages 1. A value crossing a cut between stages of different
//    layouts is gathered whole on the sender's sub-mesh, sent, and cut to the receiver's
//    placement (its gradient back the same way). Written only when set.
//  - stage_shardings: with stage_meshes, each stage's layout (as stage_sharding, on that
//    stage's mesh); the plan is complete with them. Empty otherwise.
//  - virtual_stages > 1 only with Schedule::Interleaved1F1B or ZeroBubbleV (which takes
//    exactly 2); kfkb_k > 1 only with KFKB.
//  - precision: "f32", "tf32", "bf16", "f16" or "fp8" (cost::Precision names; fp8: linears in
//    float8, the rest in bf16, analysis/fp8_linears.h).
//  - state_dtype: "" (default, not written: the precision's master weights) or the dtype the
//    optimizer steps the parameters in without a master copy ("bf16", "f16", "f32"); it prices
//    the model states (cost::plan_memory_constants).
//  - micro_batch_semantics: "exact" (default, not written) or "per_micro_batch" (written
//    only when set, so plans without it keep their hash): see MicroBatchSemantics.
//  - fused_accumulation: a pipelined plan's stages add each micro-batch's weight gradient into
//    the parameter's .grad inside its product, where transform/fused_weight_accumulation.h
//    marks a contraction (python/shardwise/runtime/fused_accumulation.py). true (default, not
//    written, so plans without it keep their hash) or false: the stages leave it to autograd
//    (the control arm of benchmarks/fused_accumulation.py).
//  - split_experts: whether the stages' layout may split a mixture of experts' experts over
//    its tensor ranks (search/stage_layout.h: ShardingModelOptions::expert_parallel); true
//    (default, not written, so plans without it keep their hash) or false: every rank of a
//    stage holds every expert (shardwise.plan(expert_parallel=False)); with expert > 1, refused.
//  - compile: the ranks run their programs through torch.compile (parallelize(compile=...),
//    runtime/compiled.py), and the plan is priced so (cost/op_cost.h: memory-bound ops fused,
//    analysis/compiled_fusion.h). false (default, not written, so plans without it keep their
//    hash) or true.
//  - collective_matmul: the plan's tensor-parallel collectives run inside their contractions
//    as rings where its layout lets them (search/parameter_collectives.h, MatmulCollective;
//    transform/collective_matmul.h): completing the plan searches its layout so
//    (SpmdSearchOptions::collective_matmul) and the layout says so (Sharding::collective_matmul,
//    what the rewrite and the runtime read). false (default, not written, so plans without it
//    keep their hash) or true. Megatron's layout, which prices a plan given by degrees alone,
//    has no sequence parallelism and so no ring: such a plan is priced so once completed.
//  - predicted: set by the evaluator (cost/plan_cost.h); not part of the hash, so costing a
//    plan twice, or with another model, keeps its identity.
//  - sharding: set by the SPMD search (search/spmd_search.h), see Sharding; part of the hash.
//    With it, validate() requires mesh = {data, tensor}, pipeline 1, micro_batch =
//    global_batch, and one placement per axis everywhere.
//  - stage_sharding: a pipelined plan's (pipeline > 1, or micro-batches on one stage) layout
//    of every stage's {data, tensor} sub-mesh, searched on the graph at one micro-batch of the
//    data axis (micro_batch x data rows); part of the hash. With it the plan is complete: the
//    runtime runs it and searches nothing. validate() requires no `sharding` beside it and
//    its mesh = {data, tensor}.
//  - programs: the hash of the rank programs the plan makes (16 hex digits: every rank's
//    program hash in rank order, transform/job_program.h: its rank graph and, pipelined, every
//    stage graph after its passes, as the runtime lowers them) and the hash of the plan they
//    were made from. Derived, so not part of the hash. The runtime refuses a plan whose
//    programs come out otherwise (another version of the rewrite, or another graph); a
//    record made for another plan hash (the plan was edited since) is stale and not checked.
//
// JSON (plan_to_json writes exactly this; plan_from_json reads it back to an equal Plan):
//   {"format": "shardwise.plan", "version": 1,
//    "data": 8, "tensor": 8, "pipeline": 4, "global_batch": 1792, "micro_batch": 1,
//    "schedule": "interleaved-1f1b", "virtual_stages": 2, "kfkb_k": 1,
//    "recompute": "full", "zero_stage": 0, "layers_per_stage": [], "precision": "bf16",
//    "sharding": {"mesh": [1, 8], "axis_names": ["data", "tensor"], "level": "fast",
//                 "placements": {"h.0.attn.c_attn.weight": ["R", "S(1,g3)"], ...},
//                 "strategies": {"addmm": ["replicate", "split n g3"], ...},
//                 "zero": {}, "recompute": false},      (searched plans only)
//    "stage_sharding": {... as "sharding" ...},                  (complete pipelined plans)
//    "programs": {"plan": "0123456789abcdef", "hash": "fedcba9876543210"},   (when recorded)
//    "predicted": {"step_time": 12.3, "tflops_per_device": 106.0, "megatron_tflops_per_device": 141.0,
//                  "memory_per_rank": 6.1e10,
//                  "breakdown": {"compute": ...}, "memory_breakdown": {"parameters": ...}}}
//
// Worked example:
//   Plan p;
//   p.data = p.tensor = p.pipeline = 2;
//   p.global_batch = 16;
//   p.micro_batch = 2;
//   p.world_size();         // 8
//   p.num_micro_batches();  // 16 / (2 * 2) = 4
//   validate(p, 8);         // ok; validate(p, 16) throws "world size 16 != t 2 x p 2 x d 2 = 8"
//   plan_hash_hex(p);       // 16 hex digits, FNV-1a 64 of the canonical JSON
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace shardwise::plan {

// ZeroBubbleH1: ZB-H1 (schedule/schedules.h), each backward split into B and W by the runtime
// (transform/weight_gradient_split.h); a plan with recomputation cannot take it (the runtime does
// not split a recomputed block's backward).
// ZeroBubbleV: ZB-V, two chunks per rank in a V (virtual_stages 2), split as ZB-H1.
// DualPipeV: DeepSeek's DualPipeV (schedule/schedules.h), ZB-V's placement and split.
enum class Schedule : std::uint8_t { GPipe, OneFOneB, Interleaved1F1B, KFKB, ZeroBubbleH1, ZeroBubbleV, DualPipeV };
// Recomputation of the repeated blocks in backward: None keeps what autograd saves; Full
// keeps each block's inputs and runs its forward again; Selective runs it again too, but keeps
// the outputs of its products and fused attention (analysis/selective_recompute.h), so only the
// cheap ops (norms, activations, dropout, an unfused attention core) run twice.
enum class Recompute : std::uint8_t { None, Full, Selective };
// What a plan that splits the batch into micro-batches computes (analysis/batch_coupling.h):
// Exact, the step of the whole batch as one device computes it (a plan whose graph couples the
// rows of a batch, batch norm in training or a router's load-balancing loss, is refused with
// micro-batches); PerMicroBatch, the user's choice of gradient accumulation's usual meaning:
// batch statistics over each micro-batch, and a loss that is not a sum over samples averaged
// over the micro-batches.
enum class MicroBatchSemantics : std::uint8_t { Exact, PerMicroBatch };

// "gpipe", "1f1b", "interleaved-1f1b", "kfkb", "zb-h1", "zb-v", "dualpipe-v".
std::string_view schedule_name(Schedule schedule);
// Does the schedule split each backward into B and W (ZB-H1, ZB-V, DualPipeV)? Such a plan
// takes no recomputation, and is priced with W filling the bubble (cost/plan_cost.cc).
bool splits_backward(Schedule schedule);
// Does it place two chunks per rank in a V (ZB-V, DualPipeV: virtual_stages 2, stage g on
// rank g on the way down and on rank 2p - 1 - g on the way back)?
bool v_shaped(Schedule schedule);
// Also accepts "interleaved". Throws support::ValidationError listing the known names.
Schedule schedule_from_name(std::string_view name);
// Every schedule's name, in the order of the enum: the one list Python reads (_C.schedule_names).
std::vector<std::string_view> schedule_names();
std::string_view recompute_name(Recompute recompute);  // "none", "full", "selective"
Recompute recompute_from_name(std::string_view name);
// "exact", "per_micro_batch"; the parser names both on anything else.
std::string_view micro_batch_semantics_name(MicroBatchSemantics semantics);
MicroBatchSemantics micro_batch_semantics_from_name(std::string_view name);

// One collective of a searched plan's step, for reports (derived, so part of Predicted).
struct CollectiveRecord {
  std::string kind;    // cost::collective_kind_name: "all_reduce", "reduce_scatter", ...
  std::string value;   // the value it moves (a gradient sync: the parameter's name)
  int axis = 0;        // mesh axis
  std::string phase;   // "forward", "backward" or "step" (gradient synchronisation)
  double bytes = 0;    // per call, in collective_cost.h's units
  double count = 1;    // calls per step (a repeated block's: the number of blocks)
  double seconds = 0;  // predicted, per call

  friend bool operator==(const CollectiveRecord&, const CollectiveRecord&) = default;
};

// The SPMD part of a searched plan (search/spmd_search.h): the device mesh, where every value
// lives on it and how every node runs. Plans given by degrees alone have none.
//  - mesh: axis sizes, outermost first, equal to {data, tensor} (rank layout as above:
//    the last axis innermost); axis_names label them.
//  - placements: every value of the graph (parameters, inputs, activations) by name, one
//    placement text per axis (search/placement.h: "R", "S(1)", "S(2,g3)", "S(0)[0.6,0.4]",
//    "P(sum)"); an activation's is its producer's output placement.
//  - strategies: every node by its first output's name, one strategy text per axis
//    ("replicate", "split k", "split n g3").
//  - zero: per parameter name, the mesh axes over which its optimizer state is sharded while
//    the weight and its gradient stay replicated (ZeRO-1 on that axis); absent = none.
//  - recompute: how the repeated blocks are recomputed in backward (JSON: false, true = full,
//    or "selective").
//  - collective_matmul: tensor-parallel gathers into a contraction, and a contraction's
//    output reduce-scattered, run as collective matmuls (search/parameter_collectives.h,
//    MatmulCollective): priced beside the products, rewritten and run so (absent: false).
//  - async_gradients: a column-parallel contraction's input-gradient all-reduce runs inside its
//    own backward, beside its weight gradient (transform/async_gradients.h; priced so:
//    search/parameter_collectives.h, activation_gradient_overlap); false: after it, exposed
//    (absent: true).
//  - leaves: the names of the graph's parameters, buffers and inputs (the values no node
//    produces), in graph order: what a rank materialises or loads itself.
//  - graph: the fingerprint of the graph it was searched on (ir/fingerprint.h: names, ops
//    and dataflow, not shapes); the runtime refuses a plan whose graph is another.
//  - inputs: the model inputs the plan was made for (the graph's input values: a forward
//    argument's name, a tuple argument's items name_0, name_1, ...), in graph order; the
//    runtime refuses a batch that brings others, naming both.
// A sharded plan runs its global batch as one micro-batch over the mesh: micro_batch =
// global_batch, and the per-rank shares of the batch are in the inputs' placements.
struct Sharding {
  std::vector<int> mesh;
  std::vector<std::string> axis_names;
  std::string level;  // "fast" or "thorough": the search that produced it
  std::map<std::string, std::vector<std::string>> placements;
  std::map<std::string, std::vector<std::string>> strategies;
  std::map<std::string, std::vector<int>> zero;
  Recompute recompute = Recompute::None;
  bool collective_matmul = false;
  bool async_gradients = true;
  std::vector<std::string> leaves;
  std::vector<std::string> inputs;
  std::string graph;  // ir::graph_fingerprint, "" when not known

  friend bool operator==(const Sharding&, const Sharding&) = default;
};

// Plan::programs: the rank programs' hash, and the plan hash they were made from.
struct ProgramsRecord {
  std::string plan;  // plan_hash_hex of the plan when recorded
  std::string hash;  // the programs' hash
  friend bool operator==(const ProgramsRecord&, const ProgramsRecord&) = default;
};

struct Predicted {
  double step_time = 0;          // seconds per iteration (global batch)
  double tflops_per_device = 0;  // model FLOPs (3 x forward), see cost/plan_cost.h
  double memory_per_rank = 0;    // bytes, the most loaded rank
  std::map<std::string, double> breakdown;         // seconds per part of the step
  std::map<std::string, double> memory_breakdown;  // bytes per part, the most loaded rank
  std::vector<CollectiveRecord> collectives;       // searched plans: every collective of a step
  // The cluster it was priced on: ranks on each node, in node order (they sum to the plan's
  // world size). What `shardwise run --plan` turns into torchrun's --nnodes / --nproc-per-node.
  std::vector<int> ranks_per_node;
  // Megatron-LM's accounting (cost/plan_cost.h), for comparison with its published figures;
  // 0 = not priced so (the SPMD search's plans), and then not written.
  double megatron_tflops_per_device = 0;
  // A heterogeneous cluster's pipeline: the device type each stage runs on (cost/plan_cost.h);
  // empty otherwise, and then not written.
  std::vector<std::string> stage_devices;
  // A pipeline's (a plan of several stages, on any cluster): each device's seconds per
  // micro-batch (compute and tensor parallelism, before ranks that share cores are pooled).
  std::vector<double> stage_times;

  friend bool operator==(const Predicted&, const Predicted&) = default;
};

// How every rank computes its step, whatever its layout: precision, state_dtype,
// micro_batch_semantics, compile and collective_matmul (see above). A plan's stages run them as the plan does, and
// a search gives every candidate the ones it was asked for (search::JointPlanOptions): one
// value, copied whole, so that no copy forgets a field.
struct RunSettings {
  std::string precision = "bf16";
  // The dtype the optimizer steps the parameters in, with their gradients and Adam's moments,
  // where the run keeps no master copy in another ("bf16", "f16", "f32": what torch.optim does
  // with a model's own parameters; parallelize sets it from the model's); "": the precision's
  // mixed-precision convention (cost/memory_cost.h: Megatron's fp32 master and moments).
  std::string state_dtype;
  MicroBatchSemantics micro_batch_semantics = MicroBatchSemantics::Exact;
  bool compile = false;
  bool collective_matmul = false;

  friend bool operator==(const RunSettings&, const RunSettings&) = default;
};

struct Plan : RunSettings {
  int data = 1;
  int context = 1;  // ranks splitting each row's sequence (see above); data 1 beside it
  int expert = 1;   // ranks splitting each layer's experts (see above): 1 or data x context
  int tensor = 1;
  int pipeline = 1;
  std::int64_t global_batch = 1;
  std::int64_t micro_batch = 1;
  Schedule schedule = Schedule::OneFOneB;
  int virtual_stages = 1;  // interleaved-1f1b: model chunks per device
  int kfkb_k = 1;          // kfkb: micro-batches per group
  Recompute recompute = Recompute::None;
  int zero_stage = 0;  // 0-3
  std::vector<int> layers_per_stage;
  std::vector<int> stage_groups;  // pipeline stage -> its block of d x t ranks; empty = in order
  std::vector<std::vector<int>> stage_meshes;  // per pipeline stage [data, tensor]; empty = all {data, tensor}
  bool fused_accumulation = true;
  bool split_experts = true;  // see above
  std::optional<Sharding> sharding;
  std::optional<Sharding> stage_sharding;
  std::vector<Sharding> stage_shardings;  // with stage_meshes: one per stage (complete plans)
  std::optional<ProgramsRecord> programs;
  std::optional<Predicted> predicted;

  int world_size() const;
  // The ranks of a stage's first mesh axis: data x context.
  int stage_data() const { return data * context; }
  // Stage `stage`'s sub-mesh {data x context, tensor} (stage_meshes, else the plan's), its number of
  // ranks and its first rank (the stages' blocks in rank order: stage_groups, or stage_meshes'
  // running sum).
  std::vector<int> stage_mesh(int stage) const;
  int stage_size(int stage) const;
  int stage_first_rank(int stage) const;
  // Its global ranks: stage_size(stage) of them from stage_first_rank(stage).
  std::vector<int> stage_ranks(int stage) const;
  // The pipeline stage rank `rank` runs (ValidationError outside the plan's world).
  int stage_of_rank(int rank) const;
  // The block of data x tensor ranks pipeline stage `stage` runs on (stage_groups, else itself).
  int stage_group(int stage) const {
    return stage_groups.empty() ? stage : stage_groups.at(static_cast<std::size_t>(stage));
  }
  // global_batch / (micro_batch x data); validate() first. Sharded plans: 1.
  std::int64_t num_micro_batches() const;

  friend bool operator==(const Plan&, const Plan&) = default;
};

// Throws support::ValidationError naming the field and the numbers on the first broken
// invariant of the contract; with a world size, also checks t x p x d against it.
void validate(const Plan& plan, std::optional<int> world_size = std::nullopt);

// A sharding's entry for a value (`what`: "placement", "strategy") of `map` (placements or
// strategies), one text per mesh axis: ValidationError when the name is missing (a plan made
// for another graph) or it has another number of axes. What every reader of a sharding's
// per-value texts looks them up with (the rewrite, the evaluator's adopt).
const std::vector<std::string>& sharding_entry(const std::map<std::string, std::vector<std::string>>& map,
                                               const std::string& name, const char* what, std::size_t axes);

// The SPMD plan each stage of a complete pipelined plan runs on its {data, tensor} sub-mesh:
// its stage_sharding over one micro-batch of the data axis (global = micro batch = micro_batch
// x data rows), pipeline 1. ValidationError when the plan has no stage_sharding.
Plan stage_plan(const Plan& plan);
// With stage_meshes: the SPMD plan stage `stage` runs on its own mesh (its stage_shardings
// entry over the whole micro-batch). Without: stage_plan(plan).
Plan stage_plan(const Plan& plan, int stage);

nlohmann::json plan_to_json(const Plan& plan);
// Throws support::ParseError (missing field, wrong type, unknown key: with its JSON path)
// or support::ValidationError (validate()).
Plan plan_from_json(const nlohmann::json& json);
std::string plan_to_json_string(const Plan& plan, int indent = -1);
Plan plan_from_json_string(std::string_view text);

// The `sharding` section alone (a rank program's input in shardwise-opt and the golden tests);
// ParseError as plan_from_json's, without the checks that need the rest of the plan.
nlohmann::json sharding_section_to_json(const Sharding& sharding);
Sharding sharding_section_from_json(const nlohmann::json& json);

// FNV-1a 64 of the canonical (sorted keys, no spaces) JSON without "predicted" and "programs".
std::uint64_t plan_hash(const Plan& plan);
std::string plan_hash_hex(const Plan& plan);

}  // namespace shardwise::plan
