"""A plan for people: what ``Plan.report()`` prints and the CLI's tables show.

Every figure comes from the plan's predictions (the core's evaluator or SPMD search); this
module only names them as a user would: compute, the communication the step waits for by
kind (tensor-parallel, pipeline sends, gradient sync, parameter gathers), the pipeline
bubble, memory per device by kind beside the device's capacity, and MFU (model FLOPs
utilisation) beside the devices' peak. A mesh axis is named by what the plan's placements
split over it (the batch, weights, layers in stages), not by a fixed "data x tensor" label.

The machine-readable figures (``plan.breakdown()``, ``plan.predicted_memory()``, the plan's
JSON) keep the core's keys; nothing here changes them.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from . import _C

_ITEMSIZE = {"f64": 8, "f32": 4, "bf16": 2, "f16": 2, "i64": 8, "i32": 4, "i16": 2, "i8": 1, "u8": 1, "bool": 1}
_FLOATING = {"f64", "f32", "bf16", "f16"}

_SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "interleaved 1F1B", "kfkb": "kFkB",
              "zb-h1": "ZB-H1", "zb-v": "ZB-V", "dualpipe-v": "DualPipeV"}

# A breakdown entry that is not a part of the step (one send's seconds); the *_total entries
# (before overlap) and *_overlapped (a flag) are not either.
_NOT_PARTS = ("pipeline_transfer",)


# ---- what the report is told besides the plan ------------------------------------------
def hardware_of(cluster) -> dict | None:
    """What the report needs of a cluster: its device kinds (name -> ranks), the mean peak
    FLOP/s per precision over its ranks and the smallest device memory."""
    if cluster is None:
        return None
    names = cluster.devices
    kinds: dict[str, int] = {}
    for name in names:
        kinds[name] = kinds.get(name, 0) + 1
    described = {name: cluster.device_of(names.index(name)) for name in kinds}
    precisions = set.intersection(*(set(d["peak_flops"]) for d in described.values()))
    peak = {p: sum(described[n]["peak_flops"][p] * k for n, k in kinds.items()) / len(names) for p in precisions}
    return {"devices": kinds, "peak_flops": peak,
            "memory_bytes": min(float(d["memory_bytes"]) for d in described.values())}


def values_of(graph) -> dict | None:
    """The graph's values: name -> (elements, bytes per element, trainable, role, batch dim,
    floating), for the split of an SPMD plan's parameter memory by kind and to find the axes
    that carry the batch."""
    if graph is None:
        return None
    out = {}
    for v in graph.values():
        numel = 1
        for s in v["shape"]:
            numel *= int(s)
        out[v["name"]] = (numel, _ITEMSIZE.get(v["dtype"], 4), v["role"] == "parameter" and v["dtype"] in _FLOATING,
                          v["role"], v["batch_dim"], v["dtype"] in _FLOATING)
    return out


# ---- numbers as text ------------------------------------------------------------------------
def seconds_text(s: float) -> str:
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} us"


def bytes_text(n: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def flops_text(f: float) -> str:
    for unit, size in (("PFLOP/s", 1e15), ("TFLOP/s", 1e12), ("GFLOP/s", 1e9), ("MFLOP/s", 1e6)):
        if f >= size:
            return f"{f / size:.3g} {unit}"
    return f"{f:.3g} FLOP/s"


def percent_text(x: float) -> str:
    """A share in percent, as many digits as show it (never "0%" for a share above zero)."""
    p = 100 * x
    if p >= 10 or p == 0:
        return f"{p:.0f}%"
    if p >= 1:
        return f"{p:.1f}%"
    return f"{p:.2g}%"


# ---- mesh axes by what they carry -----------------------------------------------------------
def _shard_dim(placement: str) -> int | None:
    m = re.match(r"S\((\d+)", placement)
    return int(m.group(1)) if m else None


def _held(placement: str, size: int) -> float:
    """The share of a value one rank holds on an axis (csrc/search/placement.cc: held_fraction)."""
    if _shard_dim(placement) is None:
        return 1.0
    ratios = re.search(r"\)\[([^\]]*)\]", placement)
    if ratios:
        return max(float(r) for r in ratios.group(1).split(","))
    return 1.0 / size


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def axis_contents(sharding: dict, values: dict | None) -> list[tuple[str, list[str]]]:
    """Per mesh axis of a sharding: (what it carries, notes), read off its placements. The
    batch when it splits most of the computed values' elements along their batch dim (a model
    input split along it says so too; without the graph's shapes, values count alike and
    their batch is dim 0); the sequence when it splits token ids after their batch dim;
    weights when the parameters split on it hold most of the parameters' elements, else the
    few it splits are named in a note."""
    mesh = sharding["mesh"]
    placements = sharding.get("placements", {})
    names = sharding.get("leaves") or []
    inputs = set(sharding.get("inputs") or [])
    if values is not None:
        inputs |= {n for n in names if n in values and values[n][3] == "input"}
    params = [n for n in names if n not in inputs and n in placements]

    def size_of(name: str) -> float:
        return float(values[name][0]) if values is not None and name in values else 1.0

    # Values with a batch dim that nodes compute (their sizes known): the batch is on an axis
    # that splits most of their elements along it (a model input may stay whole, cut later).
    # Without the graph: every computed value, its batch along dim 0 (as captured).
    if values is None:
        batched = [n for n in placements if n not in set(names)]
        batch_dims = {n: 0 for n in batched}
    else:
        batched = [n for n, v in values.items() if v[3] == "activation" and v[4] is not None and n in placements]
        batch_dims = {n: values[n][4] for n in batched}
    out = []
    for a, ranks in enumerate(mesh):
        carried, notes = [], []
        dims = set()
        for name in inputs:
            dim = _shard_dim(placements[name][a]) if name in placements else None
            if dim is not None:
                known = values is not None and name in values
                batch_dim = values[name][4] if known and values[name][4] is not None else 0
                if dim == batch_dim:
                    dims.add("batch")
                elif dim == batch_dim + 1 and known and not values[name][5]:
                    dims.add("sequence")  # the dim after the batch of token ids
                else:
                    dims.add(f"input dim {dim}")
        if batched:
            split = sum(size_of(n) for n in batched if _shard_dim(placements[n][a]) == batch_dims[n])
            if split >= 0.5 * sum(size_of(n) for n in batched):
                dims.add("batch")
            else:
                dims.discard("batch")
        carried += sorted(dims, key=lambda d: (d != "batch", d != "sequence", d))
        split = [n for n in params if _shard_dim(placements[n][a]) is not None]
        if split:
            share = sum(size_of(n) for n in split) / max(1.0, sum(size_of(n) for n in params))
            if share >= 0.5:
                carried.append("weights")
            elif len(split) <= 2:
                notes.append("also splits " + " and ".join(split))  # a small table, named
            else:
                notes.append(f"also splits {len(split)} of {len(params)} weights"
                             + (f" ({percent_text(share)} of their elements)" if values is not None else ""))
        if not carried and ranks > 1:
            carried.append("activations only")
        out.append((" and ".join(carried) if carried else "nothing", notes))
    return out


def _mesh_phrase(sharding: dict, values: dict | None) -> str:
    """'batch over 4 ranks', 'batch over 2 x 2', 'batch over 2 (axis 0) x weights over 2 (axis 1)':
    the axes of more than one rank, each by what it carries; '' when there are none."""
    wide = [(a, n, c) for a, (n, c) in enumerate(zip(sharding["mesh"], axis_contents(sharding, values))) if n > 1]
    if not wide:
        return ""
    if len(wide) == 1 or len({c for _, _, (c, _) in wide}) == 1:
        what = wide[0][2][0]
        text = f"{what} over {_plural(wide[0][1], 'rank')}" if len(wide) == 1 else \
            f"{what} over {' x '.join(str(n) for _, n, _ in wide)}"
    else:
        text = " x ".join(f"{what} over {n} (axis {a})" for a, n, (what, _) in wide)
    if len(wide) > 1 and len({tuple(ns) for _, _, (_, ns) in wide}) == 1:  # the same on every axis
        notes = [f"every axis {note}" for note in wide[0][2][1]]
    else:
        notes = [f"axis {a} {note}" if len(wide) > 1 else note for a, _, (_, ns) in wide for note in ns]
    return text + ("; " + "; ".join(notes) if notes else "")


def _degrees_phrase(data: int, tensor: int, stage_sharding: dict | None, values: dict | None) -> str:
    """A stage's {data, tensor} mesh: from its layout when the plan has one, else the
    evaluator's (Megatron's) layout: the data ranks split the batch, the tensor ranks the
    weights (heads and hidden)."""
    if stage_sharding:
        phrase = _mesh_phrase(stage_sharding, values)
        if phrase:
            return phrase
    parts = ([f"batch over {data}"] if data > 1 else []) + ([f"weights over {tensor}"] if tensor > 1 else [])
    return " x ".join(parts)


def mesh_text(plan, values: dict | None = None) -> str:
    """The plan's devices named by what each axis carries."""
    d = plan._doc
    sharding = d.get("sharding")
    if sharding:
        return _mesh_phrase(sharding, values) or "one device"
    p = d["pipeline"]
    parts = []
    if p > 1:
        parts.append(f"layers in {p} stages")
    if d.get("stage_meshes"):
        shardings = d.get("stage_shardings") or [None] * len(d["stage_meshes"])
        inner = [f"stage {s}: " + (_degrees_phrase(a, b, shardings[s], values) or "one device")
                 for s, (a, b) in enumerate(d["stage_meshes"])]
        return (parts[0] + ", each on its own mesh: " if parts else "") + "; ".join(inner)
    inner = _degrees_phrase(d["data"] * d.get("context", 1), d["tensor"], d.get("stage_sharding"), values)
    if inner:
        parts.append(inner)
    return " x ".join(parts) if parts else "one device"


def world_size(plan) -> int:
    d = plan._doc
    if d.get("stage_meshes"):
        return sum(a * b for a, b in d["stage_meshes"])
    if d.get("sharding"):
        n = 1
        for s in d["sharding"]["mesh"]:
            n *= s
        return n
    return d["data"] * d.get("context", 1) * d["tensor"] * d["pipeline"]


# ---- the step's time by part -------------------------------------------------------------
@dataclass
class Part:
    label: str
    seconds: float
    note: str = ""
    parts: list["Part"] = field(default_factory=list)


def _parameter_gathers(plan) -> bool:
    """Whether an SPMD plan gathers parameters for their readers (FSDP / ZeRO-3's traffic)."""
    sharding = plan._doc.get("sharding") or {}
    params = set(sharding.get("leaves") or []) - set(sharding.get("inputs") or [])
    return any(c["kind"] == "all_gather" and c["phase"] in ("forward", "backward") and c["value"] in params
               for c in plan.collectives())


def time_parts(plan, values: dict | None = None) -> tuple[list[Part], Part | None]:
    """The step's parts, largest first: compute, exposed communication (its kinds inside),
    the pipeline bubble, the optimizer step; and the bubble alone (None: no pipeline)."""
    b = plan.breakdown()
    d = plan._doc
    used = set(_NOT_PARTS)
    comm: list[Part] = []

    def take(*keys: str) -> float:
        used.update(keys)
        return sum(b.get(k, 0.0) for k in keys)

    def hidden_note(exposed: float, total: float, where: str) -> str:
        if total > exposed * 1.0005 and total > 0:
            return f"of {seconds_text(total)} in all; the rest runs beside {where}"
        return ""

    compute = Part("compute", take("compute"))
    optimizer = Part("optimizer step", take("optimizer"))
    bubble = None
    if "data_parallel" in b or "tensor_parallel" in b:  # the evaluator's plans (Plan.manual, the joint planner)
        tp = take("tensor_parallel")
        if tp > 0:
            comm.append(Part("tensor-parallel", tp))
        sends = take("pipeline_p2p")
        if sends > 0:
            each = b.get("pipeline_transfer", 0.0)
            comm.append(Part("pipeline sends", sends, f"{seconds_text(each)} each" if each > 0 else ""))
        sync = take("data_parallel")
        total = take("data_parallel_total")
        used.add("data_parallel_overlapped")
        if sync > 0 or total > 0:
            zero3 = d.get("zero_stage", 0) >= 3  # ZeRO-3 gathers the weights each micro-batch
            comm.append(Part("parameter gathers and gradient sync" if zero3 else "gradient sync", sync,
                             hidden_note(sync, total, "compute" if zero3 else "the backward")))
        bubble_seconds = take("pipeline_bubble")
        if d.get("pipeline", 1) > 1 or bubble_seconds > 0:
            bubble = Part("pipeline bubble", bubble_seconds)
    else:  # the SPMD search's plans
        sharding = d.get("sharding") or {}
        tensor = any("weights" in what for what, _ in axis_contents(sharding, values)) if sharding else True
        tp = take("activations", "statistics")
        beside = take("activations_beside_backward_total") + take("activations_beside_matmul_total")
        if tp > 0 or beside > 0:
            note = f"{seconds_text(beside)} of it issued beside the backward's matmuls, partly hidden" if beside else ""
            comm.append(Part("tensor-parallel" if tensor else "activation resharding", tp, note))
        sync, total = take("gradient_sync"), take("gradient_sync_total")
        if sync > 0 or total > 0:
            gathers = _parameter_gathers(plan)
            comm.append(Part("gradient sync and parameter gathers" if gathers else "gradient sync", sync,
                             hidden_note(sync, total, "forward and backward" if gathers else "the backward")))
    broadcasts = take("zero_broadcast")  # both: each ZeRO owner's parameters after the step
    if broadcasts > 0:
        comm.append(Part("parameter broadcasts (ZeRO)", broadcasts))
    tied = take("shared_weight_sync")  # a tied embedding and head on two pipeline ranks
    if tied > 0:
        comm.append(Part("tied weights' gradient sync", tied))
    for key in sorted(set(b) - used):  # a part this module does not know yet: named, never dropped
        if b[key] > 0 and not key.endswith(("_total", "_overlapped")):
            comm.append(Part(key.replace("_", " "), b[key]))
    comm = [c for c in comm if c.seconds > 0 or c.note]
    comm.sort(key=lambda c: -c.seconds)
    parts = [compute]
    if comm:
        parts.append(Part("exposed communication", sum(c.seconds for c in comm), parts=comm))
    if bubble is not None:
        parts.append(bubble)
    parts.append(optimizer)
    parts.sort(key=lambda p: -p.seconds)
    return parts, bubble


# ---- memory per device by kind ------------------------------------------------------------
def memory_parts(plan, values: dict | None = None) -> tuple[list[tuple[str, float]], str]:
    """(kind, bytes) on the most loaded rank, and a note (which pipeline stage that is)."""
    _, parts = plan.predicted_memory()
    note = ""
    out: list[tuple[str, float]] = []
    parts = dict(parts)
    if "stage" in parts:
        stage = int(parts.pop("stage"))
        if plan._doc.get("pipeline", 1) > 1:
            note = f"pipeline stage {stage}, the most loaded"
    if "parameters" in parts:  # a plan written before the core split its model states by kind
        out.append(("weights, gradients and optimizer state", parts.pop("parameters")))
    names = {"weights": "weights", "gradients": "gradients", "optimizer": "optimizer state",
             "activations": "activations", "backward_working": "backward working set (gradients in flight)",
             "gathered_parameters": "gathered weights (in use)", "fp8_casts": "FP8 casts (forward copies, beyond the backward's)"}
    for key in ("weights", "gradients", "optimizer", "activations", "backward_working", "gathered_parameters",
                "fp8_casts"):
        if key in parts:
            value = parts.pop(key)
            if value > 0 or key not in ("backward_working", "gathered_parameters", "fp8_casts"):
                out.append((names[key], value))
    out += [(key.replace("_", " "), value) for key, value in sorted(parts.items()) if value > 0]
    return out, note


# ---- MFU ---------------------------------------------------------------------------------
def mfu(plan, hardware: dict | None) -> tuple[float | None, str]:
    """(MFU, text): model FLOPs per second per device over the devices' peak in the plan's
    precision, as "MFU 41% of 989 TFLOP/s bf16"; or (None, why it is not available)."""
    achieved = plan.predicted_tflops_per_device() * 1e12
    precision = plan._doc.get("precision", "bf16")
    if hardware is None:
        return None, ("MFU not available: the plan does not say which devices it runs on "
                      f"({flops_text(achieved)} of model FLOPs per device; plan.report(cluster) gives MFU)"
                      if achieved > 0 else "MFU not available: the plan does not say which devices it runs on")
    peak = hardware["peak_flops"].get(precision)
    if not peak:
        return None, f"MFU not available: the devices give no {precision} peak"
    if achieved <= 0:
        return None, (f"MFU not available: the model has no matrix-multiply FLOPs to count "
                      f"(devices' peak {flops_text(peak)} {precision})")
    value = achieved / peak
    mean = " mean" if len(hardware["devices"]) > 1 else ""
    return value, f"MFU {percent_text(value)} of {flops_text(peak)} {precision}{mean} peak per device"


def devices_text(hardware: dict | None, world: int) -> str:
    if hardware is None:
        return _plural(world, "device")
    return " + ".join(f"{n} x {name}" for name, n in hardware["devices"].items())


# ---- the report --------------------------------------------------------------------------
def _plan_lines(plan, values: dict | None, hardware: dict | None) -> list[str]:
    d = plan._doc
    world = world_size(plan)
    lines = [f"plan      {devices_text(hardware, world)}: {mesh_text(plan, values)}"]
    sharding = d.get("sharding")
    if sharding:
        level = sharding.get("level") or "manual"
        how = "placements given by hand" if level == "manual" else f"placements searched ({level})"
        lines.append(f"batch     global {d['global_batch']} in one step; {how}; "
                     + {"selective": "recomputing the repeated blocks in backward, their products' outputs "
                                     "kept (selective)", True: "recomputing the repeated blocks in backward"}
                     .get(sharding.get("recompute"), "no recomputation"))
        zero = sharding.get("zero") or {}
        if zero:
            axes = sorted({a for v in zero.values() for a in v})
            lines.append(f"ZeRO      optimizer state and gradients of {_plural(len(zero), 'parameter')} sharded over "
                         f"axis {', '.join(map(str, axes))}")
    else:
        m = plan.num_micro_batches()
        data = d["data"]
        if d.get("stage_meshes"):
            rows = f"micro-batches of {d['micro_batch']} rows"
            lines.append(f"batch     global {d['global_batch']} in {m} {rows}")
        else:
            per = f" on each of {data} batch ranks" if data > 1 else ""
            if d.get("context", 1) > 1:
                per = f", each row's sequence split over {d['context']} ranks (ring attention, or heads exchanged all-to-all)"
            if d.get("expert", 1) > 1:
                per += (f"; each layer's experts split over those {d['expert']} ranks (expert parallelism: a rank "
                        f"holds 1/{d['expert']} of them, each rank's tokens sent to their experts' ranks and back by "
                        "all-to-all)")
            batches = f"{m} micro-batch{'es' if m != 1 else ''} of {d['micro_batch']}"
            lines.append(f"batch     global {d['global_batch']}: {batches}{per}"
                         + ("" if m > 1 or d["pipeline"] > 1 else " (one step, no accumulation)"))
        schedule = _SCHEDULES.get(d["schedule"], d["schedule"])
        if d["schedule"] == "kfkb":
            schedule += f" (k={d.get('kfkb_k', 1)})"
        elif d.get("virtual_stages", 1) > 1:
            schedule += f", {d['virtual_stages']} virtual stages per rank"
        recompute = {"full": "full recomputation", "none": "no recomputation"}.get(d["recompute"],
                                                                                    f"{d['recompute']} recomputation")
        text = (f"schedule  {schedule}; " if d["pipeline"] > 1 else "training  ") + recompute
        zero = d.get("zero_stage", 0)
        if zero:
            what = {1: "optimizer state", 2: "optimizer state and gradients"}.get(zero, "optimizer state, gradients "
                                                                                         "and weights")
            text += f"; ZeRO-{zero}: {what} sharded over the batch ranks"
        if d.get("compile"):
            text += "; programs compiled (torch.compile: memory-bound ops priced fused)"
        lines.append(text)
        # The experts ops (shardwise_moe::experts: outputs "experts", "experts_1", ...) the stages'
        # layout splits over the tensor axis (plan.expert says the data axis' split, above).
        strategies = (d.get("stage_sharding") or {}).get("strategies", {})
        split = [k for k, v in strategies.items() if re.fullmatch(r"experts(_\d+)?", k) and v[1:] == ["split e"]]
        if split and d.get("expert", 1) == 1:
            lines.append(f"experts   each of {len(split)} layers' experts split over the {d['tensor']} tensor ranks "
                         f"of its stage (expert parallelism): each holds 1/{d['tensor']} of them for every token")
        if d.get("layers_per_stage"):
            lines.append(f"stages    layers per stage {' / '.join(map(str, d['layers_per_stage']))}")
        if plan.micro_batch_semantics == "per_micro_batch" and m > 1:
            lines.append("micro-batches per micro-batch: batch statistics are each micro-batch's and a loss that is "
                         "not a sum over samples is the mean of the micro-batches' (not one device's step)")
    return lines + _reason_lines(plan)


def _reason_lines(plan) -> list[str]:
    """The joint planner's reasons (_reason_line) for the splits the plan makes as it runs:
    each row's sequence (plan.context), each layer's experts (plan.expert, or its layout's
    split of them over any axis)."""
    d = plan._doc
    strategies = (d.get("stage_sharding") or d.get("sharding") or {}).get("strategies", {})
    experts = any(re.fullmatch(r"experts(_\d+)?", k) and any(s in ("split e", "dispatch t") for s in v)
                  for k, v in strategies.items())
    shown = {"context": d.get("context", 1) > 1, "experts": d.get("expert", 1) > 1 or experts}
    return [_reason_line(r) for r in (plan.__dict__.get("_result") or {}).get("split_reasons", [])
            if shown.get(r["split"])]


def _degrees_text(d: dict) -> str:
    parts = [f"{d.get(k, 1)} {k}" for k in ("data", "context", "tensor") if d.get(k, 1) > 1]
    return " x ".join(parts or ["1 rank"]) + f", {d['pipeline']} stage{'s' if d['pipeline'] != 1 else ''}"


def _reason_line(reason: dict) -> str:
    """Why the plan splits each row's sequence or each layer's experts: the plan it was chosen
    over without that split, as the joint planner priced both (csrc/search/joint_planner.h,
    SplitReason)."""
    with_, without = reason["with"], reason["without"]

    def priced(c: dict) -> str:
        return (f"{seconds_text(c['step_time'])} a step, {bytes_text(c['memory_per_rank'])} a GPU"
                + ("" if c["fits"] else ", does not fit"))

    if reason["split"] == "context":
        if without is None:
            return (f"why       sequence split: {priced(with_)} as the search priced it; without it no plan of "
                    "these rows and layers occupies every device")
        what, other = "sequence split", f"the best plan without it ({_degrees_text(json.loads(without['plan']))})"
    else:
        what, other = "experts split", "the same degrees with every expert on every rank"
    ratio = without["step_time"] / with_["step_time"] if with_["step_time"] > 0 else float("inf")
    # Nothing fitting, the planner chose the plan needing the least memory.
    versus = f"({ratio:.2g}x the step)" if with_["fits"] else "(nothing fits: the plan needing the least memory)"
    return f"why       {what}: {priced(with_)} as the search priced it; {other}: {priced(without)} {versus}"


def _prediction_lines(plan, values: dict | None, hardware: dict | None) -> list[str]:
    step = plan.predicted_step_time()
    _, text = mfu(plan, hardware)
    lines = [f"predicted step {seconds_text(step)}, {text}"]
    parts, bubble = time_parts(plan, values)

    def row(p: Part, indent: str) -> str:
        share = f"{100 * p.seconds / step:5.1f}%" if step > 0 else ""
        line = f"{indent}{p.label:<{40 - len(indent)}} {seconds_text(p.seconds):>9}  {share:>6}"
        return (line + f"  {p.note}" if p.note else line).rstrip()

    for p in parts:
        lines.append(row(p, "  "))
        for inner in p.parts:
            lines.append(row(inner, "    "))
    if not any(p.parts for p in parts):
        lines.append(f"  {'exposed communication':<38} none")
    if bubble is None:
        lines.append(f"  {'pipeline bubble':<38} {'none':>9}  (one pipeline stage)")
    memory, _ = plan.predicted_memory()
    kinds, note = memory_parts(plan, values)
    capacity = hardware["memory_bytes"] if hardware else None
    head = f"memory per device {bytes_text(memory)}"
    if capacity:
        smallest = " (the smallest device's)" if len(hardware["devices"]) > 1 else ""
        head += f" of {bytes_text(capacity)}{smallest} ({percent_text(memory / capacity)})"
        if memory > capacity:
            head += ", more than the device holds"
    else:
        head += " (device capacity unknown: plan.report(cluster) gives it)"
    lines.append(head + (f", {note}" if note else ""))
    for kind, value in kinds:
        share = f"{100 * value / memory:5.1f}%" if memory > 0 else ""
        lines.append(f"  {kind:<38} {bytes_text(value):>9}  {share:>6}")
    return lines


def _placement_lines(sharding: dict) -> list[str]:
    rows: dict[tuple[str, str], int] = {}
    zero = sharding.get("zero", {})
    placements = sharding.get("placements", {})
    for name in sharding.get("leaves") or []:
        if name not in placements:
            continue
        text = "[" + ", ".join(_C.readable_placement(p) for p in placements[name]) + "]"
        if name in zero:
            text += f" optimizer state sharded on axis {','.join(map(str, zero[name]))}"
        key = (re.sub(r"(^|\.)\d+(?=\.|$)", r"\1*", name), text)
        rows[key] = rows.get(key, 0) + 1
    lines = ["parameters and inputs (placement per mesh axis; names that differ only in a block number are one row)"]
    for (pattern, text), count in rows.items():
        lines.append(f"  {pattern:<48} {f'x{count}' if count > 1 else '':>4}  {text}")
    return lines


def collective_totals(plan) -> dict[tuple, list[float]]:
    """(kind, mesh axis, phase) -> [calls, bytes in all, seconds in all] of the plan's collectives."""
    groups: dict[tuple, list[float]] = {}
    for c in plan.collectives():
        total = groups.setdefault((c["kind"], c["axis"], c["phase"]), [0.0, 0.0, 0.0])
        total[0] += c["count"]
        total[1] += c["count"] * c["bytes"]
        total[2] += c["count"] * c["seconds"]
    return groups


def _collective_lines(plan) -> list[str]:
    groups = collective_totals(plan)
    if not groups:
        return []
    lines = ["collectives per step (kind, mesh axis, phase: calls, bytes in all, time in all)"]
    for (kind, axis, phase), (calls, size, seconds) in sorted(groups.items()):
        lines.append(f"  {kind.replace('_', '-'):<15} axis {axis}  {phase:<9} {calls:>6.0f} calls  "
                     f"{bytes_text(size):>10}  {seconds_text(seconds):>9}")
    return lines


def render(plan, hardware: dict | None = None, values: dict | None = None) -> str:
    """The plan as text for people (``Plan.report()``)."""
    lines = _plan_lines(plan, values, hardware)
    if plan._doc.get("predicted") is not None:
        lines += _prediction_lines(plan, values, hardware)
    sharding = plan._doc.get("sharding")
    if sharding:
        lines += _placement_lines(sharding)
        if plan._doc.get("predicted") is not None:
            lines += _collective_lines(plan)
    return "\n".join(lines) + "\n"
