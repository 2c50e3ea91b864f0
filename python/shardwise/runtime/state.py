"""What a rank holds of the single-device model's state, as boxes of global tensors: what the
engines offer checkpoints (shardwise/checkpoint.py writes and reads these boxes with DCP).

    kept = keep_state(model, read)               # at parallelize: names, shapes, what no rank reads
    names, held, params = held_state(kept, local, placement_of, mesh, params)   # engine._checkpoint_state()

A box is one contiguous run of a global tensor per dim: a sharded dim gives one run per
shard this rank holds (a strided fused-QKV shard three, an uneven share its own length).
"""
from __future__ import annotations

import dataclasses
import itertools

import torch

from .. import _C


@dataclasses.dataclass
class _Box:
    offsets: tuple[int, ...]      # in the global tensor
    sizes: tuple[int, ...]
    local: tuple[int, ...]        # the same box's offsets in this rank's tensor


@dataclasses.dataclass
class _Held:
    """One global tensor as this rank holds it: its local tensor and the boxes it covers."""
    shape: list[int]
    tensor: torch.Tensor
    boxes: list[_Box]


def _boxes(shape: list[int], placement: list[str] | None, mesh_sizes: list[int] | None, rank: int) -> list[_Box]:
    """The boxes of the global `shape` that `rank` holds under `placement` (None: all of it)."""
    if placement is None or not mesh_sizes:
        return [_Box(tuple([0] * len(shape)), tuple(shape), tuple([0] * len(shape)))]
    runs = _C.local_shard(list(shape), list(placement), list(mesh_sizes), rank)["dims"]
    per_dim = []
    for size, dim_runs in zip(shape, runs):
        at, entries = 0, []
        for start, stop in dim_runs:
            entries.append((start, stop - start, at))
            at += stop - start
        if not entries and size == 0:
            entries = [(0, 0, 0)]
        per_dim.append(entries)
    out = []
    for combo in itertools.product(*per_dim):
        box = _Box(tuple(c[0] for c in combo), tuple(c[1] for c in combo), tuple(c[2] for c in combo))
        if all(box.sizes) or not all(shape):  # skip empty boxes of a non-empty tensor
            out.append(box)
    return out


def whole(tensor: torch.Tensor) -> _Held:
    """A tensor held whole (one box)."""
    return _Held(list(tensor.shape), tensor, _boxes(list(tensor.shape), None, None, 0))


@dataclasses.dataclass
class KeptState:
    """What an engine remembers of its model for checkpoints: the model's checkpointed names,
    their global shapes, and a copy of those no stage reads (kept whole, so nothing is lost)."""
    names: list[str]
    shapes: dict[str, list[int]]
    extra: dict[str, torch.Tensor]


def keep_state(model: torch.nn.Module, read: set[str]) -> KeptState:
    """`read`: the names the rewritten program holds on some rank."""
    names = _state_names(model)
    tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    return KeptState(names, {n: list(tensors[n].shape) for n in names},
                     {n: tensors[n].detach().clone() for n in names if n not in read})


def held_state(kept: KeptState, local: dict[str, torch.Tensor], placement_of, mesh, params: dict):
    """_model_state of an engine: `local` its tensors by name, `placement_of(name)` their
    placements on `mesh` (a runtime.mesh._Mesh, or None: whole)."""
    held = {}
    for name in kept.names:
        if name in local:
            shape = kept.shapes[name]
            if mesh is None:
                held[name] = _Held(shape, local[name], _boxes(shape, None, None, 0))
            else:
                held[name] = _Held(shape, local[name], _boxes(shape, placement_of(name), mesh.sizes, mesh.rank))
        elif name in kept.extra:
            held[name] = whole(kept.extra[name])
    return kept.names, held, params


def _state_names(model: torch.nn.Module) -> list[str]:
    """The model's checkpointed names: parameters (a tied weight under its first name) and
    the buffers its state_dict keeps (persistent ones)."""
    persistent = set(model.state_dict(keep_vars=True))
    return [n for n, _ in model.named_parameters()] + [n for n, _ in model.named_buffers() if n in persistent]
