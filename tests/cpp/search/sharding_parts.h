// Small graphs and clusters whose sharding figures can be worked out by hand, and one SPMD
// candidate's facts and decisions built on them: what the tests of the sharding model's parts
// (sharding_strategies.h, sharding_edges.h, sharding_memory.h) price.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <deque>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cost/cluster.h"
#include "cost/op_cost.h"
#include "ir/graph.h"
#include "ir/parser.h"
#include "search/sharding_decisions.h"
#include "search/sharding_edges.h"
#include "search/sharding_facts.h"
#include "search/sharding_memory.h"
#include "search/sharding_options.h"
#include "search/sharding_strategies.h"

namespace shardwise::search::testing {

// float32 throughout. x [b8, 32] (an input) -> linear by fc.weight [64, 32] -> y [b8, 64] ->
// tanh -> t -> add the buffer shift [64] -> z. Autograd saves x (for fc.weight's gradient) and
// t (tanh's output), nothing of y or z.
inline ir::Graph mlp() {
  return ir::parse_graph(R"(graph(%x: f32[b8,32]) {
  %fc.weight: f32[64,32] parameter
  %shift: f32[64] buffer
  %y: f32[b8,64] = aten::linear(%x, %fc.weight) @fc
  %t: f32[b8,64] = aten::tanh(%y) @act
  %z: f32[b8,64] = aten::add.Tensor(%t, %shift) @out
  return (%z)
})");
}

// The two repeated layers of two_layers and stem_two_layers (linear then tanh), the first
// reading %`input`, and the graph's return.
inline std::string two_layer_nodes(const std::string& input) {
  return "  %layers.0.fc.weight: f32[64,64] parameter\n"
         "  %layers.1.fc.weight: f32[64,64] parameter\n"
         "  %h0: f32[b8,64] = aten::linear(%" +
         input +
         ", %layers.0.fc.weight) @layers.0.fc\n"
         "  %a0: f32[b8,64] = aten::tanh(%h0) @layers.0\n"
         "  %h1: f32[b8,64] = aten::linear(%a0, %layers.1.fc.weight) @layers.1.fc\n"
         "  %a1: f32[b8,64] = aten::tanh(%h1) @layers.1\n"
         "  return (%a1)\n"
         "}";
}

// Two repeated layers (linear then tanh) on x [b8, 64]: layers.1 folds into layers.0.
inline ir::Graph two_layers() { return ir::parse_graph("graph(%x: f32[b8,64]) {\n" + two_layer_nodes("x")); }

// two_layers behind a stem: a weight read before the repeated blocks (an embedding's place).
inline ir::Graph stem_two_layers() {
  return ir::parse_graph(
      "graph(%x: f32[b8,64]) {\n"
      "  %stem.weight: f32[64,64] parameter\n"
      "  %s: f32[b8,64] = aten::linear(%x, %stem.weight) @stem\n" +
      two_layer_nodes("s"));
}

// One weight read by two linears (a tied weight).
inline ir::Graph tied() {
  return ir::parse_graph(R"(graph(%x: f32[b8,32]) {
  %w: f32[64,32] parameter
  %y1: f32[b8,64] = aten::linear(%x, %w) @a
  %y2: f32[b8,64] = aten::linear(%x, %w) @b
  %z: f32[b8,64] = aten::add.Tensor(%y1, %y2)
  return (%z)
})");
}

// `ranks` ranks on one node and one link of 1e9 bytes/s and 10 us a hop, so that a ring
// collective over n ranks of B bytes takes (n-1)/n x B / 1e9 + (n-1) x 1e-5 s (an
// all-reduce twice that: collective_cost.h). `slow_second`: the second half of the ranks
// run at a third of the first half's speed.
inline cost::Cluster one_link(int ranks, bool slow_second = false) {
  const std::string flops = R"("peak_flops": {"f32": 3e12, "tf32": 3e12, "bf16": 3e12, "f16": 3e12})";
  const std::string slow_flops = R"("peak_flops": {"f32": 1e12, "tf32": 1e12, "bf16": 1e12, "f16": 1e12})";
  const std::string half = std::to_string(ranks / 2);
  const std::string nodes =
      slow_second ? R"({"devices": [{"device": "fast", "count": )" + half + R"(}, {"device": "slow", "count": )" +
                        half + "}]}"
                  : R"({"device": "fast", "count": )" + std::to_string(ranks) + "}";
  return cost::cluster_from_json_string(R"({"device_types": [{"name": "fast", )" + flops +
                                        R"(, "memory_bytes": 1e9, "memory_bandwidth": 1e11},
      {"name": "slow", )" + slow_flops + R"(, "memory_bytes": 1e9, "memory_bandwidth": 1e11}],
      "nodes": [)" + nodes + R"(], "links": [{"name": "link", "bandwidth": 1e9, "latency": 1e-5}]})");
}

// A candidate on `mesh` at `global_batch` rows, its model states in float32 (4 bytes of
// weight, 4 of gradient and 8 of Adam's moments per parameter: cost/memory_cost.h).
inline ShardingModelOptions f32_options(std::vector<int> mesh, std::int64_t global_batch) {
  ShardingModelOptions o;
  o.mesh = std::move(mesh);
  o.global_batch = global_batch;
  o.precision = cost::Precision::F32;
  return o;
}

// One candidate's facts and decisions (every decision replicated until a test sets one),
// and the parts that read them. The graph and the cluster must outlive it.
struct Candidate {
  Candidate(const ir::Graph& graph, const cost::Cluster& cluster, ShardingModelOptions o)
      : options(std::move(o)), facts(graph, cluster, model, options), decisions(graph, options.mesh) {}

  StrategyEnumerator strategies() const { return {facts, decisions, options}; }
  EdgePricer edges() const { return {facts, decisions, options}; }
  ShardingMemory memory() const { return {facts, decisions, options}; }

  ir::ValueId value(const std::string& name) const { return *facts.graph.find_value(name); }
  ir::NodeId producer(const std::string& name) const { return *facts.graph.value(value(name)).producer; }
  // The strategy of `name`'s producer on `axis` whose output placement is `output`.
  Strategy producing(const std::string& name, int axis, const Placement& output) const {
    for (const Strategy& s : strategies().node_strategies(producer(name), axis))
      if (s.outputs[0] == output) return s;
    throw std::runtime_error("no strategy of " + name + "'s producer gives " + output.str());
  }

  cost::AnalyticCostModel model;
  ShardingModelOptions options;
  ShardingFacts facts;
  ShardingDecisions decisions;
};

// The parts' tests: candidates on the mlp (or another graph) over four ranks on one link (or
// another cluster), kept for the test's length.
class ShardingParts : public ::testing::Test {
 protected:
  Candidate& candidate(ShardingModelOptions options) { return candidate(graph, four, std::move(options)); }
  Candidate& candidate(const ir::Graph& g, const cost::Cluster& c, ShardingModelOptions options) {
    return candidates_.emplace_back(g, c, std::move(options));
  }

  const ir::Graph graph = mlp();
  const cost::Cluster four = one_link(4);

 private:
  std::deque<Candidate> candidates_;
};

inline Placement R() { return Placement::replicate(); }
inline Placement S(int dim, std::int64_t groups = 1) { return Placement::shard(dim, groups); }
inline Placement P() { return Placement::partial(); }

}  // namespace shardwise::search::testing
