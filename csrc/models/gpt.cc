#include "models/gpt.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "analysis/batch_dim.h"
#include "ops/op_table.h"
#include "support/error.h"

namespace shardwise::models {
namespace {

using ir::Attributes;
using ir::DType;
using ir::TensorType;
using ir::ValueId;
using Shape = std::vector<std::int64_t>;

void require_positive(std::string_view field, int value) {
  if (value <= 0) {
    throw support::ValidationError(fmt::format("build_gpt: GptConfig.{} must be positive, got {}", field, value));
  }
}

void validate(const GptConfig& c) {
  require_positive("layers", c.layers);
  require_positive("hidden", c.hidden);
  require_positive("heads", c.heads);
  require_positive("seq", c.seq);
  require_positive("vocab", c.vocab);
  require_positive("batch", c.batch);
  if (c.ffn_hidden < 0) {
    throw support::ValidationError(
        fmt::format("build_gpt: GptConfig.ffn_hidden must be positive (or 0 for 4 x hidden), got {}", c.ffn_hidden));
  }
  if (c.positions < 0) {
    throw support::ValidationError(
        fmt::format("build_gpt: GptConfig.positions must be positive (or 0 for seq), got {}", c.positions));
  }
  if (c.hidden % c.heads != 0) {
    throw support::ValidationError(
        fmt::format("build_gpt: GptConfig.hidden ({}) must be a multiple of GptConfig.heads ({})", c.hidden, c.heads));
  }
  if (c.experts < 0 || (c.experts > 0 && (c.experts_per_token < 1 || c.experts_per_token > c.experts))) {
    throw support::ValidationError(fmt::format(
        "build_gpt: GptConfig.experts ({}) must be 0 or positive, with experts_per_token ({}) between 1 and it",
        c.experts, c.experts_per_token));
  }
  if (c.dense_layers < 0 || c.dense_layers > c.layers) {
    throw support::ValidationError(fmt::format(
        "build_gpt: GptConfig.dense_layers ({}) must be between 0 and GptConfig.layers ({})", c.dense_layers, c.layers));
  }
  if (c.positions != 0 && c.positions < c.seq) {
    // wpe has one row per position: GPT-2 fails to index a longer sequence.
    throw support::ValidationError(
        fmt::format("build_gpt: GptConfig.positions ({}) must be at least GptConfig.seq ({})", c.positions, c.seq));
  }
  if (c.dtype != DType::F64 && c.dtype != DType::F32 && c.dtype != DType::F16 && c.dtype != DType::BF16) {
    throw support::ValidationError(
        fmt::format("build_gpt: GptConfig.dtype must be f64, f32, f16 or bf16, got {}", ir::dtype_name(c.dtype)));
  }
  if (!(c.dropout >= 0.0 && c.dropout <= 1.0)) {
    throw support::ValidationError(fmt::format("build_gpt: GptConfig.dropout must be in [0, 1], got {}", c.dropout));
  }
  if (!(c.layer_norm_eps > 0.0)) {
    throw support::ValidationError(
        fmt::format("build_gpt: GptConfig.layer_norm_eps must be positive, got {}", c.layer_norm_eps));
  }
}

// Activation names in torch.fx's style, so a built graph reads like a capture: the base name,
// then base_1, base_2, ...; a base that would shadow a Python builtin (pow, slice) starts at _1,
// as fx's namespace does.
class Namer {
 public:
  std::string operator()(std::string_view base) {
    auto [it, inserted] = next_.try_emplace(std::string(base), 0);
    if (inserted && (base == "pow" || base == "slice")) it->second = 1;
    const int n = it->second++;
    return n == 0 ? std::string(base) : fmt::format("{}_{}", base, n);
  }

 private:
  std::unordered_map<std::string, int> next_;
};

struct LayerParams {
  ValueId ln_1_weight, ln_1_bias, c_attn_weight, c_attn_bias, attn_proj_weight, attn_proj_bias;
  ValueId ln_2_weight, ln_2_bias, c_fc_weight, c_fc_bias, mlp_proj_weight, mlp_proj_bias;
  ValueId router_weight = -1, gate_up_weight = -1, down_weight = -1;  // GptConfig::experts > 0
};

class GptBuilder {
 public:
  explicit GptBuilder(const GptConfig& c)
      : c_(c),
        b_(c.batch),
        s_(c.seq),
        h_(c.hidden),
        nh_(c.heads),
        hd_(c.hidden / c.heads),
        f_(c.ffn_hidden == 0 ? 4 * std::int64_t{c.hidden} : c.ffn_hidden),
        v_(c.vocab),
        p_(c.positions == 0 ? c.seq : c.positions) {}

  ir::Graph build() && {
    declare_parameters();
    if (c_.attention == GptAttention::Eager) {
      causal_mask_ = g_.add_value("causal_mask", typed(DType::Bool, {1, 1, s_, s_}), ir::ValueRole::Buffer);
    }
    const ValueId input_ids = g_.add_value("input_ids", batched(DType::I64, {b_, s_}), ir::ValueRole::Input);
    const ValueId labels =
        c_.with_loss ? g_.add_value("labels", batched(DType::I64, {b_, s_}), ir::ValueRole::Input) : ValueId{-1};

    ValueId x = embeddings(input_ids);
    for (int i = 0; i < c_.layers; ++i) x = layer(x, i);
    x = layer_norm(x, ln_f_weight_, ln_f_bias_, "transformer.ln_f");
    // GPT2Model's hidden_states.view(output_shape), then GPT2LMHeadModel's
    // hidden_states[:, slice(-0, None), :] (logits_to_keep=0), which export records as alias.
    x = op("aten::view", "view", {x}, act({b_, s_, h_}), {{"size", Shape{-1, s_, h_}}}, "transformer");
    x = op("aten::alias", "alias", {x}, act({b_, s_, h_}), {}, "");
    const ValueId logits =
        op("aten::linear", "linear", {x, lm_head_weight_}, act({b_, s_, v_}), {{"bias", ir::NoneAttr{}}}, "lm_head");
    if (c_.with_loss) {
      const auto [loss, upcast] = causal_lm_loss(logits, labels);
      g_.set_outputs({loss, c_.dtype == DType::F32 ? upcast : logits});
    } else {
      g_.set_outputs({logits});
    }
    analysis::propagate_batch_dim(ops::OpTable::builtin(), g_);
    return std::move(g_);
  }

 private:
  // ---- values ------------------------------------------------------------------------------
  TensorType act(Shape shape) const { return TensorType{c_.dtype, std::move(shape), {}}; }
  static TensorType typed(DType dtype, Shape shape) { return TensorType{dtype, std::move(shape), {}}; }
  static TensorType batched(DType dtype, Shape shape) { return TensorType{dtype, std::move(shape), 0}; }

  ValueId param(const std::string& name, Shape shape) {
    return g_.add_value(name, act(std::move(shape)), ir::ValueRole::Parameter);
  }

  // In named_parameters() order, as a capture declares them.
  void declare_parameters() {
    wte_ = param("transformer.wte.weight", {v_, h_});
    wpe_ = param("transformer.wpe.weight", {p_, h_});
    layers_.reserve(static_cast<std::size_t>(c_.layers));
    for (int i = 0; i < c_.layers; ++i) {
      const std::string p = fmt::format("transformer.h.{}.", i);
      LayerParams l{};
      l.ln_1_weight = param(p + "ln_1.weight", {h_});
      l.ln_1_bias = param(p + "ln_1.bias", {h_});
      l.c_attn_weight = param(p + "attn.c_attn.weight", {h_, 3 * h_});
      l.c_attn_bias = param(p + "attn.c_attn.bias", {3 * h_});
      l.attn_proj_weight = param(p + "attn.c_proj.weight", {h_, h_});
      l.attn_proj_bias = param(p + "attn.c_proj.bias", {h_});
      l.ln_2_weight = param(p + "ln_2.weight", {h_});
      l.ln_2_bias = param(p + "ln_2.bias", {h_});
      if (c_.experts > 0 && i >= c_.dense_layers) {
        const std::int64_t e = c_.experts;
        l.router_weight = param(p + "mlp.gate.weight", {e, h_});
        l.gate_up_weight = param(p + "mlp.experts.gate_up_proj", {e, 2 * f_, h_});
        l.down_weight = param(p + "mlp.experts.down_proj", {e, h_, f_});
        layers_.push_back(l);
        continue;
      }
      l.c_fc_weight = param(p + "mlp.c_fc.weight", {h_, f_});
      l.c_fc_bias = param(p + "mlp.c_fc.bias", {f_});
      l.mlp_proj_weight = param(p + "mlp.c_proj.weight", {f_, h_});
      l.mlp_proj_bias = param(p + "mlp.c_proj.bias", {h_});
      layers_.push_back(l);
    }
    ln_f_weight_ = param("transformer.ln_f.weight", {h_});
    ln_f_bias_ = param("transformer.ln_f.bias", {h_});
    // A tied lm_head is the same tensor as wte: one value, named by its first name.
    lm_head_weight_ = c_.tie_embeddings ? wte_ : param("lm_head.weight", {v_, h_});
  }

  // ---- nodes -------------------------------------------------------------------------------
  ValueId op(std::string name, std::string_view base, std::vector<ValueId> inputs, TensorType out, Attributes attrs,
             std::string module) {
    const auto n = g_.add_node(std::move(name), std::move(inputs), {{names_(base), std::move(out)}}, std::move(attrs),
                               std::move(module));
    return g_.node(n).outputs.front();
  }

  // Tensor.to(...) with a dtype (and device, as the position embeddings and the labels do).
  Attributes to_dtype_layout(DType dtype) const {
    return {{"copy", false},
            {"device", std::string("meta")},
            {"dtype", std::string(ir::dtype_name(dtype))},
            {"layout", std::string("torch.strided")},
            {"memory_format", ir::NoneAttr{}},
            {"non_blocking", false},
            {"pin_memory", ir::NoneAttr{}}};
  }

  ValueId dropout(ValueId x, const std::string& module) {
    const TensorType type = g_.value(x).type;
    return op("aten::dropout", "dropout", {x}, typed(type.dtype, type.shape), {{"p", c_.dropout}, {"train", false}},
              module);
  }

  ValueId layer_norm(ValueId x, ValueId weight, ValueId bias, const std::string& module) {
    return op("aten::layer_norm", "layer_norm", {x, weight, bias}, act({b_, s_, h_}),
              {{"cudnn_enable", false}, {"eps", c_.layer_norm_eps}, {"normalized_shape", Shape{h_}}}, module);
  }

  // GPT-2's Conv1D: x.view(-1, in) -> addmm(bias, x, weight) -> view(b, s, out).
  ValueId conv1d(ValueId x, ValueId weight, ValueId bias, std::int64_t in, std::int64_t out,
                 const std::string& module) {
    x = op("aten::view", "view", {x}, act({b_ * s_, in}), {{"size", Shape{-1, in}}}, module);
    x = op("aten::addmm", "addmm", {bias, x, weight}, act({b_ * s_, out}),
           {{"alpha", std::int64_t{1}}, {"beta", std::int64_t{1}}}, module);
    return op("aten::view", "view", {x}, act({b_, s_, out}), {{"size", Shape{b_, s_, out}}}, module);
  }

  ValueId embeddings(ValueId input_ids) {
    const Attributes embedding_attrs{
        {"padding_idx", std::int64_t{-1}}, {"scale_grad_by_freq", false}, {"sparse", false}};
    const ValueId ids =
        op("aten::view", "view", {input_ids}, typed(DType::I64, {b_, s_}), {{"size", Shape{-1, s_}}}, "transformer");
    const ValueId tokens =
        op("aten::embedding", "embedding", {wte_, ids}, act({b_, s_, h_}), embedding_attrs, "transformer.wte");
    // position_ids = arange(past_length, past_length + seq).unsqueeze(0), past_length 0.
    ValueId positions = op("aten::arange", "arange", {}, typed(DType::I64, {s_}),
                           {{"device", std::string("meta")},
                            {"dtype", ir::NoneAttr{}},
                            {"end", s_},
                            {"layout", ir::NoneAttr{}},
                            {"pin_memory", false}},
                           "transformer");
    positions = op("aten::add.Tensor", "add", {positions}, typed(DType::I64, {s_}),
                   {{"alpha", std::int64_t{1}}, {"other", std::int64_t{0}}}, "transformer");
    const ValueId position_ids = op("aten::unsqueeze", "unsqueeze", {positions}, typed(DType::I64, {1, s_}),
                                    {{"dim", std::int64_t{0}}}, "transformer");
    ValueId pos =
        op("aten::embedding", "embedding", {wpe_, position_ids}, act({1, s_, h_}), embedding_attrs, "transformer.wpe");
    pos = op("aten::to.dtype_layout", "to", {pos}, act({1, s_, h_}), to_dtype_layout(c_.dtype), "transformer");
    const ValueId sum =
        op("aten::add.Tensor", "add", {tokens, pos}, act({b_, s_, h_}), {{"alpha", std::int64_t{1}}}, "transformer");
    return dropout(sum, "transformer.drop");
  }

  ValueId layer(ValueId x, int i) {
    const LayerParams& w = layers_[static_cast<std::size_t>(i)];
    const std::string p = fmt::format("transformer.h.{}", i);
    const std::string attn = p + ".attn";
    const ValueId residual = x;
    x = layer_norm(x, w.ln_1_weight, w.ln_1_bias, p + ".ln_1");
    x = conv1d(x, w.c_attn_weight, w.c_attn_bias, h_, 3 * h_, attn + ".c_attn");
    x = attention(x, attn);
    x = conv1d(x, w.attn_proj_weight, w.attn_proj_bias, h_, h_, attn + ".c_proj");
    x = dropout(x, attn + ".resid_dropout");
    // attn_output + residual, then residual + feed_forward: GPT2Block's operand orders.
    x = op("aten::add.Tensor", "add", {x, residual}, act({b_, s_, h_}), {{"alpha", std::int64_t{1}}}, p);
    const ValueId residual_2 = x;
    x = layer_norm(x, w.ln_2_weight, w.ln_2_bias, p + ".ln_2");
    if (w.router_weight >= 0) {
      x = mixture_of_experts(x, w, p + ".mlp");
    } else {
      x = conv1d(x, w.c_fc_weight, w.c_fc_bias, h_, f_, p + ".mlp.c_fc");
      x = gelu_new(x, p + ".mlp.act");
      x = conv1d(x, w.mlp_proj_weight, w.mlp_proj_bias, f_, h_, p + ".mlp.c_proj");
    }
    x = dropout(x, p + ".mlp.dropout");
    return op("aten::add.Tensor", "add", {residual_2, x}, act({b_, s_, h_}), {{"alpha", std::int64_t{1}}}, p);
  }

  // GPT2Attention with sdpa: split the fused qkv, heads out, attention, heads back in.
  ValueId attention(ValueId qkv, const std::string& m) {
    const auto split = g_.add_node("aten::split.Tensor", {qkv},
                                   {{names_("getitem"), act({b_, s_, h_})},
                                    {names_("getitem"), act({b_, s_, h_})},
                                    {names_("getitem"), act({b_, s_, h_})}},
                                   {{"dim", std::int64_t{2}}, {"split_size", h_}}, m);
    const std::vector<ValueId> qkv_parts = g_.node(split).outputs;
    auto heads = [&](ValueId part) {
      const ValueId v =
          op("aten::view", "view", {part}, act({b_, s_, nh_, hd_}), {{"size", Shape{b_, s_, -1, hd_}}}, m);
      return op("aten::transpose.int", "transpose", {v}, act({b_, nh_, s_, hd_}),
                {{"dim0", std::int64_t{1}}, {"dim1", std::int64_t{2}}}, m);
    };
    // transformers reshapes key and value before query.
    const ValueId key = heads(qkv_parts[1]);
    const ValueId value = heads(qkv_parts[2]);
    const ValueId query = heads(qkv_parts[0]);
    if (c_.attention == GptAttention::Eager) return eager_attention(query, key, value, m);
    // scaling = head_dim ** -0.5, computed as Python does so the attribute prints identically.
    const double scale = std::pow(static_cast<double>(hd_), -0.5);
    // Causal attention as transformers calls it eagerly (no mask, is_causal): a capture folds
    // the mask export builds from shapes back into is_causal (python/shardwise/_causal_masks.py).
    const Attributes attrs{{"attn_mask", ir::NoneAttr{}},
                           {"dropout_p", 0.0},
                           {"enable_gqa", false},
                           {"is_causal", true},
                           {"scale", scale}};
    ValueId x;
    if (c_.attention == GptAttention::Math) {
      Attributes math = attrs;
      math.emplace("dropout_mask", ir::NoneAttr{});
      const auto n = g_.add_node("aten::_scaled_dot_product_attention_math", {query, key, value},
                                 {{names_("_scaled_dot_product_attention_math"), act({b_, nh_, s_, hd_})},
                                  {names_("getitem"), act({b_, nh_, s_, s_})}},
                                 std::move(math), m);
      x = g_.node(n).outputs.front();
    } else {
      x = op("aten::scaled_dot_product_attention", "scaled_dot_product_attention", {query, key, value},
             act({b_, nh_, s_, hd_}), attrs, m);
    }
    x = op("aten::reshape", "reshape", {x}, act({b_, nh_, s_, hd_}), {{"shape", Shape{b_, -1, s_, hd_}}}, m);
    x = op("aten::transpose.int", "transpose", {x}, act({b_, s_, nh_, hd_}),
           {{"dim0", std::int64_t{1}}, {"dim1", std::int64_t{2}}}, m);
    // .contiguous() here is a node or none depending on the capture device's SDPA kernel;
    // capture leaves it out (python/shardwise/_fx_import.py: VALUE_IDENTITIES), so does this.
    return op("aten::reshape", "reshape", {x}, act({b_, s_, h_}), {{"shape", Shape{b_, s_, -1}}}, m);
  }

  // GptAttention::Eager (gpt.h): the scores are values of the graph.
  ValueId eager_attention(ValueId query, ValueId key, ValueId value, const std::string& m) {
    const ValueId key_t = op("aten::transpose.int", "transpose", {key}, act({b_, nh_, hd_, s_}),
                             {{"dim0", std::int64_t{-1}}, {"dim1", std::int64_t{-2}}}, m);
    const TensorType scores_type = act({b_, nh_, s_, s_});
    ValueId scores = op("aten::matmul", "matmul", {query, key_t}, scores_type, {}, m);
    scores = op("aten::div.Tensor", "div", {scores}, scores_type,
                {{"other", std::sqrt(static_cast<double>(hd_))}}, m);
    scores = op("aten::where.ScalarOther", "where", {causal_mask_, scores}, scores_type,
                {{"other", static_cast<double>(std::numeric_limits<float>::lowest())}}, m);
    ValueId probs = op("aten::softmax.int", "softmax", {scores}, scores_type,
                       {{"dim", std::int64_t{-1}}, {"dtype", ir::NoneAttr{}}}, m);
    probs = dropout(probs, m + ".attn_dropout");
    ValueId x = op("aten::matmul", "matmul", {probs, value}, act({b_, nh_, s_, hd_}), {}, m);
    x = op("aten::transpose.int", "transpose", {x}, act({b_, s_, nh_, hd_}),
           {{"dim0", std::int64_t{1}}, {"dim1", std::int64_t{2}}}, m);
    return op("aten::reshape", "reshape", {x}, act({b_, s_, h_}), {{"shape", Shape{b_, s_, -1}}}, m);
  }

  // GptConfig::experts: the tokens flattened, routed (linear, softmax, top-k: Mixtral's router
  // without its renormalisation) and run through the experts op, shaped back.
  ValueId mixture_of_experts(ValueId x, const LayerParams& w, const std::string& m) {
    const std::int64_t e = c_.experts, k = c_.experts_per_token, tokens = b_ * s_;
    x = op("aten::view", "view", {x}, act({tokens, h_}), {{"size", Shape{-1, h_}}}, m);
    ValueId scores = op("aten::linear", "linear", {x, w.router_weight}, act({tokens, e}), {{"bias", ir::NoneAttr{}}},
                        m + ".gate");
    scores = op("aten::softmax.int", "softmax", {scores}, act({tokens, e}),
                {{"dim", std::int64_t{-1}}, {"dtype", ir::NoneAttr{}}}, m + ".gate");
    const auto topk = g_.add_node("aten::topk", {scores},
                                  {{names_("getitem"), act({tokens, k})}, {names_("getitem"), typed(DType::I64, {tokens, k})}},
                                  {{"dim", std::int64_t{-1}}, {"k", k}, {"largest", true}, {"sorted", true}}, m + ".gate");
    const ValueId weights = g_.node(topk).outputs[0], index = g_.node(topk).outputs[1];
    const ValueId ids = op("aten::arange", "arange", {}, typed(DType::I64, {e}),
                           {{"device", std::string("meta")},
                            {"dtype", ir::NoneAttr{}},
                            {"end", e},
                            {"layout", ir::NoneAttr{}},
                            {"pin_memory", false}},
                           m + ".experts");
    x = op("shardwise_moe::experts", "experts", {x, index, weights, w.gate_up_weight, w.down_weight, ids},
           act({tokens, h_}), {{"act", std::string("silu")}}, m + ".experts");
    return op("aten::view", "view", {x}, act({b_, s_, h_}), {{"size", Shape{b_, s_, h_}}}, m);
  }

  // NewGELUActivation: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))).
  ValueId gelu_new(ValueId x, const std::string& m) {
    const TensorType t = act({b_, s_, f_});
    const ValueId half = op("aten::mul.Tensor", "mul", {x}, t, {{"other", 0.5}}, m);
    ValueId y = op("aten::pow.Tensor_Scalar", "pow", {x}, t, {{"exponent", 3.0}}, m);
    y = op("aten::mul.Tensor", "mul", {y}, t, {{"other", 0.044715}}, m);
    y = op("aten::add.Tensor", "add", {x, y}, t, {{"alpha", std::int64_t{1}}}, m);
    y = op("aten::mul.Tensor", "mul", {y}, t, {{"other", std::sqrt(2.0 / std::numbers::pi)}}, m);
    y = op("aten::tanh", "tanh", {y}, t, {}, m);
    y = op("aten::add.Tensor", "add", {y}, t, {{"alpha", std::int64_t{1}}, {"other", 1.0}}, m);
    return op("aten::mul.Tensor", "mul", {half, y}, t, {}, m);
  }

  // transformers' ForCausalLMLoss at the root module: upcast the logits, shift the labels
  // left by padding one ignore_index (-100) on the right, flatten both, cross-entropy (mean).
  // Returns {loss, upcast logits}.
  std::pair<ValueId, ValueId> causal_lm_loss(ValueId logits, ValueId labels) {
    const ValueId upcast = op("aten::to.dtype", "to", {logits}, typed(DType::F32, {b_, s_, v_}),
                              {{"copy", false},
                               {"dtype", std::string(ir::dtype_name(DType::F32))},
                               {"memory_format", ir::NoneAttr{}},
                               {"non_blocking", false}},
                              "");
    ValueId shifted = op("aten::pad", "pad", {labels}, typed(DType::I64, {b_, s_ + 1}),
                         {{"mode", std::string("constant")}, {"pad", Shape{0, 1}}, {"value", -100.0}}, "");
    shifted = op("aten::slice.Tensor", "slice", {shifted}, typed(DType::I64, {b_, s_}),
                 {{"dim", std::int64_t{1}},
                  {"end", std::numeric_limits<std::int64_t>::max()},
                  {"start", std::int64_t{1}},
                  {"step", std::int64_t{1}}},
                 "");
    // .contiguous() of the shifted labels: left out, as capture leaves it out.
    const ValueId flat_logits =
        op("aten::view", "view", {upcast}, typed(DType::F32, {b_ * s_, v_}), {{"size", Shape{-1, v_}}}, "");
    ValueId flat_labels = op("aten::view", "view", {shifted}, typed(DType::I64, {b_ * s_}), {{"size", Shape{-1}}}, "");
    flat_labels =
        op("aten::to.dtype_layout", "to", {flat_labels}, typed(DType::I64, {b_ * s_}), to_dtype_layout(DType::I64), "");
    const ValueId loss =
        op("aten::cross_entropy_loss", "cross_entropy_loss", {flat_logits, flat_labels}, typed(DType::F32, {}),
           {{"ignore_index", std::int64_t{-100}},
            {"label_smoothing", 0.0},
            {"reduction", std::int64_t{1}},
            {"weight", ir::NoneAttr{}}},
           "");
    return {loss, upcast};
  }

  const GptConfig& c_;
  const std::int64_t b_, s_, h_, nh_, hd_, f_, v_, p_;
  ir::Graph g_;
  Namer names_;
  ValueId wte_ = -1, wpe_ = -1, ln_f_weight_ = -1, ln_f_bias_ = -1, lm_head_weight_ = -1;
  ValueId causal_mask_ = -1;  // GptAttention::Eager only
  std::vector<LayerParams> layers_;
};

}  // namespace

ir::Graph build_gpt(const GptConfig& config) {
  validate(config);
  return GptBuilder(config).build();
}

}  // namespace shardwise::models
