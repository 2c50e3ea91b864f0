"""The pipeline executor: a plan with pipeline degree p runs as stage modules, one rank per
stage (v model chunks per rank with interleaved 1F1B), driven by the schedule's action list.

The action lists are the C++ schedules' (csrc/schedule/schedules.h, the same lists the
simulator costs): "F3@s1" forward of micro-batch 3 on virtual stage 1, "SA3@s1->r2" send its
activations, "RA3@s2<-r1" receive them, "B3@s1" backward, "SG3@s1->r0" / "RG3@s0<-r1" the
gradients. Receives are posted (``dist.irecv``) when the list reaches them and waited just
before the forward or backward that needs them; sends are issued (``dist.isend``) and waited
at the end of the step. Gradients of every micro-batch accumulate in ``.grad``; the loss is
the mean of the micro-batch losses (each the mean over its rows: together the global mean),
broadcast from the last stage to every rank.

Stages are contiguous, FLOPs-balanced cuts of the captured graph at repeated-block boundaries
(csrc/search/stage_partition.h). A value crossing a cut goes to the next stage, which passes it
on when a later stage reads it (a skip connection); its gradient comes back the same way. A
weight read by stages on different ranks (a tied embedding and LM head) has its gradient
all-reduced among those ranks after the step, as Megatron-LM does for its embedding group.
"""
from __future__ import annotations

import re

import torch
import torch.distributed as dist

from . import _teardown
from ._C import ValidationError

_ACTION = re.compile(r"^(F|B|SA|SG|RA|RG)(\d+)@s(\d+)(?:(?:->|<-)r(\d+))?$")


def parse_actions(text: str) -> list[tuple]:
    """'F0@s0 SA0@s0->r1 ... OPT' -> [("F", 0, 0, -1), ("SA", 0, 0, 1), ...] (kind, mb, stage, peer)."""
    out = []
    for word in text.split():
        if word in ("OPT", "SYNC"):
            continue  # the optimizer step is the user's; no data axis to synchronise here
        m = _ACTION.match(word)
        if not m:
            raise ValidationError(f"pipeline: unreadable schedule action {word!r}")
        out.append((m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)) if m.group(4) else -1))
    return out


class PipelineEngine:
    """This rank's stages of a pipeline plan; the same face as ``shardwise.Engine``."""

    def __init__(self, *, plan, stages: dict, actions: list[tuple], micro_batch: int, num_micro_batches: int,
                 input_names: list[str], input_shapes: dict, value_meta: dict, parameters: dict, shared: list[tuple],
                 owners: dict, last_rank: int, mesh=None, leaves: dict | None = None, reduce: list | None = None,
                 stage_size: int = 1, sharding=None, whole_nodes: list[str] | None = None,
                 input_placements: dict | None = None, kept=None):
        _teardown.hold(self)
        self.plan = plan
        self._kept = kept              # checkpoint.KeptState: the model's names, shapes, what no rank holds
        self.sharding = sharding       # the SPMD plan of each stage's sub-mesh (None: replicated)
        self._stages = stages          # virtual stage -> {"module", "inputs", "received", "sent", "last"}
        self._actions = actions        # (kind, micro-batch, virtual stage, peer rank)
        self._micro_batch = micro_batch  # rows per micro-batch (across the data axis)
        self._m = num_micro_batches
        self._input_names = input_names
        self._global_shapes = input_shapes
        self._meta = value_meta        # value -> (local shape, dtype, tag index)
        self._parameters = parameters  # name -> this rank's tensor (shared by its stages)
        self._shared = shared          # (name, group) for weights read on several pipeline ranks
        self._owners = owners          # name -> the pipeline ranks holding it
        self._last_rank = last_rank
        self._mesh = mesh              # the stage's sub-mesh (engine._Mesh), or None
        self._leaves = leaves or {}
        # Gradients the program left Partial over the sub-mesh, reduced after the last backward.
        self._buckets = None
        if reduce:
            from .engine import _GradientBuckets

            self._buckets = _GradientBuckets([(parameters[n], axes) for n, axes in reduce], mesh.groups,
                                             overlap=False)
        self._stage_size = stage_size
        self._input_placements = input_placements or {}
        self.whole_nodes = whole_nodes or []
        self._steps = 0  # train_step calls, for error messages

    @property
    def code(self) -> str:
        return "\n".join(f"# virtual stage {g}\n{s['module'].code}" for g, s in sorted(self._stages.items()))

    def parameters(self):
        return [p for p in self._parameters.values() if isinstance(p, torch.nn.Parameter)]

    def named_parameters(self):
        return [(n, p) for n, p in self._parameters.items() if isinstance(p, torch.nn.Parameter)]

    def _micro_batches(self, batch: tuple) -> list[dict]:
        if len(batch) != len(self._input_names):
            raise ValidationError(f"train_step: {len(batch)} batch tensors, the captured program takes "
                                  f"{len(self._input_names)} ({', '.join(self._input_names)})")
        for name, t in zip(self._input_names, batch):
            if list(t.shape) != self._global_shapes[name]:
                raise ValidationError(f"train_step: input '{name}' has shape {list(t.shape)}, the plan was made "
                                      f"for {self._global_shapes[name]}")
        from .materialize import local_tensor

        mb = self._micro_batch
        out = []
        for i in range(self._m):
            piece = {name: t.narrow(0, i * mb, mb) for name, t in zip(self._input_names, batch)}
            if self._mesh is not None:  # this rank's share of the micro-batch on its sub-mesh
                piece = {name: local_tensor(t, self._input_placements[name], self._mesh.sizes, self._mesh.rank)
                         for name, t in piece.items()}
            out.append(piece)
        return out

    def _tag(self, value_index: int, micro_batch: int, gradient: bool) -> int:
        return (micro_batch * 4096 + value_index) * 2 + int(gradient)

    def train_step(self, *batch) -> torch.Tensor:
        micro = self._micro_batches(batch)
        self._steps += 1
        # Gradients from earlier steps (the caller accumulates) are set aside so the reductions
        # sum only this step's, then added back; restored as they were if the step fails.
        params = [p for _, p in self.named_parameters()]
        earlier = {p: p.grad for p in params if p.grad is not None}
        for p in earlier:
            p.grad = None
        try:
            loss = self._run(micro)
        except Exception as e:  # noqa: BLE001 - re-raised; only collective failures get context
            from .engine import _collective_error, _is_collective_failure

            if self._buckets is not None:
                self._buckets.abandon()
            for p in params:
                p.grad = earlier.get(p)
            if _is_collective_failure(e):
                raise _collective_error(e, dist.get_rank(), self._steps) from e
            raise
        for p, g in earlier.items():
            p.grad = g if p.grad is None else p.grad.add_(g)
        return loss

    def _run(self, micro: list[dict]) -> torch.Tensor:
        live: dict = {}          # (stage, mb) -> {"inputs": {name: tensor}, "outputs": [tensors]}
        pending: dict = {}       # (stage, mb, gradient) -> [(name, tensor, work)]
        sends = []
        losses = []
        if self._buckets is not None:
            self._buckets.start()
        for kind, mb, g, peer in self._actions:
            stage = self._stages[g]
            if kind == "RA":
                pending[(g, mb, False)] = [self._irecv(name, mb, peer, False) for name in stage["received"]]
            elif kind == "F":
                received = {name: t for name, t, work in self._wait(pending.pop((g, mb, False), []))}
                for t in received.values():
                    if t.is_floating_point():
                        t.requires_grad_(True)
                args = [micro[mb][name] if name in micro[mb] else received[name] for name in stage["inputs"]]
                outputs = stage["module"](*args)
                live[(g, mb)] = {"inputs": received, "outputs": list(outputs)}
                if stage["last"]:
                    losses.append(outputs[0].detach())
            elif kind == "SA":
                for name, t in zip(stage["sent"], live[(g, mb)]["outputs"]):
                    sends.append((dist.isend(t.detach().contiguous(), dst=peer, tag=self._tag(self._index(name), mb,
                                                                                          False)), t))
            elif kind == "RG":
                names = [n for n in stage["sent"] if self._meta[n][1].is_floating_point]
                pending[(g, mb, True)] = [self._irecv(name, mb, peer, True) for name in names]
            elif kind == "B":
                state = live.pop((g, mb))
                if stage["last"]:
                    torch.autograd.backward(state["outputs"][0] / self._m)
                else:
                    grads = {name: t for name, t, _ in self._wait(pending.pop((g, mb, True), []))}
                    pairs = [(t, grads[n]) for n, t in zip(stage["sent"], state["outputs"])
                             if n in grads and t.requires_grad]
                    if pairs:
                        torch.autograd.backward([t for t, _ in pairs], [gr for _, gr in pairs])
                live[(g, mb)] = state  # keep the received inputs' gradients for SG
            elif kind == "SG":
                state = live.pop((g, mb))
                for name in stage["received"]:
                    t = state["inputs"][name]
                    if not t.is_floating_point():
                        continue
                    grad = t.grad if t.grad is not None else torch.zeros_like(t)
                    sends.append((dist.isend(grad.contiguous(), dst=peer, tag=self._tag(self._index(name), mb, True)),
                                  grad))
        for work, _ in sends:
            work.wait()
        if self._buckets is not None:
            self._buckets.finish()
        for name, group in self._shared:
            p = self._parameters[name]
            if isinstance(p, torch.nn.Parameter) and p.grad is not None:
                dist.all_reduce(p.grad, group=group)
        loss = (torch.stack(losses).mean() if losses else torch.zeros((), dtype=self._loss_dtype()))
        dist.broadcast(loss, src=self._last_rank)
        return loss

    def _loss_dtype(self) -> torch.dtype:
        return next(iter(self._parameters.values())).dtype if self._parameters else torch.float32

    def _index(self, name: str) -> int:
        return self._meta[name][2]

    def _irecv(self, name: str, mb: int, peer: int, gradient: bool):
        shape, dtype, index = self._meta[name]
        buffer = torch.empty(shape, dtype=dtype)
        return name, buffer, dist.irecv(buffer, src=peer, tag=self._tag(index, mb, gradient))

    @staticmethod
    def _wait(items):
        for name, t, work in items:
            work.wait()
        return items

    def eval_step(self, *batch) -> torch.Tensor:
        """The loss of the global batch, forward only (no gradients, nothing kept): each
        micro-batch passes the stages in order, every rank taking (micro-batch, stage) pairs
        in the same order, receiving a stage's inputs just before running it and sending its
        outputs without waiting, so no rank waits on one that waits on it."""
        micro = self._micro_batches(batch)
        p, size = self.plan.pipeline, self._stage_size
        local = dist.get_rank() % size
        losses, sends = [], []
        with torch.no_grad():
            for mb in range(self._m):
                for g in sorted(self._stages):
                    stage = self._stages[g]
                    received = {}
                    for name in stage["received"]:  # from the previous stage's rank, same sub-mesh coordinate
                        shape, dtype, index = self._meta[name]
                        received[name] = torch.empty(shape, dtype=dtype)
                        dist.recv(received[name], src=((g - 1) % p) * size + local,
                                  tag=self._tag(index, mb, False))
                    outputs = stage["module"](*[micro[mb][n] if n in micro[mb] else received[n]
                                                for n in stage["inputs"]])
                    if stage["last"]:
                        losses.append(outputs[0])
                        continue
                    for name, t in zip(stage["sent"], outputs):
                        t = t.contiguous()
                        sends.append((dist.isend(t, dst=((g + 1) % p) * size + local,
                                                 tag=self._tag(self._index(name), mb, False)), t))
            for work, _ in sends:
                work.wait()
            loss = torch.stack(losses).mean() if losses else torch.zeros((), dtype=self._loss_dtype())
            dist.broadcast(loss, src=self._last_rank)
        return loss

    def _checkpoint_state(self):
        from .checkpoint import held_state

        return held_state(self._kept, self._parameters, lambda n: self._leaves[n]["placement"], self._mesh,
                          dict(self.named_parameters()))

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every parameter and buffer whole, on every rank: gathered on the sub-mesh of a stage
        holding it, then broadcast from that stage's first rank."""
        from .engine import gather_whole

        out = {}
        pipeline_rank = dist.get_rank() // self._stage_size
        with torch.no_grad():
            for name in sorted(self._owners):
                shape, dtype, _ = self._meta[name]
                if pipeline_rank in self._owners[name]:
                    t = self._parameters[name].detach()
                    if self._mesh is not None:
                        t = gather_whole(t, self._leaves[name]["placement"], self._mesh)
                    t = t.clone()
                else:
                    t = torch.empty(shape, dtype=dtype)
                dist.broadcast(t, src=min(self._owners[name]) * self._stage_size)
                out[name] = t
        return out
