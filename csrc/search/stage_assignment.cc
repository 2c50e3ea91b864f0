#include "search/stage_assignment.h"

#include <fmt/format.h>

#include "analysis/flops.h"
#include "analysis/repeated_blocks.h"
#include "cost/layer_balance.h"
#include "ops/op_table.h"
#include "search/stage_partition.h"
#include "support/error.h"

namespace shardwise::search {

StageAssignment assign_stages(const ir::Graph& graph, int stages, const std::vector<int>& layers_per_stage) {
  if (stages < 1) throw support::ValidationError(fmt::format("pipeline stages: {} stages (at least 1)", stages));
  std::vector<double> cost, memory(graph.nodes().size(), 0.0);
  for (const ir::Node& node : graph.nodes())
    cost.push_back(static_cast<double>(analysis::node_flops(ops::OpTable::builtin(), graph, node).total) + 1.0);
  StageAssignment out;
  std::vector<analysis::RepeatedBlockGroup> groups = analysis::find_repeated_blocks(graph);
  const analysis::RepeatedBlockGroup* layers = analysis::largest_group(groups);
  const int total = layers != nullptr ? static_cast<int>(layers->nodes.size()) : 0;
  // The plan format's "balanced": the repeated blocks split evenly, as the evaluator prices
  // and the stage layout search lays out (cost::even_layers). Balancing by FLOPs here put a
  // transformer's first 3 of 4 layers on stage 0 of 2 while every price assumed 2 and 2.
  const std::vector<int> counts = !layers_per_stage.empty()       ? layers_per_stage
                                  : stages > 1 && total >= stages ? cost::even_layers(total, stages)
                                                                  : std::vector<int>{};
  if (counts.empty()) {
    StagePartitionProblem problem = problem_from_graph(graph, cost, memory);
    problem.stages = stages;
    std::vector<int> cuts = block_boundary_cuts(graph);
    if (static_cast<int>(cuts.size()) >= stages - 1) problem.cut_candidates = std::move(cuts);
    StagePartition partition = partition_stages(problem);
    out.stage_of_node = std::move(partition.stage_of_node);
    out.stage_cost = std::move(partition.stage_cost);
    return out;
  }
  int sum = 0;
  for (int n : counts) {
    if (n < 1) throw support::ValidationError(fmt::format("pipeline_stages: every stage needs a layer, got {}", n));
    sum += n;
  }
  if (static_cast<int>(counts.size()) != stages || sum != total)
    throw support::ValidationError(fmt::format(
        "pipeline_stages: layers_per_stage has {} entries summing to {}; the graph has {} layers for {} stages",
        counts.size(), sum, total, stages));
  std::vector<ir::NodeId> starts;  // first node of stages 1..
  for (int k = 0, first = 0; k + 1 < stages; ++k) {
    first += counts[static_cast<std::size_t>(k)];
    starts.push_back(layers->nodes[static_cast<std::size_t>(first)].front());
  }
  out.stage_cost.assign(static_cast<std::size_t>(stages), 0.0);
  int stage = 0;
  for (const ir::Node& node : graph.nodes()) {
    while (stage + 1 < stages && node.id >= starts[static_cast<std::size_t>(stage)]) ++stage;
    out.stage_of_node.push_back(stage);
    out.stage_cost[static_cast<std::size_t>(stage)] += cost[static_cast<std::size_t>(node.id)];
  }
  return out;
}

}  // namespace shardwise::search
