"""Data parallelism's gradient reduction in buckets, overlapped with backward as DDP runs it."""
from __future__ import annotations

import torch
import torch.distributed as dist

from .. import _C
from . import transport

_BUCKET_BYTES = _C.GRADIENT_BUCKET_BYTES  # DDP's default bucket_cap_mb (csrc/cost/constants.h: the search prices it)


class _GradientBuckets:
    """Data parallelism's gradient all-reduce, overlapped with backward as DDP runs it: the
    parameters the program left Partial are packed, in reverse order of registration (about
    the order backward finishes them), into buckets of 25 MB per set of axes; a bucket's
    all-reduce is issued (async) as soon as its last gradient is accumulated, and every
    bucket is waited on at the end. Every rank forms the same buckets and autograd finishes
    them in the same order, so the collectives line up; a bucket whose parameter got no
    gradient this step is issued, with what it has, at the end, in bucket order.
    armed_only=True (a pipeline: several backwards per step): a gradient counts only once
    its parameter is armed (``arm``), which the pipeline engine does just before the last
    backward that accumulates it; overlap=False: no hooks, every bucket issued by finish()."""

    def __init__(self, params: list[tuple[torch.Tensor, tuple]], groups: list, overlap: bool = True,
                 reduce_dtype: torch.dtype | None = None, armed_only: bool = False):
        self._groups = groups
        self._armed_only = armed_only
        self._armed: set = set()
        self._reduce_dtype = reduce_dtype  # a mixed-precision policy's (runtime/precision.py)
        self._buckets: list[tuple[tuple, list]] = []
        by_axes: dict[tuple, list] = {}
        for param, axes in reversed(params):
            by_axes.setdefault(tuple(axes), []).append(param)
        for axes, group in by_axes.items():
            bucket, size = [], 0
            for param in group:
                bucket.append(param)
                size += param.numel() * param.element_size()
                if size >= _BUCKET_BYTES:
                    self._buckets.append((axes, bucket))
                    bucket, size = [], 0
            if bucket:
                self._buckets.append((axes, bucket))
        self._bucket_of = {}
        for i, (_, bucket) in enumerate(self._buckets):
            for param in bucket:
                self._bucket_of[param] = i
                if overlap:
                    param.register_post_accumulate_grad_hook(self._ready)
        self._active = False
        self.issued_in_backward = 0

    def start(self, carry: dict | None = None) -> None:
        """A step begins; `carry`: gradients of earlier unsynchronised steps (engine.no_sync), by
        parameter, folded into each bucket before its reduction (popped from the dict)."""
        self._carry = carry if carry is not None else {}
        self._active = True
        self._armed = set()
        self.issued_in_backward = 0  # buckets a hook issued this step (the rest: at finish())
        self._waiting = [len(bucket) for _, bucket in self._buckets]
        self._issued: dict[int, tuple] = {}

    def __len__(self) -> int:
        return len(self._buckets)

    def arm(self, params: list) -> None:
        """The next backward accumulates `params`' gradients for the last time this step."""
        self._armed.update(id(p) for p in params)

    def counts(self, param: torch.Tensor) -> bool:
        """Whether a gradient of `param` accumulated now would count towards its bucket (what
        ``_ready`` does with it): not before the step, and in a pipeline only once armed. Where
        it would not, the accumulation may skip autograd and this hook (runtime/fused_accumulation.py)."""
        return self._active and (not self._armed_only or id(param) in self._armed)

    def _ready(self, param: torch.Tensor) -> None:
        if not self.counts(param):
            return  # a backward outside train_step, or an earlier micro-batch's: more will come
        self._armed.discard(id(param))  # counted once, whatever runs after
        i = self._bucket_of[param]
        self._waiting[i] -= 1
        if self._waiting[i] == 0:
            self.issued_in_backward += 1
            self._issue(i)

    def _issue(self, i: int) -> None:
        axes, bucket = self._buckets[i]
        for p in bucket:
            held = self._carry.pop(p, None)
            if held is not None:
                p.grad = held.clone() if p.grad is None else p.grad.add_(held)
        grads = [p.grad for p in bucket if p.grad is not None]
        if not grads:
            self._issued[i] = None
            return
        flat = torch._utils._flatten_dense_tensors(grads)
        if self._reduce_dtype is not None and flat.dtype != self._reduce_dtype:
            flat = flat.to(self._reduce_dtype)
        self._issued[i] = (flat, grads, transport.all_reduce(flat, group=self._groups[axes[0]], async_op=True), axes[1:])

    def abandon(self) -> None:
        """A failed step: forget the buckets in flight (their collectives failed or never ran)."""
        self._active = False
        self._armed = set()
        self._issued = {}

    def finish(self) -> None:
        for i in range(len(self._buckets)):
            if i not in self._issued:
                self._issue(i)
        for i in sorted(self._issued, key=lambda i: i):
            entry = self._issued[i]
            if entry is None:
                continue
            flat, grads, work, rest = entry
            work.wait()
            for a in rest:  # further axes: one after the other on the same buffer
                transport.all_reduce(flat, group=self._groups[a])
            if flat.dtype != grads[0].dtype:
                flat = flat.to(grads[0].dtype)
            for g, reduced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
                g.copy_(reduced)
        # Drop the flat buffers and this step's gradient references: kept, they held a copy of
        # every gradient between steps, and the gradients themselves past zero_grad().
        self._issued = {}
        self._active = False

