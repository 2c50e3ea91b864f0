// Which contractions of a pipeline stage can accumulate their weight gradient into the
// parameter's gradient inside the product that makes it (Megatron-LM's
// gradient_accumulation_fusion: a GEMM with beta = 1 into main_grad).
//
// A pipeline step runs m micro-batches' backwards into one gradient per parameter. Unfused,
// each makes its weight gradient in a fresh tensor and then adds it in: m writes of the
// whole weight, m reads back and m adds. Fused, the product adds into the gradient as it is
// computed. The runtime (python/shardwise/runtime/fused_accumulation.py) runs each marked
// node that way when, at backward, the operand is still the leaf (or its t()) and nothing
// watches the gradient arrive (a data-parallel bucket's hook); otherwise as autograd would.
//
// Marked: aten::linear (weight at input 1), aten::addmm (input 2) and aten::mm (input 1)
// whose weight operand is a parameter, or aten::t / aten::transpose.int of a 2-D parameter
// (torch.export's linear is t + addmm); aten::embedding (the table at input 0) of a
// parameter itself, neither scale_grad_by_freq nor sparse: its backward makes a whole-table
// gradient per micro-batch (zeros, then the looked-up rows scattered in) that
// AccumulateGrad adds in, where the fused one adds the rows into .grad (GPT-2's 50,257 x 768
// table on one CPU core: 77 ms a micro-batch against 0.22). Not marked: a weight made
// otherwise (a cast, a gathered shard: its own backward reaches the leaf), a product of two
// activations.
//
// Worked example: %wt = aten::t(%w); %y = aten::addmm(%b, %x, %wt) marks y {input 2,
// parameter w, transposed}; %z = aten::mm(%x, %h) with %h an activation marks nothing;
// %e = aten::embedding(%wte, %ids) marks e {input 0, parameter wte}.
//
// As a pass (mark_fused_accumulations, "fused-accumulation"): run on each pipeline stage's
// rank graph (stage_rank_graph.h) when the plan's fused_accumulation is on (the default; a
// pipelined job only), it marks those nodes {shardwise.fused_accumulation=i}, i the weight
// operand, which the runtime's lowering reads. On a rank graph the weight operand is what the
// rank reads: a parameter's shard (its leaf), or a value a resharding step or a stage boundary
// gives (a ZeRO gather, a recv), which is not marked, so the runtime never meets a marked call
// whose weight it cannot reach (tests/golden/fused_accumulation_pass.ir). Nor a call an earlier
// pass or the rank graph gave a backward of its own (an asynchronous gradient, a ring, an FP8
// linear).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace shardwise::transform {

struct FusedWeightAccumulation {
  std::string node;       // the contraction's first output
  int weight_input = -1;  // the position of its weight operand (an embedding's table: 0)
  std::string parameter;  // the parameter whose gradient it accumulates into
  bool transposed = false;  // the operand is the parameter's transpose
};

// In node order.
std::vector<FusedWeightAccumulation> fused_weight_accumulations(const ir::Graph& stage);

// The pass: marks `stage_rank_graph`'s fused accumulations in place (node and value ids kept;
// a second run changes nothing).
void mark_fused_accumulations(ir::Graph& stage_rank_graph);

// The weight operand a marked node accumulates into its parameter's .grad, or -1.
std::int64_t fused_accumulation_operand(const ir::Node& node);

}  // namespace shardwise::transform
