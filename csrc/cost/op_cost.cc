// The analytic op-cost model; see op_cost.h for the formulas.
//
// Why these default constants (AnalyticConstants): they are the one set the Megatron-LM
// benchmark (benchmarks/megatron.py) is run with, for every row and model size:
//  - max_efficiency 0.75: cuBLAS bf16 GEMMs of transformer sizes reach 70-80% of the A100's
//    312 TFLOP/s in isolation.
//  - half_efficiency_dim 96: a GEMM whose intensity is ~100 multiply-adds per element (a
//    64/128-wide attention head, a 1/8 slice of a small layer) runs at about half that.
//  - memory_efficiency 0.75: streaming kernels reach ~75% of HBM bandwidth.
//  - attention_backward_factor 2.5: FlashAttention-2's backward recomputes the scores and
//    computes dV, dP, dQ and dK, five products of the forward's size against its two
//    (Dao 2023, section 3.2); not fitted.
//  - attention_block 128: the key/query tile of FlashAttention-2 and of torch's memory-
//    efficient kernel on sm80/sm90 at head dim <= 128; a causal kernel skips whole tiles.
//    Not fitted either: at s = 2048 it prices 53% of the scores, at 8192 51%.
//  - unfused_attention_score_bytes 9, fitted on Megatron-LM 2021's Table 1 (Narayanan et al.,
//    benchmarks/megatron.py, the only rows it was fitted on): what the unfused attention of
//    Megatron-LM 2021 moves per score beyond its two GEMMs, priced on the one node that
//    stands for that kernel, aten::_scaled_dot_product_attention_math: the fused
//    scale-mask-softmax reads the bf16 scores and writes the probabilities (2 + 2), dropout
//    reads them and writes the dropped ones and a 1-byte mask (2 + 2 + 1). The QK^T GEMM's
//    write of the scores and the PV GEMM's read of them are in the fit, not counted apart.
//    Until 2026-11 every attention node was priced so, flash kernels included.
#include "cost/op_cost.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <string_view>
#include <variant>

#include "analysis/compiled_fusion.h"
#include "analysis/flops.h"
#include "ops/op_table.h"

namespace shardwise::cost {
namespace {

// Activations and inputs scale with the batch; parameters, buffers and constants do not.
// (Not batch_dim: a graph built at batch 1 loses it through [b*s, h] views.)
bool scales_with_batch(const ir::Value& value) {
  return value.role == ir::ValueRole::Activation || value.role == ir::ValueRole::Input;
}

// Elements of a value on one rank under the context: scaled by the batch, divided by the
// tensor-parallel degree when the split covers it.
// `operand`: the value's position among the node's inputs then outputs (for
// NodeContext::operand_shards).
double local_elements(const ir::Value& value, const NodeContext& context, bool is_output, std::size_t operand) {
  double elements = static_cast<double>(value.type.numel());
  if (scales_with_batch(value)) elements *= context.batch_scale;
  if (!context.operand_shards.empty()) {
    return operand < context.operand_shards.size() ? elements / context.operand_shards[operand] : elements;
  }
  bool split = false;
  switch (context.split) {
    case TensorSplit::None: break;
    case TensorSplit::All: split = true; break;
    // Column: Y[:, n/t] = X W[:, n/t]; Row: Y (partial) = X[:, k/t] W[k/t, :].
    case TensorSplit::Column: split = is_output || value.role == ir::ValueRole::Parameter; break;
    case TensorSplit::Row:
      // A 1-D parameter of a row-parallel product is its bias: added once after the all-reduce.
      split = !is_output && (value.role != ir::ValueRole::Parameter || value.type.rank() >= 2);
      break;
  }
  return split ? elements / context.shards : elements;
}

double local_bytes(const ir::Value& value, const NodeContext& context, bool is_output, std::size_t operand) {
  return local_elements(value, context, is_output, operand) * ir::dtype_bytes(value.type.dtype);
}

// Work scales with the batch when the output does and divides by t under any split.
double work_scale(const ir::Graph& graph, const ir::Node& node, const NodeContext& context) {
  double scale = 1.0;
  if (!node.outputs.empty() && scales_with_batch(graph.value(node.outputs[0]))) scale = context.batch_scale;
  if (!context.operand_shards.empty()) return scale / context.work_shards;
  if (context.split != TensorSplit::None) scale /= context.shards;
  return scale;
}

// An attention's two products divide apart: the scores Q K^T by what splits the query's rows
// (batch, heads, sequence: q's shards), the weighted sum P V by what splits the output (those,
// and the value's columns e). A split of e alone leaves every rank all the scores. {scores'
// scale, products' scale}; the products' FLOPs are the two in the ratio of D to e.
std::pair<double, double> attention_work_scales(const ir::Graph& graph, const ir::Node& node,
                                                const NodeContext& context) {
  const double whole = work_scale(graph, node, context);
  if (context.operand_shards.empty() || node.inputs.size() < 3 || node.outputs.empty()) return {whole, whole};
  const double batch = whole * context.work_shards;
  const double scores = batch / context.operand_shards[0];
  const double weighted = batch / context.operand_shards[node.inputs.size()];
  const auto& q = graph.value(node.inputs[0]).type.shape;
  const auto& v = graph.value(node.inputs[2]).type.shape;
  if (q.empty() || v.empty()) return {whole, whole};
  const double d = static_cast<double>(q.back()), e = static_cast<double>(v.back());
  return {scores, (d * scores + e * weighted) / (d + e)};
}

}  // namespace

double attention_causal_fraction(std::int64_t queries, std::int64_t keys, bool causal, std::int64_t block) {
  if (!causal || queries <= 0 || keys <= 0) return 1.0;
  block = std::max<std::int64_t>(block, 1);
  double computed = 0;
  for (std::int64_t row = 0; row < queries; row += block) {
    const std::int64_t rows = std::min(block, queries - row);
    // The tile's last query sees keys 0 .. row + rows - 1; the kernel computes every key
    // tile up to the one holding that key.
    const std::int64_t seen = std::min(row + rows, keys);
    const std::int64_t key_tiles = (seen + block - 1) / block;
    computed += static_cast<double>(rows) * static_cast<double>(std::min(key_tiles * block, keys));
  }
  return computed / (static_cast<double>(queries) * static_cast<double>(keys));
}

namespace {

bool attribute_true(const ir::Node& node, std::string_view name) {
  auto found = node.attrs.find(name);
  if (found == node.attrs.end()) return false;
  const bool* value = std::get_if<bool>(&found->second);
  return value != nullptr && *value;
}

// attention_causal_fraction of a fused attention node: q [..., s, d], k [..., t, d].
double causal_fraction(const ir::Graph& graph, const ir::Node& node, std::int64_t block) {
  if (node.inputs.size() < 2) return 1.0;
  const auto& q = graph.value(node.inputs[0]).type.shape;
  const auto& k = graph.value(node.inputs[1]).type.shape;
  if (q.size() < 2 || k.size() < 2) return 1.0;
  return attention_causal_fraction(q[q.size() - 2], k[k.size() - 2], attribute_true(node, "is_causal"), block);
}

}  // namespace

Precision high_precision(const ir::Graph& graph, const ir::Node& node, Precision precision) {
  if (precision != Precision::FP8) return precision;
  // The node's own floating dtype: a bf16 model (Float8 training's) computes in bf16.
  auto floating = [&](ir::ValueId id) { return ir::is_floating(graph.value(id).type.dtype); };
  ir::DType dtype = ir::DType::BF16;
  for (ir::ValueId id : node.outputs)
    if (floating(id)) { dtype = graph.value(id).type.dtype; break; }
  if (dtype == ir::DType::F32 || dtype == ir::DType::F64) return Precision::F32;
  return dtype == ir::DType::F16 ? Precision::F16 : Precision::BF16;
}

double peak_for_measured_gemm(const AnalyticConstants& constants, double measured_flops, std::int64_t n) {
  return measured_flops / matmul_efficiency(constants, static_cast<double>(n) / 3.0);
}

double bandwidth_for_measured_copy(const AnalyticConstants& constants, double measured_bytes_per_second) {
  return measured_bytes_per_second / constants.memory_efficiency;
}

std::vector<std::vector<std::int64_t>> batch_scaled_shapes(const ir::Graph& graph, const ir::Node& node,
                                                           double batch_scale) {
  std::vector<std::vector<std::int64_t>> out;
  out.reserve(node.inputs.size() + node.outputs.size());
  auto add = [&](ir::ValueId v) {
    const ir::TensorType& type = graph.value(v).type;
    out.push_back(type.shape);
    if (type.batch_dim && batch_scale != 1.0) {
      std::int64_t& rows = out.back()[static_cast<std::size_t>(*type.batch_dim)];
      rows = std::max<std::int64_t>(1, std::llround(static_cast<double>(rows) * batch_scale));
    }
  };
  for (ir::ValueId v : node.inputs) add(v);
  for (ir::ValueId v : node.outputs) add(v);
  return out;
}

double matmul_efficiency(const AnalyticConstants& constants, double intensity) {
  if (intensity <= 0) return constants.max_efficiency;  // no elements: degenerate, never slower than max
  return constants.max_efficiency * intensity / (intensity + constants.half_efficiency_dim);
}

OpTime AnalyticCostModel::node_time(const ir::Graph& graph, const ir::Node& node, const DeviceType& device,
                                    Precision precision, const NodeContext& context) const {
  const ops::OpSpec* spec = ops::OpTable::builtin().find(node.op);
  ops::FlopsKind kind = spec != nullptr ? spec->flops.kind : ops::FlopsKind::Zero;
  double bandwidth = device.memory_bandwidth * constants_.memory_efficiency;
  OpTime time;

  // A lookup (embedding) scatters its output gradient into a dense gradient of the whole
  // table: zeroed, then written, on every rank that holds the table (a vocabulary split
  // divides it). Compiled or not.
  const bool lookup = spec != nullptr && spec->lookup && !node.inputs.empty() &&
                      ir::is_floating(graph.value(node.inputs[0]).type.dtype);
  const double table_gradient = lookup ? 2.0 * local_bytes(graph.value(node.inputs[0]), context, false, 0) / bandwidth : 0.0;
  if (context.compiled != nullptr && (kind == ops::FlopsKind::Zero || kind == ops::FlopsKind::PerOutputElement ||
                                      kind == ops::FlopsKind::PerInputElement)) {
    time = compiled_memory_time(graph, node, *context.compiled, context, bandwidth, kind == ops::FlopsKind::Zero);
    time.backward += table_gradient;
    return time;
  }
  if (kind == ops::FlopsKind::Zero) {
    if (analysis::is_alias(graph, node)) return time;
    double bytes = 0;
    for (std::size_t o = 0; o < node.outputs.size(); ++o) {
      bytes += 2.0 * local_bytes(graph.value(node.outputs[o]), context, true, node.inputs.size() + o);
    }
    time.forward = bytes / bandwidth;
    time.backward = constants_.memory_backward_factor * time.forward + table_gradient;
    return time;
  }

  if (kind == ops::FlopsKind::Contraction || kind == ops::FlopsKind::Convolution ||
      kind == ops::FlopsKind::Attention || kind == ops::FlopsKind::Experts) {
    analysis::NodeFlops flops = analysis::node_flops(ops::OpTable::builtin(), graph, node);
    const bool attention = kind == ops::FlopsKind::Attention;
    const auto [scores_scale, scale] =
        attention ? attention_work_scales(graph, node, context)
                  : std::pair{work_scale(graph, node, context), work_scale(graph, node, context)};
    double matmul = static_cast<double>(flops.matmul) * scale;
    const bool unfused = attention && ops::op_base_name(node.op) == "aten::_scaled_dot_product_attention_math";
    const bool flash = attention && !unfused;
    if (flash) matmul *= causal_fraction(graph, node, constants_.attention_block);
    double elements = 0;
    for (std::size_t i = 0; i < node.inputs.size(); ++i) {
      elements += local_elements(graph.value(node.inputs[i]), context, false, i);
    }
    // An attention kernel's products stream Q, K, V and write the output: its further
    // outputs (the log-sum-exp, the math kernel's probabilities) are not GEMM operands.
    const std::size_t gemm_outputs = attention ? std::min<std::size_t>(node.outputs.size(), 1) : node.outputs.size();
    for (std::size_t o = 0; o < gemm_outputs; ++o) {
      elements += local_elements(graph.value(node.outputs[o]), context, true, node.inputs.size() + o);
    }
    double intensity = elements > 0 ? matmul / (2.0 * elements) : 0.0;
    double efficiency = matmul_efficiency(constants_, intensity);
    time.contraction = true;
    if (precision == Precision::FP8) {
      if (auto linear = analysis::fp8_linear(graph, node)) return fp8_linear_time(graph, node, *linear, device,
                                                                                  context, matmul / efficiency);
    }
    time.forward = matmul / (device.peak_flops.at(high_precision(graph, node, precision)) * efficiency);
    time.backward = (flash ? constants_.attention_backward_factor : constants_.contraction_backward_factor) *
                    time.forward;
    // A fused attention's softmax (exp, max, sum per score) runs between its products on
    // the tiles in registers: no bytes cross memory, and its FLOPs are not priced apart.
    // The math kernel computes every score and moves unfused_attention_score_bytes each.
    if (unfused && spec->flops.per_element > 0) {
      double scores = static_cast<double>(flops.total - flops.matmul) * scores_scale / spec->flops.per_element;
      double softmax = scores * constants_.unfused_attention_score_bytes / bandwidth;
      time.forward += softmax;
      time.backward += constants_.memory_backward_factor * softmax;
    }
    // A bias (the rest of an addmm's FLOPs) is fused into the GEMM epilogue: free.
    return time;
  }

  // Memory-bound: pointwise, normalisations, reductions, losses. A pointwise op reading a
  // pointwise op's output is fused with it (Megatron's bias-GeLU, torch.compile): that input
  // stays in registers, so only the chain's first inputs and each output cross HBM.
  double bytes = 0;
  for (std::size_t i = 0; i < node.inputs.size(); ++i) {
    const ir::Value& value = graph.value(node.inputs[i]);
    if (kind == ops::FlopsKind::PerOutputElement && value.producer.has_value()) {
      const ops::OpSpec* from = ops::OpTable::builtin().find(graph.node(*value.producer).op);
      if (from != nullptr && from->flops.kind == ops::FlopsKind::PerOutputElement) continue;
    }
    bytes += local_bytes(value, context, false, i);
  }
  for (std::size_t o = 0; o < node.outputs.size(); ++o) {
    bytes += local_bytes(graph.value(node.outputs[o]), context, true, node.inputs.size() + o);
  }
  time.forward = bytes / bandwidth;
  time.backward = constants_.memory_backward_factor * time.forward;
  return time;
}

// A memory-bound node of a compiled program: the bytes of the operands that cross memory
// (analysis/compiled_fusion.h). A copy or gather (`zero_flops`: cat, embedding, index) reads at
// most what it writes: a lookup reads its rows, not the table.
OpTime AnalyticCostModel::compiled_memory_time(const ir::Graph& graph, const ir::Node& node,
                                               const analysis::FusedValues& fused, const NodeContext& context,
                                               double bandwidth, bool zero_flops) const {
  OpTime time;
  if (analysis::is_alias(graph, node)) return time;
  double read = 0, written = 0, made = 0;
  for (std::size_t i = 0; i < node.inputs.size(); ++i) {
    if (fused.read_from_memory(node.inputs[i], node.id)) read += local_bytes(graph.value(node.inputs[i]), context, false, i);
  }
  for (std::size_t o = 0; o < node.outputs.size(); ++o) {
    const double bytes = local_bytes(graph.value(node.outputs[o]), context, true, node.inputs.size() + o);
    made += bytes;
    if (!fused.in_registers(node.outputs[o])) written += bytes;
  }
  if (zero_flops) read = std::min(read, made);
  time.forward = (read + written) / bandwidth;
  time.backward = constants_.memory_backward_factor * time.forward;
  return time;
}

// An FP8 linear (analysis/fp8_linears.h): forward, x W^T at the fp8 peak after the casts of x
// and W; backward, dx = dy W at the fp8 peak after the casts of dy and W (column scales) and
// dW = dy^T x at the peak of the node's dtype. A cast runs as runtime/fp8.py's quantize does:
// |t| (reads b bytes an element, writes b) and its amax (reads b), the scaled copy in float32
// (reads b, writes 4), its cast to float8 (reads 4, writes 1): 4b + 9 bytes an element. One of W's two casts reads W
// through a transpose and is copied once more into the layout _scaled_mm takes (1 + 1 bytes).
// `peak_work` is the product's FLOPs over its efficiency.
OpTime AnalyticCostModel::fp8_linear_time(const ir::Graph& graph, const ir::Node& node,
                                          const analysis::Fp8Linear& linear, const DeviceType& device,
                                          const NodeContext& context, double peak_work) const {
  const double bandwidth = device.memory_bandwidth * constants_.memory_efficiency;
  const ir::Value& x = graph.value(node.inputs[linear.input]);
  const ir::Value& w = graph.value(node.inputs[linear.weight]);
  // Compiled, the runtime traces an FP8 linear (runtime/compiled.py; its amax all-reduce, where
  // the weight is split, a traced op; a gathered weight's float8 W^T saved, no regather) unless
  // its input gradient is all-reduced asynchronously: its casts fused, one kernel per operand
  // reading it twice (the row's amax, then the scaled cast) and writing its float8 copy, 2b + 1
  // bytes an element, the transposed W written in the layout _scaled_mm takes.
  const bool fused = context.compiled != nullptr && !context.async_input_gradient;
  auto cast_seconds = [&](const ir::Value& value, bool output, std::size_t index, double extra_per_element) {
    if (fused) return (2.0 * local_bytes(value, context, output, index) + local_elements(value, context, output, index)) /
                      bandwidth;
    return (4.0 * local_bytes(value, context, output, index) +
            (9.0 + extra_per_element) * local_elements(value, context, output, index)) /
           bandwidth;
  };
  const ir::Value& y = graph.value(node.outputs[0]);
  const double fp8_product = peak_work / device.peak_flops.at(Precision::FP8);
  OpTime time;
  time.contraction = true;
  time.forward = fp8_product + cast_seconds(x, false, linear.input, 0) + cast_seconds(w, false, linear.weight, 0);
  time.backward = fp8_product + peak_work / device.peak_flops.at(high_precision(graph, node, Precision::FP8)) +
                  cast_seconds(y, true, node.inputs.size(), 0) + cast_seconds(w, false, linear.weight, 2);
  return time;
}

double AnalyticCostModel::collective_time(const Cluster& cluster, CollectiveKind kind, std::span<const int> ranks,
                                          std::int64_t bytes, Algorithm algorithm) const {
  return cost::collective_time(cluster, kind, ranks, bytes, algorithm);
}

}  // namespace shardwise::cost
