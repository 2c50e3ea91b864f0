"""Resharding steps (csrc/transform/reshard_actions.h) run on tensors, with their autograd.

A rank program's operand carries its forward steps (the producer's placement to the
reader's) and its backward steps (the reader's gradient to the value's canonical one), each
a typed dict from the core ({"kind", "axis", "dim", "groups", "concat_dim", "reduce",
"scale_power", "ratios", "text"}); each step is one collective of ``torch.ops.shardwise`` on
the axis' group, or a local slice / scale. The printed program names a step by its text
("all_gather(axis 1, dim 0, g3)"); the Reshard module holds the typed step of each text.
"""
from __future__ import annotations

import torch

from .. import _C
from .._C import ValidationError
from .mesh import _Mesh

def block_bounds(size: int, ranks: int, rank: int, ratios: list[float]) -> tuple[int, int]:
    """This rank's [begin, end) of `size` rows cut in `ranks` blocks (``_C.block_bounds``: the
    bounds local_shard gave the shard). A constant to dynamo at static shapes
    (compiled.py marks it, assume_constant_result), not a graph break."""
    return tuple(_C.block_bounds(size, ranks, rank, ratios))


def _grouped(x: torch.Tensor, dim: int, groups: int) -> tuple[torch.Tensor, int]:
    """`x` with `dim` viewed as [groups, size / groups] (strided shards), and the dim to cut."""
    return (x, dim) if groups == 1 else (x.unflatten(dim, (groups, -1)), dim + 1)


def _ungrouped(x: torch.Tensor, dim: int, groups: int) -> torch.Tensor:
    return x if groups == 1 else x.flatten(dim, dim + 1)


def _apply_step(x: torch.Tensor, step: dict, mesh: _Mesh) -> torch.Tensor:
    kind, axis, a = step["kind"], step["axis"], step
    n, k, group = mesh.sizes[axis], mesh.coords[axis], mesh.group_names[axis]
    ops = torch.ops.shardwise
    if kind == "all_gather" and a["ratios"]:  # uneven blocks: pad to the longest, gather, trim
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
        try:  # the bounds local_shard gave this rank's shard
            begin, end = block_bounds(y.shape[d], n, k, list(a["ratios"]))
        except ValidationError as e:
            raise ValidationError(f"resharding step {step['text']!r} on a tensor of shape {tuple(x.shape)}: {e}") from e
        return _ungrouped(y.narrow(d, begin, end - begin), a["dim"], a["groups"]).contiguous()
    if kind == "zero_others":
        return x if k == 0 else torch.zeros_like(x)
    if kind == "scale":
        return x * float(n) ** a["scale_power"]
    raise ValidationError(f"unknown resharding step {step['text']!r}")


def _apply_steps(x: torch.Tensor, steps: tuple[dict, ...], mesh: _Mesh) -> torch.Tensor:
    for step in steps:
        x = _apply_step(x, step, mesh)
    return x


def gather_whole(x: torch.Tensor, placement: list[str], mesh: _Mesh) -> torch.Tensor:
    """The whole tensor from this rank's shard `x` placed `placement` (collective on the mesh)."""
    return _apply_steps(x, tuple(_C.reshard_actions(placement, ["R"] * len(mesh.sizes))), mesh)


class _ReshardFn(torch.autograd.Function):
    """Forward: the steps to the reader's placement; backward: the steps that bring the
    reader's gradient to the value's canonical one (spmd_rewrite.h). Explicit pairs, because
    a collective's own autograd formula presumes one gradient placement (all-gather's
    backward is a reduce-scatter only when the gradient is Partial)."""

    @staticmethod
    def forward(ctx, x, forward_steps, backward_steps, mesh, deferred=None):
        ctx.backward_steps, ctx.mesh, ctx.deferred = backward_steps, mesh, deferred
        y = _apply_steps(x, forward_steps, mesh)
        return y.view_as(y) if y is x else y

    @staticmethod
    def backward(ctx, grad):
        return backward_of(grad, ctx.backward_steps, ctx.mesh, ctx.deferred), None, None, None, None


def backward_of(grad: torch.Tensor, steps: tuple, mesh: _Mesh, deferred) -> torch.Tensor | None:
    """The gradient `steps` make of a reader's `grad`; None where `deferred` (scatters, leaf,
    unit group) takes it: the one reduce-scatter issued asynchronously with its group's,
    its result added to the leaf's gradient when it lands (parameter_gathers.DeferredScatters)."""
    if deferred is None:
        return _apply_steps(grad, steps, mesh)
    scatters, leaf, group = deferred
    scatters.issue(grad, steps, leaf, group)
    return None


class Reshard(torch.nn.Module):
    """``self.reshard(x, forward_steps, backward_steps)`` in the printed rank program: the
    steps named by their texts, each registered (``step``) with its typed form when lowered."""

    def __init__(self, mesh: _Mesh):
        super().__init__()
        self._mesh = mesh
        self._steps: dict[str, dict] = {}
        self.scatters = None  # parameter_gathers.DeferredScatters, set by the lowering

    def step(self, step: dict) -> str:
        """Registers a typed step; returns the text the program names it by."""
        self._steps.setdefault(step["text"], step)
        return step["text"]

    def forward(self, x: torch.Tensor, forward_steps: tuple, backward_steps: tuple, scatter=None) -> torch.Tensor:
        """`scatter`: (name, leaf, unit group) of a parameter whose gradient's reduce-scatter
        (the one backward step) runs beside backward, delivered into ``leaf.grad``."""
        if not forward_steps and not backward_steps:
            return x
        return _ReshardFn.apply(x, tuple(self._steps[t] for t in forward_steps),
                                tuple(self._steps[t] for t in backward_steps), self._mesh,
                                self.deferred(scatter))

    def deferred(self, scatter) -> tuple | None:
        """What backward_of takes for `scatter` ((name, leaf, unit group) or None; the name is
        the program's, for its reader)."""
        if scatter is None:
            return None
        _, leaf, group = scatter
        return self.scatters, leaf, group

