"""Checkpoints that survive a change of plan, written with torch.distributed.checkpoint (DCP).

    shardwise.save_checkpoint("ckpt", engine, optimizer, extra={"step": 100})
    extra = shardwise.load_checkpoint("ckpt", other_engine, other_optimizer)  # any plan, any world
    shardwise.load_checkpoint("ckpt", plain_model, torch_optimizer)           # one device, no job

What is stored is the single-device model's state, whatever the plan: each parameter and
persistent buffer under ``model/<name>`` with its global shape, each optimizer state tensor
under ``optim/<name>/<key>`` (``exp_avg``, ``step``, ...), the optimizer's hyperparameters,
and the caller's ``extra``. Every rank writes the boxes of the global tensors it holds: a
sharded dim contributes one run per box (a strided fused-QKV shard three, an uneven share its
own length), a replica is written once (DCP removes duplicate boxes across ranks). Loading
asks DCP for this rank's boxes of the stored tensors, so any plan reads any other's files
(DCP's resharding reads the overlaps). Names are the model's own (a tied weight under its
first name), so an ``nn.Module`` and a torch optimizer save and load the same format.

Nothing half-done: a load is checked against the checkpoint's metadata (every name present,
the same global shapes, nothing left over) on every rank before anything is read, everything
is read into fresh tensors, and only when DCP succeeded on every rank are the parameters,
buffers and optimizer state replaced. A save writes into ``<path>.partial`` and renames it
to ``<path>`` at the end, so a crash mid-save leaves the previous checkpoint as it was.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import warnings
from typing import Any

import torch
import torch.distributed as dist

from . import _C
from ._C import ValidationError
from ._logging import get_logger
from .runtime.engine_base import EngineBase
# What a rank holds, as boxes (runtime/state.py: the engines build it; keep_state, held_state and
# KeptState are re-exported here, where they used to live).
from .runtime.state import KeptState, _Box, _boxes, _Held, _state_names, held_state, keep_state, whole  # noqa: F401

log = get_logger("shardwise.checkpoint")

__all__ = ["save_checkpoint", "load_checkpoint"]

_FORMAT = 1
_META = "shardwise"
_HYPER = "optim/hyperparameters"


class CheckpointError(_C.ShardwiseError):
    """A checkpoint could not be written or read (storage, or a rank failed); nothing changed."""


# ---- what a target holds ---------------------------------------------------------------------
def _model_state(target) -> tuple[list[str], dict[str, _Held], dict[str, torch.Tensor]]:
    """The names of every parameter and persistent buffer of the single-device model, {name:
    held tensor} of those this rank holds (a pipeline rank: its stages'), and {name: parameter
    object} of this rank's trainable ones (what an optimizer steps)."""
    if isinstance(target, EngineBase):  # the SPMD and pipeline engines: runtime/state.py's held_state
        return target._checkpoint_state()
    if isinstance(target, torch.nn.Module):
        names = _state_names(target)
        tensors = {**dict(target.named_parameters()), **dict(target.named_buffers())}
        held = {n: whole(tensors[n]) for n in names}
        return names, held, dict(target.named_parameters())
    raise ValidationError(f"checkpoint: expected a shardwise Engine or a torch.nn.Module, got {type(target).__name__}")


def _optimizer_parts(optimizer) -> list[tuple[Any, Any]]:
    """(outer, holder) per optimizer inside `optimizer`: holder keeps the state (a
    ZeroRedundancyOptimizer's local optimizer over the parameters this rank owns)."""
    inner = getattr(optimizer, "optimizers", None)
    parts = []
    for o in (inner if inner is not None else [optimizer]):
        holder = getattr(o, "optim", o)
        if not hasattr(holder, "state") or not hasattr(holder, "param_groups"):
            raise ValidationError(f"checkpoint: {type(o).__name__} is not a torch.optim optimizer")
        parts.append((o, holder))
    return parts


def _optimizer_state(optimizer, params: dict[str, torch.Tensor], model: dict[str, _Held]):
    """{key: held tensor} of the optimizer state this rank keeps, {key: object} of its
    non-tensor state, and the parameters it steps as [(name, parameter, holder)]."""
    name_of = {id(p): n for n, p in params.items()}
    tensors: dict[str, _Held] = {}
    objects: dict[str, Any] = {}
    stepped = []
    for _, holder in _optimizer_parts(optimizer):
        for group in holder.param_groups:
            for p in group["params"]:
                if id(p) not in name_of:
                    raise ValidationError(f"checkpoint: the optimizer steps a tensor of shape {list(p.shape)} that is "
                                          "not one of the model's parameters")
                name = name_of[id(p)]
                stepped.append((name, p, holder))
                for key, value in holder.state.get(p, {}).items():
                    full = f"optim/{name}/{key}"
                    if isinstance(value, torch.Tensor):
                        tensors[full] = _state_tensor(full, value, model[name])
                    else:
                        objects[full] = value
    return tensors, objects, stepped


def _state_tensor(key: str, value: torch.Tensor, param: _Held) -> _Held:
    """Optimizer state shaped as its parameter's shard is placed as the parameter is; a
    scalar (AdamW's step) is whole."""
    if value.dim() == 0:
        return _Held([], value, [_Box((), (), ())])
    if list(value.shape) == list(param.tensor.shape):
        return _Held(param.shape, value, param.boxes)
    raise ValidationError(f"checkpoint: optimizer state {key} has shape {list(value.shape)}, neither a scalar nor "
                          f"the shape of its parameter's shard {list(param.tensor.shape)}")


def _hyperparameters(optimizer) -> list[dict]:
    groups = [{k: v for k, v in g.items() if k not in ("params", "param_names")}
              for outer, _ in _optimizer_parts(optimizer) for g in outer.param_groups]
    if groups and all(_same(g, groups[0]) for g in groups):
        return groups[:1]  # one set for every group, whatever the plan split them into
    return groups


def _same(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and torch.equal(x, y)):
                return False
        elif x != y:
            return False
    return True


# ---- save / load ------------------------------------------------------------------------------
def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank() -> int:
    return dist.get_rank() if _distributed() else 0


def _failures(error: BaseException) -> str:
    """One line per failed rank (DCP's own message carries each rank's traceback)."""
    from ._checkpoint_dcp import CheckpointException

    if isinstance(error, CheckpointException):
        return "; ".join(f"rank {r}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                         for r, (exc, _) in sorted(error.failures.items()))
    return f"rank {_rank()}: {type(error).__name__}: {error}"


@contextlib.contextmanager
def _quiet():
    """DCP warns that a job of one process is one; that is what a single-device model means."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _agree(errors: list[str]) -> None:
    """Raise on every rank when any rank found a problem (so none goes on into DCP alone)."""
    if _distributed():
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, errors)
        ranks: dict[str, list[int]] = {}
        for r, found in enumerate(everyone):
            for e in found:
                ranks.setdefault(e, []).append(r)
        errors = [f"{'rank' if len(rs) == 1 else 'ranks'} {', '.join(map(str, rs))}: {e}" for e, rs in ranks.items()]
    if errors:
        shown = "; ".join(errors[:6]) + (f"; and {len(errors) - 6} more" if len(errors) > 6 else "")
        raise ValidationError(shown)


def save_checkpoint(path: str | os.PathLike, target, optimizer=None, extra: dict | None = None) -> None:
    """Write `target`'s state (an Engine, a PipelineEngine or an nn.Module) and `optimizer`'s
    to the directory `path` (replaced at the end when it exists). Under torch.distributed every
    rank calls it with its own engine and optimizer. `extra`: small values (ints, floats,
    strings, tensors) given back by load_checkpoint, e.g. the step count."""
    path = os.fspath(path)
    tensors: dict[str, _Held] = {}
    objects: dict[str, Any] = {}
    try:  # what this rank writes; a rank that cannot say stops every rank before DCP's collectives
        _, held, params = _model_state(target)
        tensors.update({f"model/{n}": h for n, h in held.items()})
        if optimizer is not None:
            state, other, _ = _optimizer_state(optimizer, params, held)
            tensors.update(state)
            objects.update(other)
            objects[_HYPER] = _hyperparameters(optimizer)
        _agree([])
    except ValidationError as e:
        _agree([str(e)])
        raise
    plan = getattr(target, "plan", None)
    objects[_META] = {"format": _FORMAT, "world_size": dist.get_world_size() if _distributed() else 1,
                      "plan_hash": plan.hash() if plan is not None else "", "optimizer": optimizer is not None,
                      "extra": dict(extra or {})}
    partial = path + ".partial"
    if _rank() == 0 and os.path.exists(partial):
        shutil.rmtree(partial)
    if _distributed():
        dist.barrier()
    from ._checkpoint_dcp import BoxSavePlanner, CheckpointException, dcp

    try:
        with _quiet():
            dcp.save({}, storage_writer=dcp.FileSystemWriter(partial), planner=BoxSavePlanner(tensors, objects),
                     no_dist=not _distributed())
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - DCP's is a BaseException: every rank's failure
        raise CheckpointError(f"save_checkpoint: writing {path} failed: {_failures(e)}") from e
    if _rank() == 0:  # the previous checkpoint stays whole until the new one is complete
        old = path + ".old"
        if os.path.exists(old):
            shutil.rmtree(old)
        if os.path.exists(path):
            os.replace(path, old)
        os.replace(partial, path)
        if os.path.exists(old):
            shutil.rmtree(old)
    if _distributed():
        dist.barrier()


def load_checkpoint(path: str | os.PathLike, target, optimizer=None) -> dict:
    """Replace `target`'s parameters and buffers (and `optimizer`'s state and hyperparameters)
    with the checkpoint's, resharded for `target`'s plan. Returns the `extra` given to
    save_checkpoint. Raises ValidationError (nothing changed) when the checkpoint is not one,
    or holds another model: a missing or extra name, or another shape."""
    path = os.fspath(path)
    if not os.path.exists(path) and os.path.exists(path + ".old"):
        # save_checkpoint stopped between moving the previous checkpoint aside and moving the
        # new one in: the previous one is whole under .old.
        log.warning("load_checkpoint: %s is missing; loading %s.old, the checkpoint before an interrupted save",
                    path, path)
        path = path + ".old"
    from ._checkpoint_dcp import BoxLoadPlanner, CheckpointException, TensorStorageMetadata, dcp

    errors: list[str] = []
    metadata = None
    try:
        metadata = dcp.FileSystemReader(path).read_metadata()
    except Exception as e:  # noqa: BLE001 - a missing or unreadable directory: say which
        errors.append(f"load_checkpoint: {path} is not a readable checkpoint ({type(e).__name__}: {e})")
    if metadata is not None and _META not in metadata.state_dict_metadata:
        errors.append(f"load_checkpoint: {path} is a DCP checkpoint but not shardwise's (no '{_META}' entry)")
    try:
        all_names, held, params = _model_state(target)
    except ValidationError as e:
        _agree([str(e)])
        raise
    stored = metadata.state_dict_metadata if metadata is not None else {}
    staged: dict[str, _Held] = {}
    objects = [_META]
    stepped = []
    if metadata is not None and not errors:
        names = set(all_names)
        saved = {k[len("model/"):] for k in stored if k.startswith("model/")}
        missing, unexpected = sorted(names - saved), sorted(saved - names)
        if missing:
            errors.append(f"load_checkpoint: {path} lacks {len(missing)} of the model's tensors: "
                          + ", ".join(missing[:5]))
        if unexpected:
            errors.append(f"load_checkpoint: {path} holds {len(unexpected)} tensors the model has not (a checkpoint "
                          "of another model?): " + ", ".join(unexpected[:5]))
        for name in sorted(set(held) & saved):
            md, h = stored[f"model/{name}"], held[name]
            if list(md.size) != h.shape:
                errors.append(f"load_checkpoint: {name} is {list(md.size)} in {path}, {h.shape} in the model")
                continue
            staged[f"model/{name}"] = _Held(h.shape, torch.empty_like(h.tensor, dtype=md.properties.dtype), h.boxes)
        if optimizer is not None:
            if _HYPER not in stored:
                errors.append(f"load_checkpoint: {path} was saved without an optimizer")
            else:
                objects.append(_HYPER)
                try:
                    _, _, stepped = _optimizer_state(optimizer, params, held)
                except ValidationError as e:
                    errors.append(str(e))
                for name, p, _ in stepped:
                    for key, md in stored.items():
                        if not key.startswith(f"optim/{name}/") or "/" in key[len(f"optim/{name}/"):]:
                            continue
                        if isinstance(md, TensorStorageMetadata):
                            if list(md.size) not in ([], held[name].shape):
                                errors.append(f"load_checkpoint: {key} is {list(md.size)} in {path}, neither a "
                                              f"scalar nor {name}'s shape {held[name].shape}")
                                continue
                            local = torch.empty(p.shape if md.size else (), dtype=md.properties.dtype,
                                                device=held[name].tensor.device)
                            try:
                                staged[key] = _state_tensor(key, local, held[name])
                            except ValidationError as e:
                                errors.append(str(e))
                        else:
                            objects.append(key)
    _agree(errors)
    planner = BoxLoadPlanner(staged, objects)
    try:
        with _quiet():
            dcp.load({}, storage_reader=dcp.FileSystemReader(path), planner=planner, no_dist=not _distributed())
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - DCP's is a BaseException: every rank's failure
        raise CheckpointError(f"load_checkpoint: reading {path} failed (nothing was changed): {_failures(e)}") from e
    hyper = planner.objects.get(_HYPER)
    groups = sum(len(outer.param_groups) for outer, _ in _optimizer_parts(optimizer)) if optimizer is not None else 0
    if optimizer is not None and len(hyper) not in (1, groups):
        raise ValidationError(f"load_checkpoint: {path} has {len(hyper)} parameter groups of distinct "
                              f"hyperparameters, the optimizer {groups} (nothing was changed)")
    # Every rank read everything: replace.
    with torch.no_grad():
        for name, h in held.items():
            h.tensor.copy_(staged[f"model/{name}"].tensor)
    if optimizer is not None:
        _set_optimizer(optimizer, stepped, staged, planner.objects)
    return dict(planner.objects[_META].get("extra", {}))


def _set_optimizer(optimizer, stepped: list, staged: dict[str, _Held], objects: dict[str, Any]) -> None:
    for name, p, holder in stepped:
        prefix = f"optim/{name}/"
        state = {k[len(prefix):]: h.tensor for k, h in staged.items() if k.startswith(prefix)}
        state.update({k[len(prefix):]: v for k, v in objects.items() if k.startswith(prefix)})
        holder.state.pop(p, None)
        if state:
            holder.state[p] = state
    hyper = objects[_HYPER]
    i = 0
    for outer, holder in _optimizer_parts(optimizer):
        for j, group in enumerate(outer.param_groups):
            values = hyper[0] if len(hyper) == 1 else hyper[i]
            group.update(values)
            if holder is not outer and j < len(holder.param_groups):  # a ZeroRedundancyOptimizer's own
                holder.param_groups[j].update(values)
            i += 1
