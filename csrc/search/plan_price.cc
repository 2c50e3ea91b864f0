#include "search/plan_price.h"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "cost/layer_structure.h"
#include "search/stage_layout.h"
#include "support/error.h"

namespace shardwise::search {

ShardingModelOptions sharding_model_options(const plan::Plan& plan, const plan::Sharding& sharding,
                                            const cost::Cluster& cluster, double memory_fraction) {
  ShardingModelOptions mo;
  mo.mesh = sharding.mesh;
  mo.global_batch = plan.global_batch;
  mo.precision = cost::parse_precision(plan.precision).value_or(cost::Precision::BF16);
  mo.memory = cost::state_dtype_memory(plan.state_dtype);
  mo.compile = plan.compile;
  double memory_limit = std::numeric_limits<double>::infinity();
  for (int r = 0; r < cluster.world_size(); ++r)
    memory_limit = std::min(memory_limit, static_cast<double>(cluster.device_of(r).memory_bytes));
  mo.memory_limit = memory_limit * memory_fraction;
  mo.recompute = sharding.recompute;
  mo.collective_matmul = sharding.collective_matmul;
  mo.async_gradients = sharding.async_gradients;
  mo.optimizer_memory_efficiency = cost::PlanCostConstants{}.optimizer_memory_efficiency;
  mo.overlap_interference = cost::overlap_interference(cluster);
  return mo;
}

void add_plain_collectives(const ShardingModel& model, ShardingEvaluation& evaluation) {
  if (!model.options().collective_matmul) return;
  ShardingModel plain(model);
  plain.set_collective_matmul(false);
  evaluation.breakdown["step_time_plain_collectives"] = plain.evaluate().step_time;
}

plan::Predicted sharding_prediction(const ShardingEvaluation& e, const cost::Cluster& cluster) {
  plan::Predicted predicted;
  predicted.step_time = e.step_time;
  predicted.memory_per_rank = e.memory_per_rank;
  predicted.tflops_per_device = e.step_time > 0 ? e.model_flops / e.step_time / cluster.world_size() / 1e12 : 0.0;
  predicted.breakdown = e.breakdown;
  predicted.memory_breakdown = e.memory_breakdown;
  predicted.collectives = e.collectives;
  predicted.ranks_per_node = cluster.ranks_per_node();
  return predicted;
}

PricedPlan price_plan(const ir::Graph& graph, const cost::Cluster& cluster, const cost::CostModel& model,
                      const plan::Plan& plan, double memory_fraction) {
  PricedPlan out;
  out.plan = plan;
  if (!plan.sharding) {
    const cost::LayerStructure structure = cost::find_layer_structure(graph);
    const std::optional<cost::StageLayoutPrices> layout = stage_sharding_prices(graph, structure, cluster, model, plan);
    out.degrees = cost::evaluate(structure, graph, cluster, plan, model, {}, layout ? &*layout : nullptr);
    out.plan = cost::with_prediction(plan, out.degrees);
    out.stage_layout = layout.has_value();
    return out;
  }
  if (cluster.world_size() != plan.world_size())
    throw support::ValidationError(fmt::format("price plan: the cluster has {} devices, the plan's mesh {}",
                                               cluster.world_size(), plan.world_size()));
  ShardingModel model_of_plan(graph, cluster, model,
                              sharding_model_options(plan, *plan.sharding, cluster, memory_fraction));
  model_of_plan.adopt(*plan.sharding);
  ShardingEvaluation e = model_of_plan.evaluate();
  add_plain_collectives(model_of_plan, e);
  out.plan.predicted = sharding_prediction(e, cluster);
  out.fits = e.fits;
  out.sharded = true;
  return out;
}

}  // namespace shardwise::search
