#include "transform/stage_rank_graph.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "support/error.h"
#include "transform/stage_split.h"

namespace shardwise::transform {
namespace {

using support::ValidationError;
using Stages = std::set<int>;

// The stages each node of the rank graph runs on (the header's rules).
std::vector<Stages> node_stages(const RankGraph& rank, const std::vector<int>& stage_of_node, int stages) {
  const ir::Graph& graph = rank.graph;
  std::vector<Stages> of(graph.nodes().size());
  for (std::size_t i = 0; i < rank.nodes.size(); ++i)
    of[static_cast<std::size_t>(rank.nodes[i])] = {stage_of_node[static_cast<std::size_t>(rank.program.nodes[i].node)]};
  // Nodes the rewrite adds after a call (counted means, scales): where their operands are made.
  for (const ir::Node& node : graph.nodes()) {
    Stages& here = of[static_cast<std::size_t>(node.id)];
    if (!here.empty() || is_step_node(node) || node.outputs.empty()) continue;
    int latest = -1;
    for (ir::ValueId in : node.inputs)
      if (const auto producer = graph.value(in).producer; producer && !of[static_cast<std::size_t>(*producer)].empty())
        latest = std::max(latest, *of[static_cast<std::size_t>(*producer)].rbegin());
    if (latest >= 0) here = {latest};
  }
  const std::vector<std::vector<ir::NodeId>> users = graph.users_by_value();
  // A state write-back: the stages of the calls that read the value it writes back (the
  // call that wrote it), before the regions take their readers' stages.
  for (const ir::Node& node : graph.nodes()) {
    if (node.op != "shardwise::write_state" || node.inputs.size() != 2) continue;
    const ir::ValueId written = region_ending_at(graph, node.inputs[1]).source;
    for (ir::NodeId user : users[static_cast<std::size_t>(written)])
      if (!is_step_node(graph.node(user)))
        of[static_cast<std::size_t>(node.id)].insert(of[static_cast<std::size_t>(user)].begin(),
                                                    of[static_cast<std::size_t>(user)].end());
  }
  // A region: every stage its readers run on (the last, for a graph output).
  const std::vector<ir::ValueId>& outputs = graph.outputs();
  for (const StepRegion& region : step_regions(graph)) {
    const ir::ValueId end = region_end(graph, region);
    Stages readers;
    for (ir::NodeId user : users[static_cast<std::size_t>(end)]) readers.insert(of[static_cast<std::size_t>(user)].begin(),
                                                            of[static_cast<std::size_t>(user)].end());
    if (std::find(outputs.begin(), outputs.end(), end) != outputs.end()) readers.insert(stages - 1);
    for (const auto* steps : {&region.forward, &region.backward})
      for (ir::NodeId id : *steps) of[static_cast<std::size_t>(id)] = readers;
  }
  // A gradient reduction: every stage that reads its parameter.
  for (const ir::Node& node : graph.nodes()) {
    if (!node.outputs.empty() || node.inputs.empty() || node.op == "shardwise::write_state") continue;
    Stages& here = of[static_cast<std::size_t>(node.id)];
    for (ir::NodeId user : users[static_cast<std::size_t>(node.inputs[0])])
      if (user != node.id) here.insert(of[static_cast<std::size_t>(user)].begin(), of[static_cast<std::size_t>(user)].end());
  }
  for (const ir::Node& node : graph.nodes())
    if (of[static_cast<std::size_t>(node.id)].empty() && !node.outputs.empty())
      throw ValidationError(fmt::format("cut_rank_graph: {} node '{}' of rank {} has no stage (none of the "
                                        "header's rules places it)",
                                        node.op, graph.value(node.outputs[0]).name, rank.rank));
  return of;
}

void check_stages(const ir::Graph& global, const std::vector<int>& stage_of_node, int stages) {
  if (stage_of_node.size() != global.nodes().size())
    throw ValidationError(fmt::format("cut_rank_graph: {} stage entries for {} nodes", stage_of_node.size(),
                                      global.nodes().size()));
  for (std::size_t n = 0; n < stage_of_node.size(); ++n)
    if (stage_of_node[n] < 0 || stage_of_node[n] >= stages)
      throw ValidationError(fmt::format("cut_rank_graph: node {} ({}) in stage {} of {}", n, global.nodes()[n].op,
                                        stage_of_node[n], stages));
}

}  // namespace

std::vector<ir::Graph> cut_rank_graph(const RankGraph& rank, const ir::Graph& global,
                                      const std::vector<int>& stage_of_node, int stages) {
  check_stages(global, stage_of_node, stages);
  return split_stages_of(rank.graph, node_stages(rank, stage_of_node, stages), stages);
}

}  // namespace shardwise::transform
