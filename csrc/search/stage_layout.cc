// A stage's searched layout, priced by part; the model is documented in stage_layout.h.
#include "search/stage_layout.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <vector>

#include "analysis/batch_dim.h"
#include "cost/layer_balance.h"
#include "cost/memory_cost.h"
#include "ops/experts.h"
#include "search/placement.h"
#include "search/plan_price.h"
#include "search/sharding_model.h"
#include "support/error.h"
#include "support/log.h"

namespace shardwise::search {
namespace {

struct MemoryShares {
  double parameters = 1;   // of the graph's parameter states, on the most loaded stage's ranks
  double activations = 1;  // of one micro-batch's saved activations of the whole graph
};

// The shares of the graph's memory that the most loaded stage holds: the most layers any
// device holds (not the first stage's: a joint plan gives the first stage fewer layers for its
// embedding and its micro-batches in flight, DeepSeek-V3's 1 of 61 beside 2 elsewhere, and a
// layout chosen under 1/61 of the memory was priced at 127 GB where the devices hold 80), with
// the first stage's micro-batches in flight (the most of any stage): a bound, not the stage.
MemoryShares stage_memory_shares(const cost::LayerStructure& structure, const plan::Plan& plan) {
  const int layers = structure.num_layers();
  const int chunks = plan.pipeline * plan.virtual_stages;
  std::vector<int> chunk_layers = plan.layers_per_stage.empty() ? cost::even_layers(layers, chunks)
                                                                : plan.layers_per_stage;
  const std::vector<int> on_device = cost::layers_per_device(chunk_layers, plan.pipeline, plan::v_shaped(plan.schedule));
  const double share =
      layers > 0 && !on_device.empty() ? *std::ranges::max_element(on_device) / static_cast<double>(layers) : 1.0;
  const cost::MemoryConstants states = cost::state_dtype_memory(plan.state_dtype)
                                            .value_or(cost::memory_constants(
                                                cost::parse_precision(plan.precision).value_or(cost::Precision::BF16)));
  const double zero = cost::model_state_bytes(1, plan.stage_data(), plan.zero_stage, states).total() /
                      cost::model_state_bytes(1, 1, 0, states).total();
  const double in_flight = cost::stage_micro_batches_in_flight(plan.schedule, plan.pipeline, plan.virtual_stages,
                                                               plan.kfkb_k, plan.num_micro_batches());
  return {share * zero, share * in_flight};
}

// The prices of `found`'s decisions by part, on a {1, t} or {d, t} model: a rank's compute
// and saved bytes (one micro-batch's rows each), the collectives of both axes and the splits
// of both (a layout searched on {d, t} may split more than the batch on the data axis: a
// vocabulary, an MLP's hidden width, whose activations the runtime then gathers and
// scatters over the data axis every micro-batch); the gradient reductions of the tensor axis
// only (axis 1; the data axis' are the evaluator's: data parallelism, ZeRO, the optimizer).
cost::StageLayoutPrices layout_prices(const ShardingModel& found, const ir::Graph& graph,
                                      const cost::LayerStructure& structure, const plan::Plan& plan) {
  constexpr int kTensorAxis = 1;
  const std::vector<NodePrice> prices = found.node_prices(kTensorAxis);
  const std::vector<NodePrice> both_axes = found.node_prices(0);
  // Of a node's outputs, the share whose gradients a split backward holds (the graph's figure).
  auto held_share = [&](ir::NodeId id) {
    const std::int64_t held = structure.weight_gradient_held[static_cast<std::size_t>(id)];
    if (held == 0) return 0.0;
    std::int64_t whole = 0;
    for (ir::ValueId o : graph.node(id).outputs) whole += graph.value(o).type.bytes();
    return whole > 0 ? static_cast<double>(held) / static_cast<double>(whole) : 0.0;
  };
  const double batch_scale = static_cast<double>(plan.micro_batch) / structure.graph_batch;
  auto part = [&](const std::vector<ir::NodeId>& nodes) {
    cost::PartPrice out;
    cost::OuterBlockTally blocks(structure);
    std::set<ir::ValueId> seen;
    for (ir::NodeId id : nodes) {
      const NodePrice& price = prices[static_cast<std::size_t>(id)];
      out.backward_working_bytes = std::max(out.backward_working_bytes, found.node_backward_working_bytes(id));
      blocks.add(id, price.forward, price.selective_forward, price.activation_bytes, price.selective_kept_bytes);
      out.forward += price.forward;
      out.backward += price.backward;
      out.collectives += both_axes[static_cast<std::size_t>(id)].collectives;
      out.gradient_sync += price.gradient_sync;
      out.activation_bytes += price.activation_bytes;
      out.selective_forward += price.selective_forward;
      out.selective_kept_bytes += price.selective_kept_bytes;
      out.weight_gradient_bytes += price.output_bytes * held_share(id);
      const ir::Node& node = graph.node(id);
      for (std::size_t i = 0; i < node.inputs.size(); ++i) {
        const ir::ValueId in = node.inputs[i];
        const ir::Value& value = graph.value(in);
        if (value.role != ir::ValueRole::Parameter || !seen.insert(in).second) continue;
        const double held = static_cast<double>(value.type.numel()) * found.held_fraction_of(in, 0);
        out.parameters += held;
        if (ops::is_expert_weight(node, i)) out.expert_parameters += held;
      }
    }
    out.blocks = blocks.finish([&](ir::ValueId v) {
      return static_cast<double>(graph.value(v).type.bytes()) * batch_scale / plan.context *
             found.held_fraction_of(v, kTensorAxis);
    });
    return out;
  };
  cost::StageLayoutPrices out;
  out.layer = part(structure.layers->nodes.front());
  out.pre = part(structure.pre);
  out.post = part(structure.post);
  out.boundary_bytes = structure.layer_input_bytes * batch_scale / plan.context *
                       (structure.layer_input >= 0 ? found.held_fraction_of(structure.layer_input, kTensorAxis) : 1.0);
  return out;
}

// The options of the model a stage's {1, t} layout is searched and priced on.
ShardingModelOptions stage_model_options(const cost::LayerStructure& structure,
                                                        const cost::Cluster& ranks, const plan::Plan& plan,
                                                        double memory_fraction) {
  const std::optional<cost::Precision> precision = cost::parse_precision(plan.precision);
  if (!precision) throw support::ValidationError(fmt::format("stage layout: unknown precision '{}'", plan.precision));
  const MemoryShares shares = stage_memory_shares(structure, plan);
  ShardingModelOptions mo;
  mo.mesh = {1, plan.tensor};
  mo.global_batch = plan.micro_batch;
  mo.precision = *precision;
  mo.compile = plan.compile;
  mo.memory = cost::state_dtype_memory(plan.state_dtype);
  mo.memory_limit = static_cast<double>(ranks.device_of(0).memory_bytes) * memory_fraction;
  mo.recompute = plan.recompute;
  mo.allow_zero = false;
  mo.optimizer_memory_efficiency = cost::PlanCostConstants{}.optimizer_memory_efficiency;
  mo.overlap_interference = cost::overlap_interference(ranks);
  mo.parameter_memory_scale = shares.parameters;
  mo.activation_memory_scale = shares.activations;
  mo.require_batch_index = false;
  mo.expert_parallel = plan.split_experts;
  mo.collective_matmul = plan.collective_matmul;  // its sequence-parallel collectives as rings, priced so
  // The stage's rows are its data axis' (as completion searches and the runtime runs it:
  // complete_stage_sharding): a tensor axis splitting the graph's batch would price a
  // micro-batch of one row as split over the t ranks where the graph was captured at t rows.
  mo.batch_axes = {true, false};
  return mo;
}

}  // namespace

StageLayoutKey stage_layout_key(const cost::LayerStructure& structure, const plan::Plan& plan) {
  const MemoryShares shares = stage_memory_shares(structure, plan);
  return {plan.tensor, plan.micro_batch, static_cast<int>(plan.recompute),
          std::llround(shares.parameters * 1000), std::llround(shares.activations * 1000)};
}

std::optional<StageLayout> search_stage_layout(const ir::Graph& graph, const cost::LayerStructure& structure,
                                               const cost::Cluster& cluster, const cost::CostModel& model,
                                               const plan::Plan& plan, const StageLayoutOptions& options) {
  const int t = plan.tensor;
  if (t <= 1 || !structure.layers) return std::nullopt;
  // The t ranks of one stage sit on one node (the joint planner's t divides a node).
  const cost::Cluster ranks = cost::first_ranks(cluster, t);
  const ShardingModelOptions mo = stage_model_options(structure, ranks, plan, options.memory_fraction);
  std::optional<ShardingModel> start;
  try {
    start.emplace(graph, ranks, model, mo);
  } catch (const support::ValidationError&) {
    return std::nullopt;  // a graph the search cannot take (say why: the caller keeps Megatron's layout)
  }
  ShardingEvaluation evaluation;
  const bool thorough = options.level == SearchLevel::Thorough;
  std::unique_ptr<ShardingModel> found = search_decisions(*start, thorough, &evaluation);
  StageLayout out;
  out.prices = layout_prices(*found, graph, structure, plan);
  out.sharding = found->sharding(std::string(search_level_name(options.level)));
  out.memory_per_rank = evaluation.memory_per_rank;
  out.fits = evaluation.fits;
  return out;
}

std::optional<cost::StageLayoutPrices> stage_sharding_prices(const ir::Graph& graph,
                                                             const cost::LayerStructure& structure,
                                                             const cost::Cluster& cluster, const cost::CostModel& model,
                                                             const plan::Plan& plan) {
  if (!plan.stage_sharding || plan.stage_data() * plan.tensor <= 1 || !structure.layers || !plan.stage_meshes.empty())
    return std::nullopt;
  const plan::Sharding& running = *plan.stage_sharding;
  if (running.mesh.size() != 2 || running.mesh[1] != plan.tensor)
    throw support::ValidationError(fmt::format("plan: stage_sharding mesh [{}] for tensor degree {}",
                                               fmt::join(running.mesh, ", "), plan.tensor));
  if (running.mesh[0] != plan.stage_data())
    throw support::ValidationError(fmt::format("plan: stage_sharding mesh [{}] for data x context {}",
                                               fmt::join(running.mesh, ", "), plan.stage_data()));
  // Adopted as it runs: on the {d, t} sub-mesh at one micro-batch of the data axis (the rows
  // it was searched at, so every strategy reads its rule at the batch it was written for: at
  // one row a flattening view's batch dim is a unit dim and its indices shift), each rank's
  // compute one micro-batch's. What is priced of it is its compute, both axes' collectives
  // and the tensor axis' gradient reductions (layout_prices); the data axis' ZeRO is the
  // evaluator's (zero_stage), so only the tensor axis' stays.
  plan::Sharding adopted = running;
  adopted.zero.clear();
  for (const auto& [name, axes] : running.zero)
    if (std::ranges::find(axes, 1) != axes.end()) adopted.zero[name] = {1};
  const cost::Cluster ranks = cost::first_ranks(cluster, plan.stage_data() * plan.tensor);
  ShardingModelOptions mo = stage_model_options(structure, ranks, plan, cost::kMemoryFraction);
  mo.mesh = {plan.stage_data(), plan.tensor};
  mo.global_batch = plan.micro_batch * plan.data;
  mo.collective_matmul = running.collective_matmul;
  mo.async_gradients = running.async_gradients;
  try {
    ShardingModel priced(graph, ranks, model, mo);
    priced.adopt(adopted);
    return layout_prices(priced, graph, structure, plan);
  } catch (const support::ValidationError& e) {
    // A graph the model cannot take (search_stage_layout then keeps Megatron's layout too),
    // or a sharding searched on another capture than this graph (a plan read back): the
    // plan is priced with Megatron's layout, and the log says why.
    support::log(support::LogLevel::Info,
                 fmt::format("plan price: the stage_sharding's tensor axis not priced ({}); Megatron's layout priced",
                             e.what()));
    return std::nullopt;
  }
}

namespace {

// The SPMD search of `graph` at `rows` on the plan's {data, tensor} mesh of `cluster`, in the
// plan's precision (validated with the plan) and with its recomputation (the one its stages
// run: plan::stage_plan): what completing a plan runs. `shares`: a pipeline stage's part of
// the graph's memory, under which its layout is chosen.
SpmdSearchResult search_plan_mesh(const ir::Graph& graph, const cost::Cluster& cluster, const plan::Plan& plan,
                                  std::int64_t rows, SearchLevel level, double memory_fraction,
                                  const cost::CostModel* model, std::vector<int> mesh = {}, bool allow_zero = true,
                                  MemoryShares shares = {}) {
  SpmdSearchOptions options;
  options.allow_zero = allow_zero;
  options.recompute = plan.recompute;
  options.parameter_memory_scale = shares.parameters;
  options.activation_memory_scale = shares.activations;
  options.global_batch = rows;
  // Rows of one micro-batch: the step runs the plan's micro-batches through it, and reduces
  // the gradients (steps the optimizer, broadcasts ZeRO's shards) once.
  if (rows < plan.global_batch) options.step_share = 1.0 / static_cast<double>(std::max<std::int64_t>(1, plan.num_micro_batches()));
  options.level = level;
  options.mesh = mesh.empty() ? std::vector<int>{plan.stage_data(), plan.tensor} : std::move(mesh);
  options.batch_on_tensor_axis = false;  // the plan's degrees say which axis is the data's
  // The experts split over the data axis where the plan says so (plan.expert), and only there:
  // what the evaluator priced.
  if (options.mesh->front() > 1) options.experts_on_first_axis = plan.expert > 1;
  options.expert_parallel = plan.split_experts;
  options.memory_fraction = memory_fraction;
  options.precision = cost::parse_precision(plan.precision).value_or(cost::Precision::BF16);
  options.state_dtype = plan.state_dtype;
  options.compile = plan.compile;
  options.collective_matmul = plan.collective_matmul;
  const cost::AnalyticCostModel analytic;
  return search_spmd(graph, cluster, model != nullptr ? *model : static_cast<const cost::CostModel&>(analytic),
                     options);
}

// A pipelined plan's stage layout with the plan's own ZeRO stage, as the evaluator prices it
// (model_state_bytes over the data axis): zero_stage 1 shards the optimizer state of every
// floating parameter the layout holds whole on the data axis (axis 0) over it, zero_stage 0
// none. The layout is searched without ZeRO choices of its own, which the degrees would not
// price. The runtime shards a stage's optimizer state and nothing more: zero_stage 2 or 3
// (gradients, weights) is refused rather than priced as something that does not run.
plan::Sharding with_plan_zero(plan::Sharding sharding, const ir::Graph& graph, const plan::Plan& plan) {
  if (plan.zero_stage > 1)
    throw support::ValidationError(fmt::format(
        "plan.zero_stage: {} with pipeline {} and {} micro-batches: a pipelined plan's stages shard the optimizer "
        "state over the data axis (zero_stage 1) and nothing more; use zero_stage 1, or pipeline 1 with one "
        "micro-batch (the SPMD search shards gradients and weights where they pay)",
        plan.zero_stage, plan.pipeline, plan.num_micro_batches()));
  sharding.zero.clear();
  if (plan.zero_stage == 0 || sharding.mesh.empty() || sharding.mesh[0] <= 1) return sharding;
  for (const ir::Value& v : graph.values()) {
    if (v.role != ir::ValueRole::Parameter || !ir::is_floating(v.type.dtype)) continue;
    const auto it = sharding.placements.find(v.name);
    if (it == sharding.placements.end() || it->second.empty() || !parse_placement(it->second[0]).is_replicate())
      continue;
    sharding.zero[v.name] = {0};
  }
  return sharding;
}

// Whether a layout searched on `graph` holds for the runtime's capture at `rows` (one
// micro-batch): only when `graph` was captured at those rows. At another batch the capture may
// be another graph: export specializes a size of 1 (a micro-batch of one row), and a value
// sized by the batch without being indexed by it (a padding mask's arange over the rows) keeps
// the captured size, which a layout may split where one micro-batch has 1 (a tiny Llama with
// an attention_mask, 1 row per micro-batch). Nor has a graph captured at batch 1 (a cost
// model's) any batch index to split. The runtime captures at one micro-batch and completes the
// plan there (shardwise.Plan.complete). A graph without a batch dim has nothing to differ.
bool captured_at(const ir::Graph& graph, std::int64_t rows) {
  const std::int64_t batch = analysis::input_batch(graph);
  return batch == 0 || batch == rows;
}

}  // namespace

namespace {

// The layout the joint planner prices a pipelined plan with (search_stage_layout: the {1, t}
// search at one micro-batch) on the stage's {d, t} sub-mesh: its tensor axis as found, the
// data axis then solved from pure data parallelism (ShardingModel::solve_axis' seed), as the
// evaluator prices the data axis. Searched on {d, t} from scratch, the descent (the data axis
// solved first, or the tensor axis under a data axis still whole) can settle elsewhere:
// DeepSeek-V3 (61 layers) at t 8 p 32 d 8 gathered over the tensor ranks the attention's
// keys that the {1, t} layout keeps split by head, 97 s a step against the 59 s it was chosen at.
std::optional<plan::Sharding> lifted_stage_layout(const ir::Graph& graph, const cost::LayerStructure& structure,
                                                  const cost::Cluster& sub_mesh, const cost::CostModel& model,
                                                  const plan::Plan& plan, SearchLevel level, double memory_fraction) {
  if (plan.tensor <= 1 || plan.stage_data() <= 1 || plan.context > 1 || plan.expert > 1) return std::nullopt;
  const std::optional<StageLayout> layout =
      search_stage_layout(graph, structure, sub_mesh, model, plan, {level, memory_fraction});
  if (!layout) return std::nullopt;
  plan::Sharding lifted = layout->sharding;
  lifted.mesh = {plan.stage_data(), plan.tensor};
  ShardingModelOptions mo = stage_model_options(structure, sub_mesh, plan, memory_fraction);
  mo.mesh = lifted.mesh;
  mo.global_batch = plan.micro_batch * plan.data;
  if (plan.num_micro_batches() > 1)
    mo.step_share = 1.0 / static_cast<double>(plan.num_micro_batches());
  try {
    ShardingModel model_of_stage(graph, sub_mesh, model, mo);
    model_of_stage.adopt(lifted);
    model_of_stage.solve_axis(0, /*thorough=*/false, 1.0, 1.0, /*seeds_only=*/true);
    return model_of_stage.sharding(std::string(search_level_name(level)));
  } catch (const support::ValidationError& e) {
    support::log(support::LogLevel::Info, fmt::format("stage sharding: the searched stage layout not lifted onto "
                                                      "the data axis ({})", e.what()));
    return std::nullopt;
  }
}

}  // namespace

std::optional<plan::Sharding> complete_stage_sharding(const ir::Graph& graph, const cost::Cluster& cluster,
                                                      const plan::Plan& plan, SearchLevel level,
                                                      double memory_fraction, const cost::CostModel* model) {
  if (plan.sharding.has_value() || plan.stage_data() * plan.tensor == 1 || !plan.stage_meshes.empty())
    return std::nullopt;
  if (plan.pipeline == 1 && plan.num_micro_batches() <= 1) return std::nullopt;
  if (!captured_at(graph, plan.micro_batch * plan.data)) return std::nullopt;
  const int size = plan.stage_data() * plan.tensor;
  if (cluster.world_size() < size)
    throw support::ValidationError(
        fmt::format("stage sharding: the cluster has {} devices, a stage's sub-mesh data {} x tensor {} = {}",
                    cluster.world_size(), plan.stage_data(), plan.tensor, size));
  const cost::Cluster sub_mesh = cluster.world_size() == size ? cluster : cost::first_ranks(cluster, size);
  // Under the first stage's memory, the most any stage holds (as search_stage_layout). A graph
  // without repeated layers has no share to take (its stages are cut by cost): the whole
  // graph at one micro-batch, as before.
  const cost::LayerStructure structure = cost::find_layer_structure(graph);
  const MemoryShares shares = structure.layers ? stage_memory_shares(structure, plan) : MemoryShares{};
  const SpmdSearchResult found = search_plan_mesh(graph, sub_mesh, plan, plan.micro_batch * plan.data, level,
                                                 memory_fraction, model, {}, /*allow_zero=*/false, shares);
  std::optional<plan::Sharding> searched;
  if (found.plan.sharding) searched = with_plan_zero(*found.plan.sharding, graph, plan);
  // The two are compared as the whole plan runs them: on a cluster of the plan's world (one of
  // a stage's sub-mesh alone, as a test's or a user's may be, prices no pipeline).
  if (!structure.layers || cluster.world_size() != plan.world_size()) return searched;
  const cost::AnalyticCostModel analytic;
  const cost::CostModel& pricing = model != nullptr ? *model : static_cast<const cost::CostModel&>(analytic);
  std::optional<plan::Sharding> lifted =
      lifted_stage_layout(graph, structure, sub_mesh, pricing, plan, level, memory_fraction);
  if (!lifted) return searched;
  lifted = with_plan_zero(*lifted, graph, plan);
  if (!searched) return lifted;
  // The two priced as the plan runs them (price_plan): the one that fits, then the faster.
  auto priced = [&](const plan::Sharding& sharding) {
    plan::Plan with = plan;
    with.stage_sharding = sharding;
    const cost::PlanCost cost = price_plan(graph, cluster, pricing, with, memory_fraction).degrees;
    return std::pair{cost.memory_use > memory_fraction, cost.step_time};
  };
  return priced(*lifted) < priced(*searched) ? lifted : searched;
}

std::vector<plan::Sharding> complete_stage_shardings(const ir::Graph& graph, const cost::Cluster& cluster,
                                                    const plan::Plan& plan, SearchLevel level,
                                                    double memory_fraction, const cost::CostModel* model) {
  if (plan.stage_meshes.empty()) return {};
  if (cluster.world_size() != plan.world_size())
    throw support::ValidationError(fmt::format("stage shardings: the cluster has {} devices, the stage meshes {}",
                                               cluster.world_size(), plan.world_size()));
  if (!captured_at(graph, plan.micro_batch)) return {};
  std::vector<plan::Sharding> out;
  // (mesh, its ranks' device types): stages alike in both share one search.
  std::map<std::pair<std::vector<int>, std::vector<std::string>>, plan::Sharding> searched;
  for (int s = 0; s < plan.pipeline; ++s) {
    const cost::Cluster block = cost::rank_range(cluster, plan.stage_first_rank(s), plan.stage_size(s));
    std::vector<std::string> types;
    for (int r = 0; r < block.world_size(); ++r) types.push_back(block.device_of(r).name);
    auto key = std::pair{plan.stage_mesh(s), types};
    if (!searched.contains(key))
      searched.emplace(key, with_plan_zero(*search_plan_mesh(graph, block, plan, plan.micro_batch, level,
                                                              memory_fraction, model, plan.stage_mesh(s),
                                                              /*allow_zero=*/false)
                                                 .plan.sharding,
                                             graph, plan));
    out.push_back(searched.at(key));
  }
  return out;
}

CompletedPlan complete_plan(const ir::Graph& graph, const cost::Cluster& cluster, const plan::Plan& plan,
                            SearchLevel level, double memory_fraction, const cost::CostModel* model) {
  if (plan.sharding.has_value()) return {plan, std::nullopt};
  if (!plan.stage_meshes.empty()) {
    plan::Plan out = plan;
    if (out.stage_shardings.empty())
      out.stage_shardings = complete_stage_shardings(graph, cluster, plan, level, memory_fraction, model);
    return {out, std::nullopt};
  }
  if (plan.pipeline > 1 || plan.num_micro_batches() > 1) {
    plan::Plan out = plan;
    if (!out.stage_sharding) {
      out.stage_sharding = complete_stage_sharding(graph, cluster, plan, level, memory_fraction, model);
      // Priced again with the layout it now runs (search/plan_price.h), as any plan read back is.
      if (out.stage_sharding && out.predicted) {
        const cost::AnalyticCostModel analytic;
        const cost::CostModel& pricing = model != nullptr ? *model : static_cast<const cost::CostModel&>(analytic);
        out.predicted = price_plan(graph, cluster, pricing, out).plan.predicted;
      }
    }
    return {out, std::nullopt};
  }
  if (analysis::input_batch(graph) == 1 && plan.global_batch > 1) return {plan, std::nullopt};
  if (cluster.world_size() != plan.world_size())
    throw support::ValidationError(fmt::format("complete plan: the cluster has {} devices, the plan data {} x tensor {}",
                                               cluster.world_size(), plan.data, plan.tensor));
  SpmdSearchResult found = search_plan_mesh(graph, cluster, plan, plan.global_batch, level, memory_fraction, model);
  found.plan.collective_matmul = plan.collective_matmul;  // what it asked, and its sharding runs
  return {std::move(found.plan), found.fits};
}

}  // namespace shardwise::search
