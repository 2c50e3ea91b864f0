"""Parameters held sharded and read whole, gathered as the plan prices them
(csrc/search/parameter_collectives.h; the rank program marks each gather with
``overlap`` and ``regather``):

- prefetched: a gather the core marks ``prefetch`` (one all-gather of an even, contiguous
  shard) is issued asynchronously where the previous prefetched gather is waited for (the
  first at the program's start) and waited for at its read (``self.prefetch.start`` /
  ``self.prefetch.wait``), FSDP's forward prefetch;
- released: a gathered weight marked ``regather`` is not kept for backward; autograd saves
  how to make it again and backward gathers it again, blocking (``self.regather``).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.fx

from . import traffic, transport
from .reshard import Reshard, _apply_steps, backward_of

# torch 2.13 renames all_gather_into_tensor (deprecated there); 2.11 has only the old name.
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


# A parameter held sharded (ZeRO-3 / FSDP) and read whole is gathered for its read. The
# gathered weight is not kept for backward: autograd saves, in its place, how to make it again
# (the shard and the steps), and backward runs the gather again, blocking, when it needs the
# weight (search/parameter_collectives.h: what the cost model prices, twice the gather's
# traffic, one gathered weight held at a time). Saved tensors are matched to the gathered
# weight by their storage while the call runs (a transpose linear saves is a view of it).
def _released_after(graph: torch.fx.Graph, call: torch.fx.Node, regathers: list) -> torch.fx.Node:
    """`call` run through ``self.regather``, which saves `regathers`' gathered weights as
    their shards."""
    with graph.inserting_before(call):
        fn = call.target if call.op == "call_function" else graph.get_attr(call.target)
        wrapped = graph.call_module("regather", (fn, tuple(call.args), dict(call.kwargs), tuple(regathers)))
    call.replace_all_uses_with(wrapped)
    graph.erase_node(call)
    return wrapped


def _storage(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage().data_ptr() if t.numel() else None
    except (RuntimeError, NotImplementedError):  # a tensor without storage
        return None


class _Released:
    """A saved view of a gathered weight, held as the shard it was gathered from."""

    def __init__(self, shard: torch.Tensor, steps: tuple, saved: torch.Tensor):
        self.shard, self.steps = shard.detach(), steps
        self.size, self.stride, self.offset = saved.size(), saved.stride(), saved.storage_offset()

    def gather(self, reshard: Reshard) -> torch.Tensor:
        steps = tuple(reshard._steps[t] for t in self.steps)
        whole = _apply_steps(self.shard, steps, reshard._mesh)
        return whole.as_strided(self.size, self.stride, self.offset)


class Regather(torch.nn.Module):
    """``self.regather(fn, args, kwargs, ((gathered, shard, steps), ...))``: fn(*args, **kwargs)
    with every tensor it saves for backward that is (a view of) a gathered weight saved as
    its shard, and gathered again when backward unpacks it."""

    def __init__(self, reshard: Reshard):
        super().__init__()
        self._reshard = reshard

    def forward(self, fn, args, kwargs, regathers):
        if not torch.is_grad_enabled():
            return fn(*args, **kwargs)
        by_storage = {}
        for gathered, shard, steps in regathers:
            ptr = _storage(gathered)
            if ptr is not None:
                by_storage[ptr] = (shard, steps)

        def pack(t):
            hit = by_storage.get(_storage(t))
            return t if hit is None else _Released(hit[0], hit[1], t)

        def unpack(x):
            return x.gather(self._reshard) if isinstance(x, _Released) else x

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            return fn(*args, **kwargs)


# ---- parameter gathers prefetched one read ahead (FSDP's forward prefetch) ---------------------
# A parameter's gather the core marks prefetched (search/parameter_collectives.h: one
# all-gather of an even, contiguous shard, outside a recomputed block) is issued
# asynchronously where the previous prefetched gather is waited for (the first at the
# program's start) and waited for at its read: it runs while the reads between compute,
# as the search prices it (beside the forward). Its backward is the gather's own backward
# steps (the gradient's reduce-scatter), as the reshard would run them.
class _Prefetches:
    """The gathers in flight of one program: index -> (output, work, dim)."""

    def __init__(self, reshard: Reshard):
        self.reshard = reshard
        self.pending: dict[int, tuple] = {}

    def issue(self, shard: torch.Tensor, text: str) -> tuple:
        step = self.reshard._steps[text]
        mesh = self.reshard._mesh
        axis, dim = step["axis"], step["dim"]
        group = mesh.groups[axis]
        moved = shard.detach().movedim(dim, 0).contiguous()
        out = torch.empty((mesh.sizes[axis] * moved.shape[0],) + tuple(moved.shape[1:]), dtype=moved.dtype,
                          device=moved.device)
        traffic.count("all_gather", out)
        if transport.on_host(moved, group):  # Gloo with a device tensor: staged, blocking
            out.copy_(_apply_steps(shard.detach(), (step,), mesh).movedim(dim, 0))
            return out, None, dim
        return out, _ALL_GATHER(out, moved, group=group, async_op=True), dim


class PrefetchStart(torch.nn.Module):
    """``self.prefetch.start(k, shard, step)``: issues the k-th prefetched gather."""

    def __init__(self, state: _Prefetches):
        super().__init__()
        self._state = state

    def forward(self, k: int, shard: torch.Tensor, step: str) -> None:
        if k == 0:
            self._state.pending.clear()  # a step that failed left its gathers behind
        self._state.pending[k] = self._state.issue(shard, step)


class _Prefetched(torch.autograd.Function):
    """Forward: the gathered weight (issued earlier); backward: the gather's backward steps."""

    @staticmethod
    def forward(ctx, shard, box, backward_steps, mesh, deferred):
        ctx.backward_steps, ctx.mesh, ctx.deferred = backward_steps, mesh, deferred
        return box[0]

    @staticmethod
    def backward(ctx, grad):
        return backward_of(grad, ctx.backward_steps, ctx.mesh, ctx.deferred), None, None, None, None


class PrefetchWait(torch.nn.Module):
    """``self.prefetch.wait(k, shard, forward_steps, backward_steps)``: the k-th prefetched
    gather, waited for (issued now, blocking, when nothing issued it)."""

    def __init__(self, state: _Prefetches):
        super().__init__()
        self._state = state

    def forward(self, k: int, shard: torch.Tensor, forward_steps: tuple, backward_steps: tuple,
                scatter=None) -> torch.Tensor:
        entry = self._state.pending.pop(k, None) or self._state.issue(shard, forward_steps[0])
        out, work, dim = entry
        if work is not None:
            work.wait()
        whole = out.movedim(0, dim).contiguous()
        steps = tuple(self._state.reshard._steps[t] for t in backward_steps)
        return _Prefetched.apply(shard, [whole], steps, self._state.reshard._mesh,
                                 self._state.reshard.deferred(scatter))


# ---- gradients reduce-scattered beside backward (FSDP2's post-backward reduce-scatter) ----------
# A parameter's gradient the core marks ``overlap="backward"`` (search/parameter_collectives.h,
# gradient_scatter_overlap: one reduce-scatter of an even, contiguous shard on one axis, no
# axis left to the buckets) is not reduced where backward reaches the gather: the reduce-
# scatter is issued asynchronously there, and the gather's backward gives its input no
# gradient. The scatter in flight is waited for when the next is issued (one whole gradient in
# flight besides the one being made, as FSDP2 holds it) or when backward ends (``finish``,
# called by the engine), and its result, cast to the leaf's dtype (a mixed-precision master),
# is added to the leaf's ``.grad``: what the blocking steps and the cast's backward made.
class DeferredScatters:
    """The reduce-scatters one program issues in backward. ``events``: ("issue" | "wait",
    parameter name) in order, for the step since ``start``."""

    def __init__(self, reshard: Reshard):
        self._reshard = reshard
        self._in_flight: tuple | None = None
        self.events: list[tuple[str, str]] = []

    def start(self) -> None:
        self._in_flight = None
        self.events = []

    def issue(self, grad: torch.Tensor, steps: tuple, name: str, leaf: torch.Tensor) -> None:
        (step,) = steps  # the core marks one reduce-scatter only (gradient_scatter_overlap)
        mesh = self._reshard._mesh
        axis, dim = step["axis"], step["dim"]
        group = mesh.groups[axis]
        moved = grad.movedim(dim, 0).contiguous()
        out = torch.empty((moved.shape[0] // mesh.sizes[axis],) + tuple(moved.shape[1:]), dtype=moved.dtype,
                          device=moved.device)
        work = transport.reduce_scatter(out, moved, group=group, async_op=True)
        earlier, self._in_flight = self._in_flight, (out, work, dim, name, leaf)
        self.events.append(("issue", name))
        if earlier is not None:
            self._land(earlier)

    def _land(self, entry: tuple) -> None:
        out, work, dim, name, leaf = entry
        work.wait()
        g = out.movedim(0, dim).to(leaf.dtype).contiguous()
        with torch.no_grad():
            leaf.grad = g if leaf.grad is None else leaf.grad.add_(g)
        self.events.append(("wait", name))

    def finish(self) -> None:
        """Backward has ended: the last scatter waited for and delivered."""
        if self._in_flight is not None:
            entry, self._in_flight = self._in_flight, None
            self._land(entry)

    def abandon(self) -> None:
        """A failed step: forget the scatter in flight."""
        self._in_flight = None
