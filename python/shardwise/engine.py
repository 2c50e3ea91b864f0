"""shardwise.parallelize: a model, a plan and torch.distributed -> training on every rank.

    engine = shardwise.parallelize(model, (ids, targets), loss_fn)   # plan searched
    opt = torch.optim.AdamW(engine.parameters(), lr=1e-3)
    for ids, targets in batches:
        opt.zero_grad()
        loss = engine.train_step(ids, targets)                        # the loss, on every rank
        opt.step()

How (the data flow of docs/ARCHITECTURE.md):
 1. capture: the model and its loss as one ATen graph (torch.export), at the global batch;
 2. plan: the SPMD search (or the plan given), checked to be the same on every rank (hash);
 3. rewrite: the core's rank program (csrc/transform/spmd_rewrite.h) says, per node, what
    each operand needs and which collectives bring it there, forward and backward;
 4. lowering (here): each IR node becomes the ATen call it was captured from, on local
    shapes, in a ``torch.fx.GraphModule`` per rank (``engine.code`` prints it); a node whose
    local call fails its shape check on meta tensors runs whole instead (gathered operands),
    so every plan runs correctly;
 5. run: ``train_step`` slices the rank's share of the batch, runs the module, calls
    backward and reduces the gradients the program left Partial (data parallelism) in
    buckets through ``torch.distributed``.

The batch: ``train_step(*batch)`` takes the whole global batch on every rank, as the
single-device loop would; each rank keeps its share (the inputs' placements). With
``loss_fn``, the last element of the batch is the target: ``loss = loss_fn(model(*batch[:-1]),
batch[-1])``; without, the model returns the loss (a tensor, or an output with ``.loss``).

A plan without a sharding section (made by ``Plan.manual``) with pipeline 1 is completed by
the SPMD search on its {data, tensor} mesh; with pipeline > 1 (data = tensor = 1 so far) it
runs as stage modules under the schedule's action list (python/shardwise/pipeline.py).
"""
from __future__ import annotations

import functools
import operator
import os
import re
import warnings
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.fx

from . import _C, _teardown
from ._C import ValidationError
from ._logging import get_logger
from ._fx_import import _schema_args
from .capture import _bind_inputs, _capture_with_sources, _input_names
from .checkpoint import keep_state
from .materialize import local_tensor
from .plan import Plan, micro_batch_fallback

log = get_logger("shardwise.engine")

__all__ = ["CollectiveError", "Engine", "parallelize"]


class CollectiveError(_C.ShardwiseError):
    """A collective of a training step failed on this rank: a peer died or stalled past the
    process group's timeout, or the transport broke. Raised instead of hanging; the message
    names the rank, the step and the collective."""


def _is_collective_failure(error: BaseException) -> bool:
    return (isinstance(error, getattr(dist, "DistError", ())) or
            (isinstance(error, RuntimeError) and str(error).startswith("shardwise.")))


def _collective_error(error: BaseException, rank: int, step: int) -> CollectiveError:
    return CollectiveError(f"rank {rank}, train_step {step}: a collective failed: {error}\n"
                           "A peer rank probably died or stalled; every rank fails the same way within the "
                           "timeout given to torch.distributed.init_process_group (its default: 30 minutes for "
                           "Gloo, 10 for NCCL).")

_BUCKET_BYTES = 25 * 1024 * 1024  # DDP's default bucket_cap_mb
_TARGET = "target"  # the IR name of the loss' target when parallelize is given a loss_fn


# ---- the mesh as this rank sees it ---------------------------------------------------------
class _Mesh:
    """Axis sizes, this rank's coordinates and the torch.distributed group of each axis.

    With `pipeline` > 1 the job is pipeline x mesh (Megatron's layout: the pipeline outermost):
    the mesh is the rank's pipeline stage's sub-mesh, `rank` the rank within it."""

    def __init__(self, sizes: list[int], rank: int, pipeline: int = 1):
        _teardown.hold(self)  # its groups are destroyed before the interpreter's finalization
        from torch.distributed.device_mesh import init_device_mesh

        self.sizes = list(sizes)
        self.rank = rank
        self.coords = []
        stride = 1
        for size in reversed(self.sizes):
            self.coords.insert(0, (rank // stride) % size)
            stride *= size
        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
        names = tuple(f"axis{a}" for a in range(len(self.sizes)))
        if pipeline > 1:
            self.device_mesh = init_device_mesh(device, (pipeline, *self.sizes), mesh_dim_names=("pipeline", *names))
            self.groups = [self.device_mesh.get_group(a + 1) for a in range(len(self.sizes))]
        else:
            self.device_mesh = init_device_mesh(device, tuple(self.sizes), mesh_dim_names=names)
            self.groups = [self.device_mesh.get_group(a) for a in range(len(self.sizes))]
        self.group_names = [g.group_name for g in self.groups]


# ---- resharding steps ----------------------------------------------------------------------
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


class VocabLookup(torch.nn.Module):
    """A lookup split over its table's rows (the vocabulary-parallel embedding): each rank
    looks up the ids in its rows [start, stop), zero elsewhere; the sum over ranks is the
    lookup (the program all-reduces or reduce-scatters it where a reader needs)."""

    def forward(self, table, ids, start: int, stop: int, padding_idx: int = -1, scale_grad_by_freq: bool = False,
                sparse: bool = False):
        inside = (ids >= start) & (ids < stop)
        local = torch.where(inside, ids - start, torch.zeros_like(ids))
        pad = padding_idx - start if start <= padding_idx < stop else -1
        out = torch.ops.aten.embedding.default(table, local, pad, scale_grad_by_freq, sparse)
        return out * inside.unsqueeze(-1).to(out.dtype)


# ---- lowering one IR node back to its ATen call --------------------------------------------
def _substitute(value: Any, operands) -> Any:
    if isinstance(value, torch.fx.Node):
        return next(operands)
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.fx.Node) for v in value):
        return type(value)(next(operands) if isinstance(v, torch.fx.Node) else v for v in value)
    return value


def _matches_shape(value: Any, shape: list[int]) -> bool:
    return (isinstance(value, (list, tuple)) and len(value) == len(shape) and len(shape) > 0
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
            and all(v == s or v == -1 for v, s in zip(value, shape)))


def _call_parts(src: torch.fx.Node, operands: list, local_out: list[list[int]], global_out: list[list[int]]):
    """(args, kwargs) of the source node's call with the operands substituted in schema
    order (the IR's input order) and shape arguments made local: a size list equal to the
    output's whole shape (view, reshape, expand, new_zeros: -1 allowed) becomes the local
    shape; split sizes become the local outputs' sizes along the split dim."""
    it = iter(operands)
    target = src.target
    if isinstance(target, torch._ops.OpOverload):
        schema = target._schema
        args, kwargs = [], {}
        names = {a.name: a for a in schema.arguments}
        items = _schema_args(src)
        for name, value in items:
            value = _substitute(value, it)
            if names[name].kwarg_only:
                kwargs[name] = value
            else:
                args.append(value)
        named = dict(items)
    else:
        args = [_substitute(a, it) for a in src.args]
        kwargs = {k: _substitute(v, it) for k, v in src.kwargs.items()}
        items, named = [], {}
    if local_out and local_out != global_out:
        g0, l0 = global_out[0], local_out[0]

        def fix(value):
            return list(l0) if l0 != g0 and _matches_shape(value, g0) else value

        args = [fix(a) for a in args]
        kwargs = {k: fix(v) for k, v in kwargs.items()}
        if len(local_out) > 1 and "dim" in named:
            dim = named["dim"] % len(l0)
            for key in ("split_size", "split_sizes"):
                position = next((i for i, (n, _) in enumerate(items) if n == key), None)
                if position is None:
                    continue
                sizes = [o[dim] for o in local_out]
                new = sizes[0] if key == "split_size" else sizes
                if key in kwargs:
                    kwargs[key] = new
                else:
                    args[position] = new
    return args, kwargs


def _tensor_outputs(result: Any, indices: list[int] | None) -> list[torch.Tensor]:
    return [result] if indices is None else [result[i] for i in indices]


# ---- the engine ------------------------------------------------------------------------------
class _Trainable(torch.nn.Module):
    """The model and its loss as one module (captured together, so the loss is sharded too)."""

    def __init__(self, model: torch.nn.Module, loss_fn: Callable | None):
        super().__init__()
        self.model = model
        self._loss_fn = loss_fn

    def forward(self, **batch):
        if self._loss_fn is not None:
            target = batch.pop(_TARGET)
            return self._loss_fn(self.model(**batch), target)
        out = self.model(**batch)
        if isinstance(out, torch.Tensor):
            return out
        loss = getattr(out, "loss", None)
        if loss is None and isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
            loss = out[0]
        if loss is None:
            raise ValidationError(f"parallelize: {type(self.model).__name__} returned {type(out).__name__} with no "
                                  "loss; pass loss_fn=(output, target) -> loss")
        return loss


class Engine:
    """One rank's share of a model under a plan. Train with any torch.optim optimizer over
    ``engine.parameters()``; ``train_step`` returns the loss (the same on every rank)."""

    def __init__(self, module: torch.fx.GraphModule, plan: Plan, mesh: _Mesh, program: dict, input_names: list[str],
                 input_shapes: dict[str, list[int]], whole_nodes: list[str], kept=None):
        _teardown.hold(self)
        self.module = module
        self._kept = kept  # checkpoint.KeptState: the model's names, shapes, and what no rank holds
        self.plan = plan
        self._mesh = mesh
        self._input_names = input_names
        self._global_shapes = input_shapes
        self.whole_nodes = whole_nodes  # nodes run on gathered operands (no local form)
        leaves = {leaf["value"]: leaf for leaf in program["leaves"]}
        self._input_placements = [leaves[name]["placement"] for name in input_names]
        self._leaves = leaves
        self._params = dict(module.named_parameters())
        self._reduce = [(name, tuple(leaves[name]["reduce_axes"])) for name in self._params
                        if leaves[name]["reduce_axes"]]
        self._buckets = _GradientBuckets([(self._params[n], axes) for n, axes in self._reduce], mesh.groups)
        self._steps = 0  # train_step calls, for error messages

    @property
    def code(self) -> str:
        """The rank's program as Python source (torch.fx)."""
        return self.module.code

    def parameters(self):
        return self.module.parameters()

    def named_parameters(self):
        return self.module.named_parameters()

    def optimizer(self, optimizer_class=torch.optim.AdamW, **defaults) -> "ShardedOptimizer":
        """An optimizer over this rank's parameters that applies the plan's ZeRO decisions: a
        parameter the plan replicates on some mesh axes but shards the optimizer state of
        over them (``plan.sharding["zero"]``) is stepped by torch's ZeroRedundancyOptimizer on
        those axes' ranks, so each rank keeps the state of 1/n of them; the rest by
        ``optimizer_class`` itself. The result is the single-device update (ZeRO-1 is exact);
        any torch.optim optimizer over ``parameters()`` works too, with whole state."""
        zero = (self.plan.sharding or {}).get("zero", {})
        by_axes: dict[tuple, list] = {}
        plain = []
        for name, param in self.module.named_parameters():
            axes = tuple(a for a in zero.get(name, ()) if self._leaves[name]["placement"][a] == "R"
                         and self._mesh.sizes[a] > 1)
            if axes:
                by_axes.setdefault(axes, []).append(param)
            else:
                plain.append(param)
        return ShardedOptimizer(self._mesh, by_axes, plain, optimizer_class, defaults)

    def _local_batch(self, batch: tuple) -> list[torch.Tensor]:
        if len(batch) != len(self._input_names):
            raise ValidationError(f"train_step: {len(batch)} batch tensors, the captured program takes "
                                  f"{len(self._input_names)} ({', '.join(self._input_names)})")
        out = []
        for name, tensor, placement in zip(self._input_names, batch, self._input_placements):
            expected = self._global_shapes[name]
            if list(tensor.shape) != expected:
                raise ValidationError(f"train_step: input '{name}' has shape {list(tensor.shape)}, the program was "
                                      f"captured at {expected} (rank {self._mesh.rank})")
            out.append(local_tensor(tensor, placement, self._mesh.sizes, self._mesh.rank))
        return out

    def train_step(self, *batch) -> torch.Tensor:
        """Forward and backward of the global batch; gradients left in the local parameters'
        ``.grad`` (accumulated, as ``loss.backward()`` does). Returns the loss."""
        local = self._local_batch(batch)
        # Gradients already there (the caller accumulates over steps) are set aside so the
        # reduction sums only this step's contributions, then added back.
        earlier = {p: p.grad for p in self._params.values() if p.grad is not None}
        for p in earlier:
            p.grad = None
        self._steps += 1
        self._buckets.start()
        try:
            outputs = self.module(*local)
            loss = outputs[0]
            loss.backward()
            self._buckets.finish()
        except Exception as e:  # noqa: BLE001 - re-raised; only collective failures get context
            self._buckets.abandon()
            for p in self._params.values():  # nothing lost: the gradients from before the step
                p.grad = earlier.get(p)
            if _is_collective_failure(e):
                raise _collective_error(e, dist.get_rank(), self._steps) from e
            raise
        for p, g in earlier.items():
            p.grad = g if p.grad is None else p.grad.add_(g)
        return loss.detach()

    def eval_step(self, *batch) -> torch.Tensor:
        with torch.no_grad():
            return self.module(*self._local_batch(batch))[0]

    def _checkpoint_state(self):
        from .checkpoint import held_state

        local = {**dict(self.module.named_parameters()), **dict(self.module.named_buffers())}
        return held_state(self._kept, local, lambda n: self._leaves[n]["placement"], self._mesh,
                          dict(self.module.named_parameters()))

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every parameter and buffer whole, on every rank (gathered through the mesh)."""
        out = {}
        with torch.no_grad():
            for name, tensor in [*self.module.named_parameters(), *self.module.named_buffers()]:
                out[name] = gather_whole(tensor.detach(), self._leaves[name]["placement"], self._mesh).clone()
        return out


class _GradientBuckets:
    """Data parallelism's gradient all-reduce, overlapped with backward as DDP runs it: the
    parameters the program left Partial are packed, in reverse order of registration (about
    the order backward finishes them), into buckets of 25 MB per set of axes; a bucket's
    all-reduce is issued (async) as soon as its last gradient is accumulated, and every
    bucket is waited on at the end. Every rank forms the same buckets and autograd finishes
    them in the same order, so the collectives line up; a bucket whose parameter got no
    gradient this step is issued, with what it has, at the end, in bucket order.
    overlap=False (a pipeline: several backwards per step, one reduction after the last):
    no hooks, every bucket issued by finish()."""

    def __init__(self, params: list[tuple[torch.Tensor, tuple]], groups: list, overlap: bool = True):
        self._groups = groups
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

    def start(self) -> None:
        self._active = True
        self._waiting = [len(bucket) for _, bucket in self._buckets]
        self._issued: dict[int, tuple] = {}

    def _ready(self, param: torch.Tensor) -> None:
        if not self._active:
            return  # a backward outside train_step: nothing to reduce
        i = self._bucket_of[param]
        self._waiting[i] -= 1
        if self._waiting[i] == 0:
            self._issue(i)

    def _issue(self, i: int) -> None:
        axes, bucket = self._buckets[i]
        grads = [p.grad for p in bucket if p.grad is not None]
        if not grads:
            self._issued[i] = None
            return
        flat = torch._utils._flatten_dense_tensors(grads)
        self._issued[i] = (flat, grads, dist.all_reduce(flat, group=self._groups[axes[0]], async_op=True), axes[1:])

    def abandon(self) -> None:
        """A failed step: forget the buckets in flight (their collectives failed or never ran)."""
        self._active = False
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
                dist.all_reduce(flat, group=self._groups[a])
            for g, reduced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
                g.copy_(reduced)
        self._active = False


class ShardedOptimizer:
    """Engine.optimizer's result: ZeroRedundancyOptimizer per set of ZeRO axes (its group: the
    ranks of this rank's mesh slice along those axes), the plain optimizer for the rest."""

    def __init__(self, mesh: _Mesh, zero_params: dict[tuple, list], plain: list, optimizer_class, defaults: dict):
        from torch.distributed.optim import ZeroRedundancyOptimizer

        self.optimizers = []
        for axes, params in sorted(zero_params.items()):
            group = mesh.groups[axes[0]] if len(axes) == 1 else mesh.device_mesh[
                tuple(f"axis{a}" for a in axes)]._flatten().get_group()
            self.optimizers.append(ZeroRedundancyOptimizer(params, optimizer_class, process_group=group, **defaults))
        if plain:
            self.optimizers.append(optimizer_class(plain, **defaults))

    @property
    def param_groups(self):
        return [g for o in self.optimizers for g in o.param_groups]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for o in self.optimizers:
            o.step()

    def local_state_numel(self) -> int:
        """Elements of optimizer state this rank holds (ZeRO keeps 1/n of its parameters')."""
        total = 0
        for o in self.optimizers:
            inner = getattr(o, "optim", o)
            for state in inner.state.values():
                total += sum(v.numel() for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
        return total


def _set_attr(root: torch.nn.Module, qualified: str, value) -> None:
    *path, last = qualified.split(".")
    module = root
    for part in path:
        if not hasattr(module, part):
            module.add_module(part, torch.nn.Module())
        module = getattr(module, part)
    if isinstance(value, torch.nn.Parameter):
        module.register_parameter(last, value)
    else:
        module.register_buffer(last, value)


def _meta_check(src: torch.fx.Node, node: dict, indices) -> bool:
    """Does the local call give the local output shapes? (run on meta tensors)"""
    whole_operands = [arg.meta["val"] for arg in _operand_nodes(src)]
    local_out = [o["local_shape"] for o in node["outputs"]]
    global_out = [list(t.shape) for t in _tensor_outputs(src.meta["val"], indices)]
    if all(op["local_shape"] == list(val.shape) for op, val in zip(node["inputs"], whole_operands)) \
            and local_out == global_out:
        return True  # nothing local about it
    operands = [torch.empty(op["local_shape"], dtype=val.dtype, device="meta")
                for op, val in zip(node["inputs"], whole_operands)]
    args, kwargs = _call_parts(src, operands, local_out, global_out)
    meta = torch.device("meta")  # a device argument (to(device=cpu)) would leave the meta device
    args = [meta if isinstance(a, torch.device) else a for a in args]
    kwargs = {k: meta if isinstance(v, torch.device) else v for k, v in kwargs.items()}
    try:
        result = src.target(*args, **kwargs)
    except Exception:  # noqa: BLE001 - any failure means: run it whole
        return False
    got = [list(t.shape) for t in _tensor_outputs(result, indices)]
    return got == local_out


def _operand_nodes(src: torch.fx.Node) -> list[torch.fx.Node]:
    """The FX nodes of the source call's tensor operands, in the IR's input order."""
    out = []
    items = _schema_args(src) if isinstance(src.target, torch._ops.OpOverload) else \
        [(f"arg{i}", a) for i, a in enumerate(src.args)] + list(src.kwargs.items())
    for _, value in items:
        if isinstance(value, torch.fx.Node):
            out.append(value)
        elif isinstance(value, (list, tuple)):
            out.extend(v for v in value if isinstance(v, torch.fx.Node))
    return out


def _build_module(program: dict, sources: dict, mesh: _Mesh | None, tensors: dict[str, torch.Tensor],
                  input_names: list[str], trainable: set[str], *, nodes: list[dict] | None = None,
                  outputs: list[dict] | None = None, parameters: dict[str, torch.Tensor] | None = None,
                  class_name: str | None = None) -> torch.fx.GraphModule:
    """The GraphModule of `program`'s nodes (or the subset `nodes`, a pipeline stage) taking
    `input_names` as arguments and returning `outputs` (default: the program's outputs, each
    {"value", "forward", "backward"}). Leaves the nodes read become the module's parameters
    and buffers: this rank's shards of `tensors`, or the objects in `parameters` (created and
    recorded there when missing: stages on one rank share a tied weight)."""
    graph = torch.fx.Graph()
    root = torch.nn.Module()
    if mesh is not None:
        root.reshard = Reshard(mesh)
    root.vocab_lookup = VocabLookup()
    env: dict[str, torch.fx.Node] = {}
    leaves = {leaf["value"]: leaf for leaf in program["leaves"]}
    nodes = program["nodes"] if nodes is None else nodes
    outputs = program["outputs"] if outputs is None else outputs
    parameters = {} if parameters is None else parameters
    sizes, rank = (mesh.sizes, mesh.rank) if mesh is not None else ([1] * len(program["mesh"]), 0)
    for name in input_names:
        env[name] = graph.placeholder(re.sub(r"\W", "_", name))
    needed = [op["value"] for node in nodes for op in node["inputs"]]
    for name in dict.fromkeys(needed):
        if name in env or name not in leaves:
            continue
        if name not in parameters:
            if name not in tensors:
                raise ValidationError(f"parallelize: the program needs '{name}', which the model does not have")
            shard = local_tensor(tensors[name].detach(), leaves[name]["placement"], sizes, rank)
            parameters[name] = torch.nn.Parameter(shard, requires_grad=True) if name in trainable else shard
        _set_attr(root, name, parameters[name])
        env[name] = graph.get_attr(name)
    # Readers that want a value the same way share one reshard (q, k and v read one gathered
    # norm output): its backward then runs once, on the sum of their gradients (every step is
    # linear). The search's evaluation counts it once too (sharding_model.cc).
    reshards: dict[tuple, torch.fx.Node] = {}
    for node in nodes:
        first = node["outputs"][0]["value"]
        src, indices = sources[first]
        operands = []
        for op in node["inputs"]:
            value = env[op["value"]]
            fwd = tuple(s["text"] for s in op["forward"])
            bwd = tuple(s["text"] for s in op["backward"])
            if fwd or bwd:
                key = (op["value"], fwd, bwd)
                if key not in reshards:
                    reshards[key] = graph.call_module("reshard", (value, fwd, bwd))
                value = reshards[key]
            operands.append(value)
        local_out = [o["local_shape"] for o in node["outputs"]]
        global_out = [list(t.shape) for t in _tensor_outputs(src.meta["val"], indices)]
        if node["mode"] == "lookup":
            table = node["inputs"][0]
            runs = _C.local_shard(list(src.args[0].meta["val"].shape), table["required"], sizes, rank)["dims"][0]
            _, _, padding_idx, scale, sparse = [v for _, v in _schema_args(src)]
            call = graph.call_module("vocab_lookup", (operands[0], operands[1], runs[0][0], runs[-1][1], padding_idx,
                                                      scale, sparse))
        else:
            args, kwargs = _call_parts(src, operands, local_out, global_out)
            call = graph.call_function(src.target, tuple(args), kwargs)
        if indices is None:
            env[first] = call
        else:
            for out, i in zip(node["outputs"], indices):
                env[out["value"]] = graph.call_function(operator.getitem, (call, i))
        for out in node["outputs"]:
            if out.get("scale", 1.0) != 1.0:  # a mean over this rank's uneven share of the batch
                env[out["value"]] = graph.call_function(operator.mul, (env[out["value"]], out["scale"]))
    results = []
    for out in outputs:
        value = env[out["value"]]
        fwd = tuple(s["text"] for s in out.get("forward", ()))
        bwd = tuple(s["text"] for s in out.get("backward", ()))
        results.append(graph.call_module("reshard", (value, fwd, bwd)) if fwd or bwd else value)
    graph.output(tuple(results))
    return torch.fx.GraphModule(root, graph, class_name=class_name or f"Rank{rank}Program")


def _rank_program(graph, builder, plan_json: str, rank: int) -> tuple[dict, list[str]]:
    """The core's program for `rank` (of the plan's mesh); nodes whose local call fails its
    shape check on meta tensors are asked to run whole. Returns it and the nodes run whole."""
    program = _C.rank_program(graph._core, plan_json, rank)
    whole = []
    for n in program["nodes"]:
        src, indices = builder.sources[n["outputs"][0]["value"]]
        if n["mode"] == "local" and not _meta_check(src, n, indices):
            whole.append(n["outputs"][0]["value"])
    if whole:
        program = _C.rank_program(graph._core, plan_json, rank, whole)
    whole = [n["outputs"][0]["value"] for n in program["nodes"] if n["mode"] == "whole"]
    if whole:
        log.info("rank %d: %d nodes run whole on gathered operands (no local form): %s", rank, len(whole),
                 ", ".join(whole[:8]) + (" ..." if len(whole) > 8 else ""))
    return program, whole


def _plan_file(path: str) -> Plan:
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise ValidationError(f"parallelize: SHARDWISE_PLAN={path}: cannot read it ({e.strerror})") from e
    try:
        return Plan.from_json(text)
    except _C.ShardwiseError as e:
        raise type(e)(f"parallelize: SHARDWISE_PLAN={path}: {e}") from e


def _warn_unknown_ops(graph) -> None:
    """An op no rule knows runs whole on gathered operands: correct, but not parallel."""
    for u in graph.unknown_ops():
        where = f"module '{u.module_path}'" if u.module_path else "the top-level module"
        message = (f"parallelize: {u.op} ({u.count}x, in {where}) has no sharding rule; it runs replicated on "
                   "gathered operands (the result is right, the op is not parallel)")
        warnings.warn(message, stacklevel=3)


_MEMORY_FRACTION = 0.9  # of each device's memory, what a searched plan may use (the rest: allocator, workspace)


def _check_fits(plan: Plan, cluster, model_name: str) -> None:
    """A searched plan that fits in no memory is the one needing the least: say how much."""
    if plan.fits is not False:
        return
    need = plan.predicted_memory()[0]
    have = min(cluster.device_of(r)["memory_bytes"] for r in range(cluster.world_size))
    raise ValidationError(f"parallelize: {model_name} fits in memory under no plan on {cluster.world_size} ranks: "
                          f"the least any plan needs is {_bytes(need)} per rank, the devices have {_bytes(have)} of "
                          f"which plans may use {_MEMORY_FRACTION:.0%} (more devices, a smaller global batch or a "
                          "pipeline plan may fit)")


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def _check_same_plan(plan: Plan, rank: int) -> None:
    digest = plan.hash()
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, digest)
    differ = [r for r, d in enumerate(everyone) if d != everyone[0]]
    if differ:
        raise ValidationError(f"parallelize: ranks hold different plans (rank 0: {everyone[0]}, "
                              + ", ".join(f"rank {r}: {everyone[r]}" for r in differ) + f"); this is rank {rank}")


def parallelize(model: torch.nn.Module, example_inputs, loss_fn: Callable | None = None, plan: Plan | None = None,
                cluster=None, *, level: str = "fast", mesh: tuple[int, int] | None = None) -> Engine:
    """Rewrites `model` (with its loss) for this rank of the running torch.distributed job.

    ``example_inputs``: the global batch (a tensor or a tuple; with ``loss_fn``, the target
    last). ``plan``: a searched plan (``shardwise.plan``), a saved one (``Plan.from_json``),
    a ``Plan.manual`` one (its {data, tensor} mesh is filled in by the search), the file
    named by the environment variable SHARDWISE_PLAN, or None (the
    search on ``cluster``, default ``Cluster.detect()``, at ``level``, on the {data, tensor}
    ``mesh`` when given). Every rank must call this with the
    same arguments; the plan's hash is checked across ranks before the first collective.
    """
    if not dist.is_initialized():
        raise ValidationError("parallelize: call torch.distributed.init_process_group() first (torchrun sets "
                              "the environment for it)")
    world, rank = dist.get_world_size(), dist.get_rank()
    batch = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)
    if not batch or not all(isinstance(t, torch.Tensor) for t in batch):
        raise ValidationError("parallelize: example_inputs must be a tensor or a tuple of tensors (the batch)")
    wrapper = _Trainable(model, loss_fn)
    # The model's own argument names (so a plan searched on shardwise.capture(model) fits),
    # and the loss' target as "target".
    named = _bind_inputs(model, batch[:-1] if loss_fn is not None else batch, None)
    if loss_fn is not None:
        if _TARGET in named:
            raise ValidationError(f"parallelize: {type(model).__name__}.forward has an argument named "
                                  f"'{_TARGET}'; pass the loss inside the model (loss_fn=None)")
        named[_TARGET] = batch[-1]

    from .cluster import Cluster

    if plan is None and os.environ.get("SHARDWISE_PLAN"):  # `python -m shardwise run --plan` sets it
        plan = _plan_file(os.environ["SHARDWISE_PLAN"])
    # A pipeline plan, or one that accumulates gradients over micro-batches (the joint
    # planner's pipeline 1 with m > 1): captured there, at one micro-batch, run by the schedule.
    if plan is not None and not plan.sharding and (plan.pipeline > 1 or plan.num_micro_batches() > 1):
        return _parallelize_pipeline(wrapper, named, plan, batch, model, cluster, level)
    graph, builder = _capture_with_sources(wrapper, named, "export", 0, prefix="model.model.")
    _warn_unknown_ops(graph)
    input_names = _input_names(named)
    global_batch = int(batch[0].shape[0])
    if plan is None or not plan.sharding:
        if plan is not None:
            mesh = (plan.data, plan.tensor)
        cluster = cluster or Cluster.detect()
        if cluster.world_size != world:
            raise ValidationError(f"parallelize: the cluster has {cluster.world_size} devices, the job {world} ranks")
        searched = plan is None
        plan = Plan.search(graph, cluster, global_batch=global_batch, level=level, mesh=mesh,
                           memory_fraction=_MEMORY_FRACTION)
        if searched and mesh is None:  # nothing fits at once: maybe in micro-batches, as shardwise.plan does
            joint = micro_batch_fallback(plan, graph, cluster, global_batch=global_batch, level=level,
                                         memory_fraction=_MEMORY_FRACTION)
            if joint is not None:
                return _parallelize_pipeline(wrapper, named, joint, batch, model, cluster, level)
        _check_fits(plan, cluster, type(model).__name__)
    sharding = plan.sharding
    size = 1
    for s in sharding["mesh"]:
        size *= s
    if size != world:
        raise ValidationError(f"parallelize: the plan's mesh {sharding['mesh']} has {size} ranks, the job {world}")
    if plan.global_batch != global_batch:
        raise ValidationError(f"parallelize: the plan is for global batch {plan.global_batch}, the example batch "
                              f"has {global_batch}")
    _check_same_plan(plan, rank)
    mesh = _Mesh(sharding["mesh"], rank)  # from here on, the rank's view of the plan's mesh

    program, whole = _rank_program(graph, builder, plan.to_json(), rank)

    tensors, trainable = _model_tensors(model, builder)
    module = _build_module(program, builder.sources, mesh, tensors, input_names, trainable)
    shapes = {name: list(t.shape) for name, t in zip(input_names, batch)}
    return Engine(module, plan, mesh, program, input_names, shapes, whole,
                  kept=keep_state(model, {leaf["value"] for leaf in program["leaves"]}))


def _model_tensors(model: torch.nn.Module, builder) -> tuple[dict[str, torch.Tensor], set[str]]:
    """Every parameter, buffer and lifted constant by its IR name (a tied weight under its first
    name), and the names of the trainable parameters."""
    tensors: dict[str, torch.Tensor] = {}
    for name, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        tensors.setdefault(name, t)
    tensors.update({k: t for k, t in builder.constants.items() if t is not None})
    return tensors, {name for name, p in model.named_parameters() if p.requires_grad}



def _parallelize_pipeline(wrapper: _Trainable, named: dict, plan: Plan, batch: tuple, model: torch.nn.Module,
                          cluster=None, level: str = "fast"):
    """A pipeline plan (Plan.manual with pipeline > 1, or pipeline 1 with several micro-batches:
    gradient accumulation on one stage): the graph captured at one micro-batch of the data
    axis (micro_batch x data rows), sharded over each stage's {data, tensor} sub-mesh by the
    SPMD search (one sharding for every stage), cut into pipeline x virtual_stages stages (the
    plan's layers_per_stage, else balanced by forward FLOPs), this rank's stages lowered into
    GraphModules and driven by the schedule's action list (python/shardwise/pipeline.py).
    Ranks: Megatron's layout, the pipeline outermost; a value crossing a cut goes between the
    ranks of the same sub-mesh coordinate, as the shard its producer leaves."""
    from .cluster import Cluster
    from .pipeline import PipelineEngine, parse_actions

    world, rank = dist.get_world_size(), dist.get_rank()
    p, v, d, t = plan.pipeline, plan.virtual_stages, plan.data, plan.tensor
    if p * d * t != world:
        raise ValidationError(f"parallelize: the plan has pipeline {p} x data {d} x tensor {t} = {p * d * t} ranks, "
                              f"the job {world}")
    global_batch, mb = int(batch[0].shape[0]), int(plan.micro_batch)
    rows = mb * d  # one micro-batch across the data axis
    if plan.global_batch != global_batch or global_batch % rows:
        raise ValidationError(f"parallelize: the plan is for global batch {plan.global_batch} in micro-batches of "
                              f"{mb} x data {d}; the example batch has {global_batch}")
    m = global_batch // rows
    _check_same_plan(plan, rank)
    micro = {k: x.narrow(0, 0, rows) for k, x in named.items()}
    graph, builder = _capture_with_sources(wrapper, micro, "export", 0, prefix="model.model.")
    _warn_unknown_ops(graph)
    input_names = _input_names(named)
    size = d * t
    pipeline_rank, local = rank // size, rank % size
    if size > 1:
        # The stages' sub-mesh: the job's first d x t ranks (every stage's are alike), so the
        # layout is searched on the devices and links it runs on, as the joint planner priced it
        # (csrc/search/stage_layout.h). A cluster of exactly d x t ranks is taken as that sub-mesh.
        job = cluster or Cluster.detect()
        if job.world_size not in (world, size):
            raise ValidationError(f"parallelize: the cluster has {job.world_size} devices, the job {world} ranks")
        sub_cluster = job if job.world_size == size else job.first_ranks(size)
        sharded = Plan.search(graph, sub_cluster, global_batch=rows, level=level, mesh=(d, t))
        _check_same_plan(sharded, rank)
        program, whole = _rank_program(graph, builder, sharded.to_json(), local)
        mesh = _Mesh([d, t], local, pipeline=p)
    else:
        sharded, whole, mesh = None, [], None
        program = _C.rank_program(graph._core, "", 0)
    stages = p * v
    cut = _C.pipeline_stages(graph._core, stages, list(plan.layers_per_stage or []))
    stage_of = dict(zip(cut["nodes"], cut["stage_of_node"]))

    # Where each value is made and read, by stage; what crosses each cut (forwarded on).
    leaves = {leaf["value"]: leaf for leaf in program["leaves"]}
    index = {name: i for i, name in enumerate(leaves)}
    producer: dict[str, int] = {}
    meta: dict[str, tuple] = {}
    nodes_of = [[] for _ in range(stages)]
    for node in program["nodes"]:
        first = node["outputs"][0]["value"]
        g = stage_of[first]
        nodes_of[g].append(node)
        src, indices = builder.sources[first]
        for out, val in zip(node["outputs"], _tensor_outputs(src.meta["val"], indices)):
            producer[out["value"]] = g
            index.setdefault(out["value"], len(index))
            meta[out["value"]] = (list(out["local_shape"]), val.dtype, index[out["value"]])
    reads: dict[str, set] = {}
    for g, nodes in enumerate(nodes_of):
        for node in nodes:
            for op in node["inputs"]:
                reads.setdefault(op["value"], set()).add(g)
    for out in program["outputs"]:
        reads.setdefault(out["value"], set()).add(stages - 1)
    received = [sorted((x for x, made in producer.items() if made < g and max(reads.get(x, {-1})) >= g),
                       key=lambda x: index[x]) for g in range(stages)]

    tensors, trainable = _model_tensors(model, builder)
    owners = {x: {g % p for g in gs} for x, gs in reads.items() if x in tensors}
    for x in owners:
        meta[x] = (list(tensors[x].shape), tensors[x].dtype, index.get(x, -1))
    shared = []
    for x in sorted(owners):  # every rank creates every group, in the same order
        if len(owners[x]) > 1:
            for coordinate in range(size):
                ranks = [o * size + coordinate for o in sorted(owners[x])]
                group = dist.new_group(ranks)
                if rank in ranks:
                    shared.append((x, group))

    parameters: dict[str, torch.Tensor] = {}
    mine = {}
    for g in range(pipeline_rank, stages, p):
        batch_inputs = [x for x in input_names if g in reads.get(x, set())]
        last = g == stages - 1
        outputs = program["outputs"] if last else [{"value": x} for x in received[g + 1]]
        module = _build_module(program, builder.sources, mesh, tensors, batch_inputs + received[g], trainable,
                               nodes=nodes_of[g], outputs=outputs, parameters=parameters, class_name=f"Stage{g}")
        mine[g] = {"module": module, "inputs": batch_inputs + received[g], "received": received[g],
                   "sent": [] if last else received[g + 1], "last": last}
    schedule = _C.simulate_schedule(plan.schedule, p, m, virtual_stages=v, k=plan.kfkb_k)
    # The schedule's peers are pipeline ranks; this rank talks to the same sub-mesh coordinate.
    actions = [(kind, i, g, peer * size + local if peer >= 0 else peer)
               for kind, i, g, peer in parse_actions(schedule.actions(pipeline_rank))]
    log.info("rank %d: pipeline stages %s of %d, %d micro-batches of %d rows, %s, sub-mesh %s", rank, sorted(mine),
             stages, m, rows, plan.schedule, [d, t])
    reduce = [(name, tuple(leaves[name]["reduce_axes"])) for name in parameters if leaves[name]["reduce_axes"]]
    return PipelineEngine(plan=plan, stages=mine, actions=actions, micro_batch=rows, num_micro_batches=m,
                          input_names=input_names, input_shapes={n: list(x.shape) for n, x in zip(input_names, batch)},
                          value_meta=meta, parameters=parameters, shared=shared, owners=owners,
                          last_rank=((stages - 1) % p) * size, mesh=mesh, leaves=leaves, reduce=reduce,
                          stage_size=size, sharding=sharded, whole_nodes=whole, input_placements={
                              n: leaves[n]["placement"] for n in input_names if n in leaves},
                          kept=keep_state(model, set(owners)))
