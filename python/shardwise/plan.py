"""shardwise.Plan: how a model trains on a cluster, and what that is predicted to cost.

A thin Python face over the C++ plan (csrc/plan/plan.h) and evaluator
(csrc/cost/plan_cost.h): the plan is its JSON document; every figure comes from the core.

    >>> g = shardwise.models.gpt(layers=96, hidden=12288, heads=96, seq=2048, vocab=51200)
    >>> c = shardwise.Cluster.preset("dgx-a100", nodes=192)
    >>> p = shardwise.Plan.manual(g, c, tensor=8, pipeline=8, data=24, global_batch=1536,
    ...                           micro_batch=1, schedule="interleaved-1f1b", virtual_stages=2)
    >>> p.predicted_tflops_per_device(), p.predicted_step_time(), p.predicted_memory()
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from . import _C

@dataclass(frozen=True)
class NetworkCondition:
    """The links between pipeline stages over time (Ada-Grouper's preempted network): the
    bandwidth repeats with period ``sum(durations)`` seconds, segment j at ``bandwidth[j]``
    times the cluster's (0.5 = halved). For ``shardwise.plan(..., network=...)``: pipelined
    plans are timed on it by the simulator, and kFkB with the adaptive k joins 1F1B.

        >>> shardwise.NetworkCondition(durations=(1.0, 1.0), bandwidth=(1.0, 0.5))
    """

    durations: tuple[float, ...]
    bandwidth: tuple[float, ...]


_SEMANTICS = ("exact", "per_micro_batch")


def _semantics(value: str, where: str) -> str:
    """A micro_batch_semantics argument, checked (plan/plan.h: MicroBatchSemantics)."""
    if value not in _SEMANTICS:
        raise _C.ValidationError(f"{where}: micro_batch_semantics {value!r} (known: {', '.join(_SEMANTICS)})")
    return value


def _profile_json(profile) -> str:
    """A planner's cost model: a ``shardwise.Profile``'s JSON, or "" for the analytic model."""
    return "" if profile is None else profile.to_json()


def _recompute(value) -> str:
    """A recompute argument as plan/plan.h names it: True / False are "full" / "none"; a name
    is passed on, and the core refuses one it does not know (listing those it does)."""
    if isinstance(value, bool):
        return "full" if value else "none"
    return str(value)


def _floats(doc):
    """`doc` with the plan JSON's non-finite numbers ({"float": "inf" | "-inf" | "nan"}: JSON has
    none, csrc/plan/plan.h) as Python floats."""
    if isinstance(doc, dict):
        if len(doc) == 1 and isinstance(doc.get("float"), str):
            return float(doc["float"])
        return {k: _floats(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_floats(v) for v in doc]
    return doc


def _precision(graph, precision: str | None) -> str:
    """The precision a plan is priced in: the one given, else the model's as captured (the
    dtype most of its parameters have: a model cast to bf16, or captured under a mixed-
    precision policy's param_dtype, trains in bf16; float32 and float64 models in f32;
    csrc/analysis/parameter_stats.h)."""
    return str(precision) if precision is not None else _C.training_precision(graph._core)


class Plan:
    """Data / tensor / pipeline degrees, batches, schedule, recomputation, ZeRO stage and,
    once costed, the predicted step time, TFLOP/s per device and memory per rank."""

    def __init__(self, doc: dict, result: dict | None = None, *, hardware: dict | None = None,
                 values: dict | None = None, graph=None):
        self._doc = doc
        self._result = result
        # For report() alone (not part of the plan, its JSON or its hash): the devices it was
        # priced on (_report.hardware_of) and the graph it was made for, whose values' shapes
        # (_report.values_of) are read when a report asks for them.
        self._hardware = hardware
        self._values = values
        self._graph = graph

    def _context(self) -> dict:
        """What report() knows besides the plan, for the plans made from this one."""
        return {"hardware": self.__dict__.get("_hardware"), "values": self.__dict__.get("_values"),
                "graph": self.__dict__.get("_graph")}

    def _report_values(self) -> dict | None:
        if self.__dict__.get("_values") is None and self.__dict__.get("_graph") is not None:
            from ._report import values_of

            self._values = values_of(self._graph)
        return self.__dict__.get("_values")

    def __getstate__(self) -> dict:
        """Pickled and deep-copied without the graph (its values' shapes read first)."""
        self._report_values()
        return {k: v for k, v in self.__dict__.items() if k != "_graph"}

    # ---- construction -------------------------------------------------------
    @classmethod
    def manual(cls, graph, cluster, *, tensor: int = 1, pipeline: int = 1, data: int | None = None, context: int = 1,
               expert: int = 1,
               global_batch: int, micro_batch: int = 1, schedule: str = "1f1b", virtual_stages: int = 1,
               kfkb_k: int = 1, recompute: bool | str = True, zero: int = 0, precision: str | None = None,
               layers_per_stage: list[int] | None = None, profile=None, cost_model=None,
               stage_groups: list[int] | None = None,
               stage_meshes: list[list[int]] | None = None, micro_batch_semantics: str = "exact",
               state_dtype: str | None = None, compile: bool = False, collective_matmul: bool = False) -> "Plan":
        """An expert configuration, costed on ``cluster`` for ``graph`` (any batch size: the
        graph is scaled to ``micro_batch``). ``data`` defaults to world size / (t x p x context).
        ``context``: ranks that split each row's sequence (context parallelism: every attention
        runs as a ring, ``runtime/ring_attention.py``), with ``data`` 1 beside it; a stage's mesh
        is then {context, tensor} and a micro-batch ``micro_batch`` rows. ``expert``: ranks that
        split each mixture of experts layer's experts (expert parallelism), 1 or a stage's whole
        first axis (data x context): each holds its block, and each rank's routed tokens go to
        their experts' ranks and back by all-to-all (``runtime/expert_dispatch.py``).
        Raises shardwise.ValidationError naming the numbers when the plan is inconsistent
        (t x p x d != world size, global batch not divisible by micro batch x data, ...).
        ``recompute``: True or "full" (each repeated block's forward run again in backward),
        "selective" (run again, but the outputs of its products and fused attention kept:
        csrc/analysis/selective_recompute.h), False or "none".
        ``profile`` (or its alias ``cost_model``): a ``shardwise.Profile``; measured op and
        collective times replace the analytic ones where it has them (csrc/cost/profiled_cost.h)
        and ``cost_coverage()`` says how many were measured. None: the analytic model.
        ``stage_groups``: pipeline stage s on block ``stage_groups[s]`` of
        data x tensor ranks (a heterogeneous cluster's stages on the devices that suit them;
        docs/plan-format.md). ``stage_meshes``: one ``[data, tensor]`` per stage, sub-meshes of
        different sizes (then ``data`` and ``tensor`` are 1, ``pipeline`` defaults to their
        number, and ``micro_batch`` is a whole micro-batch's rows, which each stage splits over
        its own data width). ``micro_batch_semantics``: "exact" (default) refuses a plan with
        micro-batches for a graph whose rows meet in batch statistics (batch norm in training, a
        router's load-balancing loss: csrc/analysis/batch_coupling.h), naming the op and module;
        "per_micro_batch" accepts it, each micro-batch's statistics its own and such a loss the
        mean of the micro-batches' (gradient accumulation's usual meaning; the report says so).
        ``state_dtype``: the dtype the optimizer steps the parameters in, with their gradients
        and Adam's moments, for a run that keeps no master copy ("bf16", "f16", "f32": torch.optim
        on the model's own parameters, as ``parallelize`` runs them); None: the precision's
        mixed-precision convention (fp32 master weights and moments beside bf16 weights and
        gradients, as Megatron-LM trains). ``compile``: the ranks run their programs through
        ``torch.compile`` (``parallelize(..., compile=True)``), priced so: memory-bound ops
        fused between the products (csrc/analysis/compiled_fusion.h); the plan's ``compile``.
        ``collective_matmul``: the tensor-parallel collectives run inside their contractions as
        rings where the layout lets them (Megatron's tp_comm_overlap; ``shardwise.plan``'s), the
        plan's ``collective_matmul``: ``Plan.complete`` searches its layout so, and the plan is
        priced with the rings once completed (Megatron's layout, which prices a plan given by
        degrees, has no sequence parallelism and so no ring)."""
        if stage_meshes:
            stage_meshes = [[int(x) for x in mesh] for mesh in stage_meshes]
            if pipeline == 1:
                pipeline = len(stage_meshes)
            if (data or 1) != 1 or tensor != 1:
                raise _C.ValidationError(f"Plan.manual: stage_meshes {stage_meshes} with data {data} and tensor "
                                         f"{tensor}: each stage's mesh gives its own (leave them 1)")
            data = 1
        if data is None:
            data = max(1, cluster.world_size // (tensor * pipeline * max(1, int(context))))
        try:
            name = _C.canonical_schedule(str(schedule).lower())
        except _C.ValidationError as e:
            raise _C.ValidationError(f"Plan.manual: {e}") from None
        if _C.schedule_v_shaped(name) and virtual_stages == 1:
            virtual_stages = 2  # ZB-V and DualPipeV are two chunks per rank, in a V
        doc = {"format": "shardwise.plan", "version": 1, "data": data, "tensor": tensor, "pipeline": pipeline,
               "global_batch": global_batch, "micro_batch": micro_batch, "schedule": name,
               "virtual_stages": virtual_stages, "kfkb_k": kfkb_k,
               "recompute": _recompute(recompute), "zero_stage": zero,
               "layers_per_stage": list(layers_per_stage or []), "precision": _precision(graph, precision)}
        if int(context) != 1:
            doc["context"] = int(context)
        if int(expert) != 1:
            doc["expert"] = int(expert)
        if stage_groups:
            doc["stage_groups"] = [int(g) for g in stage_groups]
        if stage_meshes:
            doc["stage_meshes"] = stage_meshes
        doc["micro_batch_semantics"] = _semantics(micro_batch_semantics, "Plan.manual")
        if state_dtype:
            doc["state_dtype"] = str(state_dtype)
        if compile:
            doc["compile"] = True
        if collective_matmul:
            doc["collective_matmul"] = True
        if profile is not None and cost_model is not None and profile is not cost_model:
            raise _C.ValidationError("Plan.manual: give profile= or cost_model=, not both")
        profile = profile if profile is not None else cost_model
        if profile is None:
            result = _C.evaluate_plan(graph._core, cluster._core, json.dumps(doc))
        else:
            result = _C.evaluate_plan_profiled(graph._core, cluster._core, json.dumps(doc), profile.to_json())
        return cls(json.loads(result["plan"]), result, **_context_of(graph, cluster))

    @classmethod
    def search(cls, graph, cluster, *, global_batch: int, level: str = "fast", mesh: tuple[int, int] | None = None,
               memory_fraction: float = _C.MEMORY_FRACTION, precision: str | None = None,
               recompute: bool | str = True, zero: bool = True, progress=None, collective_matmul: bool = False,
               batch_on_tensor_axis: bool | None = None, profile=None, context_parallel: bool = True,
               expert_parallel: bool = True, state_dtype: str | None = None, compile: bool = False) -> "Plan":
        """The SPMD sharding search (csrc/search/spmd_search.h): where every parameter and
        activation lives on a {data, tensor} mesh, chosen from the graph's op rules and the
        cluster's cost model. See ``shardwise.plan``. ``batch_on_tensor_axis``: whether the
        mesh's tensor axis may split the batch too; None: not on a ``mesh`` given (its tensor
        axis splits weights, heads and sequences, as the name says), freely on a searched one.
        ``profile``: a ``shardwise.Profile`` whose measured op and collective times the search
        prices with where it has them (see ``Plan.manual``); None: the analytic model.
        ``context_parallel``: whether self-attention's sequence may be split over an axis that
        may carry the batch, as ring attention (``runtime/ring_attention.py``); False keeps
        every attention's sequence whole on each rank. ``expert_parallel``: whether a mixture of
        experts' experts (``shardwise_moe::experts``) may be split over an axis, each rank
        holding its block of them; False: every rank holds every expert. ``state_dtype`` and
        ``compile``: as ``Plan.manual``'s."""
        if batch_on_tensor_axis is None:
            batch_on_tensor_axis = mesh is None
        result = _C.search_plan(graph._core, cluster._core, int(global_batch), str(level),
                                None if mesh is None else [int(x) for x in mesh], float(memory_fraction),
                                _precision(graph, precision), recompute is not False, bool(zero), progress,
                                bool(collective_matmul), bool(batch_on_tensor_axis),
                                "" if isinstance(recompute, bool) else _recompute(recompute), _profile_json(profile),
                                bool(context_parallel), bool(expert_parallel), str(state_dtype or ""), bool(compile))
        return cls(json.loads(result["plan"]), result, **_context_of(graph, cluster))

    @classmethod
    def joint(cls, graph, cluster, *, global_batch: int, level: str = "fast",
              memory_fraction: float = _C.MEMORY_FRACTION, precision: str | None = None, progress=None,
              network: NetworkCondition | None = None, stage_layouts: bool = True, zero: bool = True,
              micro_batch_semantics: str = "exact", profile=None, context_parallel: bool = True,
              expert_parallel: bool = True, state_dtype: str | None = None, compile: bool = False,
              collective_matmul: bool = False) -> "Plan":
        """The joint planner (csrc/search/joint_planner.h): pipeline x data x tensor degrees,
        micro-batch, schedule, virtual stages, recomputation and ZeRO stage, searched over the
        evaluator that prices Plan.manual. See ``shardwise.plan``. ``stage_layouts``: the best
        plans are priced again with the layout the SPMD search finds for their stages' tensor
        ranks (csrc/search/stage_layout.h), as ``parallelize`` runs them; False keeps
        Megatron's layout, the one Plan.manual is priced with. ``zero`` False: no candidate
        shards the optimizer states (ZeRO-1). ``micro_batch_semantics``: "exact" (default) keeps a
        graph whose rows meet in batch statistics in one micro-batch per step (see
        ``Plan.manual``); "per_micro_batch" lets it take any. ``profile``: as ``Plan.search``'s.
        ``context_parallel``: whether candidates may split each row's sequence over a stage's
        data ranks (``Plan.manual``'s ``context``) where every attention runs as a ring; False:
        none. ``expert_parallel``: whether candidates may split each mixture of experts layer's
        experts over a stage's data ranks (``Plan.manual``'s ``expert``), or its layout over its
        tensor ranks; False: neither (the plan's ``split_experts`` false: every rank of a stage
        holds every expert, however the plan is completed). ``state_dtype``, ``compile`` and
        ``collective_matmul``: as ``Plan.manual``'s (every candidate's; the stage layouts it prices
        and completes are searched with the rings)."""
        links = None if network is None else ([float(x) for x in network.durations],
                                              [float(x) for x in network.bandwidth])
        result = _C.plan_joint(graph._core, cluster._core, int(global_batch), str(level), float(memory_fraction),
                               _precision(graph, precision), progress, links, bool(stage_layouts), bool(zero),
                               _semantics(micro_batch_semantics, "Plan.joint"), _profile_json(profile),
                               bool(context_parallel), bool(expert_parallel), str(state_dtype or ""),
                               bool(compile), bool(collective_matmul))
        return cls(json.loads(result["plan"]), result, **_context_of(graph, cluster))

    def alternatives(self) -> list["Plan"]:
        """The joint planner's 10 best plans that fit, best first (empty for other plans)."""
        return [] if self._result is None else [Plan(json.loads(t), **self._context())
                                                for t in self._result.get("best", [])]

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        return cls(json.loads(_C.plan_normalise(text)))

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self._doc, indent=indent, sort_keys=True)

    def hash(self) -> str:
        """16 hex digits: FNV-1a 64 of the canonical JSON without the predictions."""
        return _C.plan_hash(json.dumps(self._doc))

    # ---- fields ----------------------------------------------------------------
    def __getattr__(self, name: str):
        doc = self.__dict__.get("_doc", {})
        if name in doc:
            return doc[name]
        raise AttributeError(name)

    @property
    def state_dtype(self) -> str | None:
        """The dtype the run steps the parameters in without a master copy ("bf16", "f16",
        "f32"), which prices the model states; None: the precision's mixed-precision convention."""
        return self._doc.get("state_dtype") or None

    @property
    def compile(self) -> bool:
        """Whether the ranks run the plan's programs through torch.compile, and the plan is
        priced so (``Plan.manual``'s ``compile``)."""
        return bool(self._doc.get("compile", False))

    @property
    def collective_matmul(self) -> bool:
        """Whether the plan's tensor-parallel collectives run inside their contractions as rings
        where its layout lets them (``Plan.manual``'s ``collective_matmul``)."""
        return bool(self._doc.get("collective_matmul", False))

    def num_micro_batches(self) -> int:
        """m: global batch / (micro-batch x data) micro-batches per step on each data rank (a
        sharded plan: global batch / micro-batch); the core's count (plan::Plan)."""
        d = self._doc
        return _C.plan_num_micro_batches(d["global_batch"], d["micro_batch"], d["data"], bool(d.get("sharding")))

    @property
    def context(self) -> int:
        """Ranks splitting each row's sequence (context parallelism, ring attention); 1 when
        the plan does not say. A stage's mesh is {data x context, tensor} (csrc/plan/plan.h)."""
        return self._doc.get("context", 1)

    @property
    def expert(self) -> int:
        """Ranks splitting each mixture of experts layer's experts (expert parallelism); 1 when
        the plan does not say (an SPMD plan's sharding says where its experts are split)."""
        return self._doc.get("expert", 1)

    @property
    def micro_batch_semantics(self) -> str:
        """"exact" or "per_micro_batch" (see ``Plan.manual``)."""
        return self._doc.get("micro_batch_semantics", "exact")

    def with_micro_batch_semantics(self, value: str) -> "Plan":
        """The plan with ``micro_batch_semantics`` set (its hash changes with it)."""
        doc = dict(self._doc)
        doc["micro_batch_semantics"] = _semantics(value, "Plan.with_micro_batch_semantics")
        return Plan(json.loads(_C.plan_normalise(json.dumps(doc))), self._result, **self._context())

    @property
    def fused_accumulation(self) -> bool:
        """Whether a pipelined plan's stages add each micro-batch's weight gradient into the
        parameter's ``.grad`` inside its product, where the core marks it
        (runtime/fused_accumulation.py). True unless the plan says otherwise."""
        return self._doc.get("fused_accumulation", True)

    def with_fused_accumulation(self, value: bool) -> "Plan":
        """The plan with ``fused_accumulation`` set (off, its hash changes: the stages run other
        programs)."""
        if not isinstance(value, bool):
            raise _C.ValidationError(f"Plan.with_fused_accumulation: expected True or False, got {value!r}")
        doc = dict(self._doc)
        doc["fused_accumulation"] = value
        return Plan(json.loads(_C.plan_normalise(json.dumps(doc))), self._result, **self._context())

    @property
    def sharding(self) -> dict | None:
        """The SPMD section of a searched plan (mesh, placements, strategies), else None."""
        return self._doc.get("sharding")

    @property
    def stage_sharding(self) -> dict | None:
        """A pipelined plan's layout of every stage's {data, tensor} sub-mesh (the SPMD search of
        one micro-batch of the data axis), else None."""
        return self._doc.get("stage_sharding")

    @property
    def stage_meshes(self) -> list[list[int]] | None:
        """Each pipeline stage's own ``[data, tensor]`` sub-mesh (stages of different sizes), else None."""
        return self._doc.get("stage_meshes")

    @property
    def stage_shardings(self) -> list[dict] | None:
        """With ``stage_meshes``: each stage's layout on its own mesh, once completed; else None."""
        return self._doc.get("stage_shardings")

    def stage_ranks(self, stage: int) -> list[int]:
        """The global ranks pipeline stage ``stage`` runs on (its block: stage_groups, or the
        stage meshes' running sum)."""
        return list(_C.stage_ranks(self.to_json(), int(stage)))

    @property
    def programs(self) -> str | None:
        """The hash of the rank programs the plan makes (16 hex digits; csrc/plan/plan.h), once
        recorded by ``with_programs`` or by ``parallelize`` (the engine's plan); None when not
        recorded, or recorded for the plan before an edit (stale: the edit made new programs)."""
        record = self._doc.get("programs")
        return record["hash"] if record and record["plan"] == self.hash() else None

    def is_complete(self) -> bool:
        """Whether the plan holds everything a run needs, so that ``parallelize`` searches
        nothing: a sharding (pipeline 1, one micro-batch), or a pipelined plan whose stages hold
        their graph whole (data x tensor 1) or carry their layout (``stage_sharding``)."""
        d = self._doc
        if d.get("sharding"):
            return True
        pipelined = d["pipeline"] > 1 or self.num_micro_batches() > 1
        if d.get("stage_meshes"):
            return bool(d.get("stage_shardings")) or all(a * b == 1 for a, b in d["stage_meshes"])
        return pipelined and (d["data"] * d.get("context", 1) * d["tensor"] == 1 or bool(d.get("stage_sharding")))


    def complete(self, graph, cluster, *, level: str = "fast", profile=None) -> "Plan":
        """The plan with everything its run needs (csrc/search/stage_layout.h: complete_plan),
        searched once on ``graph`` (captured as ``parallelize`` captures the model: with its
        loss, at one micro-batch of the data axis for a pipelined plan) and ``cluster``: a
        pipelined plan gains its stages' layout (the SPMD search on the first data x tensor
        devices); a plan of pipeline 1 and one micro-batch becomes the SPMD search's plan on its
        {data, tensor} mesh. Unchanged when complete. Plans given by degrees alone
        (``Plan.manual``, a hand-written file) are completed so; the planners' come complete,
        but for a pipelined plan planned on a graph captured at other rows than one micro-batch
        of its data axis (docs/plan-format.md: which graph its stages' layout is searched on).
        A pipelined plan that gains its stages' layout is priced again with it (``Plan.price``;
        with ``profile``'s measurements where given, else the analytic model)."""
        if self.is_complete():
            return self
        done = _C.complete_plan(graph._core, cluster._core, self.to_json(), level, _profile_json(profile))
        result = {} if done["fits"] is None else {"fits": done["fits"]}
        # The same degrees: the planner's reasons for its splits still hold (the report's "why").
        if self._result and self._result.get("split_reasons"):
            result["split_reasons"] = self._result["split_reasons"]
        return Plan(json.loads(done["plan"]), result or None, **_context_of(graph, cluster))

    def price(self, graph, cluster, *, profile=None) -> "Plan":
        """The plan priced again on ``graph`` and ``cluster`` by the one evaluator
        (csrc/search/plan_price.h), the figures every planner records: a plan with a sharding
        as that sharding runs (the SPMD search's model, its decisions as written), any other by
        its degrees (as ``Plan.manual``). ``profile``: a ``shardwise.Profile`` (see
        ``Plan.manual``). A plan loaded from a file gets its predictions so."""
        if profile is None:
            result = _C.evaluate_plan(graph._core, cluster._core, self.to_json())
        else:
            result = _C.evaluate_plan_profiled(graph._core, cluster._core, self.to_json(), profile.to_json())
        return Plan(json.loads(result["plan"]), result, **_context_of(graph, cluster))

    def stage_plan(self, stage: int | None = None) -> "Plan":
        """The SPMD plan every stage of a complete pipelined plan runs on its sub-mesh (with
        ``stage_meshes``: stage ``stage``'s, on its own mesh)."""
        return Plan(json.loads(_C.stage_plan(self.to_json(), -1 if stage is None else int(stage))),
                    **self._context())

    def with_programs(self, graph) -> "Plan":
        """The plan with the hash of every rank's program recorded (``programs``): made by the
        core for each rank from ``graph`` (captured as ``parallelize`` captures it), so a job
        that makes other programs from it is refused. The plan must be complete."""
        return self.with_programs_hash(_C.plan_programs(graph._core, self.to_json()))

    def with_programs_hash(self, programs: str) -> "Plan":
        doc = dict(self._doc)
        doc["programs"] = {"plan": self.hash(), "hash": programs}
        return Plan(json.loads(_C.plan_normalise(json.dumps(doc))), self._result, **self._context())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Plan) and self._doc == other._doc

    def __repr__(self) -> str:
        d = self._doc
        if d.get("sharding"):
            return (f"Plan(mesh={d['sharding']['mesh']}, level={d['sharding']['level']!r}, "
                    f"global_batch={d['global_batch']}, recompute={d['sharding']['recompute']})")
        degrees = (f"stage_meshes={d['stage_meshes']}" if d.get("stage_meshes")
                   else f"t={d['tensor']}, p={d['pipeline']}, d={d['data']}"
                   + (f", c={d['context']}" if d.get("context", 1) > 1 else "")
                   + (f", e={d['expert']}" if d.get("expert", 1) > 1 else ""))
        return (f"Plan({degrees}, global_batch={d['global_batch']}, "
                f"micro_batch={d['micro_batch']}, schedule={d['schedule']!r}, v={d['virtual_stages']}, "
                f"recompute={d['recompute']!r}, zero={d['zero_stage']})")

    # ---- predictions -----------------------------------------------------------
    def _predicted(self) -> dict:
        pred = self._doc.get("predicted")
        if pred is None:
            raise _C.ValidationError("Plan: not costed (make it with Plan.manual, or load one with predictions)")
        return _floats(pred)

    def predicted_step_time(self) -> float:
        """Seconds per iteration of the global batch."""
        return self._predicted()["step_time"]

    def predicted_tflops_per_device(self) -> float:
        """Model TFLOP/s per device: 3 x the forward's matmul FLOPs per step (a recomputed
        forward is not counted) / step time / devices (csrc/cost/plan_cost.h)."""
        return self._predicted()["tflops_per_device"]

    def predicted_megatron_tflops_per_device(self) -> float:
        """TFLOP/s per device in Megatron-LM's accounting (Narayanan et al. 2021, eq. 3: the
        layers' forward counted 4 times, recomputation included whether or not the plan
        recomputes), to hold against its published figures. The evaluator's plans (manual,
        joint); the SPMD search's have none (ValidationError)."""
        value = self._predicted().get("megatron_tflops_per_device")
        if not value:
            raise _C.ValidationError("Plan: no Megatron-LM accounting for this plan (the SPMD search prices model "
                                     "FLOPs only: predicted_tflops_per_device)")
        return value

    def predicted_memory(self) -> tuple[float, dict]:
        """(bytes on the most loaded rank, {weights, gradients, optimizer, activations, stage})."""
        pred = self._predicted()
        return pred["memory_per_rank"], dict(pred["memory_breakdown"])

    def cost_coverage(self) -> dict | None:
        """Where the figures came from, for a plan costed with a profile: nodes_measured /
        nodes_analytic (of the graph) and node_calls_* / collective_calls_* (of the
        evaluation). None for the analytic model or a plan loaded from JSON."""
        if self._result is None or "coverage" not in self._result:
            return None
        return dict(self._result["coverage"])

    # ---- searched plans ---------------------------------------------------------
    @property
    def fits(self) -> bool | None:
        """Whether the searched plan fits in memory (None for plans not made by a search)."""
        return None if self._result is None or "fits" not in self._result else bool(self._result["fits"])

    def candidates(self) -> list[dict]:
        """Every (mesh, recompute) candidate the search tried, with its step time and memory."""
        return [] if self._result is None else [dict(c) for c in self._result.get("candidates", [])]

    def balance(self) -> dict | None:
        """Heterogeneous clusters: the uneven batch shares (axis, ranks, ratios) and the step
        time with them, with equal shares and at the LP optimum. None when the batch is even."""
        return None if self._result is None or "balance" not in self._result else dict(self._result["balance"])

    def search_seconds(self) -> float | None:
        return None if self._result is None else self._result.get("search_seconds")

    def searched_layout(self) -> bool | None:
        """The joint planner's plans: whether this one is priced with its stages' layout as the
        SPMD search finds it (True) or with Megatron's (False: tensor degree 1, or not re-priced).
        None for other plans."""
        return None if self._result is None or "searched_layout" not in self._result else \
            bool(self._result["searched_layout"])

    def placements(self) -> dict[str, list[str]]:
        """Value name -> placement per mesh axis ("R", "S(1)", "S(2,g3)", "P(sum)")."""
        return {k: list(v) for k, v in (self._doc.get("sharding") or {}).get("placements", {}).items()}

    def strategies(self) -> dict[str, list[str]]:
        """Node (its first output's name) -> strategy per mesh axis ("split n g3", "replicate")."""
        return {k: list(v) for k, v in (self._doc.get("sharding") or {}).get("strategies", {}).items()}

    def collectives(self) -> list[dict]:
        """Every collective of a step: kind, value, axis, phase, bytes, count, seconds."""
        return [dict(c) for c in _floats(self._doc.get("predicted") or {}).get("collectives", [])]

    def report(self, cluster=None, graph=None) -> str:
        """The plan as text for people: its devices named by what each mesh axis carries (the
        batch, weights, layers in stages), the predicted step time by part (compute, the
        communication it waits for by kind, the pipeline bubble, the optimizer step), MFU
        beside the devices' peak FLOP/s, memory per device by kind beside its capacity, then
        (searched plans) the placements of the parameters and inputs and the collectives of a
        step. ``cluster``: the devices, for MFU and capacity; ``graph``: the model's, for the
        sizes behind memory by kind and the axes' contents (defaults: those the plan was made
        with; a plan read from JSON has neither). The figures, by the core's keys:
        ``breakdown()``, ``predicted_memory()``, ``predicted_tflops_per_device()``."""
        from ._report import hardware_of, render, values_of

        hardware = hardware_of(cluster) if cluster is not None else self.__dict__.get("_hardware")
        values = values_of(graph) if graph is not None else self._report_values()
        return render(self, hardware, values)

    def simulation(self):
        """The plan's pipeline schedule run through the simulator (csrc/schedule/simulator.h)
        with the predicted per-micro-batch times of its bottleneck stage: forward and backward
        1 : 2 of the compute, the breakdown's pipeline_transfer per send. A plan without pipeline
        simulates one stage. Each stage takes its own time (the prediction's stage_times: the
        first and last stages hold the embedding, head and loss); on a heterogeneous cluster
        the rows are named by its device type."""
        from .simulate import simulate

        pred = self._predicted()["breakdown"]
        d = self._doc
        m = self.num_micro_batches()
        v = d.get("virtual_stages", 1)
        compute = (pred.get("compute", 0.0) + pred.get("tensor_parallel", 0.0)) / m
        stage_times = self._predicted().get("stage_times") or []
        scale = [t / max(stage_times) for t in stage_times] if stage_times and max(stage_times) > 0 else None
        return simulate(d["schedule"], stages=d["pipeline"], micro_batches=m, virtual_stages=v,
                        k=d.get("kfkb_k", 1), forward=compute / 3, backward=2 * compute / 3,
                        comm=pred.get("pipeline_transfer", 0.0) if d["pipeline"] > 1 else 0.0,
                        optimizer_step=pred.get("optimizer", 0.0), stage_scale=scale,
                        devices=self._predicted().get("stage_devices"))

    def timeline_svg(self, path, title: str | None = None) -> str:
        """The plan's timeline as SVG (one row per pipeline rank): see ``simulation()``."""
        d = self._doc
        title = title if title is not None else (f"t {d['tensor']} p {d['pipeline']} d {d['data']}, "
                                                 f"{d['schedule']}, global batch {d['global_batch']}")
        return self.simulation().timeline_svg(path, title=title)

    def chrome_trace(self, path) -> str:
        """The plan's timeline as a Chrome trace (JSON that Perfetto opens)."""
        return self.simulation().chrome_trace(path)

    def breakdown(self) -> dict:
        """Seconds per part of the step: compute, tensor_parallel, pipeline_p2p (the sends the
        step waits for), pipeline_bubble, data_parallel (exposed), data_parallel_total,
        optimizer; and pipeline_transfer, one send's seconds (not a part of the step)."""
        return dict(self._predicted()["breakdown"])


def _context_of(graph, cluster) -> dict:
    """What report() knows of a plan made here: the cluster's devices and the graph."""
    from ._report import hardware_of

    return {"hardware": hardware_of(cluster), "graph": graph}


def plan(graph, cluster, *, global_batch: int, level: str = "fast", mesh: tuple[int, int] | None = None,
         memory_fraction: float = _C.MEMORY_FRACTION, precision: str | None = None, recompute: bool | str = True,
         zero: bool = True, progress=None, pipeline: bool | None = None,
         network: NetworkCondition | None = None, collective_matmul: bool = False,
         micro_batch_semantics: str = "exact", profile=None, context_parallel: bool = True,
         expert_parallel: bool = True, state_dtype: str | None = None, compile: bool = False) -> Plan:
    """Search a plan for ``graph`` on ``cluster`` at ``global_batch``.

    ``pipeline``: True runs the joint planner (pipeline x data x tensor degrees, micro-batch,
    schedule, virtual stages: ``Plan.joint``); False the SPMD sharding search (pipeline 1:
    ``Plan.search``); None (default) the joint planner for a homogeneous cluster of several
    nodes and a model with repeated layers when no ``mesh`` is given, else the SPMD search,
    and then the joint planner if no SPMD sharding of the whole batch fits but its plan
    (in micro-batches) does.

    ``level="fast"``: a beam dynamic programme per mesh axis; ``"thorough"``: an integer
    programme (HiGHS) started from the fast answer, never worse under the cost model.
    ``mesh``: fix the {data, tensor} mesh instead of searching every factorisation; its data
    axis splits the batch and its tensor axis does not (weights, heads, sequences: ``mesh=(1,
    4)`` is 4-way tensor parallelism), where a searched mesh's axes split whatever prices best.
    ``recompute`` / ``zero``: allow activation recomputation / sharded optimizer state. The
    search tries no recomputation, selective and full (True), none (False), or only the one
    named ("none", "selective", "full": csrc/analysis/selective_recompute.h).
    ``precision``: "f32", "tf32", "bf16", "f16" or "fp8" (the linear layers in float8, the rest
    in the model's dtype: csrc/analysis/fp8_linears.h; refused on a cluster with a device
    without FP8 units); None (default): the model's, as captured (a bf16 model, or one
    captured under a mixed-precision policy, trains in bf16; a float32 or float64 model in f32).
    ``collective_matmul``: the search prices, and the plan runs, a tensor-parallel
    all-gather into a matmul (and a matmul's output reduce-scattered) as a ring whose blocks
    travel while the blocks before them are multiplied (collective matmul / async tensor
    parallelism, ``runtime/collective_matmul.py``): the SPMD search's plan's
    ``sharding.collective_matmul``; the joint planner's plan's ``collective_matmul``, its
    stages' layouts searched, priced and run with the rings (``Plan.joint``).
    ``network``: a ``NetworkCondition`` for the links between pipeline stages; the joint
    planner then times its pipelined plans on it and may pick kFkB (implies the joint planner).
    ``micro_batch_semantics``: "exact" (default): a plan in micro-batches only for a graph whose
    rows meet in linear reductions alone (no batch norm in training, no router load-balancing
    loss: csrc/analysis/batch_coupling.h); "per_micro_batch": any (see ``Plan.manual``).
    ``profile``: a ``shardwise.Profile`` (``shardwise.profile(model, inputs)``): every planner
    prices with its measured op and collective times where it has them, the analytic model
    elsewhere; ``Plan.price(graph, cluster, profile=)`` prices the plan again so.
    ``context_parallel``: whether a plan may split each row's sequence over ranks, every
    attention run as a ring (``runtime/ring_attention.py``; the joint planner's ``context``
    degree, the SPMD search's sequence split of an axis wider than the batch); False: never.
    ``expert_parallel``: whether a plan may split each mixture of experts layer's experts over
    ranks (the SPMD search's split of them over any axis; the joint planner's ``expert`` degree
    over a stage's data ranks, its stages' layout over their tensor ranks); False: never (a
    joint plan's ``split_experts`` false: its stages' layout keeps every expert on every rank).
    ``state_dtype``: the dtype a run steps the parameters in without a master copy ("bf16",
    "f16", "f32"), which prices the model states (``Plan.manual``'s); None: the precision's
    mixed-precision convention. ``parallelize`` passes its model's.
    ``compile``: the plan's programs run under ``torch.compile`` and are priced so (memory-bound
    ops fused between the products: csrc/analysis/compiled_fusion.h); ``parallelize(...,
    compile=)`` passes it.
    ``progress(done, total)`` is called after each candidate. The graph must have been
    captured at a batch of at least 2 (any size: it is scaled to ``global_batch``).

        >>> g = shardwise.capture(model, (ids,))
        >>> p = shardwise.plan(g, shardwise.Cluster.preset("dgx-a100"), global_batch=64)
        >>> print(p.report())
    """
    if network is not None and pipeline is False:
        raise _C.ValidationError("plan: network= describes the links between pipeline stages; not with pipeline=False")
    if network is not None and pipeline is None:
        pipeline = True
    choose = pipeline is None
    # Where the joint planner may choose: several nodes, a model with repeated layers, no
    # SPMD-only option. On a mixed cluster there it runs beside the SPMD search, and the
    # faster of uneven batch shares and stages sized to their devices wins.
    joint_may = choose and mesh is None and cluster.num_nodes > 1 and bool(graph.repeated_blocks())
    both = joint_may and cluster.heterogeneous
    if choose:
        pipeline = joint_may and not cluster.heterogeneous
    if pipeline:
        if mesh is not None:
            raise _C.ValidationError("plan: mesh= fixes the SPMD search's {data, tensor} mesh; not with pipeline=True")
        return Plan.joint(graph, cluster, global_batch=global_batch, level=level, memory_fraction=memory_fraction,
                          precision=precision, progress=progress, network=network, zero=zero,
                          micro_batch_semantics=micro_batch_semantics, profile=profile,
                          context_parallel=context_parallel, expert_parallel=expert_parallel,
                          state_dtype=state_dtype, compile=compile, collective_matmul=collective_matmul)
    found = Plan.search(graph, cluster, global_batch=global_batch, level=level, mesh=mesh,
                        memory_fraction=memory_fraction, precision=precision, recompute=recompute, zero=zero,
                        progress=progress, collective_matmul=collective_matmul, profile=profile,
                        context_parallel=context_parallel, expert_parallel=expert_parallel, state_dtype=state_dtype,
                        compile=compile)
    if both:
        joint = Plan.joint(graph, cluster, global_batch=global_batch, level=level, memory_fraction=memory_fraction,
                           precision=precision, progress=progress, zero=zero,
                           micro_batch_semantics=micro_batch_semantics, profile=profile,
                           context_parallel=context_parallel, expert_parallel=expert_parallel,
                           state_dtype=state_dtype, compile=compile, collective_matmul=collective_matmul)
        if joint.fits and (found.fits is False or joint.predicted_step_time() < found.predicted_step_time()):
            return joint
        return found
    if choose and mesh is None:
        joint = micro_batch_fallback(found, graph, cluster, global_batch=global_batch, level=level,
                                     memory_fraction=memory_fraction, precision=precision, progress=progress,
                                     zero=zero, micro_batch_semantics=micro_batch_semantics, profile=profile,
                                     context_parallel=context_parallel, expert_parallel=expert_parallel,
                                     state_dtype=state_dtype, compile=compile,
                                     collective_matmul=collective_matmul)
        if joint is not None:
            return joint
    return found


def micro_batch_fallback(found: Plan, graph, cluster, *, global_batch: int, level: str, memory_fraction: float,
                         precision: str | None = None, progress=None, zero: bool = True,
                         micro_batch_semantics: str = "exact", profile=None,
                         context_parallel: bool = True, expert_parallel: bool = True,
                         state_dtype: str | None = None, compile: bool = False,
                         collective_matmul: bool = False) -> Plan | None:
    """When the SPMD search's plan ``found`` fits under no sharding of one step of the whole
    batch: the joint planner's plan, in micro-batches (gradient accumulation, pipeline
    stages), if that fits; else None. Only for models with repeated layers (what the joint
    planner takes). shardwise.plan and parallelize both ask it.

    A graph whose rows meet in batch statistics (csrc/analysis/batch_coupling.h) is not split
    into micro-batches under "exact" semantics: when only such a plan would fit, the error says
    which op couples the batch and how to accept it (``micro_batch_semantics``)."""
    if found.fits is not False or not graph.repeated_blocks():
        return None
    joint = Plan.joint(graph, cluster, global_batch=global_batch, level=level, memory_fraction=memory_fraction,
                       precision=precision, progress=progress, zero=zero, micro_batch_semantics=micro_batch_semantics,
                       profile=profile, context_parallel=context_parallel, expert_parallel=expert_parallel,
                       state_dtype=state_dtype, compile=compile, collective_matmul=collective_matmul)
    if not joint.fits:
        coupling = _C.batch_coupling(graph._core)
        if micro_batch_semantics == "exact" and coupling["sites"]:
            loose = Plan.joint(graph, cluster, global_batch=global_batch, level=level,
                               memory_fraction=memory_fraction, precision=precision, zero=zero,
                               micro_batch_semantics="per_micro_batch", profile=profile,
                               context_parallel=context_parallel, expert_parallel=expert_parallel,
                               state_dtype=state_dtype, compile=compile, collective_matmul=collective_matmul)
            if loose.fits:
                raise _C.ValidationError(
                    f"plan: no plan of the whole batch {global_batch} fits in memory, and a plan in micro-batches "
                    f"({loose.num_micro_batches()} of {loose.micro_batch} rows) would change what the model "
                    f"computes: {coupling['describe']}. Pass micro_batch_semantics='per_micro_batch' to accept "
                    "statistics over each micro-batch and a loss averaged over them, or use more devices or a "
                    "smaller batch")
        return None
    from ._logging import get_logger

    get_logger("shardwise.plan").info(
        "no sharding of the whole batch %d fits; the joint planner's plan does, in %d micro-batches of %d "
        "(pipeline %d, data %d, tensor %d)", global_batch, joint.num_micro_batches(), joint.micro_batch,
        joint.pipeline, joint.data, joint.tensor)
    return joint
