"""Each rank builds only its own shards of a model's parameters and buffers.

    shards = shardwise.materialize(model, plan, rank)           # a model with real weights
    shards = shardwise.materialize(meta_model, plan, rank, loader=load)   # weights elsewhere

``plan`` is a searched plan (its sharding section says where every value lives on the
mesh); the slices come from ``csrc/transform/local_shard.h`` (contiguous, nested, strided
and uneven shards). With a model on the meta device, nothing of full size is allocated:
``loader(name, index)`` returns the rank's slice of the named tensor, where ``index`` is a
tuple with one entry per dim: a ``slice`` when the rank holds one run of that dim, a
``LongTensor`` of indices otherwise (a strided fused-QKV shard). ``take(tensor, index)``
applies it dim by dim (``tensor[index]`` does the same while at most one entry is a
tensor). A loader that returns the full tensor is sliced here.

A Partial placement is not a layout of stored values: parameters and buffers never get
one; asking for it raises ``shardwise.ValidationError``.
"""
from __future__ import annotations

from typing import Callable

import torch

from . import _C
from ._C import ValidationError

__all__ = ["local_index", "local_tensor", "materialize", "take"]


def local_index(shape, placements, mesh, rank: int) -> tuple:
    """The index of rank `rank`'s shard of a tensor of `shape` placed `placements` (one text
    placement per mesh axis, outermost first) on a mesh of `mesh` sizes."""
    shard = _C.local_shard(list(shape), list(placements), list(mesh), rank)
    if shard["partial"]:
        raise ValidationError(f"a Partial placement {list(placements)} holds no slice of stored values")
    index = []
    for runs in shard["dims"]:
        if not runs:  # the rank holds none of this dim (an uneven share of 0, or a dim of size 0)
            index.append(slice(0, 0))
        elif len(runs) == 1:
            index.append(slice(runs[0][0], runs[0][1]))
        else:
            # A host index: indexing a tensor of any device with it is allowed (torch moves it).
            index.append(torch.cat([torch.arange(start, stop, device="cpu") for start, stop in runs]))
    return tuple(index)


def local_tensor(tensor: torch.Tensor, placements, mesh, rank: int) -> torch.Tensor:
    """Rank `rank`'s shard of `tensor` (a copy: contiguous, owning its memory)."""
    return take(tensor, local_index(tuple(tensor.shape), placements, mesh, rank))


def take(tensor: torch.Tensor, index: tuple) -> torch.Tensor:
    """`tensor` restricted to `index` (from local_index), dim by dim: a contiguous copy."""
    out = tensor
    for dim, sel in enumerate(index):
        if isinstance(sel, slice):
            out = out.narrow(dim, sel.start, sel.stop - sel.start)
        else:
            out = out.index_select(dim, sel)
    return out.contiguous().clone()


def materialize(model: torch.nn.Module, plan, rank: int,
                loader: Callable[[str, tuple], torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """{name: rank `rank`'s shard} for every parameter and buffer of `model` that the plan
    places. Tensors on the meta device need `loader`; the others are sliced directly."""
    sharding = plan.sharding
    if not sharding:
        raise ValidationError("materialize needs a plan with a sharding section (from shardwise.plan)")
    mesh, placements = sharding["mesh"], sharding["placements"]
    world = 1
    for size in mesh:
        world *= size
    if not 0 <= rank < world:
        raise ValidationError(f"materialize: rank {rank} outside the plan's mesh {mesh} of {world} ranks")
    out: dict[str, torch.Tensor] = {}
    named = list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers(remove_duplicate=False))
    for name, tensor in named:
        if name not in placements or name in out:
            continue
        index = local_index(tuple(tensor.shape), placements[name], mesh, rank)
        if tensor.device.type == "meta":
            if loader is None:
                raise ValidationError(f"materialize: {name} is on the meta device; pass loader=(name, index) -> tensor")
            piece = loader(name, index)
            if tuple(piece.shape) == tuple(tensor.shape):
                piece = take(piece, index)
            expected = tuple(_length(sel, n) for sel, n in zip(index, tensor.shape))
            if tuple(piece.shape) != expected:
                raise ValidationError(f"materialize: the loader gave {name} of shape {tuple(piece.shape)}, "
                                      f"rank {rank} holds {expected}")
            out[name] = piece
        else:
            out[name] = take(tensor.detach(), index)
    return out


def _length(sel, size: int) -> int:
    return sel.stop - sel.start if isinstance(sel, slice) else int(sel.numel())
