// How long one node of a graph takes on one device: the cost-model interface every planner
// calls (CostModel), and its analytic implementation (AnalyticCostModel). A profiled model
// (measured times) implements the same interface and replaces it without touching callers.
//
// The analytic model, with every constant in AnalyticConstants (one set for all models and
// clusters; the values and why are in op_cost.cc):
//
//   contraction (FlopsKind Contraction, Convolution, and the two products of Attention)
//       forward  = matmul FLOPs / (peak(precision) x matmul_efficiency(d))
//       d        = matmul FLOPs / (2 x elements the node reads and writes): the arithmetic
//                  intensity in multiply-adds per element. For an [M,K] x [K,N] product it is
//                  1 / (1/M + 1/K + 1/N): about the smallest GEMM dimension, but it needs no
//                  knowledge of which operand is which, so it works for addmm, bmm, linear,
//                  einsum and attention alike.
//       matmul_efficiency(d) = max_efficiency x d / (d + half_efficiency_dim)
//                  a saturating curve: small GEMMs (a 64-wide head, a t-way sliced weight)
//                  are latency- and bandwidth-bound, large ones approach max_efficiency.
//       backward = contraction_backward_factor (2) x forward: dX and dW are one product each.
//   FP8 linears (a plan in "fp8": analysis/fp8_linears.h): the forward product and dX at
//       peak(fp8), dW at the peak of the node's dtype (bf16 in a bf16 model), each at the same
//       matmul_efficiency(d); plus the casts, memory-bound: x and W in forward, dY and W in
//       backward, each as runtime/fp8.py runs it (|t| and its amax, a scaled float32 copy, the
//       cast to float8: 4b + 9 bytes an element of b bytes; W once more through a transpose, 2). Every
//       other node of an fp8 plan is priced at its dtype's peak (high_precision).
//   fused attention (FlopsKind Attention: aten::scaled_dot_product_attention and the flash /
//       memory-efficient kernels it dispatches to) as a flash kernel runs it: the two products
//       over the score blocks it computes, never the S x S scores in memory:
//       forward  = computed matmul FLOPs / (peak(precision) x matmul_efficiency(d)), d from the
//                  elements of Q, K, V, the output and a mask when one is passed
//       computed = the matmul FLOPs x causal_block_fraction (attention_causal_fraction): with
//                  is_causal the kernel skips every attention_block x attention_block tile
//                  above the diagonal (top-left aligned, as torch's is_causal), computing the
//                  diagonal tiles whole; without it, every tile
//       backward = attention_backward_factor (2.5) x forward: flash's backward recomputes
//                  Q K^T and forms dV, dP, dQ, dK: five products where the forward has two.
//   the math kernel (aten::_scaled_dot_product_attention_math: what SDPA runs where no fused
//       kernel applies, and the one node that stands for Megatron-LM 2021's unfused attention)
//       computes every score: the two products as a contraction (intensity of Q, K, V and
//       the output), backward 2 x, plus unfused_attention_score_bytes per score moved,
//       forward, and memory_backward_factor x that backward. Its probabilities are an output.
//       An unfused attention (the model's own matmul, scale, mask, softmax, dropout, matmul:
//       transformers' eager attention, Megatron-LM 2021) is its nodes, each priced by its kind
//       below; its S x S scores cross memory there and are saved as activations.
//   memory-bound (pointwise, normalisations, reductions, losses, copies)
//       forward  = bytes moved / (memory bandwidth x memory_efficiency); bytes moved =
//                  inputs + outputs for pointwise and reductions; 2 x outputs for copies and
//                  gathers (Zero-FLOP ops that are not aliases: contiguous, embedding, cat)
//       backward = memory_backward_factor x forward (read the output gradient and the saved
//                  inputs, write the input gradients)
//   aliases (view, reshape, transpose, split, expand, ... and a `to` that keeps the dtype): 0
//   compiled (NodeContext::compiled: a plan with `compile`, torch.compile's inductor): a
//       memory-bound node's bytes are only its operands that cross memory
//       (analysis/compiled_fusion.h): inputs it reads from memory, outputs it writes; a copy
//       or gather reads at most what it writes. Products and attention as eager. An FP8
//       linear's casts fused (the runtime traces it: its amax all-reduce, where its weight is
//       split, is a traced op; a gathered weight saves its float8 W^T, no regather): each
//       operand read twice (amax, scaled cast) and its float8 copy written, 2b + 1 bytes an
//       element; as eager where its input gradient is all-reduced asynchronously
//       (NodeContext::async_input_gradient: the runtime runs that linear eagerly between
//       compiled pieces).
//
// NodeContext scales one node to a plan: batch_scale multiplies every activation and input
// (not parameters, buffers, constants) (a graph built at batch 1 costed at micro-batch 4: 4), and a tensor-parallel
// split divides the work by `shards`:
//   Column  the weight and the output are split (Megatron's first GEMM of a pair)
//   Row     the weight and the activation inputs are split (the second GEMM)
//   All     every operand is split (attention heads, the pointwise ops between a pair)
//
// Worked example (A100 bf16 peak 312 TFLOP/s, 2.039 TB/s; default constants
// max_efficiency 0.75, half_efficiency_dim 96, memory_efficiency 0.75):
//   aten::mm  bf16[2048,4096] x bf16[4096,4096]: 2*2048*4096*4096 = 68.7 GFLOP,
//     elements 2048*4096*2 + 4096^2 = 33.6M, d = 68.7e9 / (2 * 33.6e6) = 1024,
//     efficiency = 0.75 * 1024 / 1120 = 0.686, forward = 68.7e9 / (312e12 * 0.686) = 0.321 ms,
//     backward 0.642 ms.
//   aten::gelu on bf16[2048,4096]: bytes 2 * 16.8 MB = 33.6 MB, forward = 33.6e6 /
//     (2.039e12 * 0.75) = 21.9 us, backward 43.9 us.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "analysis/compiled_fusion.h"
#include "analysis/fp8_linears.h"
#include "cost/cluster.h"
#include "cost/collective_cost.h"
#include "ir/graph.h"

namespace shardwise::cost {

// Which operands a tensor-parallel split divides (see the header comment).
enum class TensorSplit : std::uint8_t { None, Column, Row, All };

struct NodeContext {
  double batch_scale = 1.0;  // multiplies every tensor that has a batch dimension
  int shards = 1;            // tensor-parallel degree the split divides by
  TensorSplit split = TensorSplit::None;
  // The SPMD search's general split (search/spmd_builder.h): when non-empty it replaces
  // shards/split: one divisor per operand, the node's inputs then its outputs (1 = whole on
  // every rank), and the node's FLOPs divide by work_shards.
  std::vector<double> operand_shards;
  double work_shards = 1;
  // The operands' shapes on one rank under this context (inputs then outputs; the largest
  // block: rank 0's of an even split, the most loaded rank's of an uneven one, as time is
  // priced), filled by a planner only for a model that asks
  // (CostModel::wants_local_shapes): a profile measured at the shapes each rank runs
  // (profiled_cost.h) answers by them. Empty: the planner did not say.
  std::vector<std::vector<std::int64_t>> local_shapes;
  // The node runs in a compiled program (a plan's `compile`, analysis/compiled_fusion.h): a
  // memory-bound node moves only its operands that cross memory. Null: eager.
  const analysis::FusedValues* compiled = nullptr;
  // The node's input gradient is all-reduced beside its weight gradient (the runtime's
  // asynchronous gradient, transform/async_gradients.h, runtime/async_gradients.py): a
  // compiled plan runs such an FP8 linear eagerly between compiled pieces, its casts unfused.
  bool async_input_gradient = false;
};

struct OpTime {
  double forward = 0;   // seconds
  double backward = 0;  // seconds
  bool contraction = false;  // priced on the matmul curve (for reports)
  // Seconds the node adds to a step beyond `forward` and `backward` when it runs inside a block
  // recomputed under the selective policy (runtime/recompute.py: torch.utils.checkpoint with a
  // policy function under a Python dispatch mode): its forward in the policy's caching mode, and
  // its replay in backward, returned from the cache where kept or run again otherwise. Measured
  // by a profile (profiled_cost.h, "selective"); < 0 where not measured, and the evaluators
  // take the rule of analysis/selective_recompute.h (a kept node 0, any other its forward).
  double selective_extra = -1;

  friend bool operator==(const OpTime&, const OpTime&) = default;
};

// The interface planners call. Implementations must be deterministic and thread-compatible
// (const methods, no hidden state that changes results).
class CostModel {
 public:
  virtual ~CostModel() = default;
  virtual OpTime node_time(const ir::Graph& graph, const ir::Node& node, const DeviceType& device,
                           Precision precision, const NodeContext& context) const = 0;
  // `algorithm` lets a caller that knows how a system issues a collective (e.g. ZeRO-3's
  // flat per-bucket gathers) ask for that algorithm rather than the best one.
  virtual double collective_time(const Cluster& cluster, CollectiveKind kind, std::span<const int> ranks,
                                 std::int64_t bytes, Algorithm algorithm) const = 0;
  // Whether node_time reads NodeContext::local_shapes: planners compute them only then
  // (the search prices millions of contexts; most models never look at shapes).
  virtual bool wants_local_shapes() const { return false; }
  // The optimizer step's seconds per parameter element a rank holds the state of, where it
  // was measured (a profile); none: the planners' bandwidth rule (every byte of the states
  // read and written at optimizer_memory_efficiency of the device's memory bandwidth).
  virtual std::optional<double> optimizer_seconds_per_element() const { return std::nullopt; }
};

// Each operand's shape (inputs then outputs) with its batch dim scaled by `batch_scale`
// (rounded, at least 1): the shapes of a context that only scales the batch.
std::vector<std::vector<std::int64_t>> batch_scaled_shapes(const ir::Graph& graph, const ir::Node& node,
                                                           double batch_scale);

struct AnalyticConstants {
  double max_efficiency = 0.75;        // matmul efficiency of a very large GEMM (fraction of peak)
  double half_efficiency_dim = 96;     // intensity d at which a GEMM reaches half of max_efficiency
  double memory_efficiency = 0.75;     // achieved / peak memory bandwidth of memory-bound kernels
  double contraction_backward_factor = 2.0;
  double memory_backward_factor = 2.0;
  double attention_backward_factor = 2.5;  // fused attention: backward / forward (5 products / 2)
  std::int64_t attention_block = 128;      // the tile a fused kernel skips above a causal diagonal
  double unfused_attention_score_bytes = 9.0;  // the math kernel: bytes per score, forward

  friend bool operator==(const AnalyticConstants&, const AnalyticConstants&) = default;
};

// What an FP8 linear's casts hold at once beyond their operands, as runtime/fp8.py runs them:
// each operand's |t| (its own dtype, 2 or 4 bytes an element) is freed once its amax is taken;
// then its scaled float32 copy and its float8 one are held together (5 bytes an element); the
// second operand (W) is cast beside the first's float8 copy (x in forward, dY in backward).
// `first` and `second` in elements, as one rank holds them.
inline constexpr double kFp8CastBytesPerElement = 4.0 + 1.0;
inline double fp8_cast_transient_bytes(double first, double second) {
  return std::max(kFp8CastBytesPerElement * first, first + kFp8CastBytesPerElement * second);
}
// An FP8 linear's backward at its peak, beyond the saved activations: dY (`dy_bytes`, the
// gradient it reads) beside dY's and W^T's casts, then beside their float8 copies and the
// input's gradient (`dx_bytes`) the product makes. `dy`, `w`: elements.
inline double fp8_backward_working_bytes(double dy_bytes, double dx_bytes, double dy, double w) {
  return dy_bytes + std::max(fp8_cast_transient_bytes(dy, w), dy + w + dx_bytes);
}

// The precision `node` computes in under a plan in `precision`: the plan's, but for "fp8" the
// node's own floating dtype's (bf16 in a bf16 model, as Float8 training runs; f32 in a float32
// one): an FP8 linear's dW and every other node.
Precision high_precision(const ir::Graph& graph, const ir::Node& node, Precision precision);

// matmul_efficiency(d) of the header comment.
double matmul_efficiency(const AnalyticConstants& constants, double intensity);

// What a measured device is in this model's terms. Cluster.detect times a square GEMM of n and
// a copy; the figures it writes into a DeviceType are the peak FLOP/s and bandwidth under which
// this model prices that very GEMM (aten::mm [n,n] x [n,n]: intensity n / 3) and that copy
// (2 x its bytes at memory_efficiency) at their measured times. Writing the achieved rates
// themselves would apply the model's efficiencies twice.
// Worked example (default constants): n = 1024, 45 GFLOP/s measured -> intensity 341.3,
// efficiency 0.75 x 341.3 / 437.3 = 0.585, peak 76.9 GFLOP/s; 15 GB/s copied -> 20 GB/s.
double peak_for_measured_gemm(const AnalyticConstants& constants, double measured_flops, std::int64_t n);
double bandwidth_for_measured_copy(const AnalyticConstants& constants, double measured_bytes_per_second);

// The fraction of the s x t scores a fused kernel computes: 1 without is_causal; with it, the
// tiles of `block` x `block` that hold at least one unmasked score (query i sees keys j <= i),
// weighted by their rows and columns inside the matrix.
// Worked example: s = t = 2048, block 128: 16 row tiles, row tile i computes i + 1 key tiles,
// (1 + ... + 16) / 256 = 136 / 256 = 0.531; s = t = 8192: 2080 / 4096 = 0.508.
double attention_causal_fraction(std::int64_t queries, std::int64_t keys, bool causal, std::int64_t block);

class AnalyticCostModel final : public CostModel {
 public:
  explicit AnalyticCostModel(AnalyticConstants constants = {}) : constants_(constants) {}

  const AnalyticConstants& constants() const { return constants_; }

  OpTime node_time(const ir::Graph& graph, const ir::Node& node, const DeviceType& device, Precision precision,
                   const NodeContext& context) const override;
  // The alpha-beta model of collective_cost.h.
  double collective_time(const Cluster& cluster, CollectiveKind kind, std::span<const int> ranks,
                         std::int64_t bytes, Algorithm algorithm) const override;

 private:
  OpTime compiled_memory_time(const ir::Graph& graph, const ir::Node& node, const analysis::FusedValues& fused,
                              const NodeContext& context, double bandwidth, bool zero_flops) const;
  OpTime fp8_linear_time(const ir::Graph& graph, const ir::Node& node, const analysis::Fp8Linear& linear,
                         const DeviceType& device, const NodeContext& context, double peak_work) const;

  AnalyticConstants constants_;
};

}  // namespace shardwise::cost
