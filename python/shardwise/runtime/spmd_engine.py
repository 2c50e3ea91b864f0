"""The SPMD engine: one rank's share of a model under a plan with pipeline 1, as a
``torch.fx.GraphModule`` per (mode, batch shapes) lowered from the core's rank program
(runtime/lower.py), and the training loop's controls (runtime/engine_base.py).

shardwise.parallelize (python/shardwise/engine.py, above the runtime) captures the model,
plans it and builds the first program; the engine builds the others itself: a batch of
another shape (the last, shorter one; another sequence length) or eval mode is captured again
(through the ``Recapture`` parallelize gave it) and run under the same sharding, searched again
on the same mesh when the sharding does not fit it (the parameters' placements must stay).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.fx

from .._C import ValidationError
from .._logging import get_logger
from .._tensor_names import tied_names
from ..materialize import local_tensor
from .batch import BatchBinding, call_arguments
from .buckets import _GradientBuckets
from .compiled import runner
from .counted import Counter
from .engine_base import EngineBase, Recapture, check_same_plan, mode_name, replicated_copies, zero_axes
from .grad_norm import plain
from .lower import _build_module, _rank_program, program_code
from .mesh import _Mesh
from .precision import Policy
from .reshard import gather_whole
from .state import held_state

log = get_logger("shardwise.engine")

__all__ = ["Engine"]


@dataclass
class _Program:
    """One captured and lowered program of the engine: a (mode, batch shapes)."""

    module: torch.fx.GraphModule
    program: dict
    plan: object  # shardwise.Plan (the sharding this program runs)
    whole: list[str]
    placements: list  # per input, in the binding's order
    counter: Counter
    buckets: _GradientBuckets | None = None  # the reduction of gradients it leaves Partial
    run: Any = None  # what runs it: `module`, or its compiled form (runtime/compiled.py)


class Engine(EngineBase):
    """One rank's share of a model under a plan (runtime/engine_base.py: the loop's controls)."""

    def __init__(self, *, model: torch.nn.Module, wrapper: torch.nn.Module, binding: BatchBinding, plan,
                 mesh: _Mesh, first: _Program, parameters: dict, tensors: dict, trainable: set[str], kept,
                 recapture: Recapture, policy: Policy | None, static: bool, compute_dtypes: dict, shapes: tuple,
                 compile_options: dict | None = None):
        super().__init__(binding, policy)
        self._compile_options = compile_options  # torch.compile's arguments; None: eager
        self._compute_dtypes = compute_dtypes
        self._model = model
        self._wrapper = wrapper
        self._tied = tied_names(model)
        self.plan = plan
        self._mesh = mesh
        self._parameters = parameters  # IR name -> this rank's tensor (shared by every program)
        self._tensors = tensors        # IR name -> the model's whole tensor (for programs built later)
        self._trainable = trainable
        self._kept = kept              # runtime.state.KeptState: the model's names, shapes, what no rank holds
        self._recapture = recapture    # capture and the search, for programs built later
        self._static = static
        self._programs = {(self._mode_key(), shapes): first}  # captured in the model's mode at the time
        self._first = first
        self._carry_buckets = None  # the buckets of the program that made the no_sync gradients
        self._leaves = {leaf["value"]: leaf for leaf in first.program["leaves"]}
        self._model_names = {id(p): n for n, p in model.named_parameters()}
        self._params = {n: p for n, p in parameters.items() if isinstance(p, torch.nn.Parameter)}
        first.buckets = self._buckets_of(first.program)
        first.run = runner(first.module, compile_options, f"rank {mesh.rank}: the {mode_name(self._mode_key())} "
                                                          f"program at batch shapes {[list(s) for s in shapes]}")
        world = 1
        for size in mesh.sizes:
            world *= size
        self._world = world

    # ---- what the rank holds ------------------------------------------------------------------
    @property
    def module(self) -> torch.fx.GraphModule:
        """The training program's module (at the example batch's shapes)."""
        return self._first.module

    @property
    def code(self) -> str:
        """The rank's program as Python source (torch.fx)."""
        return program_code(self._first.module)

    @property
    def rank_ir(self) -> str:
        """The rank's program in shardwise's IR (docs/rank-ir.md): local shapes, every
        collective a node, backward steps explicit; what ``code`` runs, before lowering."""
        return self._first.program["rank_ir"]

    @property
    def whole_nodes(self) -> list[str]:
        """Nodes the training program runs on gathered operands (no local form)."""
        return self._first.whole

    def _held(self):
        out = []
        for name, p in self._params.items():
            copies = replicated_copies(self._leaves[name], self._mesh.sizes)
            out.append((name, p, copies, copies < self._world))
        return out

    def _zero_groups(self) -> dict[str, tuple]:
        zero = (self.plan.sharding or {}).get("zero", {})
        out = {}
        for name in self._params:
            axes = zero_axes(zero, name, self._leaves[name], self._mesh.sizes)
            if axes:
                out[name] = self._mesh.axes_group(axes)
        return out

    def _buckets_of(self, program: dict) -> _GradientBuckets | None:
        """Gradient buckets of the parameters `program` leaves Partial (a program for another
        shape may reduce over other axes: a node replicated there gives a whole gradient)."""
        leaves = {leaf["value"]: leaf for leaf in program["leaves"]}
        reduce = [(self._params[n], tuple(leaves[n]["reduce_axes"])) for n in self._params
                  if n in leaves and leaves[n]["reduce_axes"]]
        return _GradientBuckets(reduce, self._mesh.groups, reduce_dtype=self._reduce_dtype()) if reduce else None

    def _process_groups(self) -> list:
        return [self._control, *self._mesh.groups]

    def _local_batch(self, batch: tuple) -> list[torch.Tensor]:
        """This rank's share of a positional batch (tests and benchmarks)."""
        tensors = self._binding.bind(*call_arguments(batch, {}))
        program = self._program_for(self._mode_key(), tensors)
        return [local_tensor(t, p, self._mesh.sizes, self._mesh.rank) for t, p in zip(tensors.values(),
                                                                                      program.placements)]

    # ---- steps -------------------------------------------------------------------------------------
    def _check_shapes(self, tensors: dict[str, torch.Tensor], where: str) -> None:
        shapes = tuple(tuple(t.shape) for t in tensors.values())
        if self._static and not any(key[1] == shapes for key in self._programs):
            first = next(iter(self._programs))[1]
            raise ValidationError(f"{where}: the batch has shapes {dict(zip(tensors, map(list, shapes)))}, the "
                                  f"program was captured at {dict(zip(tensors, map(list, first)))} (static=True "
                                  f"refuses other shapes; rank {self._mesh.rank})")

    def _run(self, tensors: dict[str, torch.Tensor], backward: bool, carry: dict) -> torch.Tensor:
        program = self._program_for(self._mode_key(), tensors)
        local = [local_tensor(t, p, self._mesh.sizes, self._mesh.rank)
                 for t, p in zip(tensors.values(), program.placements)]
        counts = program.counter(tensors)
        if not backward:
            return program.run(*local, *counts)[0]
        buckets = program.buckets if self._syncing else None
        if carry and buckets is not self._carry_buckets and self._carry_buckets is not None:
            raise ValidationError("train_step: gradients held back under no_sync() were made by a program that "
                                  "reduces them over other mesh axes than this batch's program; step the "
                                  "optimizer between batches of different shapes")
        if buckets is not None:
            buckets.start(carry)
        scatters = program.module.scatters  # gradients reduce-scattered beside backward (parameter_gathers.py)
        if scatters is not None:
            scatters.start()
        try:
            loss = program.run(*local, *counts)[0]
            loss.backward()
            if scatters is not None:
                scatters.finish()
            if buckets is not None:
                buckets.finish()
        except BaseException:
            if scatters is not None:
                scatters.abandon()
            if buckets is not None:
                buckets.abandon()
            raise
        self._carry_buckets = None if self._syncing else program.buckets
        return loss.detach()

    def _runs(self) -> list:
        return [program.run for program in self._programs.values()]

    def _program_for(self, mode, tensors: dict[str, torch.Tensor]) -> _Program:
        shapes = tuple(tuple(t.shape) for t in tensors.values())
        key = (mode, shapes)
        if key not in self._programs:
            self._programs[key] = self._build_program(mode, tensors)
        return self._programs[key]

    def _build_program(self, training, tensors: dict[str, torch.Tensor]) -> _Program:
        """A program for another mode or batch shape: captured again, run under the engine's
        sharding (searched again on its mesh when that does not fit), sharing the parameters."""
        with self._mode(training):
            graph, builder = self._recapture.capture(self._captured_arguments())
        batch = int(next(iter(tensors.values())).shape[0])
        plan = self._recapture.at_batch(self.plan, batch)
        rank = self._mesh.rank
        shapes = [list(t.shape) for t in tensors.values()]
        try:
            program, whole = _rank_program(graph, plan.to_json(), rank)
        except ValidationError as e:
            # Nodes whose splits these sizes do not allow (3 rows on 2 data ranks) run replicated
            # on that axis; the parameters keep their placements.
            log.info("rank %d: the plan's sharding does not split the %s program at batch shapes %s (%s); the nodes "
                     "it cannot split run replicated", rank, mode_name(training), shapes, e)
            try:
                program, whole = _rank_program(graph, plan.to_json(), rank, adapt_to_shapes=True)
            except ValidationError as again:  # not a shape matter (another graph): search the mesh again
                log.info("rank %d: %s; searching the mesh again", rank, again)
                plan = self._recapture.search(graph, batch, tuple(self._mesh.sizes))
                check_same_plan(plan, dist.get_rank())
                program, whole = _rank_program(graph, plan.to_json(), rank)
        leaves = {leaf["value"]: leaf for leaf in program["leaves"]}
        for name, leaf in leaves.items():
            if name in self._leaves and name in self._parameters and leaf["placement"] != self._leaves[name][
                    "placement"]:
                raise ValidationError(f"train_step: the {mode_name(training)} program at batch shapes "
                                      f"{[list(t.shape) for t in tensors.values()]} places '{name}' "
                                      f"{leaf['placement']}, the engine holds it {self._leaves[name]['placement']}; "
                                      "parallelize with static=True and a batch of this shape, or pad the batch")
        names = self._binding.names
        module = _build_module(program, builder.sources, self._mesh, self._tensors, names, self._trainable,
                               parameters=self._parameters, compute_dtypes=self._compute_dtypes)
        counter = Counter.build(graph, builder, self._tensors, self._trainable, module.counted, names)
        log.info("rank %d: a %s program for batch shapes %s (%d nodes, %d whole)", rank,
                 mode_name(training), [list(t.shape) for t in tensors.values()],
                 len(program["nodes"]), len(whole))
        where = f"rank {rank}: the {mode_name(training)} program at batch shapes {shapes}"
        return _Program(module, program, plan, whole, [leaves[n]["placement"] for n in names], counter,
                        self._buckets_of(program), runner(module, self._compile_options, where))

    # ---- state ------------------------------------------------------------------------------------
    def _checkpoint_state(self):
        return held_state(self._kept, self._parameters, lambda n: self._leaves[n]["placement"], self._mesh,
                          dict(self._params))

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The model's state_dict, whole, on every rank (gathered through the mesh): its
        parameters and persistent buffers by its names, a tied weight under each of them."""
        return self._as_state_dict(self._gather({n: t.detach() for n, t in self._parameters.items()}))

    def _full_grads(self) -> dict[str, torch.Tensor]:
        """Every trainable parameter's gradient whole (zeros where there is none), on every rank."""
        return self._gather({n: plain(p.grad) if p.grad is not None else torch.zeros_like(p)
                             for n, p in self._params.items()})

    def _gather(self, local: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            return {n: gather_whole(t, self._leaves[n]["placement"], self._mesh).clone() for n, t in local.items()}
