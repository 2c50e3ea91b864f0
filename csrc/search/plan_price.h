// The one evaluator of a plan as written: what Plan.manual, Plan.complete, the SPMD search,
// the joint planner and a plan read from a file are priced with.
//
//   PricedPlan p = price_plan(graph, cluster, model, plan);
//   p.plan.predicted->step_time;   // the same figure the planner that made `plan` recorded
//
// A plan with a sharding (plan.h: pipeline 1, one micro-batch, every node's strategy) is
// priced as that sharding runs: a ShardingModel on its mesh takes its decisions
// (ShardingModel::adopt) and evaluates them, the model the SPMD search chose them with
// (search/spmd_search.h documents it). A pipelined plan is priced by its degrees
// (cost/plan_cost.h), its stages' tensor ranks with the layout of its stage_sharding where it
// has one and t > 1 (search/stage_layout.h: stage_sharding_prices), else Megatron's.
//
// What is not yet one: a joint plan priced with a searched layout that the planner could not
// complete (its graph captured at other rows than one micro-batch of the data axis) records
// the price of the {1, t} layout its own search found, which this does not give.
// docs/cost-model.md, "One evaluator".
#pragma once

#include "cost/cluster.h"
#include "cost/constants.h"
#include "cost/op_cost.h"
#include "cost/plan_cost.h"
#include "ir/graph.h"
#include "plan/plan.h"
#include "search/sharding_model.h"

namespace shardwise::search {

struct PricedPlan {
  plan::Plan plan;  // the plan with its predicted section replaced
  bool fits = true;  // sharded plans: whether it fits in memory_fraction of the smallest device
  bool sharded = false;  // priced by its sharding (else by its degrees)
  bool stage_layout = false;  // a pipelined plan priced with its stage_sharding's layout
  cost::PlanCost degrees;  // plans priced by their degrees: the evaluator's whole answer
};

// The ShardingModel options a sharded plan is priced with; the SPMD search's candidates are
// the same but for what steers the search (beam, memo, batch axes).
ShardingModelOptions sharding_model_options(const plan::Plan& plan, const plan::Sharding& sharding,
                                            const cost::Cluster& cluster, double memory_fraction);

// With collective matmuls on: the breakdown's "step_time_plain_collectives", the same
// placements priced with every collective run plainly (what the collective matmuls save;
// benchmarks/collective_matmul.py). Nothing otherwise.
void add_plain_collectives(const ShardingModel& model, ShardingEvaluation& evaluation);

// The predicted section of a sharded plan from its evaluation.
plan::Predicted sharding_prediction(const ShardingEvaluation& evaluation, const cost::Cluster& cluster);

PricedPlan price_plan(const ir::Graph& graph, const cost::Cluster& cluster, const cost::CostModel& model,
                      const plan::Plan& plan, double memory_fraction = cost::kMemoryFraction);

}  // namespace shardwise::search
