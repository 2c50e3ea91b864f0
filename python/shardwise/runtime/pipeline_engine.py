"""The pipeline engine: a plan with pipeline degree p runs as stage modules, one rank per
stage (v model chunks per rank with interleaved 1F1B), driven by the schedule's action list.

The action lists are the C++ schedules' (csrc/schedule/schedules.h, the same lists the
simulator costs): "F3@s1" forward of micro-batch 3 on virtual stage 1, "SA3@s1->r2" send its
activations, "RA3@s2<-r1" receive them, "B3@s1" backward, "SG3@s1->r0" / "RG3@s0<-r1" the
gradients. Receives are posted (``dist.irecv``) when the list reaches them (one computation
before the one that reads them: csrc/schedule/early_receives.h) and waited just before the
forward or backward that needs them; sends are issued (``dist.isend``) and waited
at the end of the step (both through runtime/transport.py: staged through host memory on
Gloo with CUDA tensors). Each travels on its link's channel for its way and kind, with tag 0,
so receives meet sends by their order, on Gloo as on NCCL, which ignores tags; the core checks
that the lists' orders agree and cannot hang that way (csrc/schedule/p2p_channels.h,
runtime/stage_links.py). Gradients of every micro-batch accumulate in ``.grad``; the loss
combines the micro-batch losses as the loss's reduction over the batch requires, which the core
reads off the graph (csrc/analysis/batch_coupling.h, ``loss_combination``): a sum over the rows
(torchtitan's cross entropy, ``reduction="sum"``) is the sum of the micro-batch sums, each
backward seeded with 1; a mean over the rows is their mean, each seeded with 1 / m (a loss whose
mean the data counts takes each micro-batch's share of the global count, see
runtime/counted.py); broadcast from the last stage to every rank in its own dtype. A graph whose
rows meet in batch statistics is not run in micro-batches unless the plan says
micro_batch_semantics "per_micro_batch" (shardwise.parallelize checks it).

``engine.eval()`` captures the model again in eval mode (through the ``Recapture``
shardwise.parallelize gave it: capture is above the runtime) and cuts it as the training graph
was cut (the same layers per stage), sharing the parameters; a batch of another shape is
refused (the schedule's micro-batches are fixed).

Stages are contiguous, FLOPs-balanced cuts of the captured graph at repeated-block boundaries
(csrc/search/stage_partition.h). A value crossing a cut goes to the next stage, which passes it
on when a later stage reads it (a skip connection); its gradient comes back the same way. A
weight read by stages on different ranks (a tied embedding and LM head) has its gradient
all-reduced among those ranks after the step, as Megatron-LM does for its embedding group.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from .. import _C
from .._C import ValidationError
from .._logging import get_logger
from .._tensor_names import tied_names
from ..materialize import local_tensor
from .batch import map_tensors
from .buckets import _GradientBuckets
from .compiled import runner
from .counted import Counter
from .engine_base import EngineBase, Recapture, mode_name, replicated_copies, zero_axes
from .grad_norm import plain
from .lower import StageCut, _build_module, _rank_program, _tensor_outputs, program_code
from .reshard import gather_whole
from .stage_links import StageLinks
from .state import held_state
from .weight_split import backward_input, backward_weight, check_splittable
from . import fused_accumulation, transport

log = get_logger("shardwise.engine")

@dataclass
class StageProgram:
    """One captured graph cut into this rank's stages (a mode's program)."""

    stages: dict            # virtual stage -> {"module", "inputs", "received", "sent", "last"}
    meta: dict              # value -> (local shape, dtype)
    owners: dict            # parameter/buffer name -> the pipeline ranks reading it
    leaves: dict            # leaf name -> its placement on the stage sub-mesh
    reduce: list            # (parameter, axes) left Partial over the sub-mesh
    whole: list             # nodes run on gathered operands
    placements: dict        # batch input -> placement on the sub-mesh
    counter: Counter        # the counts of counted losses, per micro-batch
    counted: list           # their names, in the counter's order
    loss_dtype: torch.dtype
    reads: dict             # leaf name -> the virtual stages of this rank that read it
    produced: dict          # value -> its placement on the stage sub-mesh (what crosses a cut is held so)
    shapes: dict            # value -> its whole shape
    program_hash: str       # of the rank program cut (transform/job_program.h: the one the ranks agree on)


def stage_io(rank_ir: str, input_names: list[str]) -> dict:
    """What a pipeline stage's rank IR (transform/stage_rank_graph.h) takes and hands on: the
    batch inputs it reads (its graph inputs among `input_names`, in their order; a counted
    loss's count is an input of its own), the values it receives (its recv nodes) and sends (its
    send nodes' operands), each in the IR's order, the order their transfers are posted in,
    and the leaves it reads (the values no node makes that are no input)."""
    ir = _C.Graph.from_text(rank_ir)
    nodes = ir.nodes()
    taken = set(ir.input_names())
    made = {out for node in nodes for out in node["outputs"]}
    return {"inputs": [x for x in input_names if x in taken],
            "received": [node["outputs"][0] for node in nodes if node["op"] == "shardwise::recv"],
            "sent": [node["inputs"][0] for node in nodes if node["op"] == "shardwise::send"],
            "leaves": [v["name"] for v in ir.values() if v["name"] not in made and v["name"] not in taken]}


def stage_program(graph, builder, plan, sharded, mesh, pipeline_rank: int, input_names: list[str], tensors: dict,
                  trainable: set, parameters: dict, micro_batches: int, *, stage_ranks: list[int],
                  frozen: bool = False, compute_dtypes: dict | None = None,
                  split_backward: bool = False) -> StageProgram:
    """`graph` (captured at one micro-batch) sharded by `sharded` on the stage sub-mesh (None:
    replicated), cut into the plan's pipeline x virtual stages, and this rank's stages lowered,
    sharing `parameters` (filled when empty; `frozen`: a later program, which must not hold a
    trainable parameter the first one did not). `split_backward`: the schedule runs each stage's
    backward as B and W (runtime/weight_split.py), where the core's cut says. `stage_ranks`:
    the pipeline rank of each virtual stage, as the schedule places them (round-robin, g % p;
    ZB-V's V: csrc/schedule/action.h)."""
    p, v = plan.pipeline, plan.virtual_stages
    stages = p * v
    # The core assigns every node its stage (the plan's layers per stage, or balanced by forward
    # FLOPs: search/stage_assignment.h) and cuts the rank program there: each stage's rank IR
    # (transform/stage_rank_graph.h).
    by_stage = StageCut(stages, tuple(plan.layers_per_stage or ()), plan.fused_accumulation, split_backward)
    if sharded is not None:
        program, whole = _rank_program(graph, sharded.to_json(), mesh.rank, group=mesh.stage_group,
                                       micro_batches=micro_batches, stages=by_stage)
    else:
        # One rank a stage: the replicated program, its blocks recomputed as the plan says (they
        # were not: a pure pipeline's recompute=True ran, and held, every activation).
        program, whole = _C.rank_program(graph._core, "", 0, recompute=plan.recompute,
                                         fp8=plan.precision == "fp8", micro_batches=micro_batches,
                                         stages=stages, layers_per_stage=list(by_stage.layers_per_stage),
                                         fused_accumulation=by_stage.fused_accumulation,
                                         split_backward=split_backward), []

    # The stages' nodes; what crosses each cut (forwarded on) and which leaves each stage reads
    # are the core's (transform/stage_split.h: recv / send at the boundaries).
    leaves = {leaf["value"]: leaf for leaf in program["leaves"]}
    meta: dict[str, tuple] = {}
    produced: dict[str, list] = {}
    shapes: dict[str, list] = {}
    for node in program["nodes"]:
        first = node["outputs"][0]["value"]
        src, indices = builder.sources[first]
        for out, val in zip(node["outputs"], _tensor_outputs(src.meta["val"], indices)):
            meta[out["value"]] = (list(out["local_shape"]), val.dtype)
            produced[out["value"]] = list(out.get("produced") or [])
            shapes[out["value"]] = list(val.shape)
    # What each stage reads, receives and sends: its rank IR's (the core's cut).
    io = [stage_io(ir, input_names) for ir in program["stage_rank_irs"]]
    received = [stage["received"] for stage in io]
    reads: dict[str, set] = {}
    for g, stage in enumerate(io):
        for name in stage["inputs"] + stage["leaves"]:
            reads.setdefault(name, set()).add(g)
    owners = {x: {stage_ranks[g] for g in gs} for x, gs in reads.items() if x in tensors}
    for x in owners:
        meta[x] = (list(tensors[x].shape), tensors[x].dtype)
    if frozen:
        mine_now = {x for x, o in owners.items() if pipeline_rank in o and x in trainable}
        if not mine_now <= set(parameters):
            extra = sorted(mine_now - set(parameters))
            raise ValidationError(f"pipeline: the eval program's stages on pipeline rank {pipeline_rank} read "
                                  f"{extra}, which its training stages do not hold; the cut differs between modes")
    # The values whose gradient goes back across a cut: those the core's program differentiates
    # (floating values a trainable parameter reaches: its readers' operands say so, in any
    # stage, for a value passed on through one), and the program's outputs. A mask or a
    # position table computed from integers crosses as floating but carries none, and its
    # reshardings have no backward steps: a gradient required of it reaches them, and their
    # backward hands autograd the reader's shape, not the value's (Llama's causal mask under a
    # sequence-parallel stage).
    differentiable = {op["value"] for node in program["nodes"] for op in node["inputs"] if op["gradient"]}
    differentiable |= {out["value"] for out in program["outputs"]}
    mine = {}
    counted: list[str] = []
    for g in (g for g in range(stages) if stage_ranks[g] == pipeline_rank):
        batch_inputs = [x for x in input_names if g in reads.get(x, set())]
        last = g == stages - 1
        outputs = program["outputs"] if last else [{"value": x} for x in io[g]["sent"]]
        module = _build_module(program, builder.sources, mesh, tensors, batch_inputs + received[g], trainable,
                               rank_ir=program["stage_rank_irs"][g], outputs=outputs, parameters=parameters,
                               class_name=f"Stage{g}",
                               compute_dtypes=compute_dtypes,
                               split_backward=split_backward)
        if split_backward:
            check_splittable(module, g)
        counted.extend(module.counted)
        mine[g] = {"module": module, "rank_ir": program["stage_rank_irs"][g],
                   "inputs": batch_inputs + received[g], "received": received[g],
                   "differentiable": [x for x in received[g] if x in differentiable],  # (their gradients go back)
                   "sent": io[g]["sent"], "last": last, "weight_outputs": set(module.weight_outputs)}
    reduce = [(name, tuple(leaves[name]["reduce_axes"])) for name in parameters
              if name in leaves and leaves[name]["reduce_axes"] and isinstance(parameters[name], torch.nn.Parameter)]
    loss_value = program["outputs"][0]["value"]
    src, indices = builder.sources[loss_value] if loss_value in builder.sources else (None, None)
    loss_dtype = _tensor_outputs(src.meta["val"], indices)[0].dtype if src is not None else \
        tensors[loss_value].dtype if loss_value in tensors else torch.float32
    counter = Counter.build(graph, builder, tensors, trainable, counted, input_names)
    here = {x: sorted(g for g in gs if stage_ranks[g] == pipeline_rank) for x, gs in reads.items()}
    return StageProgram(mine, meta, owners, leaves, reduce, whole,
                        {n: leaves[n]["placement"] for n in input_names if n in leaves}, counter, counted, loss_dtype,
                        {x: gs for x, gs in here.items() if gs}, produced, shapes, program["hash"])


def full_backward(tensors: list, grads: list) -> None:
    """A stage's backward, B and W at once (``torch.autograd.backward``): a schedule that does not
    split it, and a split schedule's B whose W comes next (fused_backwards)."""
    with fused_accumulation.phase("full"):
        torch.autograd.backward(tensors, grads)


def fused_backwards(actions: list) -> dict[int, int]:
    """B action index -> W action index, for each B whose W is the next compute on its rank
    (only sends and receives between): such a micro-batch's forward runs unsplit and its B is
    the plain full backward (full_backward), its W nothing, as a fused schedule's full
    backward is (DualPipeV's steady phase, torch's FULL_BACKWARD)."""
    out = {}
    for i, (kind, mb, g, _) in enumerate(actions):
        if kind != "B":
            continue
        j = next((j for j in range(i + 1, len(actions)) if actions[j][0] in ("F", "B", "W")), None)
        if j is not None and actions[j][:3] == ("W", mb, g):
            out[i] = j
    return out


class PipelineEngine(EngineBase):
    """This rank's stages of a pipeline plan; the same face as ``shardwise.Engine``."""

    def __init__(self, *, model, wrapper, binding, plan, first: StageProgram, actions: list[tuple], micro_batch: int,
                 num_micro_batches: int, shapes: tuple, parameters: dict, tensors: dict, trainable: set,
                 shared: list[tuple], links: StageLinks, mesh=None, sharding=None,
                 recapture: Recapture | None = None, kept=None, policy=None, compute_dtypes: dict | None = None,
                 stage_ranks: list[int], loss_combination: str = "mean", compile_options: dict | None = None):
        super().__init__(binding, policy)
        self._compile_options = compile_options  # torch.compile's arguments; None: eager
        # How the micro-batch losses make the step's: "sum" or "mean" (the module docstring).
        if loss_combination not in ("sum", "mean"):
            raise ValidationError(f"pipeline: loss_combination {loss_combination!r} (known: sum, mean)")
        self._loss_sum = loss_combination == "sum"
        self._compute_dtypes = compute_dtypes or {}
        self.plan = plan
        self._model = model
        self._wrapper = wrapper
        self._tied = tied_names(model)
        self._kept = kept              # runtime.state.KeptState: the model's names, shapes, what no rank holds
        self.sharding = sharding       # the SPMD plan of each stage's sub-mesh (None: replicated)
        # captured in the model's mode at the time
        self._programs = {self._mode_key(): self._with_runners(first, self._mode_key())}
        self._first = first
        self._actions = actions        # (kind, micro-batch, virtual stage, peer pipeline rank)
        # The pipeline rank of each virtual stage (the schedule's placement: g % p, or ZB-V's V).
        self._stage_ranks = list(stage_ranks)
        self._micro_batch = micro_batch  # rows per micro-batch (across the data axis)
        self._m = num_micro_batches
        self._shapes = shapes
        self._parameters = parameters  # name -> this rank's tensor (shared by its stages and programs)
        self._tensors = tensors
        self._trainable = trainable
        # (name, group, whole) for weights read on several pipeline ranks: `whole` where their
        # stages' layouts differ (the gradient summed whole over every rank of those stages)
        self._shared = shared
        self._owners = first.owners    # name -> the pipeline ranks holding it
        self._links = links            # every pipeline rank's block of ranks (runtime/stage_links.py)
        self._last_rank = links.first_rank(stage_ranks[-1])
        self._mesh = mesh              # the stage's sub-mesh (runtime.mesh._Mesh), or None
        self._leaves = first.leaves
        self._recapture = recapture    # capture and the search, for the other mode's program
        self._model_names = {id(p): n for n, p in model.named_parameters()}
        # Gradients the program left Partial over the sub-mesh, reduced in buckets beside the
        # backward that accumulates them for the last time: a parameter's hook counts only
        # during the last B action of the last of this rank's virtual stages that reads it
        # (`_final`: action index -> those parameters), so a bucket is issued while that
        # backward and the cooldown's remaining actions run (search/parameter_collectives.h's
        # BesideBackward, priced in cost/plan_cost.cc as the window after the stage's last B).
        self._buckets = None
        self._final: dict[int, list] = {}
        self._fused = fused_backwards(actions)
        self._unsplit = {(actions[b][2], actions[b][1]) for b in self._fused}  # (stage, micro-batch)
        if first.reduce:
            self._buckets = _GradientBuckets([(parameters[n], axes) for n, axes in first.reduce], mesh.groups,
                                             reduce_dtype=self._reduce_dtype(), armed_only=True)
            # (a split backward's weight gradients come in its W, or in its B where the W is fused)
            accumulating = {w: b for b, w in self._fused.items()}
            last_b = {g: accumulating.get(i, i) for i, (kind, _, g, _) in enumerate(actions) if kind in ("B", "W")}
            for name, _ in first.reduce:
                stages = [g for g in first.reads.get(name, []) if g in last_b]
                if stages:
                    self._final.setdefault(max(last_b[g] for g in stages), []).append(parameters[name])
        self._pipeline_rank = links.me
        self.whole_nodes = first.whole
        # Where this rank's tensors live (the model's device): receive buffers and the loss too.
        self._device = next(iter(parameters.values())).device if parameters else torch.device("cpu")

    def _with_runners(self, program: StageProgram, training) -> StageProgram:
        """`program` with what runs each of its stages: the stage's module, or its compiled form
        (runtime/compiled.py: forward, and its backward through AOTAutograd, compiled on the
        first call)."""
        for g, stage in program.stages.items():
            where = f"rank {dist.get_rank()}: the {mode_name(training)} program's virtual stage {g}"
            stage["run"] = runner(stage["module"], self._compile_options, where)
        return program

    def _runs(self) -> list:
        return [stage["run"] for program in self._programs.values() for stage in program.stages.values()]

    @property
    def _stages(self) -> dict:
        return self._first.stages

    @property
    def code(self) -> str:
        return "\n".join(f"# virtual stage {g}\n{program_code(s['module'])}" for g, s in sorted(self._stages.items()))

    @property
    def stage_rank_irs(self) -> dict[int, str]:
        """Each of this rank's stages' programs in shardwise's IR (docs/rank-ir.md): the rank
        program cut by the core (csrc/transform/stage_rank_graph.h), what each stage's ``code``
        runs, before lowering; by virtual stage."""
        return {g: s["rank_ir"] for g, s in sorted(self._stages.items())}

    @property
    def rank_ir(self) -> str:
        """This rank's stages' rank IR, one after another (as ``code`` prints their programs)."""
        return "\n".join(f"// virtual stage {g}\n{ir}" for g, ir in self.stage_rank_irs.items())

    def _held(self):
        out = []
        pipeline = self.plan.pipeline
        for name, p in self._parameters.items():
            if not isinstance(p, torch.nn.Parameter):
                continue
            copies = len(self._owners.get(name, {0}))
            if self._mesh is not None:
                copies *= replicated_copies(self._leaves[name], self._mesh.sizes)
            out.append((name, p, copies, pipeline > 1 or copies < self._world()))
        return out

    def _world(self) -> int:
        return dist.get_world_size()

    def _trained_names(self) -> set[str]:
        return {n for n in self._owners if n in self._trainable}  # every stage's, not only this rank's

    def _zero_groups(self) -> dict[str, tuple]:
        if self._mesh is None or self.sharding is None:
            return {}
        zero = (self.sharding.sharding or {}).get("zero", {})
        out = {}
        for name, p in self._parameters.items():
            if not isinstance(p, torch.nn.Parameter):
                continue
            axes = zero_axes(zero, name, self._leaves[name], self._mesh.sizes)
            if axes:
                out[name] = self._mesh.axes_group(axes)
        return out

    def _process_groups(self) -> list:
        groups = [self._control, *(g for _, g, _ in self._shared)]
        if self._mesh is not None:
            groups.extend(self._mesh.groups)
        return groups

    def _check_shapes(self, tensors: dict, where: str) -> None:
        shapes = tuple(tuple(t.shape) for t in tensors.values())
        if shapes != self._shapes:
            raise ValidationError(f"{where}: the batch has shapes {dict(zip(tensors, map(list, shapes)))}, the "
                                  f"pipeline plan was made for {dict(zip(tensors, map(list, self._shapes)))} "
                                  f"({self._m} micro-batches of {self._micro_batch} rows); a pipeline takes batches "
                                  "of that shape only")

    def _program(self, training) -> StageProgram:
        if training not in self._programs:
            self._programs[training] = self._build_program(training)
        return self._programs[training]

    def _build_program(self, training) -> StageProgram:
        """The model captured in the other mode, cut as the plan says, sharing the parameters."""
        rows = self._micro_batch
        with self._mode(training):
            micro = map_tensors(self._captured_arguments(), lambda x: x.narrow(0, 0, rows))
            graph, builder = self._recapture.capture(micro)
        sharded = self.sharding
        if sharded is not None:
            try:
                _rank_program(graph, sharded.to_json(), self._mesh.rank, group=self._mesh.stage_group)
            except ValidationError:
                sharded = self._recapture.search(graph, rows, tuple(self._mesh.sizes))
        pipeline_rank = self._pipeline_rank
        program = stage_program(graph, builder, self.plan, sharded, self._mesh, pipeline_rank, self._binding.names,
                                self._tensors, self._trainable, self._parameters, self._m, frozen=True,
                                compute_dtypes=self._compute_dtypes,
                                split_backward=any(a[0] == "W" for a in self._actions),
                                stage_ranks=self._stage_ranks)
        for name, leaf in program.leaves.items():
            if name in self._leaves and leaf["placement"] != self._leaves[name]["placement"] and \
                    name in self._parameters:
                raise ValidationError(f"pipeline: the {mode_name(training)} program places '{name}' "
                                      f"{leaf['placement']}, the engine holds it {self._leaves[name]['placement']}")
        log.info("rank %d: a %s pipeline program (stages %s)", dist.get_rank(), mode_name(training),
                 sorted(program.stages))
        return self._with_runners(program, training)

    def _micro_batches(self, tensors: dict, program: StageProgram) -> tuple[list[dict], list[float]]:
        """This rank's share of each micro-batch, and the counts of the global batch."""
        mb = self._micro_batch
        out = []
        counts = [0.0] * len(program.counted)
        for i in range(self._m):
            whole = {name: t.narrow(0, i * mb, mb) for name, t in tensors.items()}
            for k, c in enumerate(program.counter(whole)):
                counts[k] += c
            piece = whole
            if self._mesh is not None:  # this rank's share of the micro-batch on its sub-mesh
                piece = {name: local_tensor(t, program.placements[name], self._mesh.sizes, self._mesh.rank)
                         for name, t in piece.items() if name in program.placements}
            out.append(piece)
        return out, counts

    @staticmethod
    def _call(stage: dict, args: list, counts: dict):
        return stage["run"](*args, *[counts[n] for n in stage["module"].counted])

    def _run(self, tensors: dict, backward: bool, carry: dict) -> torch.Tensor:
        program = self._program(self._mode_key())
        micro, count_list = self._micro_batches(tensors, program)
        counts = dict(zip(program.counted, count_list))
        if not backward:
            return self._forward_only(program, micro, counts)
        live: dict = {}          # (stage, mb) -> {"inputs": {name: tensor}, "outputs": [tensors]}
        pending: dict = {}       # (stage, mb, gradient) -> [(name, tensor, work)]
        # The V's turn (stages p - 1 and p on one rank): the input gradients stage p's B left,
        # kept past its W for stage p - 1's B when the schedule runs that W first (DualPipeV).
        turned: dict = {}        # (stage, mb) -> {name: gradient}
        sends = []
        losses = []
        reduce = self._buckets is not None and self._syncing
        if reduce:
            self._buckets.start(carry)
        scatters = [st["module"].scatters for st in program.stages.values() if st["module"].scatters is not None]
        for deferred in scatters:  # gradients reduce-scattered beside backward (parameter_gathers.py)
            deferred.start()
        try:
            for i, (kind, mb, g, peer) in enumerate(self._actions):
                stage = program.stages[g]
                if reduce and i in self._final:
                    self._buckets.arm(self._final[i])
                if kind == "RA":
                    pending[(g, mb, False)] = [self._irecv(program, name, peer, False)
                                               for name in stage["received"]]
                elif kind == "F":
                    if (g, mb, False) not in pending and g - 1 in program.stages:
                        received = self._handed_on(program, g, mb, live)  # the stage before is on this rank
                    else:
                        received = dict(self._wait(pending.pop((g, mb, False), [])))
                    for name in stage["differentiable"]:
                        if received[name].is_floating_point():
                            received[name].requires_grad_(True)
                    args = [micro[mb][name] if name in micro[mb] else received[name] for name in stage["inputs"]]
                    split = stage["module"].weight_split
                    if split is not None and (g, mb) not in self._unsplit:  # weights read through fresh leaves
                        split.active = True
                        try:
                            outputs = self._call(stage, args, counts)
                        finally:
                            split.active = False
                        live[(g, mb)] = {"inputs": received, "outputs": list(outputs), "sites": split.take()}
                    else:
                        outputs = self._call(stage, args, counts)
                        live[(g, mb)] = {"inputs": received, "outputs": list(outputs)}
                    if stage["last"]:
                        losses.append(outputs[0].detach())
                    # (live holds them now: a local name would keep the graph past its W)
                    outputs = received = args = None
                elif kind == "SA":
                    for name, t in zip(stage["sent"], live[(g, mb)]["outputs"]):
                        # The buffer sent is kept until the send completes, not the output: its
                        # graph (kept for W under a split backward) would live to the step's end.
                        sends.extend(self._isend(program, name, t.detach(), peer, False))
                elif kind == "RG":
                    names = [n for n in stage["sent"] if program.meta[n][1].is_floating_point]
                    pending[(g, mb, True)] = [self._irecv(program, name, peer, True) for name in names]
                elif kind == "B" and "sites" in live[(g, mb)]:
                    self._backward_input(stage, live[(g, mb)], self._incoming(program, g, mb, pending, live, turned))
                elif kind == "W" and (g, mb) in self._unsplit:
                    continue  # its B was the full backward
                elif kind == "W":
                    state = live.pop((g, mb))
                    backward_weight(state["sites"], state["site_grads"], state["weight_outputs"])
                    if g - 1 in program.stages and (g - 1, mb) in live:  # the turn: g - 1's B still to read them
                        turned[(g, mb)] = state["input_grads"]
                    del state  # the micro-batch's graph (kept for W) freed now, not at the next action
                elif kind == "B":
                    state = live.pop((g, mb))
                    if stage["last"]:
                        full_backward([self._seeded(state["outputs"][0])], [None])
                    else:
                        grads = self._incoming(program, g, mb, pending, live, turned)
                        pairs = [(t, grads[n]) for n, t in zip(stage["sent"], state["outputs"])
                                 if n in grads and t.requires_grad]
                        if pairs:
                            full_backward([t for t, _ in pairs], [gr for _, gr in pairs])
                    live[(g, mb)] = state  # keep the received inputs' gradients for SG
                elif kind == "SG":
                    state = live[(g, mb)] if "sites" in live[(g, mb)] else live.pop((g, mb))  # (W still to run)
                    for name in stage["received"]:
                        t = state["inputs"][name]
                        if not t.is_floating_point():
                            continue
                        grad = state["input_grads"].get(name) if "sites" in state else t.grad
                        grad = grad if grad is not None else torch.zeros_like(t)
                        sends.extend(self._isend(program, name, grad, peer, True))
            for work, _ in sends:
                work.wait()
            for deferred in scatters:
                deferred.finish()
            if reduce:
                self._buckets.finish()
        except BaseException:
            for deferred in scatters:
                deferred.abandon()
            if reduce:
                self._buckets.abandon()
            raise
        for name, group, whole in self._shared:
            p = self._parameters[name]
            if not isinstance(p, torch.nn.Parameter):
                continue
            if not whole:
                if p.grad is not None:
                    transport.all_reduce(p.grad, group=group)
                continue
            # Stages of different layouts: each stage's gradient whole, summed over every
            # rank of the stages holding the weight, each rank's copy counting 1 / its stage's size.
            placement = self._leaves[name]["placement"]
            grad = plain(p.grad) if p.grad is not None else torch.zeros_like(p)
            total = self._links.whole(grad, placement, name) / len(self._links.blocks[self._pipeline_rank])
            transport.all_reduce(total, group=group)
            p.grad = self._links.cut(total, placement, name).to(p.dtype)
        return self._broadcast_loss(losses, program)

    def _handed_on(self, program: StageProgram, g: int, mb: int, live: dict) -> dict:
        """Stage g's inputs from stage g - 1 on this rank (ZB-V's turn on rank p - 1): its
        outputs, detached, as a receive would give them (what g - 1 sends is what g receives)."""
        before = program.stages[g - 1]
        return {name: t.detach() for name, t in zip(before["sent"], live[(g - 1, mb)]["outputs"])
                if name in program.stages[g]["received"]}

    def _incoming(self, program: StageProgram, g: int, mb: int, pending: dict, live: dict, turned: dict) -> dict:
        """The gradients of stage g's outputs for micro-batch mb: received from the next stage's
        rank, or, where the next stage is on this rank, the gradients its B left for its inputs
        (in `turned` once that stage's W has run)."""
        if (g, mb, True) in pending or g + 1 not in program.stages:
            return dict(self._wait(pending.pop((g, mb, True), [])))
        if (g + 1, mb) in turned:
            return {n: gr for n, gr in turned.pop((g + 1, mb)).items() if gr is not None}
        state = live[(g + 1, mb)]
        if "sites" in state:  # a split backward: W still to run, the state stays
            grads = state["input_grads"]
        else:
            grads = {n: t.grad for n, t in live.pop((g + 1, mb))["inputs"].items()}
        return {n: gr for n, gr in grads.items() if gr is not None}

    def _backward_input(self, stage: dict, state: dict, grads: dict) -> None:
        """B of a split backward (runtime/weight_split.py): the received inputs' gradients
        (kept for SG) and each site's output gradients (kept for W), the weight values sent
        kept with their gradients for W. `grads`: the gradients of the stage's outputs."""
        if stage["last"]:
            roots, root_grads, weight_outputs = [self._seeded(state["outputs"][0])], [None], []
        else:
            pairs = [(n, t, grads[n]) for n, t in zip(stage["sent"], state["outputs"]) if n in grads and t.requires_grad]
            roots = [t for n, t, _ in pairs if n not in stage["weight_outputs"]]
            root_grads = [gr for n, _, gr in pairs if n not in stage["weight_outputs"]]
            weight_outputs = [(t, gr) for n, t, gr in pairs if n in stage["weight_outputs"]]
        names = [n for n in stage["received"] if state["inputs"][n].requires_grad]
        input_grads, site_grads = backward_input(roots, root_grads, [state["inputs"][n] for n in names],
                                                 state["sites"])
        state["input_grads"] = dict(zip(names, input_grads))
        state["site_grads"] = site_grads
        state["weight_outputs"] = weight_outputs
        state["outputs"] = None  # B's roots: W starts from the sites

    def _seeded(self, loss: torch.Tensor) -> torch.Tensor:
        """A micro-batch's loss as its share of the step's: itself for a sum over the rows, / m
        for a mean (the module docstring)."""
        return loss if self._loss_sum else loss / self._m

    def _broadcast_loss(self, losses: list, program: StageProgram) -> torch.Tensor:
        """The step's loss from the micro-batch losses (their sum, or their mean), from the last
        stage to every rank, in the loss' dtype (sent as float64: exact for every floating
        dtype, and Gloo-safe for half ones)."""
        if losses:
            stacked = torch.stack(losses)
            loss = (stacked.sum() if self._loss_sum else stacked.mean()).double()
        else:
            loss = torch.zeros((), dtype=torch.float64, device=self._device)
        transport.broadcast(loss, src=self._last_rank)
        return loss.to(program.loss_dtype)

    def _irecv(self, program: StageProgram, name: str, peer: int, gradient: bool):
        """Post the receive of `name` (or its gradient) from pipeline rank `peer`, for the
        micro-batch the list is at: (name, buffer, work, placement to cut it to; None: the
        buffer is the shard). On the link's channel for that way and kind, tag 0: receives
        meet sends by order (csrc/schedule/p2p_channels.h), on Gloo as on NCCL."""
        shape, dtype = program.meta[name]
        links = self._links
        if links.by_coordinate(peer):
            buffer = torch.empty(shape, dtype=dtype, device=self._device)
            src, placement = links.peer(peer), None
        else:
            buffer = torch.empty(program.shapes[name], dtype=dtype, device=self._device)
            src, placement = links.source(peer), program.produced[name]
        return name, buffer, transport.irecv(buffer, src=src, group=links.channel(src, links.rank, gradient)), \
            placement

    def _isend(self, program: StageProgram, name: str, t: torch.Tensor, peer: int, gradient: bool) -> list[tuple]:
        """Send this rank's `t` (the value `name`, or its gradient) to pipeline rank `peer`, on
        the link's channel for that way and kind: [(work, buffer kept until it completes)]."""
        links = self._links
        if links.by_coordinate(peer):
            buffer, destinations = t.contiguous(), [links.peer(peer)]
        else:
            buffer = links.whole(t, program.produced[name], name).contiguous()  # collective on the sub-mesh
            destinations = links.destinations(peer)
        return [(transport.isend(buffer, dst=rank, group=links.channel(links.rank, rank, gradient)), buffer)
                for rank in destinations]

    def _wait(self, items) -> list[tuple]:
        """[(name, this rank's tensor)] once every receive of `items` (from _irecv) completed."""
        out = []
        for name, t, work, placement in items:
            work.wait()
            out.append((name, t if placement is None else self._links.cut(t, placement, name)))
        return out

    def _forward_only(self, program: StageProgram, micro: list[dict], counts: dict) -> torch.Tensor:
        """The loss of the global batch, forward only (no gradients, nothing kept): each
        micro-batch passes the stages in order, every rank taking (micro-batch, stage) pairs
        in the same order, receiving a stage's inputs just before running it and sending its
        outputs without waiting, so no rank waits on one that waits on it."""
        losses, sends = [], []
        for mb in range(self._m):
            handed: dict = {}  # a stage's outputs for the next stage on this rank (ZB-V's turn)
            for g in sorted(program.stages):
                stage = program.stages[g]
                received = {}
                for name in stage["received"]:  # from the previous stage's rank, same sub-mesh coordinate
                    if name in handed:
                        received[name] = handed[name]
                        continue
                    received.update(self._wait([self._irecv(program, name, self._stage_ranks[g - 1], False)]))
                outputs = self._call(stage, [micro[mb][n] if n in micro[mb] else received[n]
                                             for n in stage["inputs"]], counts)
                if stage["last"]:
                    losses.append(outputs[0])
                    continue
                if g + 1 in program.stages:
                    handed = dict(zip(stage["sent"], outputs))
                    continue
                for name, t in zip(stage["sent"], outputs):
                    sends.extend(self._isend(program, name, t, self._stage_ranks[g + 1], False))
        for work, _ in sends:
            work.wait()
        return self._broadcast_loss(losses, program)

    def _checkpoint_state(self):
        return held_state(self._kept, self._parameters, lambda n: self._leaves[n]["placement"], self._mesh,
                          dict(self.named_parameters()))

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every parameter and buffer whole, on every rank: gathered on the sub-mesh of a stage
        holding it, then broadcast from that stage's first rank. The model's state_dict: its
        parameters and persistent buffers by its names, a tied weight under each of them."""
        return self._as_state_dict(self._gather(sorted(self._owners), lambda t: t.detach()))

    def _full_grads(self) -> dict[str, torch.Tensor]:
        """Every trainable parameter's gradient whole (zeros where there is none), on every rank."""
        names = sorted(n for n in self._owners if n in self._trainable)
        return self._gather(names, lambda p: plain(p.grad) if p.grad is not None else torch.zeros_like(p))

    def _gather(self, names: list[str], local_of) -> dict[str, torch.Tensor]:
        out = {}
        pipeline_rank = self._pipeline_rank
        with torch.no_grad():
            for name in names:
                shape, dtype = self._first.meta[name]
                if pipeline_rank in self._owners[name]:
                    t = local_of(self._parameters[name])
                    if self._mesh is not None:
                        t = gather_whole(t, self._leaves[name]["placement"], self._mesh)
                    t = t.clone()
                else:
                    t = torch.empty(shape, dtype=dtype, device=self._device)
                transport.broadcast(t, src=self._links.first_rank(min(self._owners[name])))
                out[name] = t
        return out
