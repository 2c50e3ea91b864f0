"""Point-to-point and collective calls of the runtime on tensors of any device.

The runtime's own ``torch.distributed`` calls (gradient buckets, pipeline sends and
receives, the loss broadcast, ZeRO's parameter broadcast) go through here. On NCCL, and on
Gloo with CPU tensors, each is the ``torch.distributed`` call itself. On Gloo with a tensor
off the CPU (several ranks sharing one GPU, which NCCL refuses) the call runs on a host copy
and the result is copied back: Gloo has CUDA forms of some collectives and none of others
(send / recv), and the forms it has copy through host memory themselves. The ops of
``torch.ops.shardwise`` do the same in C++ (csrc/torch/collectives.cc, ``on_host``).

Every function returns what its ``torch.distributed`` namesake returns: a work handle for
the asynchronous ones, whose ``wait()`` also finishes the copy back to the device. Each call
is counted (traffic.py: bytes and calls per kind; a receive is its sender's send).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from . import traffic

# The collectives a compiled rank program (runtime/compiled.py) must run eagerly, each as one
# piece between the compiled ones: dynamo cannot trace an asynchronous collective or its Work,
# and tracing the traffic counters would guard on their values (a recompilation every step).
# compiled.py replaces each by its torch.compiler.disable'd form when the first program is
# compiled (every caller reads them off the module: ``transport.all_gather(...)``), not at
# import: disable imports torch._dynamo, which would add most of a second to every
# ``import shardwise``.
EAGER: list[str] = []


def _eager(fn):
    EAGER.append(fn.__name__)
    return fn

# torch 2.13 renames all_gather_into_tensor and reduce_scatter_tensor (deprecated there); 2.11
# has only the old names.
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def on_host(tensor: torch.Tensor, group=None) -> bool:
    """True when `group` (None: the default group) runs `tensor`'s collectives with Gloo and
    `tensor` is not on the CPU."""
    if tensor.device.type in ("cpu", "meta"):
        return False
    backend = str(dist.get_backend(group))
    if ":" not in backend:  # "gloo" / "nccl": one backend for every device type
        return backend == "gloo"
    per_device = dict(part.split(":", 1) for part in backend.split(","))  # "cpu:gloo,cuda:nccl"
    return per_device.get(tensor.device.type) == "gloo"


class _Staged:
    """A host-side work handle: ``wait()`` waits for it, then copies the host result into the
    device tensor (``into``; None for a send, whose host copy only has to stay alive)."""

    def __init__(self, work, host: torch.Tensor, into: torch.Tensor | None):
        self._work, self._host, self._into = work, host, into

    def wait(self, *args, **kwargs) -> bool:
        done = self._work.wait(*args, **kwargs) if self._work is not None else True
        if self._into is not None:
            self._into.copy_(self._host)
            self._into = None
        return done

    def is_completed(self) -> bool:
        return self._work is None or self._work.is_completed()


def _collective(call, tensor: torch.Tensor, group, async_op: bool, **kwargs):
    """`call` (dist.all_reduce, dist.broadcast) on `tensor` in place, on a host copy where
    ``on_host`` says so."""
    if not on_host(tensor, group):
        return call(tensor, group=group, async_op=async_op, **kwargs)
    host = tensor.cpu()
    work = _Staged(call(host, group=group, async_op=async_op, **kwargs), host, tensor)
    if async_op:
        return work
    work.wait()
    return None


@_eager
def all_reduce(tensor: torch.Tensor, op=dist.ReduceOp.SUM, group=None, async_op: bool = False):
    traffic.count("all_reduce", tensor)
    return _collective(dist.all_reduce, tensor, group, async_op, op=op)


def _out_of_place(call, output: torch.Tensor, input: torch.Tensor, group, async_op: bool):
    """`call` (all-gather or reduce-scatter into a tensor) from `input` into `output`, through
    host copies where ``on_host`` says so."""
    if not on_host(input, group):
        return call(output, input, group=group, async_op=async_op)
    host = torch.empty(output.shape, dtype=output.dtype, device="cpu")
    work = _Staged(call(host, input.cpu(), group=group, async_op=async_op), host, output)
    if async_op:
        return work
    work.wait()
    return None


@_eager
def all_gather(output: torch.Tensor, input: torch.Tensor, group=None, async_op: bool = False):
    """Every rank's `input`, rank r's at block r of `output` (dim 0; ``dist.all_gather_single``)."""
    traffic.count("all_gather", output)
    return _out_of_place(_ALL_GATHER, output, input, group, async_op)


@_eager
def reduce_scatter(output: torch.Tensor, input: torch.Tensor, group=None, async_op: bool = False):
    """The sum over the group's ranks of `input` (dim 0: one block per rank), rank r's block
    into `output` (``dist.reduce_scatter_single``)."""
    traffic.count("reduce_scatter", input)
    return _out_of_place(_REDUCE_SCATTER, output, input, group, async_op)


@_eager
def all_to_all(output: torch.Tensor, input: torch.Tensor, output_splits: list[int], input_splits: list[int],
               group=None) -> None:
    """Rank r's rows of `input` (dim 0, ``input_splits[r]`` of them, in rank order) to rank r,
    whose rows arrive in `output` in rank order, ``output_splits[r]`` from rank r
    (``dist.all_to_all_single``), through host copies where ``on_host`` says so."""
    traffic.count("all_to_all", input)
    if not on_host(input, group):
        dist.all_to_all_single(output, input, output_splits, input_splits, group=group)
        return
    host = torch.empty(output.shape, dtype=output.dtype, device="cpu")
    dist.all_to_all_single(host, input.cpu(), output_splits, input_splits, group=group)
    output.copy_(host)


@_eager
def broadcast(tensor: torch.Tensor, src: int, group=None, async_op: bool = False):
    traffic.count("broadcast", tensor)
    return _collective(dist.broadcast, tensor, group, async_op, src=src)


@_eager
def isend(tensor: torch.Tensor, dst: int, group=None, tag: int = 0):
    traffic.count("send", tensor)
    if not on_host(tensor, group):
        return dist.isend(tensor, dst=dst, group=group, tag=tag)
    host = tensor.detach().cpu()
    return _Staged(dist.isend(host, dst=dst, group=group, tag=tag), host, None)


@_eager
def irecv(tensor: torch.Tensor, src: int, group=None, tag: int = 0):
    if not on_host(tensor, group):
        return dist.irecv(tensor, src=src, group=group, tag=tag)
    host = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu")
    return _Staged(dist.irecv(host, src=src, group=group, tag=tag), host, tensor)


@_eager
def recv(tensor: torch.Tensor, src: int, group=None, tag: int = 0) -> None:
    irecv(tensor, src, group=group, tag=tag).wait()
