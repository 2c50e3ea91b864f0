"""Resharding steps (csrc/transform/reshard_actions.h) run on tensors, with their autograd.

A rank program's operand carries its forward steps (the producer's placement to the
reader's) and its backward steps (the reader's gradient to the value's canonical one), as
text such as "all_gather(axis 1, dim 0, g3)"; each step is one collective of
``torch.ops.shardwise`` on the axis' group, or a local slice / scale.
"""
from __future__ import annotations

import functools
import re
from typing import Any

import torch

from .. import _C
from .._C import ValidationError
from .mesh import _Mesh

_STEP = re.compile(r"^(\w+)\(axis (\d+)(?:, (.*))?\)$")


@functools.lru_cache(maxsize=None)
def _parse_step(text: str) -> tuple:
    """'all_gather(axis 1, dim 0, g3)' -> ('all_gather', 1, {'dim': 0, 'groups': 3})."""
    m = _STEP.match(text)
    if not m:
        raise ValidationError(f"unreadable resharding step {text!r}")
    kind, axis, rest = m.group(1), int(m.group(2)), m.group(3) or ""
    args: dict[str, Any] = {"groups": 1}
    for part in filter(None, (p.strip() for p in re.split(r", (?=[a-z]|n\^|g\d)", rest))):
        if part.startswith("dim "):
            args["dim"] = int(part[4:])
        elif part.startswith("split "):
            args["dim"] = int(part[6:])
        elif part.startswith("concat "):
            args["concat_dim"] = int(part[7:])
        elif part.startswith("ratios "):
            args["ratios"] = [float(r) for r in part[7:].split(",")]
        elif re.fullmatch(r"g\d+", part):
            args["groups"] = int(part[1:])
        elif part.startswith("n^"):
            args["power"] = int(part[2:])
        elif part in ("sum", "mean"):
            args["reduce"] = part
        else:
            raise ValidationError(f"unreadable resharding step {text!r} (at {part!r})")
    return kind, axis, args


def _grouped(x: torch.Tensor, dim: int, groups: int) -> tuple[torch.Tensor, int]:
    """`x` with `dim` viewed as [groups, size / groups] (strided shards), and the dim to cut."""
    return (x, dim) if groups == 1 else (x.unflatten(dim, (groups, -1)), dim + 1)


def _ungrouped(x: torch.Tensor, dim: int, groups: int) -> torch.Tensor:
    return x if groups == 1 else x.flatten(dim, dim + 1)


def _apply_step(x: torch.Tensor, text: str, mesh: _Mesh) -> torch.Tensor:
    kind, axis, a = _parse_step(text)
    n, k, group = mesh.sizes[axis], mesh.coords[axis], mesh.group_names[axis]
    ops = torch.ops.shardwise
    if kind == "all_gather" and "ratios" in a:  # uneven blocks: pad to the longest, gather, trim
        d = a["dim"]
        sizes = ops.all_gather(torch.tensor([x.shape[d]], dtype=torch.int64, device=x.device), 0, group).tolist()
        longest = max(sizes)
        padded = torch.nn.functional.pad(x, [0, 0] * (x.dim() - 1 - d) + [0, longest - x.shape[d]])
        y = ops.all_gather(padded.contiguous(), d, group)
        return torch.cat([y.narrow(d, r * longest, sizes[r]) for r in range(n)], dim=d)
    if kind == "all_gather":
        y, d = _grouped(x, a["dim"], a["groups"])
        return _ungrouped(ops.all_gather(y.contiguous(), d, group), a["dim"], a["groups"])
    if kind == "reduce_scatter":
        y, d = _grouped(x, a["dim"], a["groups"])
        return _ungrouped(ops.reduce_scatter(y.contiguous(), d, group), a["dim"], a["groups"])
    if kind == "all_reduce":
        y = ops.all_reduce(x.contiguous(), "sum", group)  # Gloo has no average: divide after
        return y / n if a.get("reduce") == "mean" else y
    if kind == "all_to_all":
        return ops.all_to_all(x.contiguous(), a["dim"], a["concat_dim"], group)
    if kind == "slice":
        y, d = _grouped(x, a["dim"], a["groups"])
        length = y.shape[d]
        if "ratios" in a:
            cumulative = [0.0]
            for r in a["ratios"]:
                cumulative.append(cumulative[-1] + r)
            begin = round(cumulative[k] * length)
            end = length if k == n - 1 else round(cumulative[k + 1] * length)
        else:
            begin, end = k * (length // n), (k + 1) * (length // n)
        return _ungrouped(y.narrow(d, begin, max(0, end - begin)), a["dim"], a["groups"]).contiguous()
    if kind == "zero_others":
        return x if k == 0 else torch.zeros_like(x)
    if kind == "scale":
        return x * float(n) ** a["power"]
    raise ValidationError(f"unknown resharding step {text!r}")


def _apply_steps(x: torch.Tensor, steps: tuple[str, ...], mesh: _Mesh) -> torch.Tensor:
    for step in steps:
        x = _apply_step(x, step, mesh)
    return x


def gather_whole(x: torch.Tensor, placement: list[str], mesh: _Mesh) -> torch.Tensor:
    """The whole tensor from this rank's shard `x` placed `placement` (collective on the mesh)."""
    steps = tuple(s["text"] for s in _C.reshard_actions(placement, ["R"] * len(mesh.sizes)))
    return _apply_steps(x, steps, mesh)


class _ReshardFn(torch.autograd.Function):
    """Forward: the steps to the reader's placement; backward: the steps that bring the
    reader's gradient to the value's canonical one (spmd_rewrite.h). Explicit pairs, because
    a collective's own autograd formula presumes one gradient placement (all-gather's
    backward is a reduce-scatter only when the gradient is Partial)."""

    @staticmethod
    def forward(ctx, x, forward_steps, backward_steps, mesh):
        ctx.backward_steps, ctx.mesh = backward_steps, mesh
        y = _apply_steps(x, forward_steps, mesh)
        return y.view_as(y) if y is x else y

    @staticmethod
    def backward(ctx, grad):
        return _apply_steps(grad, ctx.backward_steps, ctx.mesh), None, None, None


class Reshard(torch.nn.Module):
    """``self.reshard(x, forward_steps, backward_steps)`` in the printed rank program."""

    def __init__(self, mesh: _Mesh):
        super().__init__()
        self._mesh = mesh

    def forward(self, x: torch.Tensor, forward_steps: tuple, backward_steps: tuple) -> torch.Tensor:
        if not forward_steps and not backward_steps:
            return x
        return _ReshardFn.apply(x, tuple(forward_steps), tuple(backward_steps), self._mesh)

