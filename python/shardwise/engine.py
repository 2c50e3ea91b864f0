"""shardwise.parallelize: a model, a plan and torch.distributed -> training on every rank.

    engine = shardwise.parallelize(model, batch)          # batch: a collator's dict, or (args...)
    opt = engine.optimizer(torch.optim.AdamW, lr=1e-3)    # a torch.optim.Optimizer
    for batch in loader:
        loss = engine.train_step(**batch)                 # the loss, on every rank
        engine.clip_grad_norm_(1.0)
        opt.step(); opt.zero_grad()

How (the data flow of docs/ARCHITECTURE.md); ``parallelize`` reads as these steps:
 1. capture (``_capture``): the model and its loss as one ATen graph (torch.export), at the
    global batch;
 2. plan (``_spmd_plan``): the SPMD search (or the plan given, completed), run on rank 0 and
    broadcast where every rank asks the same of it (runtime/engine_base.py, planned_once);
 3. job (``_spmd_job``; a pipeline's: ``_parallelize_pipeline`` with the core's
    ``_C.pipeline_job``): the plan and every rank's program agreed on in one gather (their
    hashes: check_same_job); the core's rank program (csrc/transform/spmd_rewrite.h) says, per
    node, what each operand needs and which collectives bring it there, forward and backward;
    the lowering (runtime/lower.py) makes each IR node the ATen call it was captured from, on
    local shapes, in a ``torch.fx.GraphModule`` per rank (``engine.code`` prints it);
 4. engine (runtime/engine_base.py): ``train_step`` binds the batch by name, the ranks agree on
    it, each keeps its share (the inputs' placements), runs the module, calls backward and
    reduces the gradients the program left Partial (data parallelism) in buckets.

The batch: ``train_step`` takes the whole global batch on every rank, as the single-device
loop would, bound as ``model(*args, **kwargs)`` binds it (runtime/batch.py); each rank keeps
its share. With ``loss_fn``, the target is the last positional element (or ``target=``):
``loss = loss_fn(model(*args), target)``; without, the model returns the loss (a tensor, or an
output with ``.loss``, as a transformers model given ``labels=``, or a tuple, list or dict whose
one 0-dim tensor is the loss, as nanoGPT's ``(logits, loss)``: ``_loss_of``).

A program is captured per (mode, batch shapes): ``engine.eval()`` runs the model as
``model.eval()`` does (a capture in eval mode: dropout off, batch norm on running statistics),
and a batch of another shape (the last, shorter one; another sequence length) is captured
again and run under the same sharding (searched again on the same mesh when the sharding does
not fit it; the parameters' placements must stay), each logged once; ``static=True`` refuses
both new shapes instead.

A plan without a sharding section (made by ``Plan.manual``) with pipeline 1 is completed by
the SPMD search on its {data, tensor} mesh; with pipeline > 1 it runs as stage modules under
the schedule's action list (runtime/pipeline_engine.py). The engines themselves live in the
runtime (runtime/spmd_engine.py, runtime/pipeline_engine.py); this module captures, plans,
picks one and builds it.
"""
from __future__ import annotations

import hashlib
import json
import os
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.fx

from . import _C
from ._C import ValidationError
from ._logging import get_logger
from ._inputs import forward_signature, split_call
from .capture import _capture_with_sources
from .cluster import Cluster
from .plan import Plan, micro_batch_fallback
from .runtime.batch import TARGET, BatchBinding, call_arguments, map_tensors
from .runtime.compiled import compile_options
from .runtime.counted import Counter
from .runtime.engine_base import (CollectiveError, Recapture, check_same_job, check_same_plan, once_on_rank_zero,
                                  planned_once)
from .runtime.groups import make_groups
from .runtime.lower import _build_module, _rank_program
from .runtime.mesh import _Mesh
from .runtime.pipeline_engine import PipelineEngine, stage_program
from .runtime.precision import Policy, cast_input, cast_inputs, compute_copy, policy_of
from .runtime.spmd_engine import Engine, _Program
from .runtime.stage_links import StageLinks
from .runtime.state import keep_state
from .runtime.verify import should_verify, verify_capture

log = get_logger("shardwise.engine")

__all__ = ["CollectiveError", "Engine", "parallelize"]


class _Trainable(torch.nn.Module):
    """The model and its loss as one module (captured together, so the loss is sharded too)."""

    def __init__(self, model: torch.nn.Module, loss_fn: Callable | None):
        super().__init__()
        self.model = model
        self._loss_fn = loss_fn

    def forward(self, **batch):
        target = batch.pop(TARGET) if self._loss_fn is not None else None
        args, kwargs = split_call(forward_signature(self.model), batch)  # forward(*args) items positionally
        out = self.model(*args, **kwargs)
        if self._loss_fn is not None:
            return self._loss_fn(out, target)
        return _loss_of(type(self.model).__name__, out)


def _loss_of(model_name: str, out: Any) -> torch.Tensor:
    """The loss in what a model returned without a loss_fn: the output itself (a floating
    tensor of one element); else, in a tuple, list, dict or transformers ModelOutput, the entry
    named ``loss`` (a key or attribute, not None); else, in a container that declares no
    ``loss`` field, its one 0-dim floating tensor (nanoGPT's ``(logits, loss)``). A ModelOutput
    whose loss is None (no labels given) has none: another scalar in it (a router's aux_loss)
    is never the loss to train. Anything else is refused here, at capture, naming what came
    back: a guess (the first entry, say: nanoGPT's logits) fails later in backward, with
    torch's "grad can be implicitly created only for scalar outputs" on every rank."""
    if isinstance(out, torch.Tensor):
        if out.numel() == 1 and out.is_floating_point():
            return out
        why = "not a floating scalar"
    else:
        named = out.get("loss") if isinstance(out, dict) else getattr(out, "loss", None)
        if isinstance(named, torch.Tensor):
            return named
        if "loss" in getattr(out, "__dataclass_fields__", ()):
            why = "its loss is None"
        else:
            entries = out.values() if isinstance(out, dict) else out if isinstance(out, (tuple, list)) else ()
            scalars = [e for e in entries if isinstance(e, torch.Tensor) and e.dim() == 0 and e.is_floating_point()]
            if len(scalars) == 1:
                return scalars[0]
            why = ("several 0-dim floating tensors, none named loss" if scalars
                   else "no 0-dim floating tensor among its entries")
    raise ValidationError(f"parallelize: {model_name} returned {_described(out)}: no loss to train ({why}); give the "
                          "model its labels (labels=..., or the targets argument it takes) so that it returns its loss "
                          "alone or named 'loss', or pass loss_fn=(output, target) -> loss")


def _described(out: Any) -> str:
    """What a model returned, for an error: each entry's type and a tensor's shape and dtype."""
    def one(x):
        if isinstance(x, torch.Tensor):
            return f"Tensor{list(x.shape)} {str(x.dtype).removeprefix('torch.')}"
        return type(x).__name__ if x is not None else "None"
    if isinstance(out, dict):
        return f"{type(out).__name__} {{{', '.join(f'{k!r}: {one(v)}' for k, v in out.items())}}}"
    if isinstance(out, (tuple, list)):
        return f"{type(out).__name__} ({', '.join(one(x) for x in out)})"
    return f"a {one(out)}" if out is not None else "None"


@dataclass
class _Options:
    """What parallelize was asked beyond the model and plan (the pipeline path reads it)."""

    cluster: Any = None
    level: str = "fast"
    verify: bool | str = "auto"
    policy: Policy | None = None
    static: bool = False
    micro_batch_semantics: str | None = None  # None: the plan's (a searched plan: "exact")
    compile_options: dict | None = None  # torch.compile's arguments (runtime/compiled.py); None: eager


def _compute_dtypes(wrapper: "_Trainable", builder, tensors: dict[str, torch.Tensor]) -> dict[str, torch.dtype]:
    """The dtype the program computes each held tensor in, where it differs (mixed precision)."""
    computed, _ = _model_tensors(wrapper.model, builder)
    return {n: t.dtype for n, t in computed.items() if n in tensors and t.dtype != tensors[n].dtype}


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


_MEMORY_FRACTION = _C.MEMORY_FRACTION  # of each device's memory, what a searched plan may use (csrc/cost/constants.h)


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


def _plan_at_batch(plan: Plan, rows: int) -> Plan:
    """`plan` for a global batch of `rows` (one micro-batch; what it predicted dropped)."""
    doc = json.loads(plan.to_json())
    doc["global_batch"] = doc["micro_batch"] = rows
    doc.pop("predicted", None)
    return Plan.from_json(json.dumps(doc))


def _recapture(wrapper: _Trainable, cluster, level: str, precision: str, memory_fraction: float | None = None,
               zero: bool = True, batch_on_tensor_axis: bool = True, state_dtype: str | None = None,
               compile: bool = False) -> Recapture:
    """How an engine captures `wrapper` again and searches its mesh again (runtime/engine_base.py),
    in the precision and model states of the plan it runs (and with ZeRO allowed or not, as
    parallelize was, and priced compiled where it runs so)."""
    options = {"precision": precision, "zero": zero, "state_dtype": state_dtype, "compile": compile}
    if memory_fraction is not None:
        options["memory_fraction"] = memory_fraction
    return Recapture(
        capture=lambda arguments: _capture_with_sources(wrapper, arguments, "export", 0, prefix="model.model."),
        # (the mesh of the engine's plan, searched again as freely as its first search)
        search=lambda graph, rows, mesh: Plan.search(graph, cluster() if callable(cluster) else cluster,
                                                     global_batch=rows, level=level, mesh=mesh,
                                                     batch_on_tensor_axis=batch_on_tensor_axis, **options),
        at_batch=_plan_at_batch)


def state_dtype(model: torch.nn.Module) -> str | None:
    """The dtype torch.optim steps `model`'s own parameters in (most of their elements'), as a
    plan's state_dtype: "bf16", "f16" or "f32". The run keeps no other master copy: under a
    mixed-precision policy the model's (float32) parameters are the masters and the program
    computes in casts of them. None for float64 (priced as float32, the precision's convention)
    or a model without trainable floating parameters."""
    counts: dict[torch.dtype, int] = {}
    for p in model.parameters():
        if p.requires_grad and p.is_floating_point():
            counts[p.dtype] = counts.get(p.dtype, 0) + p.numel()
    if not counts:
        return None
    return {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}.get(max(counts, key=counts.get))


def parallelize(model: torch.nn.Module, example_inputs: Any = (), loss_fn: Callable | None = None,
                plan: Plan | None = None, cluster=None, *, level: str = "fast", mesh: tuple[int, int] | None = None,
                example_kwargs: dict | None = None, static: bool = False, verify: bool | str = "auto",
                mixed_precision=None, precision: str | None = None, zero: bool = True,
                micro_batch_semantics: str | None = None, compile: bool | str | dict = False):
    """Rewrites `model` (with its loss) for this rank of the running torch.distributed job.

    ``example_inputs``: the global batch as the model takes it: a tensor, a tuple of positional
    arguments, or a dict of keyword arguments (a data collator's batch; ``example_kwargs`` adds
    keywords to positional ones); bound by the model's own signature, by name. With ``loss_fn``,
    the target is the last positional element (or the keyword ``target``). ``plan``: a searched
    plan (``shardwise.plan``), a saved one (``Plan.from_json``), a ``Plan.manual`` one (its
    {data, tensor} mesh is filled in by the search), the file named by the environment variable
    SHARDWISE_PLAN, or None (the search on ``cluster``, default ``Cluster.detect()``, at
    ``level``, on the {data, tensor} ``mesh`` when given). ``static``: refuse batches of other
    shapes instead of capturing them again. ``verify``: run the captured program whole once
    against the eager model before anything else, on rank 0 where every rank captured the same
    program (runtime/verify.py; "auto": for models under 256 MiB of parameters, not on the meta
    device). ``mixed_precision``: FSDP2's
    ``MixedPrecisionPolicy`` (or a dict of its fields): compute in ``param_dtype`` on master
    weights of the model's dtype, reduce gradients in ``reduce_dtype`` (runtime/precision.py).
    ``precision``: what the search prices the plan in ("f32", "tf32", "bf16", "f16"), or "fp8",
    which also runs: the linear layers' products in float8 (runtime/fp8.py), refused on devices
    without FP8 units; None: the model's as captured (``param_dtype`` under a policy). A given
    plan keeps its own.
    ``zero``: whether the search may shard the optimizer's states (``shardwise.plan``'s).
    ``micro_batch_semantics``: a plan that splits the batch into micro-batches (a pipeline, or
    the gradient accumulation the search falls back to when memory is short) computes the
    whole batch's step: a loss summed over the rows is summed over the micro-batches, a mean
    averaged, and a graph whose rows meet in batch statistics (batch norm in training mode, a
    router's load-balancing loss) is not split ("exact", the default: the search keeps it in
    one micro-batch, a given plan is refused naming the op and module). "per_micro_batch"
    accepts statistics over each micro-batch (the plan records it, its report says so).
    None: the plan's own setting.
    ``compile``: run each rank program through ``torch.compile`` (runtime/compiled.py): True
    (inductor, its defaults), one of its modes ("max-autotune", ...), or a dict of its keyword
    arguments; what dynamo cannot trace runs eagerly between compiled pieces. SPMD rank programs
    and each pipeline stage's program (forward, and its backward through AOTAutograd); a
    schedule that splits a stage's backward into B and W (zero bubble) is refused with it. A
    plan parallelize searches is then priced as compiled (the plan's ``compile``: memory-bound
    ops fused, csrc/analysis/compiled_fusion.h); a plan given keeps the pricing it was made with.
    Every rank must call this with the same arguments;
    the plan's hash is checked across ranks before the first collective.
    """
    compiled = compile_options(compile)  # refused before any work
    if not dist.is_initialized():
        raise ValidationError("parallelize: call torch.distributed.init_process_group() first (torchrun sets "
                              "the environment for it)")
    call = _user_call(model, example_inputs, example_kwargs, loss_fn, mixed_precision)
    options = _Options(cluster=cluster, level=level, verify=verify, policy=call.policy, static=static,
                       micro_batch_semantics=micro_batch_semantics, compile_options=compiled)
    if plan is None and os.environ.get("SHARDWISE_PLAN"):  # `python -m shardwise run --plan` sets it
        plan = _plan_file(os.environ["SHARDWISE_PLAN"])
    # A search of our own on a mesh we choose splits the batch on any axis; a mesh or a plan
    # the user gives names its axes data x tensor, and the tensor axis keeps off the batch.
    free_batch = mesh is None and plan is None
    if plan is not None and micro_batch_semantics is not None and plan.micro_batch_semantics != micro_batch_semantics:
        plan = plan.with_micro_batch_semantics(micro_batch_semantics)
    # A pipeline plan, or one that accumulates gradients over micro-batches (the joint
    # planner's pipeline 1 with m > 1): captured there, at one micro-batch, run by the schedule.
    if plan is not None and not plan.sharding and (plan.pipeline > 1 or plan.num_micro_batches() > 1):
        return _parallelize_pipeline(call, plan, model, options)

    captured = _capture(model, call, verify)                                           # 1. capture
    if plan is None or not plan.sharding:                                              # 2. plan
        plan, joint = _spmd_plan(model, captured, plan, options, int(call.batch[0].shape[0]), mesh=mesh,
                                 precision=precision, zero=zero)
        if joint is not None:
            return _parallelize_pipeline(call, joint, model, options)
    job = _spmd_job(captured, plan, call)                                              # 3. job
    return Engine(model=model, wrapper=call.wrapper, binding=call.binding, plan=job.plan, mesh=job.mesh,  # 4. engine
                  first=job.first, parameters=job.parameters, tensors=captured.tensors,
                  trainable=captured.trainable, kept=keep_state(model, job.leaves),
                  recapture=_recapture(call.wrapper, options.cluster, level, job.plan.precision, _MEMORY_FRACTION,
                                       zero, batch_on_tensor_axis=free_batch, state_dtype=job.plan.state_dtype,
                                       compile=compiled is not None),
                  policy=call.policy, static=static, compute_dtypes=captured.compute,
                  shapes=tuple(tuple(t.shape) for t in call.batch), compile_options=compiled)


@dataclass
class _Call:
    """The user's call as the program takes it: the batch bound by the model's signature, by
    name (``named``: IR name -> tensor; ``batch``: the tensors in the binding's order), cast
    as the mixed-precision policy says, and the model with its loss as the program computes it."""

    binding: BatchBinding
    named: dict
    batch: list
    wrapper: _Trainable
    policy: Policy | None


def _user_call(model: torch.nn.Module, example_inputs: Any, example_kwargs: dict | None, loss_fn: Callable | None,
               mixed_precision) -> _Call:
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    args, kwargs = call_arguments(tuple(example_inputs) if not isinstance(example_inputs, dict)
                                  else (example_inputs,), {})
    kwargs.update(example_kwargs or {})
    binding, named = BatchBinding.capture(model, args, kwargs, loss_fn)
    batch = [named_tensor for named_tensor in binding.bind(args, kwargs, "parallelize").values()]
    policy = policy_of(mixed_precision)
    named = map_tensors(named, lambda t: cast_input(t, policy))
    batch = list(cast_inputs(dict(zip(binding.names, batch)), policy).values())
    return _Call(binding, named, batch, _Trainable(compute_copy(model, policy), loss_fn), policy)


@dataclass
class _Captured:
    """The model and its loss as one ATen graph at the global batch, with what the lowering
    reads beside it: each node's FX source (``builder``), the model's tensors by IR name, the
    trainable ones, and the dtypes the program computes held tensors in where they differ."""

    graph: Any
    builder: Any
    tensors: dict
    trainable: set
    compute: dict


def _capture(model: torch.nn.Module, call: _Call, verify: bool | str) -> _Captured:
    """Captures the call (torch.export), warns of ops no rule knows, and runs the capture
    against the eager model once where ``verify`` asks (runtime/verify.py)."""
    graph, builder = _capture_with_sources(call.wrapper, call.named, "export", 0, prefix="model.model.")
    _warn_unknown_ops(graph)
    tensors, trainable = _model_tensors(model, builder)
    compute = _compute_dtypes(call.wrapper, builder, tensors)
    if should_verify(model, verify):
        names = call.binding.names
        # On rank 0 alone where every rank captured the same program (its IR, shapes and dtypes
        # included): the check is of the capture against the model's code, the same on every
        # rank; ranks sharing a machine's cores each ran it before.
        asked = "verify the capture " + hashlib.sha256(str(graph._core).encode()).hexdigest()
        once_on_rank_zero(lambda: verify_capture(call.wrapper, call.named, graph, builder, tensors, trainable, names,
                                                 dict(zip(names, call.batch)), compute), graph, asked)
    return _Captured(graph, builder, tensors, trainable, compute)


def _spmd_plan(model: torch.nn.Module, captured: _Captured, plan: Plan | None, options: _Options, global_batch: int,
               *, mesh: tuple[int, int] | None, precision: str | None, zero: bool) -> tuple[Plan, Plan | None]:
    """The plan to run: a plan given by its degrees completed on this capture (Plan.complete),
    else the SPMD search's (on ``mesh`` when given; without one, where nothing fits at once, the
    joint planner's plan with micro-batches, returned second, as shardwise.plan does); made on
    rank 0 alone and broadcast (planned_once). Sets ``options.cluster`` to the one planned on."""
    world = dist.get_world_size()
    graph, level, compiled = captured.graph, options.level, options.compile_options is not None
    semantics = options.micro_batch_semantics
    cluster = options.cluster = options.cluster or Cluster.detect()
    if cluster.world_size != world:
        raise ValidationError(f"parallelize: the cluster has {cluster.world_size} devices, the job {world} ranks")
    states = state_dtype(model)  # what the engine's optimizer will step: the plan prices it
    if plan is not None:
        log.info("parallelize: the plan gives no sharding of its %d x %d mesh: searching it once (the "
                 "engine's plan holds it: save that one to run it without a search)", plan.data, plan.tensor)

    def choose(given=plan):  # (on rank 0 alone: planned_once)
        if given is not None:
            return given.complete(graph, cluster, level=level), None
        found = Plan.search(graph, cluster, global_batch=global_batch, level=level, mesh=mesh,
                            memory_fraction=_MEMORY_FRACTION, precision=precision, zero=zero,
                            state_dtype=states, compile=compiled)
        if mesh is not None:
            return found, None
        # nothing fits at once: maybe in micro-batches, as shardwise.plan does
        return found, micro_batch_fallback(found, graph, cluster, global_batch=global_batch, level=level,
                                           memory_fraction=_MEMORY_FRACTION, precision=precision, zero=zero,
                                           micro_batch_semantics=semantics or "exact",
                                           state_dtype=states, compile=compiled)

    asked = repr((cluster.to_json(), None if plan is None else plan.to_json(), global_batch, level, mesh,
                  _MEMORY_FRACTION, precision, zero, states, compiled, semantics))
    plan, joint = planned_once(choose, graph, asked)
    if joint is None:
        _check_fits(plan, cluster, type(model).__name__)
    return plan, joint


@dataclass
class _SpmdJob:
    """What this rank runs of an SPMD plan: the plan (its programs' hash recorded), the rank's
    view of its mesh, the lowered program and the parameters it holds, and the leaves it reads."""

    plan: Plan
    mesh: _Mesh
    first: _Program
    parameters: dict
    leaves: set


def _spmd_job(captured: _Captured, plan: Plan, call: _Call) -> _SpmdJob:
    """The plan checked against this job and capture, agreed on by every rank (one gather:
    check_same_job), and this rank's program: the core's rank program (the nodes any rank runs
    whole run whole on every rank), lowered into a GraphModule on the rank's mesh."""
    world, rank = dist.get_world_size(), dist.get_rank()
    graph, input_names, global_batch = captured.graph, call.binding.names, int(call.batch[0].shape[0])
    sharding = plan.sharding
    size = 1
    for s in sharding["mesh"]:
        size *= s
    if size != world:
        raise ValidationError(f"parallelize: the plan's mesh {sharding['mesh']} has {size} ranks, the job {world}")
    if plan.global_batch != global_batch:
        raise ValidationError(f"parallelize: the plan is for global batch {plan.global_batch}, the example batch "
                              f"has {global_batch}")
    _check_made_for(sharding, graph, input_names)
    plan = check_same_job(plan, graph, rank)  # one gather: the plan's hash and every rank program's
    mesh = _Mesh(sharding["mesh"], rank)  # from here on, the rank's view of the plan's mesh
    program, whole = _rank_program(graph, plan.to_json(), rank)
    parameters: dict[str, torch.Tensor] = {}
    module = _build_module(program, captured.builder.sources, mesh, captured.tensors, input_names,
                           captured.trainable, parameters=parameters, compute_dtypes=captured.compute)
    counter = Counter.build(graph, captured.builder, captured.tensors, captured.trainable, module.counted, input_names)
    leaves = {leaf["value"]: leaf for leaf in program["leaves"]}
    first = _Program(module, program, plan, whole, [leaves[n]["placement"] for n in input_names], counter)
    return _SpmdJob(plan, mesh, first, parameters, set(leaves))


def _refuse_compiled_split_backward(compiled: dict | None, plan: Plan, split_backward: bool) -> None:
    """A schedule that splits a stage's backward into B and W (zero bubble: runtime/weight_split.py)
    reads its weights through fresh leaves and asks autograd for one site's gradients at a time;
    a compiled stage's backward is one AOTAutograd function, which would compute W's products
    in B as well. Refused with ``compile``, never run eagerly in silence (issue 49)."""
    if compiled is None:
        return
    if split_backward:  # (some rank's action list has a W: the job's split_backward)
        raise ValidationError(f"parallelize: compile= does not run the B/W split of zero-bubble schedules yet: "
                              f"{plan.schedule} splits each stage's backward into its input and weight "
                              "gradients; run it with compile=False, or a schedule that does not split "
                              "(1f1b, gpipe, interleaved-1f1b)")


def _check_made_for(sharding: dict, graph, input_names: list[str]) -> None:
    """A plan's sharding was searched on this capture (its graph fingerprint) for these inputs."""
    made_on = sharding.get("graph") or ""
    if made_on and made_on != (this := graph._core.fingerprint()):
        raise ValidationError(f"parallelize: the plan was searched on another graph than this model's capture "
                              f"(fingerprint {made_on}, this capture's {this}: a plan made for another model, or "
                              "for this one captured otherwise, whose names would place other nodes); search the "
                              "plan on this model as parallelize captures it, with its loss")
    made_for = sharding.get("inputs") or []
    if made_for and sorted(made_for) != sorted(input_names):
        raise ValidationError(f"parallelize: the plan was made for the inputs {made_for}, the batch brings "
                              f"{input_names} (a plan records the model inputs it was searched with: pass the "
                              "same ones, by the same names)")


def _model_tensors(model: torch.nn.Module, builder) -> tuple[dict[str, torch.Tensor], set[str]]:
    """Every parameter, buffer and lifted constant by its IR name (a tied weight under its first
    name), and the names of the trainable parameters."""
    tensors: dict[str, torch.Tensor] = {}
    for name, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        tensors.setdefault(name, t)
    tensors.update({k: t for k, t in builder.constants.items() if t is not None})
    return tensors, {name for name, p in model.named_parameters() if p.requires_grad}



def _loss_combination(wrapper: _Trainable, named: dict, graph, plan: Plan, m: int, global_batch: int) -> str:
    """How the plan's m micro-batch losses make the step's ("sum" or "mean"), read by the core
    off the graph captured with its loss (csrc/analysis/batch_coupling.h); a plan with
    micro-batches whose graph couples the batch's rows is refused unless it says
    micro_batch_semantics "per_micro_batch" (csrc/search/micro_batch_check.h). The analysis
    follows the batch through the ops' rules, which a batch of one row does not show: then it
    reads a capture of two rows."""
    if m <= 1:
        return "mean"  # one micro-batch: the loss is the step's as it is
    from .capture import _capture_with_sources as capture

    if _C.batch_coupling(graph._core)["batch"] < 2 and global_batch >= 2:
        graph, _ = capture(wrapper, map_tensors(named, lambda x: x.narrow(0, 0, 2)), "export", 0,
                           prefix="model.model.")
    _C.check_micro_batches(graph._core, plan.to_json())
    return _C.batch_coupling(graph._core)["loss"]


def _parallelize_pipeline(call: _Call, plan: Plan, model: torch.nn.Module, options: _Options):
    """A pipeline plan (Plan.manual with pipeline > 1, or pipeline 1 with several micro-batches:
    gradient accumulation on one stage): the graph captured at one micro-batch of the data
    axis (micro_batch x data rows), sharded over each stage's {data, tensor} sub-mesh as the
    plan's stage_sharding says (one sharding for every stage; a plan given by its degrees is
    completed with one first: Plan.complete), its rank programs checked against the plan's
    recorded hash (Plan.programs), cut into pipeline x virtual_stages stages (the
    plan's layers_per_stage, else the layers split evenly), this rank's stages lowered into
    GraphModules and driven by the schedule's action list (runtime/pipeline_engine.py).
    Ranks: Megatron's layout, the pipeline outermost; a value crossing a cut goes between the
    ranks of the same sub-mesh coordinate, as the shard its producer leaves. A plan with
    stage_meshes runs each stage on a sub-mesh of its own size, in stage order, with its own
    layout (stage_shardings); a value crossing between stages of different layouts goes whole
    and is cut to the receiver's placement (runtime/stage_links.py)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    # The job this rank runs: every pipeline rank's block of global ranks, sub-mesh and layout
    # number, this rank's block and place in it, the micro-batches, the schedule's placement of
    # the stages, this rank's action list, the channels and every group to make, in order: the
    # core's (transform/pipeline_job.h), which refuses a plan of another world size. (A stage's
    # first axis: the data ranks, or, with plan.context, the ranks splitting each row's sequence.)
    job = _C.pipeline_job(plan.to_json(), world, rank)
    global_batch, mb = int(call.batch[0].shape[0]), int(plan.micro_batch)
    rows = mb * plan.data  # one micro-batch across the data axis
    if plan.global_batch != global_batch or global_batch % rows:
        raise ValidationError(f"parallelize: the plan is for global batch {plan.global_batch} in micro-batches of "
                              f"{mb} x data {plan.data}; the example batch has {global_batch}")
    m = job["micro_batches"]
    _refuse_compiled_split_backward(options.compile_options, plan, job["split_backward"])  # before any work
    if options.compile_options is not None and plan.fused_accumulation:
        # A compiled stage accumulates its weight gradients through AOTAutograd's backward: the
        # fused accumulation's in-place backward (runtime/fused_accumulation.py) would run
        # eagerly between compiled pieces, a graph break at every linear (a compiled 1F1B stage
        # 1.1-1.3x slower with it: benchmarks/README.md, compile.py).
        plan = plan.with_fused_accumulation(False)
        log.info("parallelize: compile= runs the stages without fused weight-gradient accumulation (the compiled "
                 "backward accumulates them)")
    check_same_plan(plan, rank)
    micro = _Call(call.binding, map_tensors(call.named, lambda x: x.narrow(0, 0, rows)),
                  [x.narrow(0, 0, rows) for x in call.batch], call.wrapper, call.policy)
    captured = _capture(model, micro, options.verify)                        # 1. capture, one micro-batch
    combination = _loss_combination(call.wrapper, call.named, captured.graph, plan, m, global_batch)
    # Detected here, on every rank together (Cluster.detect is collective under a process
    # group), not where a later step first needs it (the eval-mode layout's search).
    clusters = _PipelineClusters(options.cluster or Cluster.detect(), plan, job)
    if not plan.is_complete():                                               # 2. plan
        # A plan given by its degrees: completed once with its stages' layout, searched on the
        # job's first d x t devices (every stage's sub-mesh is alike) as the joint planner
        # completes its plans (csrc/search/stage_layout.h). The engine's plan is the complete one.
        devices = clusters.job()
        log.info("parallelize: the plan gives no layout for its stages' sub-meshes %s: searching it once "
                 "(the engine's plan holds it: save that one to run it without a search)", job["meshes"])
        plan = planned_once(lambda given=plan: given.complete(captured.graph, devices, level=options.level),
                            captured.graph, repr((devices.to_json(), plan.to_json(), options.level)))
        job = _C.pipeline_job(plan.to_json(), world, rank)  # (the layouts are the complete plan's)
    stages = _pipeline_stages(captured, plan, job, call.binding.names)      # 3. job
    first, plan = stages.first, stages.plan
    log.info("rank %d: pipeline stages %s of %d, %d micro-batches of %d rows, %s, sub-mesh %s", rank,
             sorted(first.stages), plan.pipeline * plan.virtual_stages, m, rows, plan.schedule,
             job["meshes"][job["pipeline_rank"]])
    return PipelineEngine(model=model, wrapper=call.wrapper, binding=call.binding, plan=plan, first=first,  # 4. engine
                          actions=job["actions"], micro_batch=rows, num_micro_batches=m,
                          shapes=tuple(tuple(x.shape) for x in call.batch), parameters=stages.parameters,
                          tensors=captured.tensors, trainable=captured.trainable, shared=stages.shared,
                          links=stages.links, mesh=stages.mesh, sharding=stages.sharded,
                          recapture=_recapture(call.wrapper, clusters.stage, options.level, plan.precision,
                                               state_dtype=plan.state_dtype,
                                               compile=options.compile_options is not None),
                          kept=keep_state(model, set(first.owners)),
                          policy=options.policy, compute_dtypes=captured.compute, stage_ranks=job["stage_ranks"],
                          loss_combination=combination, compile_options=options.compile_options)


class _PipelineClusters:
    """The devices a pipeline job's layouts are searched on: the job's (a plan's completion),
    and its stage's (the eval-mode program's layout, should it need its own)."""

    def __init__(self, detected, plan: Plan, job: dict):
        self._detected, self._stage_meshes = detected, bool(plan.stage_meshes)
        self._first = job["ranks"][job["pipeline_rank"]][0]
        d, t = job["meshes"][job["pipeline_rank"]]
        self._size, self._world = d * t, dist.get_world_size()

    def job(self):
        sizes = (self._world,) if self._stage_meshes else (self._world, self._size)
        if self._detected.world_size not in sizes:
            raise ValidationError(f"parallelize: the cluster has {self._detected.world_size} devices, the job "
                                  f"{self._world} ranks")
        return self._detected

    def stage(self):
        devices = self.job()
        if self._stage_meshes:
            return devices.rank_range(self._first, self._size)
        return devices if devices.world_size == self._size else devices.first_ranks(self._size)


@dataclass
class _PipelineStages:
    """What this rank runs of a complete pipelined plan: the plan (its programs' hash recorded),
    its stage's sub-mesh (None: one rank) and layout, the links between stages, its stages'
    program, the groups summing the leaves several pipeline ranks read, its parameters."""

    plan: Plan
    mesh: _Mesh | None
    sharded: Plan | None
    links: StageLinks
    first: Any
    shared: list
    parameters: dict


def _pipeline_stages(captured: _Captured, plan: Plan, job: dict, input_names: list[str]) -> _PipelineStages:
    """The job's groups made (every rank, in the core's order), the plan and every rank's
    program agreed on in one gather (check_same_job), and this rank's stages lowered."""
    rank = dist.get_rank()
    blocks, meshes = job["ranks"], job["meshes"]
    pipeline_rank, local = job["pipeline_rank"], job["local"]
    d, t = meshes[pipeline_rank]
    sharded, mesh = None, None
    if not plan.stage_meshes and d * t > 1:  # every stage alike: torch's DeviceMesh, pipeline x sub-mesh
        mesh = _Mesh([d, t], local, pipeline=plan.pipeline)
    # Every other group, on every rank in the core's order (the sub-meshes of stages of their own
    # sizes, then the schedule's channels, which the core proved its lists receive in their
    # senders' order and cannot hang where receives meet sends by order: NCCL).
    made = make_groups(job["groups"])
    if d * t > 1:
        sharded = plan.stage_plan(pipeline_rank) if plan.stage_meshes else plan.stage_plan()
        _check_made_for(sharded.sharding, captured.graph, input_names)
        if plan.stage_meshes:
            mesh = _Mesh([d, t], local, made=made)
    # Stages of one layout number exchange by coordinate (runtime/stage_links.py); the
    # schedule's peers are pipeline ranks (which of their ranks: StageLinks).
    links = StageLinks(blocks, job["layouts"], pipeline_rank, local, mesh, made=made)
    plan = check_same_job(plan, captured.graph, rank)  # (the complete plan's hash, and its rank programs')
    parameters: dict[str, torch.Tensor] = {}
    first = stage_program(captured.graph, captured.builder, plan, sharded, mesh, pipeline_rank, input_names,
                          captured.tensors, captured.trainable, parameters, job["micro_batches"],
                          compute_dtypes=captured.compute, split_backward=job["split_backward"],
                          stage_ranks=job["stage_ranks"])
    # Each leaf several pipeline ranks read: its gradient summed over them (by coordinate where
    # their layouts agree, whole where they differ), every group made on every rank in the
    # core's order (transform/job_groups.h).
    shared = [(spec["leaf"], group, spec["whole"]) for spec, group in make_groups(
        _C.shared_leaf_groups(blocks, meshes, job["layouts"], {x: sorted(o) for x, o in first.owners.items()}))]
    return _PipelineStages(plan, mesh, sharded, links, first, shared, parameters)
