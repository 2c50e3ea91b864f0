"""Example inputs bound to a model's forward() by name, the call that passes them back, and
the tensors of whatever the model returns. Shared by every capture front end (export, fx,
TorchScript), so that all three call the model the same way.

Capture names inputs by the forward() arguments they bind to: ``forward(input_ids, labels)``
gives ``input_ids`` and ``labels``; the items of ``forward(*xs)`` are ``xs_0``, ``xs_1``, ...
Calling the model back from those names needs the signature again: ``xs_0`` and every
argument before ``*xs`` must go positionally (`split_call`).
"""
from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch

from ._fx_import import CaptureError


def tensor_leaves(out: Any) -> list[torch.Tensor]:
    """The tensors of a model's output, in order; non-tensor leaves (caches, None, Python
    scalars) are dropped: they are not part of the computation to shard."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, Mapping):
        return [t for v in out.values() for t in tensor_leaves(v)]
    if isinstance(out, (list, tuple)):
        return [t for v in out for t in tensor_leaves(v)]
    return []


def forward_signature(model: torch.nn.Module) -> inspect.Signature | None:
    """The signature of `model.forward` (through decorators that keep __wrapped__, as
    transformers' do), or None when Python cannot tell it."""
    try:
        return inspect.signature(model.forward)
    except (TypeError, ValueError):
        return None


def split_call(signature: inspect.Signature | None, named: Mapping[str, Any]) -> tuple[list, dict]:
    """(args, kwargs) that call forward() with the inputs `named` as capture bound them:
    positional-only arguments, and when forward() takes *args, the items `<args>_<i>` and
    every argument before them, go positionally; the rest by keyword."""
    kwargs = dict(named)
    args: list = []
    if signature is None:
        return args, kwargs
    params = list(signature.parameters.values())
    var_positional = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
    for p in params:
        if p.kind is inspect.Parameter.POSITIONAL_ONLY or (
                var_positional and p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD):
            if p.name not in kwargs:
                break  # left to its default: nothing after it can go positionally
            args.append(kwargs.pop(p.name))
        elif p.kind is inspect.Parameter.VAR_POSITIONAL:
            i = 0
            while f"{p.name}_{i}" in kwargs:
                args.append(kwargs.pop(f"{p.name}_{i}"))
                i += 1
            break
        else:
            break
    return args, kwargs


def bind_inputs(model: torch.nn.Module, example_inputs: Any, example_kwargs: dict | None) -> dict:
    """Example inputs as {forward argument name: value}, in signature order."""
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if isinstance(example_inputs, Mapping):
        args, kwargs = (), dict(example_inputs)
    else:
        args, kwargs = tuple(example_inputs), {}
    kwargs.update(example_kwargs or {})
    signature = inspect.signature(model.forward)
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as e:
        raise CaptureError(f"example inputs do not match {type(model).__name__}.forward: {e}") from None
    named = {}
    for name, value in bound.arguments.items():
        kind = signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            named.update({f"{name}_{i}": v for i, v in enumerate(value)})
        elif kind is inspect.Parameter.VAR_KEYWORD:
            named.update(value)
        else:
            named[name] = value
    return named


def input_names(named: dict) -> list[str]:
    """IR names of the tensor leaves of the bound inputs, in pytree order."""
    names = []
    for key, value in named.items():
        leaves = tensor_leaves(value)
        if isinstance(value, torch.Tensor):
            names.append(key)
        else:
            names.extend(f"{key}_{i}" for i in range(len(leaves)))
    return names
