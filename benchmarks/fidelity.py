"""Predicted against measured on this machine (issue 20, item 4).

The local CPU "cluster" is profiled into a cluster description first: 4 Gloo processes call
``Cluster.detect(measure_links=True, measure_compute=True)`` together (a timed GEMM per
precision and a timed copy on every rank at once, so ranks sharing cores measure their
share; all-reduce times fitted into the link), and every plan below is priced on that one
description. Then, for a GPT-2-like and a LLaMA-like model (transformers, float32, sized so
a step takes tenths of a second), every plan runs in the same 4 fresh Gloo processes, each
built in turn (its memory measured then), and their steps are timed in rounds: each round
runs one step of every plan, starting one plan further on each round:

- step time: the median of the plan's timed steps (wall clock, between barriers, rank 0),
  after --warmup untimed rounds: a data- or tensor-parallel plan's first steps after its ops
  were timed ran up to 1.7x its later ones (2026-12-07, 2 processes: "gpt2 data 2" 0.61,
  0.36, 0.44, 0.38 and then 0.34-0.39 s; a pipeline's within 5% from its first). In rounds,
  a slow minute of this shared host falls on every plan alike; timed one plan after the
  other (until 2026-12-07), it fell on the plans timed in it: the same pipeline measured
  0.549 and 0.629 s in two runs 15 minutes apart, and the plans' order moved more than
  their prices did;
- peak memory per rank: the bytes of tensors alive at once in the plan's second step, the
  analogue of torch.cuda.max_memory_allocated (benchmarks/_tensor_memory.py: the tensors the
  engine and optimizer hold between steps, without the user's module or the plans built
  before it, plus the CPU allocator's peak over the step), the largest over the ranks.
  Beside it, the growth of the process's peak resident set (VmHWM, reset through
  /proc/self/clear_refs) from before the engine is built to after that step: that includes
  the interpreter's heap, the captured graphs and what malloc keeps (less where an earlier
  plan's freed memory is reused), which no plan decides and a GPU would not hold;
- bytes per collective kind per step, counted by the collective ops themselves
  (shardwise.runtime.traffic), rank 0's, beside the plan's own list of collectives
  (SPMD plans; the evaluator that prices pipelines lists none).

Plans: the SPMD search on the plan's {data, tensor} mesh (``shardwise.plan(..., mesh=)``),
or the evaluator for pipelines (``Plan.manual``), both in f32 (the models' dtype), on the
detected cluster. Predictions: each plan priced again (``Plan.price(..., profile=)``) with its
ops timed at the shapes each rank runs them (``shardwise.profile.plan_specs``: the calls
the evaluator prices, recorded; issue 46, item 7): the distinct calls of all the plans,
measured in the plans' processes in 5 passes over the list (one sample of each call a pass,
the median kept), the passes spread over the timed rounds of steps, so that prices and steps
are taken in the same minutes, by as many ranks at once as there are cores (the others waiting), times the
node's compute_alone (2 for 4 processes on 2 cores); every collective kind is timed over all
the ranks too and fitted (``measure_collectives``), and over every smaller group size that
divides them (pairs on 4 ranks: both pairs at once, as a mesh axis runs them), pricing the
plan's groups of each size; the ops that cannot be rebuilt at a rank's shapes (views whose
sizes are the whole graph's) stay analytic. The analytic model's prediction on the detected cluster is beside it.
Five plans recompute (each transformer layer one checkpointed region, as the cost model
prices it): data-parallel plans searched with full recomputation, or with selective (the
products' and attention's outputs kept, the rest run again: ``shardwise.plan(...,
recompute="selective")``), and 4-stage pipelines with full and with selective recomputation.

    python benchmarks/fidelity.py [--world 4|2] [--steps 15] [--warmup 3] [--svg benchmarks/images/fidelity.svg]
                                  [--json out.json] [--only "gpt2 data 4" ...] [--record]
                                  [--from-json out.json]  (report a saved run again)

``--record`` writes the table to benchmarks/results/fidelity.json and the README, and redraws
the README's picture, benchmarks/images/fidelity.svg (unless ``--svg`` names another file).

Timing never fails anything; ``--smoke`` runs two plans with one step (tests).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import machine_line  # noqa: E402
from _tensor_memory import PeakTensorBytes, live_storages  # noqa: E402
from _workers import spawn_ranks  # noqa: E402

WORLD = 4  # the processes of a run (--world 2 runs PLANS_2)


def threads(world: int) -> int:
    return max(1, (os.cpu_count() or 1) // world)  # the processes share the cores: no oversubscription

SEQ, BATCH, VOCAB = 128, 16, 4096


def build(name: str) -> nn.Module:
    import transformers

    from shardwise.models import CausalLMWithLoss

    torch.manual_seed(0)
    if name == "gpt2":
        cfg = transformers.GPT2Config(n_layer=4, n_embd=256, n_head=8, vocab_size=VOCAB, n_positions=SEQ,
                                      resid_pdrop=0, embd_pdrop=0, attn_pdrop=0, bos_token_id=0, eos_token_id=0)
        return CausalLMWithLoss(transformers.GPT2LMHeadModel(cfg))
    cfg = transformers.LlamaConfig(num_hidden_layers=4, hidden_size=256, intermediate_size=704, num_attention_heads=8,
                                   num_key_value_heads=8, vocab_size=VOCAB, max_position_embeddings=SEQ,
                                   bos_token_id=0, eos_token_id=0)
    return CausalLMWithLoss(transformers.LlamaForCausalLM(cfg))


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    return ids, torch.roll(ids, -1, dims=1)


# name -> (model, kind, degrees). kind: "spmd" (the search on the {data, tensor} mesh, without
# ZeRO), "zero" (the same with too little memory for a replicated optimizer state), "tight"
# (too little memory for replicated weights: they are sharded on the tensor axis),
# "recompute" / "selective" (the search with full / selective recomputation only), "fp8" (the
# search with the linears in float8: precision "fp8", runtime/fp8.py), or a pipeline schedule
# (the evaluator's plan; each stage's layout searched on its sub-mesh; "recompute" in the
# degrees recomputes so).
PLANS = {
    "gpt2 data 4": ("gpt2", "spmd", {"data": 4, "tensor": 1}),
    "gpt2 data 4, ZeRO": ("gpt2", "zero", {"data": 4, "tensor": 1}),
    "gpt2 tensor 4, weights sharded": ("gpt2", "tight", {"data": 1, "tensor": 4}),
    "gpt2 2 x 2, searched": ("gpt2", "spmd", {"data": 2, "tensor": 2}),
    "gpt2 2 x 2, weights sharded": ("gpt2", "tight", {"data": 2, "tensor": 2}),
    "gpt2 pipeline 2 x data 2, 1F1B": ("gpt2", "1f1b", {"pipeline": 2, "data": 2, "micro_batch": 2}),
    "gpt2 pipeline 2 x data 2, GPipe": ("gpt2", "gpipe", {"pipeline": 2, "data": 2, "micro_batch": 2}),
    "gpt2 pipeline 2 x data 2, interleaved": ("gpt2", "interleaved-1f1b",
                                              {"pipeline": 2, "data": 2, "micro_batch": 2, "virtual_stages": 2}),
    "gpt2 pipeline 4, 1F1B": ("gpt2", "1f1b", {"pipeline": 4, "data": 1, "micro_batch": 2}),
    "gpt2 pipeline 4, GPipe": ("gpt2", "gpipe", {"pipeline": 4, "data": 1, "micro_batch": 2}),
    "gpt2 data 4, recomputed": ("gpt2", "recompute", {"data": 4, "tensor": 1}),
    "gpt2 data 4, selective": ("gpt2", "selective", {"data": 4, "tensor": 1}),
    "gpt2 pipeline 4, 1F1B, recomputed": ("gpt2", "1f1b", {"pipeline": 4, "data": 1, "micro_batch": 2,
                                                           "recompute": "full"}),
    "gpt2 pipeline 4, 1F1B, selective": ("gpt2", "1f1b", {"pipeline": 4, "data": 1, "micro_batch": 2,
                                                          "recompute": "selective"}),
    "llama data 4": ("llama", "spmd", {"data": 4, "tensor": 1}),
    "llama tensor 4, weights sharded": ("llama", "tight", {"data": 1, "tensor": 4}),
    "llama 2 x 2, searched": ("llama", "spmd", {"data": 2, "tensor": 2}),
    "llama pipeline 4, 1F1B": ("llama", "1f1b", {"pipeline": 4, "data": 1, "micro_batch": 2}),
    "llama data 4, selective": ("llama", "selective", {"data": 4, "tensor": 1}),
    "gpt2 data 4, FP8": ("gpt2", "fp8", {"data": 4, "tensor": 1}),
    "gpt2 tensor 4, FP8": ("gpt2", "fp8", {"data": 1, "tensor": 4}),
    "llama data 4, FP8": ("llama", "fp8", {"data": 4, "tensor": 1}),
    "gpt2 pipeline 4, ZB-H1": ("gpt2", "zb-h1", {"pipeline": 4, "data": 1, "micro_batch": 2}),
    "gpt2 pipeline 2 x data 2, ZB-V": ("gpt2", "zb-v", {"pipeline": 2, "data": 2, "micro_batch": 2,
                                                        "virtual_stages": 2}),
}
# The same kinds of plan on 2 processes (--world 2).
PLANS_2 = {
    "gpt2 data 2": ("gpt2", "spmd", {"data": 2, "tensor": 1}),
    "gpt2 data 2, ZeRO": ("gpt2", "zero", {"data": 2, "tensor": 1}),
    "gpt2 tensor 2, searched": ("gpt2", "spmd", {"data": 1, "tensor": 2}),
    "gpt2 tensor 2, weights sharded": ("gpt2", "tight", {"data": 1, "tensor": 2}),
    "gpt2 pipeline 2, 1F1B": ("gpt2", "1f1b", {"pipeline": 2, "data": 1, "micro_batch": 2}),
    "gpt2 pipeline 2, GPipe": ("gpt2", "gpipe", {"pipeline": 2, "data": 1, "micro_batch": 2}),
    "gpt2 pipeline 2, interleaved": ("gpt2", "interleaved-1f1b", {"pipeline": 2, "data": 1, "micro_batch": 2,
                                                                  "virtual_stages": 2}),
    "gpt2 pipeline 2, ZB-H1": ("gpt2", "zb-h1", {"pipeline": 2, "data": 1, "micro_batch": 2}),
    "gpt2 pipeline 2, ZB-V": ("gpt2", "zb-v", {"pipeline": 2, "data": 1, "micro_batch": 2, "virtual_stages": 2}),
    "gpt2 data 2, recomputed": ("gpt2", "recompute", {"data": 2, "tensor": 1}),
    "gpt2 data 2, selective": ("gpt2", "selective", {"data": 2, "tensor": 1}),
    "gpt2 pipeline 2, 1F1B, recomputed": ("gpt2", "1f1b", {"pipeline": 2, "data": 1, "micro_batch": 2,
                                                           "recompute": "full"}),
    "gpt2 data 2, FP8": ("gpt2", "fp8", {"data": 2, "tensor": 1}),
    "llama data 2": ("llama", "spmd", {"data": 2, "tensor": 1}),
    "llama tensor 2, searched": ("llama", "spmd", {"data": 1, "tensor": 2}),
    "llama pipeline 2, 1F1B": ("llama", "1f1b", {"pipeline": 2, "data": 1, "micro_batch": 2}),
    "llama data 2, selective": ("llama", "selective", {"data": 2, "tensor": 1}),
}
TABLES = {4: PLANS, 2: PLANS_2}
SMOKE = ["gpt2 data 4", "gpt2 pipeline 2 x data 2, 1F1B"]


def layout(plan) -> str:
    """What a plan does, in a few words: the weights sharded per mesh axis, ZeRO, stages."""
    if plan.sharding:
        weights = [n for n in plan.sharding["leaves"] if n.endswith("weight")]
        placed = plan.placements()
        counts = [sum(placed[n][a] != "R" for n in weights) for a in range(2)]
        zero = sum(1 for n in weights if n in plan.sharding.get("zero", {}))
        return (f"{counts[0]}/{counts[1]} of {len(weights)} weights sharded on data/tensor"
                + (f", ZeRO on {zero}" if zero else "") + _recomputed(plan.sharding.get("recompute"))
                + (", linears in fp8" if plan.precision == "fp8" else ""))
    return (f"{plan.pipeline * plan.virtual_stages} stages, {plan.num_micro_batches()} micro-batches"
            + (", stage layout searched" if plan.stage_sharding else "")
            + _recomputed(json.loads(plan.to_json()).get("recompute")))


def _recomputed(recompute) -> str:
    """A plan's recompute (the sharding's True / False / "selective", the plan's names)."""
    if recompute == "selective":
        return ", selective recomputation"
    return ", recomputed" if recompute in (True, "full") else ""


# ---- the ranks ---------------------------------------------------------------------------------
def _peak_rss_reset() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current resident set (Linux >= 4.0)
    except OSError:
        pass


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _detect(rank: int, store: str, world: int, out: str) -> None:
    import shardwise
    from shardwise.profile import sharing

    torch.set_num_threads(threads(world))
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    try:
        cluster = shardwise.Cluster.detect(measure_links=True, measure_compute=True)
        shared_cores = sharing(cluster, rank)[0] > 1
        if rank == 0:
            with open(out, "w") as f:
                json.dump({"cluster": json.loads(cluster.to_json()), "shared_cores": shared_cores}, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _run(rank: int, store: str, world: int, plans: list[tuple[str, str]], steps: int, warmup: int,
         specs: list, shared_by: float, concurrent: int, shared_cores: bool, out: str) -> None:
    """Every plan of the run in the same processes: each built and its memory measured in
    turn, then their steps timed in interleaved rounds, with passes over all their ops between
    the rounds. ``plans``: (plan JSON, model name) each."""
    import shardwise
    from shardwise.profile import measure_collectives, measure_optimizer, measure_specs, measure_sync_wait
    from shardwise.runtime import traffic

    torch.set_num_threads(threads(world))
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    try:
        # Every collective kind over all the ranks and over each smaller group size that
        # divides them (its groups at once), fitted to alpha + beta x bytes: the plan's groups
        # of each size are priced by the fit of their kind (Gloo's all_gather, reduce_scatter
        # and all_to_all are not all-reduces).
        fits = measure_collectives(repeats=3, subgroups=True)
        optimizer = measure_optimizer(group=dist.group.WORLD)  # AdamW's step, every rank at once
        ids, y = batch()
        runs = [_built(shardwise, plan_json, model_name, ids, y) for plan_json, model_name in plans]
        # Each round runs one step of every plan, starting one plan further on each round: a
        # slow minute of this shared host, or a plan that leaves the caches or the heap to the
        # next one unlike the others, falls on every plan alike, not on the plans timed then.
        # Spread over the timed rounds, one pass over every plan's ops at the shapes each
        # rank runs them (issue 46, item 7; one spec per distinct call of all the plans),
        # timed by as many ranks at once as there are cores, the others waiting, at the rate
        # the ranks share (x compute_alone): each op's median over the passes is what
        # Plan.price(profile=) prices every plan with. So the prices and the steps are taken
        # in the same minutes: the host's speed moved by 15% from one minute to the next here
        # (2026-12-07, AMD EPYC), which, with the ops timed before the steps, scaled every
        # prediction against every measurement alike.
        # Beside each pass, what a collective a program waits on costs beyond its fit
        # (profiled_cost.h, sync_wait): the ranks' and cores', not a plan's, so one figure for
        # every plan, the median over the passes. Measured once before the run (until
        # 2026-12-08), it read 0.54 to 4.40 ms at 4 processes over five runs of the same code,
        # and the tensor-parallel plans, dozens of blocking collectives a step, followed it
        # (run c4: 4.40 ms, those plans 1.14-1.25 of measured; priced at 0 ms, 0.93-1.02).
        passes, waits, every = [], [], max(1, steps // _PROFILE_PASSES)
        for turn in range(warmup + steps):
            if turn >= warmup and (turn - warmup) % every == 0 and len(passes) < _PROFILE_PASSES:
                passes.append(measure_specs(specs, progress=False, repeats=1, group=dist.group.WORLD,
                                            budget_s=(120 + 20 * len(plans)) / _PROFILE_PASSES,
                                            shared_by=shared_by, concurrent=concurrent))
                waits.append(measure_sync_wait(group=dist.group.WORLD, rounds=3, shared_cores=shared_cores))
            for k in range(len(runs)):
                run = runs[(k + turn) % len(runs)]
                dist.barrier()
                traffic.reset()
                start = time.perf_counter()
                run["loss"] = run["step"]()
                dist.barrier()
                if turn >= warmup:
                    run["times"].append(time.perf_counter() - start)
                    run["traffic"] = run["traffic"] or traffic.snapshot()
        ops = _median_profile(passes)
        ops["optimizer"] = optimizer
        ops["collectives"] = fits["collectives"]
        ops["skipped"].update(fits["skipped"])
        ops["sync_wait"] = statistics.median(waits)  # the run's, every plan's
        results = []
        for run in runs:
            peak = torch.tensor(run["peak"])
            dist.all_reduce(peak, op=dist.ReduceOp.MAX)
            results.append({"step": statistics.median(run["times"]), "steps": run["times"],
                            "memory": float(peak[0]), "resident": float(peak[1]), "held": float(peak[2]),
                            "traffic": run["traffic"], "loss": float(run["loss"])})
        if rank == 0:
            with open(out, "w") as f:
                json.dump({"plans": results, "ops": ops}, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


_PROFILE_PASSES = 5  # the op timings' samples (shardwise.profile's default repeats)


def _median_profile(passes: list[dict]) -> dict:
    """One profile document from passes of measure_specs (one sample of each op each): each
    op's forward, backward (and selective) the median over the passes that measured it; an op
    that no pass measured keeps the first pass's reason for skipping it."""
    ops: dict[str, dict] = {}
    for sig in dict.fromkeys(sig for p in passes for sig in p["ops"]):
        taken = [p["ops"][sig] for p in passes if sig in p["ops"]]
        ops[sig] = {key: statistics.median(t[key] for t in taken) for key in taken[0]}
    skipped: dict[str, str] = {}
    for p in passes:
        for sig, why in p["skipped"].items():
            if sig not in ops:
                skipped.setdefault(sig, why)
    doc = {"device": passes[0]["device"], "ops": ops, "skipped": skipped}
    slicing = [p.get("time_slicing", 1.0) for p in passes]
    if max(slicing) > 1.0:
        doc["time_slicing"] = statistics.median(slicing)
    return doc


def _built(shardwise, plan_json: str, model_name: str, ids, y) -> dict:
    """One plan's engine and optimizer, built beside the plans before it, and its peak memory:
    the tensors alive at once in its second step (the first makes the optimizer's state), not
    counting what existed before its engine (the user's module, the other plans'), and the
    growth of the resident set's peak from before the engine to after that step."""
    model = build(model_name)
    before = live_storages()  # the user's module and the plans built before: not this plan's
    _peak_rss_reset()
    base = _rss_kib("VmRSS")
    engine = shardwise.parallelize(model, (ids, y), plan=shardwise.Plan.from_json(plan_json), verify=False)
    optimizer = engine.optimizer(torch.optim.AdamW, lr=1e-4)  # ZeRO plans shard its state

    def step():
        optimizer.zero_grad()
        loss = engine.train_step(ids, y)
        optimizer.step()
        return loss

    step()
    optimizer.zero_grad()
    with PeakTensorBytes(exclude=before) as tensors:
        engine.train_step(ids, y)
        optimizer.step()
    resident = float(_rss_kib("VmHWM") - base) * 1024
    return {"step": step, "times": [], "traffic": None, "loss": None,
            "peak": [float(tensors.peak), resident, float(tensors.live)]}


def _spawn(fn, world: int, *args) -> dict | str:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        spawn_ranks(fn, (os.path.join(tmp, "store"), world, *args, out), world)
        with open(out) as f:
            return f.read()


# ---- plans and predictions ---------------------------------------------------------------------
def make_plan(shardwise, row: tuple, cluster, graphs: dict):
    """(the plan, the graph it is priced on) for one row of PLANS / PLANS_2."""
    model_name, kind, d = row
    graph = graphs[model_name]
    mesh = (d.get("data", 1), d.get("tensor", 1))
    if kind == "fp8":
        return shardwise.plan(graph, cluster, global_batch=BATCH, mesh=mesh, zero=False, recompute=False,
                              precision="fp8"), graph
    if kind in ("spmd", "zero", "tight", "recompute", "selective"):
        def with_memory(memory: float):
            doc = json.loads(cluster.to_json())
            doc["device_types"][0]["memory_bytes"] = int(memory / shardwise._C.MEMORY_FRACTION)
            return shardwise.Cluster.from_json(json.dumps(doc))

        replicated = shardwise.plan(graph, cluster, global_batch=BATCH, mesh=mesh, zero=False, recompute=False)
        if kind == "spmd":
            return replicated, graph
        if kind in ("recompute", "selective"):  # the search's layout with that recomputation
            return shardwise.plan(graph, cluster, global_batch=BATCH, mesh=mesh, zero=False,
                                  recompute="full" if kind == "recompute" else "selective"), graph
        if kind == "zero":  # the optimizer state must shard over the data axis (ZeRO-1 saves at most
            # 3/4 of Adam's 8 of 16 bytes a float32 parameter: at 0.75 the search shards weights instead)
            return shardwise.plan(graph, with_memory(0.85 * replicated.predicted_memory()[0]), global_batch=BATCH,
                                  mesh=mesh), graph
        # halfway between the least any plan needs and the replicated one (tests/python/conftest.py)
        least = shardwise.plan(graph, with_memory(1), global_batch=BATCH, mesh=mesh, zero=False)
        memory = (least.predicted_memory()[0] + replicated.predicted_memory()[0]) / 2
        return shardwise.plan(graph, with_memory(memory), global_batch=BATCH, mesh=mesh, zero=False), graph
    # Completed here with its stages' layout on the profiled cluster (what the run uses).
    graph = pipeline_graph(shardwise, graphs, model_name, d)
    plan = shardwise.Plan.manual(graph, cluster, pipeline=d["pipeline"], data=d["data"], tensor=1,
                                 global_batch=BATCH, micro_batch=d["micro_batch"], schedule=kind,
                                 virtual_stages=d.get("virtual_stages", 1), recompute=d.get("recompute", False))
    return plan.complete(graph, cluster), graph


def pipeline_graph(shardwise, graphs: dict, model_name: str, d: dict):
    """A pipelined plan's graph, captured as parallelize captures its model: at one micro-batch
    of the data axis (kept in ``graphs`` by model and rows)."""
    rows = d["micro_batch"] * d["data"]
    key = f"{model_name}@{rows}"
    if key not in graphs:
        ids, y = batch()
        graphs[key] = shardwise.capture(build(model_name), (ids[:rows], y[:rows]))
    return graphs[key]


def load_profile(shardwise, measured_ops: dict):
    """The shardwise.Profile of the op times a plan's processes measured (``_run``'s "ops")."""
    return shardwise.Profile.from_json(json.dumps({"format": "shardwise.profile", "version": 1, **measured_ops}))


def saved_plans(shardwise, rows: list[dict], table: dict):
    """Each saved row's (plan, the graph it is priced on), the models captured once each: what
    --reprice and step_cpu.py price a saved run's plans with."""
    graphs = {}
    for model_name in sorted({table[r["plan"]][0] for r in rows}):
        ids, y = batch()
        graphs[model_name] = shardwise.capture(build(model_name), (ids, y))
    for r in rows:
        if "plan_json" not in r:
            raise SystemExit(f"{r['plan']}: the saved run has no plan and op times (saved before --reprice)")
        model_name, _, d = table[r["plan"]]
        graph = pipeline_graph(shardwise, graphs, model_name, d) if "pipeline" in d else graphs[model_name]
        yield shardwise.Plan.from_json(r["plan_json"]), graph


def reprice(shardwise, rows: list[dict], cluster, table: dict) -> None:
    """Each saved row priced again, in place, from its saved plan and op times (--reprice): what a
    change to the cost model does to the same measurements, without running the plans again."""
    for r, (plan, graph) in zip(rows, saved_plans(shardwise, rows, table)):
        ops = load_profile(shardwise, r["profile"])
        before = r["predicted_step"]
        profiled = plan.price(graph, cluster, profile=ops)
        analytic = plan.price(graph, cluster)
        r["predicted_step"] = profiled.predicted_step_time()
        r["analytic_step"] = analytic.predicted_step_time()
        r["predicted_memory"] = analytic.predicted_memory()[0]
        parts = ", ".join(f"{k} {v:.3f}" for k, v in sorted(profiled.breakdown().items()) if v)
        print(f"  {r['plan']}: predicted {before:.3f} s -> {r['predicted_step']:.3f} s "
              f"(measured {r['step']:.3f} s; {parts})")


def predicted_traffic(plan) -> dict:
    out: dict[str, float] = {}
    for c in plan.collectives():
        out[c["kind"]] = out.get(c["kind"], 0.0) + c["bytes"] * c["count"]
    return out


def _sliced(profile: dict) -> str:
    """The profile's time-slicing factor where its ranks outnumbered the cores (profile.py)."""
    factor = profile.get("time_slicing", 1.0)
    return f", x{factor:.3f} for the time-sliced cores" if factor > 1.0 else ""


def _mb(x: float | None) -> str:
    return "-" if x is None else f"{x / 1e6:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=15, help="timed steps (their median is the step time)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps before them")
    parser.add_argument("--smoke", action="store_true", help="two plans, one step (tests)")
    parser.add_argument("--svg", default=None, help="write the predicted-vs-measured scatter here")
    parser.add_argument("--json", default=None)
    parser.add_argument("--only", nargs="*", default=None, help="run these plans (names as listed)")
    parser.add_argument("--world", type=int, choices=sorted(TABLES), default=WORLD,
                        help="processes: 4 runs PLANS, 2 runs PLANS_2")
    parser.add_argument("--from-json", default=None,
                        help="report (and --record) a run saved with --json instead of running one")
    parser.add_argument("--reprice", action="store_true",
                        help="with --from-json: price the saved plans again with the saved op times and this "
                             "build's cost model (the measurements stay as they were)")
    from _results import add_record_argument

    add_record_argument(parser)
    args = parser.parse_args()
    if args.record and not args.svg:
        args.svg = os.path.join(os.path.dirname(os.path.abspath(__file__)), "images",
                                "fidelity.svg" if args.world == WORLD else f"fidelity-{args.world}.svg")
    import shardwise
    from shardwise.profile import plan_specs, sharing

    torch.set_num_threads(1)
    world = 4 if args.smoke else args.world
    table = TABLES[world]
    names = SMOKE if args.smoke else args.only or list(table)
    unknown = [n for n in names if n not in table]
    if unknown:
        parser.error(f"unknown plans {unknown}; known at --world {world}: {list(table)}")
    if args.steps < 1 or args.warmup < 0:  # a step time is the median of the timed steps
        parser.error(f"--steps {args.steps} --warmup {args.warmup}: at least one timed step, no negative warm-up")
    steps, warmup = (1, 1) if args.smoke else (args.steps, args.warmup)
    print(machine_line())
    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        cluster = shardwise.Cluster.from_json(json.dumps(saved["cluster"]))
        # A run of the other world reported (and --record'ed) as this one's would replace the
        # wrong table: the saved cluster's ranks and plans must be this world's.
        foreign = [r["plan"] for r in saved["rows"] if r["plan"] not in table]
        if len(cluster.devices) != world or foreign:
            parser.error(f"{args.from_json} holds a run on {len(cluster.devices)} ranks (plans not of --world "
                         f"{world}: {foreign}); pass the --world it ran at")
        if args.reprice:
            reprice(shardwise, saved["rows"], cluster, table)
        report(args, saved["rows"], cluster, world, len(saved["rows"][0]["steps"]),
               saved["rows"][0].get("warmup", 1))  # runs saved before --warmup had one
        return
    detected = json.loads(_spawn(_detect, world))
    cluster = shardwise.Cluster.from_json(json.dumps(detected["cluster"]))
    device = cluster.device_of(0)
    print(f"profiled: {cluster.name}\n  peak f32 {device['peak_flops']['f32'] / 1e9:.1f} GFLOP/s per rank, "
          f"bf16 {device['peak_flops']['bf16'] / 1e9:.1f}, memory bandwidth {device['memory_bandwidth'] / 1e9:.2f} "
          f"GB/s; links " + ", ".join(f"{link['name']} {link['bandwidth'] / 1e9:.2f} GB/s, "
                                      f"{link['latency'] * 1e6:.0f} us"
                                      for link in json.loads(cluster.to_json())["links"])
          + f"; a collective beside compute adds {shardwise._C.cluster_overlap_interference(cluster._core):.2f} of "
          f"its time (overlap_interference); {'ranks sharing cores' if detected['shared_cores'] else 'a core each'}")
    shared_by, concurrent = sharing(cluster, 0)  # one node: every rank's
    graphs = {}
    for model_name in sorted({table[n][0] for n in names}):
        ids, y = batch()
        graphs[model_name] = shardwise.capture(build(model_name), (ids, y))
    planned = [make_plan(shardwise, table[name], cluster, graphs) for name in names]
    specs: dict[str, dict] = {}  # one per distinct call of all the plans (plan_specs' merge)
    for plan, graph in planned:
        for spec in plan_specs(graph, cluster, [plan]):
            kept = specs.setdefault(spec["signature"], spec)
            kept["selective"] = kept.get("selective", False) or spec.get("selective", False)
    measured = json.loads(_spawn(_run, world, [(plan.to_json(), table[name][0]) for name, (plan, _) in
                                               zip(names, planned)],
                                 steps, warmup, list(specs.values()), shared_by, concurrent,
                                 detected["shared_cores"]))
    ops = load_profile(shardwise, measured["ops"])
    print(f"  {len(ops.ops)} of {len(specs)} distinct ops of the {len(names)} plans measured at the ranks' shapes"
          f"{_sliced(measured['ops'])}, in passes between the steps' rounds ({warmup} untimed and {steps} timed, "
          "one step of every plan a round); a blocking collective waits "
          f"{measured['ops']['sync_wait'] * 1e3:.2f} ms beyond its fit (sync_wait, the median of the passes')",
          flush=True)
    rows = []
    for name, (plan, graph), run in zip(names, planned, measured["plans"]):
        profiled = plan.price(graph, cluster, profile=ops)
        rows.append({"plan": name, "layout": layout(plan), "predicted_step": profiled.predicted_step_time(),
                     "plan_json": plan.to_json(), "profile": measured["ops"],
                     "analytic_step": plan.predicted_step_time(), "ops_measured": len(ops.ops),
                     "ops_asked": len(specs), "warmup": warmup, "interleaved": True,
                     "predicted_memory": plan.predicted_memory()[0], "predicted_traffic": predicted_traffic(plan),
                     **{k: run[k] for k in ("step", "steps", "memory", "resident", "held", "traffic", "loss")}})
        r = rows[-1]
        print(f"  {name}: step {r['step']:.3f} s measured, {r['predicted_step']:.3f} s predicted "
              f"({r['analytic_step']:.3f} s by the analytic model); "
              f"memory {_mb(r['memory'])} MB measured ({_mb(r['held'])} held between steps, resident growth "
              f"{_mb(r['resident'])}), {_mb(r['predicted_memory'])} MB predicted", flush=True)
    report(args, rows, cluster, world, steps, warmup)


def report(args, rows: list[dict], cluster, world: int, steps: int, warmup: int) -> None:
    """The table, the figures against the bar, and (--svg, --json, --record) their files."""
    import shardwise

    device = cluster.device_of(0)
    print(f"\n{len(rows)} plans, {world} Gloo processes, batch {BATCH} x seq {SEQ}, float32, "
          f"median of {steps} steps after {warmup} untimed"
          + (", every plan a step a round" if rows[0].get("interleaved") else ""))
    print("| plan | layout | step measured (s) | predicted (s) | predicted / measured | analytic (s) | "
          "peak memory measured (MB) | predicted (MB) | predicted / measured | resident growth (MB) | "
          "bytes per step measured, rank 0 (MB by kind) | predicted (MB by kind) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    recorded = []
    for r in rows:
        kinds = sorted(set(r["traffic"] or {}) | set(r["predicted_traffic"]))
        got = ", ".join(f"{k} {_mb((r['traffic'] or {}).get(k, {}).get('bytes', 0))}" for k in kinds
                        if k in (r["traffic"] or {}))
        want = ", ".join(f"{k} {_mb(v)}" for k, v in sorted(r["predicted_traffic"].items())) or "- (not listed)"
        print(f"| {r['plan']} | {r['layout']} | {r['step']:.3f} | {r['predicted_step']:.3f} | "
              f"{r['predicted_step'] / r['step']:.2f} | {r['analytic_step']:.3f} | {_mb(r['memory'])} | "
              f"{_mb(r['predicted_memory'])} | {r['predicted_memory'] / r['memory']:.2f} | {_mb(r['resident'])} | "
              f"{got or '-'} | {want} |")
        recorded.append([r["plan"], r["layout"], r["step"], r["predicted_step"], r["predicted_step"] / r["step"],
                         r["analytic_step"], r["memory"] / 1e6, r["predicted_memory"] / 1e6,
                         r["predicted_memory"] / r["memory"], r["resident"] / 1e6, got or None, want])
    ratios = [r["predicted_step"] / r["step"] for r in rows]
    memory_ratios = [r["predicted_memory"] / r["memory"] for r in rows]
    print(f"\nstep time predicted / measured: median {statistics.median(ratios):.2f}, "
          f"range {min(ratios):.2f} .. {max(ratios):.2f}; peak memory: median {statistics.median(memory_ratios):.2f}, "
          f"range {min(memory_ratios):.2f} .. {max(memory_ratios):.2f}")
    order = sorted(rows, key=lambda r: r["step"])
    predicted_order = sorted(rows, key=lambda r: r["predicted_step"])
    print(f"fastest measured: {order[0]['plan']}; fastest predicted: {predicted_order[0]['plan']}")
    bar = against_the_bar(rows)
    print(bar)
    if args.svg:
        write_scatter(args.svg, rows, cluster.name, world)
        print(f"scatter: {args.svg}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cluster": json.loads(cluster.to_json()), "rows": rows}, f, indent=1)
    if args.record:
        from _machine import cpu_model
        from _results import record

        link = json.loads(cluster.to_json())["links"]
        record("fidelity" if world == 4 else f"fidelity-{world}", recorded, {
            "machine": f"{cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}, Gloo",
            "columns": ["plan", "layout", "step measured (s)", "predicted (s)", "predicted / measured",
                        "analytic (s)", "peak memory measured (MB)", "predicted (MB)", "memory predicted / measured",
                        "resident growth (MB)", "bytes per step measured, rank 0 (MB by kind)",
                        "predicted (MB by kind)"],
            "formats": {"step measured (s)": ".3f", "predicted (s)": ".3f", "predicted / measured": ".2f",
                        "analytic (s)": ".3f",
                        "peak memory measured (MB)": ".2f", "predicted (MB)": ".2f",
                        "memory predicted / measured": ".2f", "resident growth (MB)": ".2f"},
            "notes": f"{world} Gloo processes, batch {BATCH} x seq {SEQ}, float32, median of {steps} steps "
                     f"after {warmup} untimed. Profiled: "
                     f"peak f32 {device['peak_flops']['f32'] / 1e9:.1f} GFLOP/s per rank, bf16 "
                     f"{device['peak_flops']['bf16'] / 1e9:.1f}, memory bandwidth "
                     f"{device['memory_bandwidth'] / 1e9:.2f} GB/s; links "
                     + ", ".join(f"{x['name']} {x['bandwidth'] / 1e9:.2f} GB/s, {x['latency'] * 1e6:.0f} us"
                                 for x in link)
                     + f"; overlap_interference {shardwise._C.cluster_overlap_interference(cluster._core):.2f}"
                     + f"; sync_wait {rows[0]['profile'].get('sync_wait', 0.0) * 1e3:.2f} ms"
                     + ". Predicted: each plan priced with its ops timed at its ranks' shapes"
                     + (", every plan's ops timed in passes between the steps' interleaved rounds, in the plans' "
                        "processes" if rows[0].get("interleaved") else " in its own processes before its run")
                     + " (the analytic model's figure beside it)"
                     + f". Step time predicted / measured: median {statistics.median(ratios):.2f}, range "
                     f"{min(ratios):.2f} to {max(ratios):.2f}; peak memory (tensors): median "
                     f"{statistics.median(memory_ratios):.2f}, range {min(memory_ratios):.2f} to "
                     f"{max(memory_ratios):.2f}. {bar}"})


def kendall_tau(pairs: list[tuple[float, float]]) -> float:
    """Kendall's tau-a over (measured, predicted) pairs: concordant minus discordant pairs over
    all pairs (ties count as neither)."""
    concordant = discordant = 0
    for i, (a1, b1) in enumerate(pairs):
        for a2, b2 in pairs[i + 1:]:
            sign = (a1 - a2) * (b1 - b2)
            concordant += sign > 0
            discordant += sign < 0
    total = len(pairs) * (len(pairs) - 1) // 2
    return (concordant - discordant) / total if total else 0.0


def against_the_bar(rows: list[dict]) -> str:
    """Issue 46's bar, measured: plans within +-25% in step time and +-15% in peak memory,
    Kendall's tau of the step times, and per model the measured step of the plan predicted
    fastest over the fastest measured (the plan the planner would pick, within 10%)."""
    steps = [r["predicted_step"] / r["step"] for r in rows]
    memory = [r["predicted_memory"] / r["memory"] for r in rows if r["memory"]]
    picked = []
    for model in sorted({r["plan"].split()[0] for r in rows}):
        mine = [r for r in rows if r["plan"].split()[0] == model]
        chosen = min(mine, key=lambda r: r["predicted_step"])
        best = min(mine, key=lambda r: r["step"])
        picked.append(f"{model} {chosen['step'] / best['step']:.2f}")
    return (f"Within 25% in step time: {sum(0.75 <= x <= 1.25 for x in steps)} of {len(steps)}; within 15% in "
            f"memory: {sum(0.85 <= x <= 1.15 for x in memory)} of {len(memory)}. Kendall tau, step time: "
            f"{kendall_tau([(r['step'], r['predicted_step']) for r in rows]):.3f}; peak memory: "  # (0.6985 is not 0.70)
            f"{kendall_tau([(r['memory'], r['predicted_memory']) for r in rows]):.2f}. The plan predicted "
            f"fastest, measured against the fastest measured: {', '.join(picked)}.")


def write_scatter(path: str, rows: list[dict], cluster_name: str, world: int = WORLD) -> None:
    from _svg import PALETTE, Panel, write_chart

    step = Panel("Step time", "measured (s)", "predicted (s)")
    memory = Panel("Peak memory per rank", "measured (MB)", "predicted (MB)")
    models = sorted({r["plan"].split()[0] for r in rows})
    for panel, key, scale in ((step, "step", 1.0), (memory, "memory", 1e-6)):
        values = [v * scale for r in rows for v in (r[key], r["predicted_" + key])]
        lo, hi = min(values) / 1.5, max(values) * 1.5
        panel.add("predicted = measured", [(lo, lo), (hi, hi)], "#999999", dashed=True, markers=False)
        for i, model in enumerate(models):
            points = [(r[key] * scale, r["predicted_" + key] * scale) for r in rows if r["plan"].startswith(model)]
            panel.add(model, points, PALETTE[i], line=False)
    legend = [("predicted = measured", "#999999", True, "circle")] + \
             [(m, PALETTE[i], False, "circle") for i, m in enumerate(models)]
    write_chart(path, [step, memory], legend, f"{len(rows)} plans on {world} Gloo processes; {cluster_name[:80]}")


if __name__ == "__main__":
    main()
