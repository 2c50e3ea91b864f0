"""Parameters held sharded and read whole, gathered as the plan prices them
(csrc/search/parameter_collectives.h; the rank program marks each gather with
``overlap``, ``regather`` and ``unit_group``):

- prefetched: the gathers the core marks ``prefetch`` (one all-gather of an even,
  contiguous shard) of one unit group (a transformer layer's parameters, on one axis, in one
  dtype) are one flattened all-gather, issued asynchronously where the previous group is
  first waited for (the first at the program's start) and waited for at the first read of
  one of them (``self.prefetch.start`` / ``self.prefetch.wait``), FSDP2's unit and forward
  prefetch;
- released: a gathered weight marked ``regather`` is not kept for backward; autograd saves
  how to make it again and backward gathers it again, blocking, with the rest of its unit
  group at the first unpack of one of them (``self.regather``);
- reduce-scattered beside backward: the gradients marked ``overlap="backward"`` of one unit
  group are one flattened reduce-scatter, issued asynchronously once the group's last has
  arrived and waited for at the next (``DeferredScatters``).
"""
from __future__ import annotations

import torch
import torch.fx

from . import transport
from .reshard import Reshard, _apply_steps, backward_of

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


class _RegatherUnit:
    """The members of one unit group (parameter_collectives.h) saved in one forward pass,
    gathered again together: one flattened all-gather at the first unpack of any of them,
    held until the unit's saved views are gone (FSDP2's backward all-gather of a unit)."""

    def __init__(self, reshard: Reshard):
        self._reshard = reshard
        self._index: dict[tuple, int] = {}
        self._shards: list[torch.Tensor] = []
        self._steps: list[str] = []
        self._wholes: list[torch.Tensor] | None = None

    def member(self, shard: torch.Tensor, steps: tuple) -> int:
        """The index of `shard` (gathered by `steps`) in the group: one per shard, however many
        views of its gathered weight the calls save."""
        key = (_storage(shard), shard.storage_offset(), tuple(shard.shape), steps)
        if key not in self._index:
            self._index[key] = len(self._shards)
            self._shards.append(shard.detach())
            self._steps.append(steps[0])  # one all-gather (a prefetched gather's)
        return self._index[key]

    def whole(self, i: int) -> torch.Tensor:
        if self._wholes is None:
            out, work, layout = flat_gather(self._shards, [self._reshard._steps[t] for t in self._steps],
                                            self._reshard._mesh)
            if work is not None:
                work.wait()
            self._wholes = flat_wholes(out, layout)
        return self._wholes[i]


class _Released:
    """A saved view of a gathered weight, held as the shard it was gathered from (and, in a
    unit group, its place in the group's gather again)."""

    def __init__(self, shard: torch.Tensor, steps: tuple, saved: torch.Tensor, unit=None, member: int = -1):
        self.shard, self.steps = shard.detach(), steps
        self.size, self.stride, self.offset = saved.size(), saved.stride(), saved.storage_offset()
        self.unit, self.member = unit, member

    def gather(self, reshard: Reshard) -> torch.Tensor:
        if self.unit is not None:
            whole = self.unit.whole(self.member)
        else:
            whole = _apply_steps(self.shard, tuple(reshard._steps[t] for t in self.steps), reshard._mesh)
        return whole.as_strided(self.size, self.stride, self.offset)


class Regather(torch.nn.Module):
    """``self.regather(fn, args, kwargs, ((gathered, shard, steps, unit_group), ...))``:
    fn(*args, **kwargs) with every tensor it saves for backward that is (a view of) a
    gathered weight saved as its shard, and gathered again when backward unpacks it: with the
    other members of its unit group saved in the same forward pass (unit_group >= 0), else
    alone. ``new_pass()`` (the program's forward pre-hook) starts a forward pass's groups."""

    def __init__(self, reshard: Reshard):
        super().__init__()
        self._reshard = reshard
        self._units: dict[int, _RegatherUnit] = {}

    def new_pass(self) -> None:
        self._units = {}

    def forward(self, fn, args, kwargs, regathers):
        if not torch.is_grad_enabled():
            return fn(*args, **kwargs)
        by_storage = {}
        for gathered, shard, steps, group in regathers:
            ptr = _storage(gathered)
            if ptr is not None:
                by_storage[ptr] = (shard, steps, group)

        def pack(t):
            hit = by_storage.get(_storage(t))
            if hit is None:
                return t
            shard, steps, group = hit
            if group < 0:
                return _Released(shard, steps, t)
            unit = self._units.setdefault(group, _RegatherUnit(self._reshard))
            return _Released(shard, steps, t, unit, unit.member(shard, steps))

        def unpack(x):
            return x.gather(self._reshard) if isinstance(x, _Released) else x

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            return fn(*args, **kwargs)


# ---- flattened collectives of a unit group ----------------------------------------------------
def flat_gather(shards: list[torch.Tensor], steps: list[dict], mesh) -> tuple:
    """One all-gather of every shard (each one all-gather step, all on one axis), flattened:
    (output, work or None, layout) for ``flat_wholes``."""
    axis = steps[0]["axis"]
    group = mesh.groups[axis]
    moved = [s.detach().movedim(st["dim"], 0).contiguous() for s, st in zip(shards, steps)]
    flat = torch.cat([m.reshape(-1) for m in moved])
    out = torch.empty(mesh.sizes[axis] * flat.numel(), dtype=flat.dtype, device=flat.device)
    work = transport.all_gather(out, flat, group=group, async_op=True)
    return out, work, (mesh.sizes[axis], [(tuple(m.shape), st["dim"]) for m, st in zip(moved, steps)])


def flat_wholes(out: torch.Tensor, layout: tuple) -> list[torch.Tensor]:
    """The whole tensors of a flattened all-gather's output: rank r's row holds its shards,
    one after the other."""
    n, members = layout
    rows = out.view(n, -1)
    wholes, offset = [], 0
    for shape, dim in members:
        size = 1
        for extent in shape:
            size *= extent
        block = rows[:, offset:offset + size].reshape((n * shape[0],) + shape[1:])
        wholes.append(block.movedim(0, dim).contiguous())
        offset += size
    return wholes


# ---- parameter gathers prefetched one unit ahead (FSDP's forward prefetch) ---------------------
# The gathers the core marks prefetched (search/parameter_collectives.h: one all-gather of an
# even, contiguous shard, outside a recomputed block) of one unit group are one flattened
# all-gather, issued asynchronously where the previous group is first waited for (the first
# at the program's start) and waited for at the first read of one of its members: it runs
# while the reads between compute, as the search prices it (beside the forward). Each
# member's backward is the gather's own backward steps (the gradient's reduce-scatter), as
# the reshard would run them, or a DeferredScatters arrival.
class _Prefetches:
    """The groups in flight of one program: index -> _PrefetchedGroup."""

    def __init__(self, reshard: Reshard):
        self.reshard = reshard
        self.pending: dict[int, _PrefetchedGroup] = {}

    def issue(self, shards: tuple, texts: tuple) -> "_PrefetchedGroup":
        return _PrefetchedGroup(*flat_gather(list(shards), [self.reshard._steps[t] for t in texts], self.reshard._mesh),
                                len(shards))


class _PrefetchedGroup:
    def __init__(self, out: torch.Tensor, work, layout: tuple, members: int):
        self._out, self._work, self._layout = out, work, layout
        self._wholes: list | None = None
        self._left = members

    def take(self, j: int) -> torch.Tensor:
        """Member j's whole tensor (waits for the gather at the first take)."""
        if self._wholes is None:
            if self._work is not None:
                self._work.wait()
            self._wholes = flat_wholes(self._out, self._layout)
            self._out = None
        whole, self._wholes[j] = self._wholes[j], None  # released after its read
        self._left -= 1
        return whole

    @property
    def done(self) -> bool:
        return self._left <= 0


class PrefetchStart(torch.nn.Module):
    """``self.prefetch.start(k, shards, steps)``: issues the k-th group's gather."""

    def __init__(self, state: _Prefetches):
        super().__init__()
        self._state = state

    def forward(self, k: int, shards: tuple, steps: tuple) -> None:
        if k == 0:
            self._state.pending.clear()  # a step that failed left its gathers behind
        self._state.pending[k] = self._state.issue(shards, steps)


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
    """``self.prefetch.wait(k, j, shard, forward_steps, backward_steps)``: member j of the k-th
    group, waited for (gathered now, alone and blocking, when nothing issued the group)."""

    def __init__(self, state: _Prefetches):
        super().__init__()
        self._state = state

    def forward(self, k: int, j: int, shard: torch.Tensor, forward_steps: tuple, backward_steps: tuple,
                scatter=None) -> torch.Tensor:
        group = self._state.pending.get(k)
        if group is None:
            group, j = self._state.issue((shard,), forward_steps), 0
        whole = group.take(j)
        if group.done:
            self._state.pending.pop(k, None)
        steps = tuple(self._state.reshard._steps[t] for t in backward_steps)
        return _Prefetched.apply(shard, [whole], steps, self._state.reshard._mesh,
                                 self._state.reshard.deferred(scatter))


# ---- gradients reduce-scattered beside backward (FSDP2's post-backward reduce-scatter) ----------
# A parameter's gradient the core marks ``overlap="backward"`` (search/parameter_collectives.h,
# gradient_scatter_overlap: one reduce-scatter of an even, contiguous shard on one axis, no
# axis left to the buckets) is not reduced where backward reaches the gather: it arrives
# here, and the gather's backward gives its input no gradient. Once every member of its
# unit group has arrived, the group's gradients are reduce-scattered in one flattened
# collective, issued asynchronously; the group in flight is waited for when the next is
# issued (one unit's gradients in flight besides the one being made, as FSDP2 holds them)
# or when backward ends (``finish``, called by the engine, which first issues the groups
# whose members did not all arrive, in group order). Each member's part, cast to its leaf's
# dtype (a mixed-precision master), is then added to the leaf's ``.grad``: what the blocking
# steps and the cast's backward made. Every rank forms the same groups from the same
# arrivals, so the collectives line up; a member arriving twice (two micro-batches' backward
# before its group completes) is two parts added to one leaf, which is the same sum.
class DeferredScatters:
    """The reduce-scatters one program issues in backward. ``members``: group -> how many
    reads' gradients complete it (set by the lowering); ``events``: ("issue" | "wait", group)
    in order, for the step since ``start``."""

    def __init__(self, reshard: Reshard):
        self._reshard = reshard
        self.members: dict[int, int] = {}
        self._arrived: dict[int, list] = {}
        self._in_flight: tuple | None = None
        self.events: list[tuple[str, int]] = []

    def start(self) -> None:
        self._arrived = {}
        self._in_flight = None
        self.events = []

    def issue(self, grad: torch.Tensor, steps: tuple, leaf: torch.Tensor, group: int) -> None:
        (step,) = steps  # the core marks one reduce-scatter only (gradient_scatter_overlap)
        arrived = self._arrived.setdefault(group, [])
        arrived.append((grad, step, leaf))
        if len(arrived) >= self.members.get(group, 1):
            self._issue(group)

    def _issue(self, group: int) -> None:
        arrived = self._arrived.pop(group)
        mesh = self._reshard._mesh
        axis = arrived[0][1]["axis"]
        n = mesh.sizes[axis]
        layout, blocks = [], []
        for grad, step, leaf in arrived:
            moved = grad.movedim(step["dim"], 0)
            layout.append(((moved.shape[0] // n,) + tuple(moved.shape[1:]), step["dim"], leaf))
            blocks.append(moved.reshape(n, -1))
        flat = torch.cat(blocks, dim=1) if len(blocks) > 1 else blocks[0].contiguous()
        out = torch.empty(flat.shape[1], dtype=flat.dtype, device=flat.device)
        work = transport.reduce_scatter(out, flat.reshape(-1), group=mesh.groups[axis], async_op=True)
        earlier, self._in_flight = self._in_flight, (out, work, layout, group)
        self.events.append(("issue", group))
        if earlier is not None:
            self._land(earlier)

    def _land(self, entry: tuple) -> None:
        out, work, layout, group = entry
        work.wait()
        offset = 0
        with torch.no_grad():
            for shape, dim, leaf in layout:
                size = 1
                for extent in shape:
                    size *= extent
                g = out[offset:offset + size].view(shape).movedim(0, dim).to(leaf.dtype).contiguous()
                offset += size
                leaf.grad = g if leaf.grad is None else leaf.grad.add_(g)
        self.events.append(("wait", group))

    def finish(self) -> None:
        """Backward has ended: the groups not complete issued, the last waited for and delivered."""
        for group in sorted(self._arrived):
            self._issue(group)
        if self._in_flight is not None:
            entry, self._in_flight = self._in_flight, None
            self._land(entry)

    def abandon(self) -> None:
        """A failed step: forget the gradients held and the scatter in flight."""
        self._arrived = {}
        self._in_flight = None
