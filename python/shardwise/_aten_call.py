"""An IR node's ATen call, rebuilt from the node alone: ``torch.ops.aten.<name>.<overload>``
with the tensor operands in schema order and every other argument from the node's
attributes (keyed by schema argument name, as the capture wrote them: _fx_import._split_operands).

Two readers: the lowering of a rank program (runtime/lower.py, each node of the core's rank
IR becomes one call of its op) and profiled mode (profile.py, each distinct node measured).
An attribute that cannot become the argument exactly (text where the schema wants a
number, a generator) raises CallRebuildError naming the argument: never a guess.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.fx

from ._fx_import import _DTYPES

_TORCH_DTYPES = {name: dtype for dtype, name in _DTYPES.items()}
_MEMORY_FORMATS = {str(f): f for f in (torch.contiguous_format, torch.preserve_format, torch.channels_last,
                                       torch.channels_last_3d)}
_LAYOUTS = {str(torch.strided): torch.strided}


class CallRebuildError(ValueError):
    """An IR node whose call cannot be rebuilt exactly from its operands and attributes."""


def _is_tensor_type(t) -> bool:
    return isinstance(t, torch.TensorType) or (isinstance(t, torch.OptionalType)
                                                and isinstance(t.getElementType(), torch.TensorType))


def _is_tensor_list_type(t) -> bool:
    return isinstance(t, torch.ListType) and _is_tensor_type(t.getElementType())


def _enum_value(value: str, table: dict, what: str, name: str) -> Any:
    if value not in table:
        raise CallRebuildError(f"argument '{name}': unknown {what} {value!r}")
    return table[value]


def attribute_value(value: Any, argument) -> Any:
    """An IR attribute as the Python value the schema `argument` takes (the inverse of
    _fx_import._attr_value: dtypes, layouts and memory formats by name, devices by their
    text, a bool list stored as integers)."""
    if value is None:
        return None
    kind = str(argument.real_type)
    if "ScalarType" in kind:
        return _enum_value(value, _TORCH_DTYPES, "dtype", argument.name)
    if "MemoryFormat" in kind:
        return _enum_value(value, _MEMORY_FORMATS, "memory format", argument.name)
    if "Layout" in kind:
        return _enum_value(value, _LAYOUTS, "layout", argument.name)
    if "Device" in kind:
        return torch.device(value)
    if "Generator" in kind:
        raise CallRebuildError(f"argument '{argument.name}': a generator object ({value}) cannot be carried "
                               "by the IR; call the op without one (it draws from the default generator)")
    if kind in ("List[bool]", "Optional[List[bool]]") and isinstance(value, list):
        return [bool(v) for v in value]
    if isinstance(value, str) and kind not in ("str", "Optional[str]"):
        raise CallRebuildError(f"argument '{argument.name}' ({kind}) was captured as text {value!r}")
    return value


def call_arguments(op: torch._ops.OpOverload, attrs: dict, operands: list) -> tuple[list, dict]:
    """(args, kwargs) calling `op` with `operands` (the node's tensor inputs, in the IR's
    order: schema order) and `attrs`. An argument absent from `attrs` takes its default.
    ``<arg>_present`` marks the slots of a ``Tensor?[]`` that held tensors."""
    arguments = list(op._schema.arguments)

    def single_tensor_slots(rest) -> int:  # what the tensor arguments after a Tensor[] still need
        return sum(1 for a in rest if _is_tensor_type(a.type) and a.name not in attrs)

    args, kwargs = [], {}
    cursor = 0
    skipped = False  # a positional argument left at its default: those after it go by name
    for index, a in enumerate(arguments):
        if a.is_out:
            raise CallRebuildError(f"{op}: an out= overload")
        if _is_tensor_type(a.type):
            if a.name in attrs:  # an optional tensor absent from the call, or a number in its place
                value = attrs[a.name]
            elif cursor < len(operands):
                value = operands[cursor]
                cursor += 1
            elif a.has_default_value():
                skipped = True
                continue
            else:
                raise CallRebuildError(f"{op}: tensor argument '{a.name}' has no operand")
        elif _is_tensor_list_type(a.type):
            present = attrs.get(f"{a.name}_present")
            if present is not None:
                value = []
                for p in present:
                    value.append(operands[cursor] if p else None)
                    cursor += 1 if p else 0
            else:
                count = len(operands) - cursor - single_tensor_slots(arguments[index + 1:])
                value = list(operands[cursor:cursor + count])
                cursor += count
        elif a.name in attrs:
            value = attribute_value(attrs[a.name], a)
        elif a.has_default_value():
            skipped = True
            continue
        else:
            raise CallRebuildError(f"{op}: argument '{a.name}' is neither an operand nor an attribute")
        if a.kwarg_only or skipped:
            kwargs[a.name] = value
        else:
            args.append(value)
    if cursor != len(operands):
        raise CallRebuildError(f"{op}: {len(operands) - cursor} operand(s) left over after matching the schema")
    return args, kwargs


def named_arguments(op: torch._ops.OpOverload, attrs: dict, operands: list) -> dict:
    """The call `call_arguments` builds, as {schema argument: value} (bound_arguments)."""
    return bound_arguments(op, *call_arguments(op, attrs, operands))


def bound_arguments(op: torch._ops.OpOverload, args, kwargs, operand=lambda v: v) -> dict:
    """A call of `op` as {schema argument: value}: defaults filled in, tuples as lists, each
    tensor or FX node given as ``operand(it)``. Two calls bind alike when they pass the same
    arguments, however they spelled them (positional or by name, defaults written or not)."""
    def plain(v):
        if isinstance(v, (torch.Tensor, torch.fx.Node)):
            return operand(v)
        return [plain(x) for x in v] if isinstance(v, (list, tuple)) else v
    arguments = op._schema.arguments
    out = {a.name: plain(a.default_value) for a in arguments if a.has_default_value()}
    out.update({arguments[i].name: plain(v) for i, v in enumerate(args)})
    out.update({k: plain(v) for k, v in kwargs.items()})
    return out
