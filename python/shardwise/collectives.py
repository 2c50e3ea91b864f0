"""Differentiable collectives over torch.distributed process groups.

Thin wrappers over the C++ ops ``torch.ops.shardwise.*`` (csrc/torch/collectives.cc, which
documents each op's forward and backward). ``group`` is a ``torch.distributed``
``ProcessGroup``, its ``group_name``, or None for the default group. The ops run the group's
own backend (Gloo on CPU tensors, NCCL on CUDA tensors) and trace under FakeTensor and
torch.export like any op.

    y = all_gather(x, dim=1, group=tp)          # backward: reduce-scatter along dim 1
    y = reduce_scatter(x, dim=1, group=tp)      # backward: all-gather
    y = all_reduce(partial, group=tp)           # Megatron's g: backward identity
    x = copy_to_group(x, group=tp)              # Megatron's f: backward all-reduce
    y = all_to_all(x, split_dim=2, concat_dim=1, group=tp)
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from . import _C  # noqa: F401  (registers torch.ops.shardwise)

__all__ = ["all_reduce", "copy_to_group", "all_gather", "reduce_scatter", "all_to_all", "group_name"]


def group_name(group: dist.ProcessGroup | str | None = None) -> str:
    """The registered name of `group` (the default group when None)."""
    if isinstance(group, str):
        return group
    if not dist.is_initialized():
        raise RuntimeError("shardwise collectives need torch.distributed.init_process_group() first")
    return (group if group is not None else dist.group.WORLD).group_name


def all_reduce(x: torch.Tensor, reduce_op: str = "sum", group=None) -> torch.Tensor:
    return torch.ops.shardwise.all_reduce(x, reduce_op, group_name(group))


def copy_to_group(x: torch.Tensor, group=None) -> torch.Tensor:
    return torch.ops.shardwise.copy_to_group(x, group_name(group))


def all_gather(x: torch.Tensor, dim: int = 0, group=None) -> torch.Tensor:
    return torch.ops.shardwise.all_gather(x, dim, group_name(group))


def reduce_scatter(x: torch.Tensor, dim: int = 0, group=None) -> torch.Tensor:
    return torch.ops.shardwise.reduce_scatter(x, dim, group_name(group))


def all_to_all(x: torch.Tensor, split_dim: int, concat_dim: int, group=None) -> torch.Tensor:
    return torch.ops.shardwise.all_to_all(x, split_dim, concat_dim, group_name(group))
