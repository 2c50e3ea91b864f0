"""Which names of a module's parameters and buffers are one tensor: the one rule for tied weights.

Capture names a tied tensor by its first name (one IR value), the TorchScript importer
likewise, and the engines keep it under that name and answer to the others (state_dict names
each). All three read this table, so they cannot disagree on which name is first.
"""
from __future__ import annotations

import torch


def module_tensor_table(model: torch.nn.Module) -> list[tuple[str, str, str, torch.Tensor]]:
    """(name, canonical name, role, tensor) for every alias of every parameter and buffer.

    The canonical name of a tensor is its first name in ``named_parameters()`` (then
    ``named_buffers()``) order, so a tied weight (GPT-2's ``lm_head.weight`` is
    ``transformer.wte.weight``) is one IR value, named as ``named_parameters()`` names it.
    """
    first: dict[int, str] = {}
    rows = []
    for role, items in (("parameter", model.named_parameters(remove_duplicate=False)),
                        ("buffer", model.named_buffers(remove_duplicate=False))):
        for name, t in items:
            if t is None:
                continue
            canonical = first.setdefault(id(t), name)
            rows.append((name, canonical, role, t))
    return rows


def canonical_names(model: torch.nn.Module) -> dict[str, str]:
    """Every parameter / buffer name -> its tensor's canonical name (itself for most)."""
    return {name: canonical for name, canonical, _, _ in module_tensor_table(model)}


def tied_names(model: torch.nn.Module) -> dict[str, str]:
    """Every other name of a tensor the model holds under several (a tied LM head: lm_head.weight
    -> the embedding's name, the first one, under which the engine keeps it)."""
    return {name: canonical for name, canonical, _, _ in module_tensor_table(model) if name != canonical}
