// A torch-free IR builder for GPT models: the graph shardwise.capture gives for Hugging Face
// transformers' GPT2LMHeadModel (eval mode, use_cache=False, sdpa attention, meta device),
// built from the configuration alone. It costs Megatron-LM's GPT family (1.7B to 1T
// parameters) without torch, weights or a trace: a 128-layer graph builds in milliseconds.
//
// Contract:
//  - Parameters are declared first, in named_parameters() order and with the same names and
//    shapes: "transformer.wte.weight" [V,h], "transformer.wpe.weight" [P,h], per layer i
//    "transformer.h.{i}." ln_1.{weight,bias} [h], attn.c_attn.{weight [h,3h], bias [3h]},
//    attn.c_proj.{weight [h,h], bias [h]}, ln_2.{weight,bias}, mlp.c_fc.{weight [h,f],
//    bias [f]}, mlp.c_proj.{weight [f,h], bias [h]} (GPT-2's Conv1D stores [in, out]), then
//    "transformer.ln_f.{weight,bias}"; "lm_head.weight" [V,h] only when the embeddings are
//    untied (tied, lm_head reads wte, which counts once).
//  - Inputs: input_ids, then labels (with_loss), both i64[b,s] with batch_dim 0.
//  - Nodes: the capture's ops, module paths, attributes (schema names, defaults filled) and
//    output types, node for node. Activations are named in torch.fx's style (view, view_1,
//    ..., pow_1, getitem_2).
//  - Outputs: (loss, logits) with the loss, where logits is the f32 upcast the loss reads
//    when dtype is f32 (Python's .float() returns the same tensor) and lm_head's output
//    otherwise; (logits) without.
//  - Batch dimensions are propagated (analysis/batch_dim.h), as after a capture.
//  - Throws support::ValidationError naming the field ("GptConfig.heads") when a size is
//    not positive (ffn_hidden and positions may be 0), hidden is not a multiple of heads,
//    positions < seq, dtype is not f64/f32/f16/bf16, dropout is outside [0, 1] or
//    layer_norm_eps is not positive.
//
// Per layer (module paths relative to transformer.h.{i}; 38 nodes):
//   ln_1 layer_norm; attn.c_attn view,addmm,view; attn split, (view,transpose) for k, v, q,
//   scaled_dot_product_attention(q,k,v, is_causal), reshape, transpose, contiguous, reshape;
//   attn.c_proj view,addmm,view; attn.resid_dropout dropout; add; ln_2 layer_norm;
//   mlp.c_fc view,addmm,view; mlp.act gelu_new as mul,pow,mul,add,mul,tanh,add,mul;
//   mlp.c_proj view,addmm,view; mlp.dropout dropout; add.
//
// The attention mask: transformers' eager SDPA attention passes is_causal and no mask; under
// torch.export it builds a [b,1,s,s] mask from the position ids (~30 ops that also detect
// packed sequences), which the capture folds back into is_causal where it depends on shapes
// alone (python/shardwise/_causal_masks.py). Here attention is causal the same way.
//
// Differences from a capture (transformers 5.x, torch 2.13):
//  - Attributes a capture takes from the machine keep the values a CPU meta-device capture
//    gives: device="meta", layer_norm's cudnn_enable=false.
//
// Worked example:
//   GptConfig c{.layers = 2, .hidden = 64, .heads = 4, .seq = 16, .vocab = 128};
//   ir::Graph g = build_gpt(c);
//   // 12*2*64^2 + 13*2*64 + (128 + 16)*64 + 2*64 = 109,312 parameters; print_graph(g) gives
//   //   %view: i64[b1,16] = aten::view(%input_ids) {size=[-1,16]} @transformer
//   //   %embedding: bf16[b1,16,64] = aten::embedding(%transformer.wte.weight, %view) {...} @transformer.wte
//   //   ...
//   //   %addmm: bf16[16,192] = aten::addmm(%transformer.h.0.attn.c_attn.bias, %view_1,
//   //       %transformer.h.0.attn.c_attn.weight) {alpha=1, beta=1} @transformer.h.0.attn.c_attn
//   //   ...
//   //   %linear: bf16[b1,16,128] = aten::linear(%alias, %transformer.wte.weight) {bias=none} @lm_head
//   //   ...
//   //   %cross_entropy_loss: f32[] = aten::cross_entropy_loss(%view_24, %to_2) {ignore_index=-100, ...}
//   //   return (%cross_entropy_loss, %linear)
//   // GPT-3 175B (96 layers, hidden 12288, 96 heads, seq 2048, vocab 51200): 174,615,846,912
//   // parameters, 3,673 nodes, built in about 10 ms.
#pragma once

#include "ir/dtype.h"
#include "ir/graph.h"

namespace shardwise::models {

// How attention runs, as transformers' attn_implementation names it.
//  Sdpa   one aten::scaled_dot_product_attention node (is_causal): a fused kernel (flash or
//         memory-efficient) that never materialises the S x S scores.
//  Eager  the model's own ops: matmul(q, k^T), div by sqrt(head dim), where(causal mask,
//         scores, finfo.min), softmax, dropout (attn_dropout), matmul(probs, v), then heads
//         back in. The scores cross memory and are saved, as Megatron-LM 2021 and GPT-2's
//         eager attention ran. The causal mask is one bool buffer "causal_mask" [1,1,s,s]
//         read by every layer. Not checked against a capture node for node (transformers'
//         eager path builds an additive mask); its ops, shapes and costs are the same kind.
//  Math   one aten::_scaled_dot_product_attention_math node (is_causal), the unfused kernel
//         SDPA falls back to, returning the output and the [b,heads,s,s] probabilities: the
//         node that stands for Megatron-LM 2021's fused-softmax attention (cost/op_cost.h).
enum class GptAttention { Sdpa, Eager, Math };

struct GptConfig {
  int layers = 0;  // n_layer
  int hidden = 0;  // n_embd
  int heads = 0;   // n_head; must divide hidden
  int seq = 0;     // tokens per sample
  int vocab = 0;   // vocab_size
  int batch = 1;
  ir::DType dtype = ir::DType::BF16;  // of parameters and activations (ids and labels are i64)
  int ffn_hidden = 0;                 // n_inner; 0 -> 4 x hidden
  bool tie_embeddings = true;         // tie_word_embeddings: lm_head reads transformer.wte.weight
  bool with_loss = true;              // a labels input and the shifted cross-entropy loss
  int positions = 0;                  // n_positions (rows of wpe); 0 -> seq
  double dropout = 0.1;               // embd_pdrop = resid_pdrop (eval mode: train=false)
  double layer_norm_eps = 1e-5;       // layer_norm_epsilon
  GptAttention attention = GptAttention::Sdpa;
  // > 0: each layer's MLP is a mixture of that many experts of ffn_hidden (not GPT-2: a
  // planner's test model, shaped as transformers' Mixtral block is captured): the router
  // mlp.gate.weight [E, h] (linear, softmax, top-k of experts_per_token), then the experts as
  // one op, shardwise_moe::experts, on mlp.experts.gate_up_proj [E, 2f, h] and
  // mlp.experts.down_proj [E, h, f] (python/shardwise/_moe_experts.py), in place of mlp.c_fc
  // and mlp.c_proj.
  int experts = 0;
  int experts_per_token = 2;
  // With experts: the first dense_layers layers keep the dense MLP (DeepSeek-V3's
  // first_k_dense_replace), two families of repeated blocks.
  int dense_layers = 0;
};

ir::Graph build_gpt(const GptConfig& config);

}  // namespace shardwise::models
