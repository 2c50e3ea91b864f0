// The layer structure the plan evaluator prices: which nodes are the repeated layers, which
// come before and after them, and which are split by Megatron-style tensor parallelism.
//
//   LayerStructure s = find_layer_structure(graph);   // once per graph
//   evaluate(s, graph, cluster, plan, model);          // per candidate plan (plan_cost.h)
//
// It depends on the graph alone, never on a plan, so planners that price thousands of
// candidates on one graph find it once: on a 128-layer GPT it is 10 of the 11 ms that
// pricing one plan used to cost.
//
// Outside the layers, weighted contractions are column-parallel (the vocabulary-parallel LM
// head) and lookups of parameter tables row-split (the vocabulary-parallel embedding).
//
// Tensor-parallel groups, from the dataflow of one layer (no layer names): a weighted
// contraction (a contraction reading a parameter of rank >= 2) whose output reaches exactly
// one other weighted contraction through ops that need no whole feature dimension
// (pointwise, views, attention) is column-parallel, that other one row-parallel, and the ops
// between run on 1/t of the data. Several column-parallel contractions may feed one
// row-parallel end: LLaMA's separate q, k and v projections meet in attention before the
// output projection, and its SwiGLU MLP's gate and up projections meet in a multiply before
// the down projection. Such a group costs one all-reduce (the row end's output), as in
// Megatron-LM. A contraction whose region would overlap another group's stays replicated.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "analysis/compiled_fusion.h"
#include "analysis/repeated_blocks.h"
#include "cost/op_cost.h"
#include "ir/graph.h"

namespace shardwise::cost {

struct LayerStructure {
  // The largest group of analysis::find_repeated_blocks; none when the graph repeats nothing.
  std::optional<analysis::RepeatedBlockGroup> layers;
  std::vector<ir::NodeId> pre;   // nodes before the first layer (first pipeline stage)
  std::vector<ir::NodeId> post;  // every other node outside the layers (last stage)

  std::map<ir::NodeId, TensorSplit> layer_split;  // nodes of the first layer that are split
  std::vector<ir::NodeId> row_ends;               // each tensor-parallel group's row-parallel end
  std::map<ir::NodeId, TensorSplit> outside_split;  // pre and post: vocabulary-parallel heads
  // Lookups of a parameter table outside the layers (the input embedding): the table is
  // vocabulary-parallel (rows split over the t ranks, each looks up its own rows, zeros
  // elsewhere) and the output is all-reduced, once per micro-batch in forward, as in
  // Megatron-LM. Of lookups before / after the layers: output bytes at the graph's batch,
  // and whether they grow with the batch (a position embedding's [1, s, h] does not).
  struct LookupOutput {
    double bytes = 0;
    bool batched = true;
  };
  std::vector<LookupOutput> pre_lookups, post_lookups;
  std::set<ir::ValueId> sharded_params;           // parameters a column or row split shards
  // Parameters read both before the layers and after them: a tied embedding (GPT-2's wte, the
  // LM head's weight). One tensor where the first and the last stage share a rank (one stage,
  // or ZB-V's V), so the evaluator counts it once there.
  std::set<ir::ValueId> pre_and_post_params;

  // Repeated blocks outside the layers (find_repeated_blocks' other groups: DeepSeek-V3's dense
  // first layers before its mixture-of-experts layers, an encoder's blocks before a decoder's),
  // which recomputation checkpoints as it does the layers: per node, the instance it is in
  // (numbered over those groups; -1: none), and per instance its checkpoint
  // (analysis::block_checkpoint; -1: none).
  std::vector<int> outer_block;
  std::vector<ir::ValueId> outer_block_checkpoint;

  std::vector<std::int64_t> activation_bytes;  // analysis::saved_bytes_by_node: what autograd keeps, by node
  std::vector<bool> selective_kept;  // analysis::kept_by_selective_recompute, by node
  std::vector<bool> gradient_flow;   // analysis::gradient_flow: by value, whether backward makes its gradient
  analysis::FusedValues compiled;    // analysis::compiled_fusion: what a compiled plan's kernels keep in registers
  std::vector<std::int64_t> compiled_activation_bytes;  // activation_bytes of a compiled plan (compiled_saved_bytes)
  // analysis::weight_gradient_held_bytes, by node: what a split backward (ZB-H1, ZB-V,
  // DualPipeV) holds from a micro-batch's B to its W
  std::vector<std::int64_t> weight_gradient_held;
  // By node: an FP8 linear (analysis/fp8_linears.h) whose input gradient, where all-reduced over
  // the tensor ranks (a column split), the runtime runs beside its weight gradient: the rule of
  // search::activation_gradient_overlap and transform/async_gradients.h (its input an
  // activation read by it alone, its weight a trainable parameter). Compiled, such a linear
  // runs eagerly (NodeContext::async_input_gradient).
  std::vector<bool> async_gradient_site;
  // The greatest common divisor of the head counts of the first layer's attention inputs
  // (q, k, v of rank 4 or more: [..., heads, seq, head_dim]; grouped-query attention's k and v have fewer);
  // 0 when the layers have no attention. A tensor degree must divide it.
  int attention_heads = 0;
  double layer_input_bytes = 0;  // the residual stream a layer reads, at the graph's batch
  ir::ValueId layer_input = -1;  // that value, in the first layer (-1: none)
  int graph_batch = 1;           // the batch size of the graph's first batched input

  int num_layers() const { return layers ? static_cast<int>(layers->nodes.size()) : 0; }
};

LayerStructure find_layer_structure(const ir::Graph& graph);

// `structure` with each mixture of experts' experts op left whole on the tensor ranks (not a
// row-parallel end, its expert weights not sharded): a plan whose layout keeps every expert on
// every rank (plan::Plan::split_experts false).
LayerStructure with_whole_experts(LayerStructure structure, const ir::Graph& graph);

}  // namespace shardwise::cost
