// Pipeline stage partitioning: balanced contiguous cuts of a graph's nodes into stages.
//
// The graph's node order is topological, so every prefix of it is a valid cut: a
// partition into S stages is S-1 cut positions 0 < c1 < ... < c(S-1) < n, stage k
// holding nodes [c_k, c_(k+1)). This works for chains and for DAGs with branches and
// skip connections alike; what differs is which values cross a cut.
//
// Communication model (forwarding): a value crosses cut c when its producer lies
// before c and some reader at or after c. Such a value is received by the stage just
// after the cut (and forwarded on if a later stage reads it), so a stage's receive
// volume is the bytes crossing the cut that opens it, each value counted once however
// many nodes read it. Stage time = compute cost + received bytes / bandwidth; the
// bottleneck (the pipeline's steady-state step per micro-batch) is the largest stage
// time. The solver minimises the bottleneck subject to every stage's memory (sum of
// node_memory) <= memory_limit, by dynamic programming over cut positions with prefix
// sums: O(stages x candidates^2). Ties go to the partition with fewer total crossing
// bytes, then to the earliest cuts, so the result is deterministic.
//
// Worked example: a chain of 8 nodes of cost 1 into 4 stages gives stage_of_node
// {0,0,1,1,2,2,3,3}, stage_cost {2,2,2,2}, bottleneck 2 (communication free).
//
// The result lists every cross-stage transfer: one CrossStageEdge per (value,
// receiving stage) pair, with the value's producing stage, so a skip that jumps over
// a stage (from 0 to 2) appears with to_stage - from_stage = 2.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace shardwise::search {

// A value flowing from node from_node to node to_node (from_node < to_node in
// topological order). value identifies the tensor so that several readers of one
// value count once per receiving stage; value < 0 means "a value of its own".
struct Edge {
  int from_node = 0;
  int to_node = 0;
  double bytes = 0.0;
  int value = -1;
  std::string value_name;

  friend bool operator==(const Edge&, const Edge&) = default;
};

struct StagePartitionProblem {
  std::vector<double> node_cost;    // per node, in topological order (e.g. seconds)
  std::vector<double> node_memory;  // per node (e.g. bytes of parameters + activations)
  std::vector<Edge> edges;
  int stages = 1;
  double memory_limit = std::numeric_limits<double>::infinity();  // per stage
  // Bytes moved per unit of node_cost (bytes/s when costs are seconds); <= 0 or
  // infinity makes communication free.
  double bandwidth = 0.0;
  // Allowed cut positions (a cut at c puts node c first in its stage), each in
  // [1, n-1]; empty = every position. See block_boundary_cuts.
  std::vector<int> cut_candidates;
};

struct CrossStageEdge {
  int value = -1;
  std::string value_name;
  int from_stage = 0;
  int to_stage = 0;
  double bytes = 0.0;

  friend bool operator==(const CrossStageEdge&, const CrossStageEdge&) = default;
};

struct StagePartition {
  std::vector<int> stage_of_node;
  std::vector<int> cuts;           // the first node of stages 1..S-1
  std::vector<double> stage_cost;  // compute only
  std::vector<double> stage_memory;
  std::vector<double> stage_recv_bytes;     // bytes crossing the cut that opens each stage
  std::vector<CrossStageEdge> cross_edges;  // ordered by value order of first edge, then to_stage
  double bottleneck = 0.0;                  // max over stages of cost + recv_bytes / bandwidth

  friend bool operator==(const StagePartition&, const StagePartition&) = default;
};

// Builds the problem for `graph`: one edge per (activation value, reading node)
// carrying the value's TensorType::bytes(); parameters, buffers, constants and graph
// inputs are not edges. node_cost / node_memory must have one entry per node
// (ValidationError otherwise). stages, memory_limit and bandwidth are left to the caller.
StagePartitionProblem problem_from_graph(const ir::Graph& graph, std::vector<double> node_cost,
                                         std::vector<double> node_memory);

// Cut positions that keep repeated blocks (transformer layers, find_repeated_blocks)
// whole: the first node of every member block of every group, and the node after the
// last member. Empty when the graph has no repeated blocks.
std::vector<int> block_boundary_cuts(const ir::Graph& graph);

// Throws support::ValidationError when stages < 1, there are fewer nodes (or cut
// candidates + 1) than stages, the vectors disagree in size, or no partition fits
// memory_limit (the message gives the smallest per-stage memory any partition needs).
StagePartition partition_stages(const StagePartitionProblem& problem);

}  // namespace shardwise::search
