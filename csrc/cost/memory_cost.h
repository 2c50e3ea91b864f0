// Memory per rank: model states (weights, gradients, optimizer state) and activations.
//
// Model states: every parameter a rank holds costs MemoryConstants::bytes_per_parameter()
// bytes, 16 by default: bf16/fp16 weights (2) and gradients (2), and Adam's fp32 master
// weights, first and second moments (4 + 4 + 4 = 12). The caller passes the parameters the
// rank holds after tensor and pipeline sharding; ZeRO then divides by the data degree:
//   stage 1  the optimizer state;  stage 2  + the gradients;  stage 3  + the weights.
//
// Activations: per micro-batch and layer, either every saved output of the layer (no
// recomputation) or only the layer's input (full recomputation: the rest is rebuilt, one
// layer at a time, during the backward pass, which needs one layer's full set as working
// memory). The number of micro-batches whose activations the first pipeline stage holds:
//   GPipe                 m
//   1F1B                  min(m, p)
//   kFkB                  min(m, k p)
//   interleaved 1F1B (v)  min(m v, 2(p-1) + (v-1) p + 1) chunks of L/(p v) layers each
//                         (Megatron-LM's warm-up count on the first stage, plus the one in
//                          its backward), i.e. that count / v stages' worth of layers.
//
// Worked example (GPT-3 175B, 174.6e9 parameters, t = 8, p = 12, d = 8, 16 bytes/param):
//   model_state_bytes(174.6e9 / 96, 8, 0).total() = 1.819e9 x 16 = 29.1 GB per rank;
//   with ZeRO-1: 1.819e9 x (2 + 2 + 12/8) = 10.0 GB.
//   stage_micro_batches_in_flight(Interleaved1F1B, p = 12, v = 2, k = 1, m = 24) =
//     min(48, 22 + 12 + 1) / 2 = 17.5
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "cost/cluster.h"
#include "ir/graph.h"
#include "plan/plan.h"

namespace shardwise::cost {

struct MemoryConstants {
  double weight_bytes = 2;      // bf16 / fp16 weights
  double gradient_bytes = 2;    // bf16 / fp16 gradients
  double optimizer_bytes = 12;  // fp32 master weights + Adam m + Adam v

  double bytes_per_parameter() const { return weight_bytes + gradient_bytes + optimizer_bytes; }
  friend bool operator==(const MemoryConstants&, const MemoryConstants&) = default;
};

// The model states a plan in `precision` holds per parameter with Adam: bf16 / f16 as mixed
// precision runs (the defaults above: Megatron-LM's and the published runs'); f32 / tf32 as
// torch trains a float32 model, weights 4, gradients 4 and Adam's two moments 8, no master
// copy. The total is 16 either way; what differs is what ZeRO divides (the optimizer's 8 or 12).
MemoryConstants memory_constants(Precision precision);

// The model states of a run that keeps no master copy: the optimizer steps the parameters in
// `state_dtype` ("bf16", "f16", "f32": plan::Plan::state_dtype), b bytes an element of weight
// and of gradient and 2b of Adam's moments (bf16: 2 + 2 + 4, where the mixed-precision
// convention holds 16); none for "" (the precision's convention applies).
// Worked example: a bf16 model of 1.236e9 parameters under torch.optim.AdamW holds 4.94 GB of
// moments (an H200 measured 4,714 MiB), not the 14.8 GB of fp32 master weights and moments.
std::optional<MemoryConstants> state_dtype_memory(const std::string& state_dtype);

// A plan's model states per parameter: its state_dtype's, else its precision's convention for
// the graph (memory_constants(model_state_precision(...))).
MemoryConstants plan_memory_constants(const plan::Plan& plan, const ir::Graph& graph);

// The precision a plan's model states are held in: the plan's, but for "fp8" (float8 is only the
// linears' operands, cast at each use) the graph's own (analysis::training_precision: a bf16
// model's states as bf16 mixed precision, a float32 model's as float32).
Precision model_state_precision(Precision precision, const ir::Graph& graph);

struct ModelStateBytes {
  double weights = 0;
  double gradients = 0;
  double optimizer = 0;

  double total() const { return weights + gradients + optimizer; }
};

// `parameters`: parameters this rank holds after tensor/pipeline sharding. Throws
// support::ValidationError on data < 1 or a ZeRO stage outside 0..3.
ModelStateBytes model_state_bytes(double parameters, int data, int zero_stage, const MemoryConstants& constants = {});

// In units of "one stage's layers for one micro-batch" (see the header comment).
double stage_micro_batches_in_flight(plan::Schedule schedule, int pipeline, int virtual_stages, int kfkb_k,
                                     std::int64_t micro_batches);

// Activation bytes of one stage: in_flight x layers x (per-layer bytes kept), plus one
// layer's full set when recomputing (the layer being rebuilt for its backward). What a
// recomputed layer keeps: its input (full recomputation), and the outputs of its products and
// fused attention besides (selective).
double stage_activation_bytes(double layer_full_bytes, double layer_kept_bytes, double layers_on_stage,
                              double micro_batches_in_flight, bool recompute);

}  // namespace shardwise::cost
