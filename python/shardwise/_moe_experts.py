"""A mixture of experts' expert computation as one op: ``shardwise_moe::experts``.

transformers' MoE models (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V3 and every other class
decorated with ``use_experts_implementation``) keep their experts as two stacked weights,
``gate_up_proj`` [E, 2I, H] and ``down_proj`` [E, H, I], and compute them by one of several
implementations (an eager loop over the experts hit, a grouped matmul, a batched matmul). Each
is a program of data-dependent shapes (the tokens an expert receives), which a capture either
cannot trace or traces into ops that have no rule (aten::histc, transformers' grouped-mm
fallback), so the planner could only replicate the layer.

While a model is captured, ``experts_as_one_op`` routes each such experts module through this
op instead, whose rule (csrc/ops/op_table_builtin.cc) says what the computation is:

    out[t, h] = sum over k, and over j with expert_ids[j] == top_k_index[t, k], of
                top_k_weights[t, k] * down_proj[j] @ (act(gate_j x_t) * up_j x_t)

with ``expert_ids`` = arange(E) made inside the call. Tokens t are independent (a split of them
is a batch split); experts j are summed over, so a split of them leaves each rank the partial
sum of its own experts, which the program reduces: each rank holds only its experts' weights
and computes only the tokens routed to them. The arange's local form on a rank is the global
ids of its block of experts (the rewrite's arange starts at the block), so the op on a rank's
operands is that rank's share, with no kernel of its own.

The op computes as transformers' eager loop does, expert by expert (dropless: every routed
token); its backward runs that computation again under autograd. Only the layout every
implementation shares is taken (concatenated gate and up, not transposed, no bias, a gate, no
norm after the experts, the default gating): any other experts module is captured as it is.
"""
from __future__ import annotations

import contextlib
import types

import torch
import torch.nn.functional as F


def _activation(name: str):
    """transformers' activation of that name; without transformers (a model written like
    torchtitan's, _grouped_experts.py), torch's."""
    try:
        from transformers.activations import ACT2FN
    except ImportError:
        return {"silu": F.silu, "gelu": F.gelu, "relu": F.relu}[name]
    return ACT2FN[name]


def _experts(hidden, top_k_index, top_k_weights, gate_up_proj, down_proj, expert_ids, act: str):
    """The experts' sum, expert by expert over the experts this call holds (expert_ids)."""
    fn = _activation(act)
    out = torch.zeros_like(hidden)
    for j, expert in enumerate(expert_ids.tolist()):
        token, slot = torch.where(top_k_index == expert)
        if token.numel() == 0:
            continue
        gate, up = F.linear(hidden[token], gate_up_proj[j]).chunk(2, dim=-1)
        routed = F.linear(fn(gate) * up, down_proj[j]) * top_k_weights[token, slot, None]
        out.index_add_(0, token, routed.to(out.dtype))
    return out


@torch.library.custom_op("shardwise_moe::experts", mutates_args=())
def moe_experts(hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                gate_up_proj: torch.Tensor, down_proj: torch.Tensor, expert_ids: torch.Tensor,
                act: str) -> torch.Tensor:
    """The experts ``expert_ids`` of a mixture of experts applied to ``hidden`` [T, H] as
    ``top_k_index`` / ``top_k_weights`` [T, K] route it (the module's docstring)."""
    return _experts(hidden, top_k_index, top_k_weights, gate_up_proj, down_proj, expert_ids, act)


@moe_experts.register_fake
def _moe_experts_fake(hidden, top_k_index, top_k_weights, gate_up_proj, down_proj, expert_ids, act):
    return torch.empty_like(hidden)


_DIFFERENTIABLE = (0, 2, 3, 4)  # hidden, top_k_weights, gate_up_proj, down_proj


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:6])
    ctx.act = inputs[6]


def _backward(ctx, grad):
    saved = list(ctx.saved_tensors)
    wanted = [i for i in _DIFFERENTIABLE if ctx.needs_input_grad[i]]
    with torch.enable_grad():
        for i in wanted:
            saved[i] = saved[i].detach().requires_grad_(True)
        out = _experts(*saved, ctx.act)
        # No token routed to these experts (a rank's share of them): nothing depends on anything.
        found = (torch.autograd.grad(out, [saved[i] for i in wanted], grad, allow_unused=True)
                 if wanted and out.requires_grad else [None] * len(wanted))
    grads: list = [None] * 7
    for i, g in zip(wanted, found):
        grads[i] = g if g is not None else torch.zeros_like(saved[i])
    return tuple(grads)


moe_experts.register_autograd(_backward, setup_context=_setup_context)


def _one_op_forward(self, hidden_states, top_k_index, top_k_weights):
    ids = torch.arange(self.gate_up_proj.shape[0], device=hidden_states.device)
    return torch.ops.shardwise_moe.experts(hidden_states, top_k_index, top_k_weights, self.gate_up_proj,
                                           self.down_proj, ids, self.config.hidden_act)


def _takes(module: torch.nn.Module) -> bool:
    """Whether `module` is a transformers experts module of the layout the op computes (its
    attributes first: a model without such a module never imports transformers here)."""
    gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    if not (isinstance(gate_up, torch.Tensor) and isinstance(down, torch.Tensor) and gate_up.dim() == 3
            and down.dim() == 3 and hasattr(module, "is_concatenated")):
        return False
    try:
        from transformers.integrations.moe import _default_apply_gate
    except ImportError:  # an older transformers: no experts interface
        return False
    config = getattr(module, "config", None)
    return (getattr(module, "is_concatenated", False) is True
            and getattr(module, "is_transposed", True) is False and getattr(module, "has_bias", True) is False
            and getattr(module, "has_gate", False) is True and getattr(module, "has_post_expert_norm", True) is False
            and getattr(type(module), "_apply_gate", None) is _default_apply_gate
            and isinstance(getattr(config, "hidden_act", None), str))


@contextlib.contextmanager
def experts_as_one_op(model: torch.nn.Module):
    """Within it, every experts module of `model` the op computes (``_takes``) runs as
    ``shardwise_moe::experts``; each is restored after, whatever happens."""
    patched = [m for m in model.modules() if _takes(m)]
    for m in patched:
        m.forward = types.MethodType(_one_op_forward, m)
    try:
        yield patched
    finally:
        for m in patched:
            m.__dict__.pop("forward", None)
