// Test helper: a GPT-2-shaped graph built with the Graph API, with the ops, attributes,
// names and module paths torch.export gives for transformers' GPT2LMHeadModel (Conv1D as
// view + addmm + view, fused q|k|v split, sdpa, tied LM head), so analyses can be checked
// against GPT-2's analytic numbers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace shardwise::analysis::testing {

struct Gpt2Config {
  std::int64_t batch = 2;
  std::int64_t seq = 16;
  std::int64_t hidden = 768;
  std::int64_t heads = 12;
  std::int64_t vocab = 1000;
  std::int64_t positions = 64;
  int layers = 2;
  bool batch_dim_on_input = true;
  // GPT-2's "gelu_new" as torch.export spells it (8 pointwise nodes) instead of one aten::gelu.
  bool expanded_gelu = false;
};

// Parameters: V*h + P*h + 2h + layers * (12h^2 + 13h) (the LM head is tied to wte).
inline std::int64_t gpt2_parameter_count(const Gpt2Config& c) {
  const auto h = c.hidden;
  return c.vocab * h + c.positions * h + 2 * h + c.layers * (12 * h * h + 13 * h);
}

// Matrix multiply-adds: per layer 2BS(3h^2 + h^2 + 8h^2) + 2*2*B*S*S*h, plus the LM head 2BShV.
inline std::int64_t gpt2_matmul_flops(const Gpt2Config& c) {
  const auto b = c.batch, s = c.seq, h = c.hidden;
  return c.layers * (2 * b * s * (3 * h * h + h * h + 8 * h * h) + 2 * 2 * b * s * s * h) + 2 * b * s * h * c.vocab;
}

class Gpt2Builder {
 public:
  explicit Gpt2Builder(Gpt2Config config) : c_(config) {}

  ir::Graph build() {
    const auto b = c_.batch, s = c_.seq, h = c_.hidden;
    ids_ =
        g_.add_value("input_ids", type(ir::DType::I64, {b, s}, c_.batch_dim_on_input ? 0 : -1), ir::ValueRole::Input);
    const auto wte = param("transformer.wte.weight", {c_.vocab, h});
    const auto wpe = param("transformer.wpe.weight", {c_.positions, h});
    const auto arange = node("aten::arange", {}, type(ir::DType::I64, {s}), {{"end", s}}, "transformer");
    const auto pos =
        node("aten::unsqueeze", {arange}, type(ir::DType::I64, {1, s}), {{"dim", std::int64_t{0}}}, "transformer");
    const auto tok = node("aten::embedding", {wte, ids_}, f32({b, s, h}), {}, "transformer.wte");
    const auto pemb = node("aten::embedding", {wpe, pos}, f32({1, s, h}), {}, "transformer.wpe");
    auto x = node("aten::add.Tensor", {tok, pemb}, f32({b, s, h}), {}, "transformer");
    x = node("aten::dropout", {x}, f32({b, s, h}), {{"p", 0.1}, {"train", false}}, "transformer.drop");
    // The causal mask, built once outside the layers: every layer reads it.
    const auto ones = node("aten::ones", {}, type(ir::DType::Bool, {s, s}), {{"size", std::vector<std::int64_t>{s, s}}},
                           "transformer");
    mask_ = node("aten::tril", {ones}, type(ir::DType::Bool, {s, s}), {}, "transformer");
    for (int l = 0; l < c_.layers; ++l) x = layer(x, "transformer.h." + std::to_string(l));
    x = layer_norm(x, "transformer.ln_f");
    const auto logits = node("aten::linear", {x, wte}, f32({b, s, c_.vocab}), {}, "lm_head");
    g_.set_outputs({logits});
    return std::move(g_);
  }

 private:
  static ir::TensorType type(ir::DType dtype, std::vector<std::int64_t> shape, int batch_dim = -1) {
    ir::TensorType t{dtype, std::move(shape), {}};
    if (batch_dim >= 0) t.batch_dim = batch_dim;
    return t;
  }
  static ir::TensorType f32(std::vector<std::int64_t> shape) { return type(ir::DType::F32, std::move(shape)); }

  ir::ValueId param(const std::string& name, std::vector<std::int64_t> shape) {
    return g_.add_value(name, f32(std::move(shape)), ir::ValueRole::Parameter);
  }

  ir::ValueId node(std::string op, std::vector<ir::ValueId> inputs, ir::TensorType out, ir::Attributes attrs,
                   std::string module) {
    const auto id = g_.add_node(std::move(op), std::move(inputs), {{"v" + std::to_string(next_++), std::move(out)}},
                                std::move(attrs), std::move(module));
    return g_.node(id).outputs[0];
  }

  ir::ValueId layer_norm(ir::ValueId x, const std::string& module) {
    const auto h = c_.hidden;
    const auto w = param(module + ".weight", {h}), bias = param(module + ".bias", {h});
    return node("aten::layer_norm", {x, w, bias}, g_.value(x).type,
                {{"normalized_shape", std::vector<std::int64_t>{h}}, {"eps", 1e-5}}, module);
  }

  // transformers' Conv1D: view to 2-D, addmm(bias, x, weight [in, out]), view back.
  ir::ValueId conv1d(ir::ValueId x, std::int64_t in, std::int64_t out, const std::string& module) {
    const auto b = c_.batch, s = c_.seq;
    const auto w = param(module + ".weight", {in, out}), bias = param(module + ".bias", {out});
    const auto flat = node("aten::view", {x}, f32({b * s, in}), {{"size", std::vector<std::int64_t>{-1, in}}}, module);
    const auto mm = node("aten::addmm", {bias, flat, w}, f32({b * s, out}), {}, module);
    return node("aten::view", {mm}, f32({b, s, out}), {{"size", std::vector<std::int64_t>{b, s, out}}}, module);
  }

  ir::ValueId heads(ir::ValueId x, const std::string& module) {
    const auto b = c_.batch, s = c_.seq, n = c_.heads, d = c_.hidden / c_.heads;
    const auto v =
        node("aten::view", {x}, f32({b, s, n, d}), {{"size", std::vector<std::int64_t>{b, s, -1, d}}}, module);
    return node("aten::transpose.int", {v}, f32({b, n, s, d}), {{"dim0", std::int64_t{1}}, {"dim1", std::int64_t{2}}},
                module);
  }

  ir::ValueId gelu(ir::ValueId x, const std::string& module) {
    const auto t = g_.value(x).type;
    if (!c_.expanded_gelu) return node("aten::gelu", {x}, t, {{"approximate", std::string("tanh")}}, module);
    // 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))
    const auto half = node("aten::mul.Tensor", {x}, t, {{"other", 0.5}}, module);
    const auto cube = node("aten::pow.Tensor_Scalar", {x}, t, {{"exponent", 3.0}}, module);
    const auto scaled = node("aten::mul.Tensor", {cube}, t, {{"other", 0.044715}}, module);
    const auto sum = node("aten::add.Tensor", {x, scaled}, t, {}, module);
    const auto inner = node("aten::mul.Tensor", {sum}, t, {{"other", 0.7978845608028654}}, module);
    const auto tanh = node("aten::tanh", {inner}, t, {}, module);
    const auto one = node("aten::add.Tensor", {tanh}, t, {{"other", 1.0}}, module);
    return node("aten::mul.Tensor", {half, one}, t, {}, module);
  }

  ir::ValueId layer(ir::ValueId x, const std::string& p) {
    const auto b = c_.batch, s = c_.seq, h = c_.hidden;
    const auto n = c_.heads, d = h / n;
    // Attention.
    auto a = layer_norm(x, p + ".ln_1");
    const auto qkv = conv1d(a, h, 3 * h, p + ".attn.c_attn");
    const auto split = g_.add_node("aten::split.Tensor", {qkv},
                                   {{"v" + std::to_string(next_++), f32({b, s, h})},
                                    {"v" + std::to_string(next_++), f32({b, s, h})},
                                    {"v" + std::to_string(next_++), f32({b, s, h})}},
                                   {{"split_size", h}, {"dim", std::int64_t{2}}}, p + ".attn");
    const auto parts = g_.node(split).outputs;  // a copy: adding nodes moves the node list
    const auto q = heads(parts[0], p + ".attn"), k = heads(parts[1], p + ".attn"), v = heads(parts[2], p + ".attn");
    auto o = node("aten::scaled_dot_product_attention", {q, k, v, mask_}, f32({b, n, s, d}), {{"scale", 0.125}},
                  p + ".attn");
    o = node("aten::transpose.int", {o}, f32({b, s, n, d}), {{"dim0", std::int64_t{1}}, {"dim1", std::int64_t{2}}},
             p + ".attn");
    o = node("aten::reshape", {o}, f32({b, s, h}), {{"shape", std::vector<std::int64_t>{b, s, -1}}}, p + ".attn");
    o = conv1d(o, h, h, p + ".attn.c_proj");
    o = node("aten::dropout", {o}, f32({b, s, h}), {{"p", 0.1}, {"train", false}}, p + ".attn.resid_dropout");
    x = node("aten::add.Tensor", {o, x}, f32({b, s, h}), {}, p);
    // MLP.
    auto m = layer_norm(x, p + ".ln_2");
    m = conv1d(m, h, 4 * h, p + ".mlp.c_fc");
    m = gelu(m, p + ".mlp.act");
    m = conv1d(m, 4 * h, h, p + ".mlp.c_proj");
    m = node("aten::dropout", {m}, f32({b, s, h}), {{"p", 0.1}, {"train", false}}, p + ".mlp.dropout");
    return node("aten::add.Tensor", {x, m}, f32({b, s, h}), {}, p);
  }

  Gpt2Config c_;
  ir::Graph g_;
  ir::ValueId ids_ = -1;
  ir::ValueId mask_ = -1;
  int next_ = 0;
};

inline ir::Graph gpt2_like_graph(const Gpt2Config& config = {}) { return Gpt2Builder(config).build(); }

}  // namespace shardwise::analysis::testing
