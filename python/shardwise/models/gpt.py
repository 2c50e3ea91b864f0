"""shardwise.models.gpt: the IR of a GPT model built from its configuration, no torch.

The graph is what ``shardwise.capture`` gives for Hugging Face transformers'
``GPT2LMHeadModel`` (eval mode, ``use_cache=False``, sdpa attention, meta device): same
parameter names and shapes, module paths and ops, node for node, built in C++
(csrc/models/gpt.h) in milliseconds and without memory for weights. Use it to cost
configurations too large to instantiate, such as Megatron-LM's GPT family up to 1T parameters::

    import shardwise
    g = shardwise.models.gpt(layers=96, hidden=12288, heads=96, seq=2048, vocab=51200)
    g.num_parameters()   # 174,615,846,912 (GPT-3 175B: tied embeddings, 2048 positions)
    g.matmul_flops()     # forward, batch 1

Attention is causal as transformers calls it eagerly (``is_causal``, no mask), which is what
a capture gives once the mask torch.export builds from shapes is folded back
(python/shardwise/_causal_masks.py). See csrc/models/gpt.h.
"""
from __future__ import annotations

from .. import _C
from ..graph import Graph

_DTYPES = {
    "bf16": "bf16", "bfloat16": "bf16",
    "f16": "f16", "fp16": "f16", "float16": "f16", "half": "f16",
    "f32": "f32", "fp32": "f32", "float32": "f32", "float": "f32",
    "f64": "f64", "fp64": "f64", "float64": "f64", "double": "f64",
}


def gpt(*, layers: int, hidden: int, heads: int, seq: int, vocab: int, batch: int = 1,
        dtype: str = "bf16", ffn_hidden: int | None = None, tie_embeddings: bool = True,
        with_loss: bool = True, positions: int | None = None, dropout: float = 0.1,
        layer_norm_eps: float = 1e-5, attention: str = "sdpa") -> Graph:
    """The graph of a GPT-2-layout language model with a causal-LM loss.

    layers, hidden, heads, vocab: GPT2Config's n_layer, n_embd, n_head, vocab_size.
    seq, batch: the shape of input_ids (and labels), [batch, seq].
    dtype: of parameters and activations: "bf16", "f16", "f32" (or "f64"); torch spellings
        such as "bfloat16" are accepted.
    ffn_hidden: n_inner, None for 4 * hidden. positions: n_positions, None for seq.
    tie_embeddings: lm_head reads transformer.wte.weight (one parameter).
    with_loss: add the labels input and the shifted cross-entropy loss.
    dropout: embd_pdrop = resid_pdrop (eval mode: the dropouts are identities with train=False).
    attention: "sdpa" (transformers' default: one fused-attention node, priced as a flash
        kernel runs it), "eager" (transformers' eager attention: matmul, scale, causal mask,
        softmax, dropout, matmul; the S x S scores are values, priced and saved as such) or
        "math" (one aten::_scaled_dot_product_attention_math node, the unfused kernel SDPA
        falls back to; it stands for Megatron-LM 2021's attention, docs/cost-model.md).

    Raises shardwise.ValidationError naming the field for a bad configuration (sizes not
    positive, hidden not a multiple of heads, positions < seq, an unknown dtype or attention).
    """
    spelled = _DTYPES.get(str(dtype).lower()) if isinstance(dtype, str) else None
    if spelled is None:
        raise _C.ValidationError(
            f"shardwise.models.gpt: dtype must be one of {sorted(set(_DTYPES.values()))}, got {dtype!r}")
    core = _C.build_gpt(
        layers=layers, hidden=hidden, heads=heads, seq=seq, vocab=vocab, batch=batch, dtype=spelled,
        ffn_hidden=0 if ffn_hidden is None else ffn_hidden, tie_embeddings=tie_embeddings,
        with_loss=with_loss, positions=0 if positions is None else positions, dropout=dropout,
        layer_norm_eps=layer_norm_eps, attention=attention)
    return Graph._from_core(core)
