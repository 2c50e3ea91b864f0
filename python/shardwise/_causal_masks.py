"""Causal masks that are constants of the graph, given back to attention as ``is_causal``.

A traced model cannot take the data-dependent shortcut its eager run takes: transformers'
SDPA attention, called without a padding mask, passes ``is_causal=True`` and no mask
eagerly, but under torch.export (which cannot see that the mask would be all causal) it
builds a boolean ``[batch, 1, seq, seq]`` mask from ``arange`` and shape arithmetic and
passes it explicitly. The numbers are the same; the kernels are not: on CUDA a mask rules
out FlashAttention, and the captured step ran 5.4% slower than the eager one (GPT-2 124M,
bf16, H200, benchmarks/gpu.py).

``fold_causal_masks`` finds each ``aten.scaled_dot_product_attention`` whose mask is
computed from no input, parameter or buffer (only from shapes), evaluates that mask once
on the CPU, and where it equals the causal mask (query row i sees key columns 0..i, for
every batch and head), rewrites the call to ``is_causal=True`` without a mask, as the eager
call was. A mask that depends on the data (a padding mask), that is not causal, or that
cannot be evaluated is left as it is. The shapes are the capture's (a batch of another
shape is captured again), so the folded mask is the mask of every batch this graph runs.
"""
from __future__ import annotations

import torch
import torch.fx

_SDPA = torch.ops.aten.scaled_dot_product_attention.default
_SIGNATURE = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")


def fold_causal_masks(graph: torch.fx.Graph) -> int:
    """Rewrites every attention call of `graph` whose mask is a constant causal mask; returns
    how many. The mask's own nodes go when nothing else reads them."""
    values: dict = {}
    folded = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not _SDPA:
            continue
        bound = dict(zip(_SIGNATURE, node.args))
        bound.update({k: v for k, v in node.kwargs.items() if k in _SIGNATURE})
        mask = bound.get("attn_mask")
        if not isinstance(mask, torch.fx.Node) or bound.get("is_causal", False):
            continue
        query, key = bound["query"].meta.get("val"), bound["key"].meta.get("val")
        if query is None or key is None or query.shape[-2] != key.shape[-2]:
            continue
        value = _constant(mask, values)
        if value is None or not _is_causal(value, query.shape[-2]):
            continue
        # As the eager call is made: no mask argument at all, is_causal set.
        kwargs = {k: v for k, v in node.kwargs.items() if k not in _SIGNATURE}
        node.args = (bound["query"], bound["key"], bound["value"])
        node.kwargs = {"dropout_p": bound.get("dropout_p", 0.0), "is_causal": True, **kwargs}
        folded += 1
        _drop_unused(mask, graph)
    return folded


def _is_causal(mask: torch.Tensor, seq: int) -> bool:
    if mask.dtype != torch.bool or mask.dim() < 2 or tuple(mask.shape[-2:]) != (seq, seq):
        return False
    causal = torch.ones(seq, seq, dtype=torch.bool, device=mask.device).tril()
    return bool((mask == causal).all())


def _constant(node: torch.fx.Node, values: dict):
    """The value of `node` computed on the CPU when nothing but shapes and constants feed it,
    else None. `values` caches what was computed (several layers share one mask)."""
    if node in values:
        return values[node]
    order, seen, stack = [], set(), [node]
    while stack:  # the ancestors, each after what it reads
        n = stack[-1]
        pending = [a for a in n.all_input_nodes if a not in seen and a not in values]
        if pending:
            stack.extend(pending)
            continue
        stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op != "call_function" or _random(n):
            values[n] = None
        order.append(n)
    cpu = torch.device("cpu")

    def on_cpu(a):
        if isinstance(a, torch.fx.Node):
            return values[a]
        return cpu if isinstance(a, torch.device) else a

    for n in order:
        if n in values:
            continue
        if any(values.get(a) is None for a in n.all_input_nodes):
            values[n] = None
            continue
        try:
            args = torch.fx.node.map_aggregate(n.args, on_cpu)
            kwargs = torch.fx.node.map_aggregate(n.kwargs, on_cpu)
            values[n] = n.target(*args, **kwargs)
        except Exception:  # an op that does not run on these values: leave the mask alone
            values[n] = None
    return values.get(node)


def _random(node: torch.fx.Node) -> bool:
    return torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ())


def _drop_unused(node: torch.fx.Node, graph: torch.fx.Graph) -> None:
    stack, erased = [node], set()
    while stack:
        n = stack.pop()
        if n in erased or n.users or n.op != "call_function":
            continue
        inputs = list(n.all_input_nodes)
        graph.erase_node(n)
        erased.add(n)
        stack.extend(inputs)
