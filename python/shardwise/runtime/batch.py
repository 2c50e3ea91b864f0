"""How an engine takes its batch: bound by name, as Python binds ``model(*args, **kwargs)``.

    binding = BatchBinding.capture(model, args, kwargs, loss_fn)   # at parallelize
    tensors = binding.bind(args, kwargs)                           # at every step: {IR name: tensor}

The user's loop calls the model as it likes: positional tensors, keywords, or a data
collator's dict (``engine.train_step(**batch)``, or ``engine.train_step(batch)``: one dict
alone is taken as the keywords). Each call is bound against ``model.forward``'s own
signature, exactly as the single-device call ``model(*args, **kwargs)`` would bind it, so a
tensor reaches the argument it reaches on one device (a positional ``(ids, labels)`` binds
``labels`` to a transformers model's second parameter, ``attention_mask``, as ``model(ids,
labels)`` does: pass ``labels=`` by keyword). The tensors are then named as the capture named
them (an argument's name; a tuple argument's items ``name_0``, ``name_1``, ...).

Every step must bring the same tensors the program was captured with, of the same dtypes,
and the same non-tensor arguments (they were specialised into the program: ``use_cache=False``
captured is not ``use_cache=True``); the error names what differs. Shapes are checked by the
engine, which re-plans a batch of another shape (or refuses it under ``static=True``).

With a separate ``loss_fn``, the target is the keyword ``target`` or the last positional
argument, and is named "target".
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

import torch

from .._C import ValidationError
from .._inputs import bind_inputs, input_names, tensor_leaves

TARGET = "target"  # the IR name of the loss' target when parallelize is given a loss_fn


def call_arguments(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """(args, kwargs) of a step call; one Mapping passed alone is the keywords (a collator's batch)."""
    if len(args) == 1 and not kwargs and isinstance(args[0], Mapping):
        return (), dict(args[0])
    return tuple(args), dict(kwargs)


class BatchBinding:
    """The names, dtypes and non-tensor arguments a program was captured with."""

    def __init__(self, model: torch.nn.Module, has_loss_fn: bool, names: list[str], constants: dict[str, Any],
                 dtypes: dict[str, torch.dtype]):
        self._model = model
        self._has_loss_fn = has_loss_fn
        self.names = names          # IR input names, in the order the program takes them
        self.constants = constants  # non-tensor arguments, by parameter name
        self.dtypes = dtypes
        self.last: dict[str, Any] = {}

    @classmethod
    def capture(cls, model: torch.nn.Module, args: tuple, kwargs: dict,
                loss_fn: Callable | None) -> tuple["BatchBinding", dict[str, Any]]:
        """The binding of the example call, and its bound arguments {name: value} (what
        capture traces: tensors, tuples of tensors, and constants)."""
        named = _bind(model, args, kwargs, loss_fn is not None)
        tensors = _leaves(named)
        if not tensors:
            raise ValidationError(f"parallelize: the example batch holds no tensor for {type(model).__name__}.forward")
        constants = {k: v for k, v in named.items() if not tensor_leaves(v)}
        binding = cls(model, loss_fn is not None, list(tensors), constants, {k: t.dtype for k, t in tensors.items()})
        return binding, named

    def bind(self, args: tuple, kwargs: dict, where: str = "train_step") -> dict[str, torch.Tensor]:
        """{IR name: tensor} of a step's call, in the program's order, or ValidationError.
        ``self.last`` keeps the call's bound arguments (what a new capture traces)."""
        args, kwargs = call_arguments(args, kwargs)
        try:
            named = _bind(self._model, args, kwargs, self._has_loss_fn)
        except ValidationError as e:
            raise ValidationError(f"{where}: {e}") from None
        tensors = _leaves(named)
        missing = [n for n in self.names if n not in tensors]
        extra = [n for n in tensors if n not in self.names]
        if missing or extra:
            raise ValidationError(
                f"{where}: the batch has tensors {sorted(tensors)}, the program was captured with {self.names}"
                + (f"; missing {missing}" if missing else "") + (f"; not captured {extra}" if extra else "")
                + " (every step must bring the same inputs, by the same names, as the example batch)")
        for name, value in named.items():
            if not tensor_leaves(value) and name in self.constants and not _same(value, self.constants[name]):
                raise ValidationError(f"{where}: argument '{name}' is {value!r}; the program was captured with "
                                      f"{self.constants[name]!r} (non-tensor arguments are fixed at capture)")
        for name, t in tensors.items():
            if t.dtype != self.dtypes[name]:
                raise ValidationError(f"{where}: input '{name}' is {t.dtype}, the program was captured with "
                                      f"{self.dtypes[name]}")
        self.last = named
        return {n: tensors[n] for n in self.names}


def _bind(model: torch.nn.Module, args: tuple, kwargs: dict, has_loss_fn: bool) -> dict[str, Any]:
    kwargs = dict(kwargs)
    target = None
    if has_loss_fn:
        if TARGET in kwargs:
            target = kwargs.pop(TARGET)
        elif args:
            args, target = args[:-1], args[-1]
        if not isinstance(target, torch.Tensor):
            raise ValidationError(f"with loss_fn, the batch's last positional element (or the keyword '{TARGET}') "
                                  "is the target tensor; none was given")
    try:
        named = bind_inputs(model, args, kwargs)
    except Exception as e:  # noqa: BLE001 - CaptureError or TypeError: a binding failure, said plainly
        raise ValidationError(str(e)) from None
    if has_loss_fn:
        if TARGET in named:
            raise ValidationError(f"{type(model).__name__}.forward has an argument named '{TARGET}'; pass the loss "
                                  "inside the model (loss_fn=None)")
        named[TARGET] = target
    return named


def _leaves(named: dict[str, Any]) -> dict[str, torch.Tensor]:
    names = input_names(named)
    tensors = [t for v in named.values() for t in tensor_leaves(v)]
    return dict(zip(names, tensors))


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b) and type(a) is type(b)
    except Exception:  # noqa: BLE001 - an object without a plain ==: compare identity
        return a is b


def map_tensors(named: dict[str, Any], fn: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, Any]:
    """`named` (bound arguments) with `fn` applied to every tensor, in tuples and lists too."""
    def one(value):
        if isinstance(value, torch.Tensor):
            return fn(value)
        if isinstance(value, (tuple, list)):
            return type(value)(one(v) for v in value)
        return value
    return {k: one(v) for k, v in named.items()}
