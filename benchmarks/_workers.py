"""Pieces the multi-process benchmarks share (ddp.py, fsdp.py, tensor_parallel.py, pipeline.py,
pipeline_memory.py): the TinyGPT size arguments, two TinyGPTs with the same weights in a Gloo
worker, a hand-written pipeline plan, the alternating timed rounds, a profiled step with its
torch.profiler summary, the end of a worker, and the timed steps and peak memory of
long_context.py's and moe.py's runs."""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Callable


def pipeline_plan(global_batch: int, micro_batch: int, schedule: str, stages: int):
    """A pipeline plan with data = tensor = 1 (as tests/python/engine/test_parallelize.py writes one)."""
    import shardwise

    doc = {"format": "shardwise.plan", "version": 1, "data": 1, "tensor": 1, "pipeline": stages,
           "global_batch": global_batch, "micro_batch": micro_batch, "schedule": schedule,
           "virtual_stages": 2 if schedule in ("zb-v", "dualpipe-v") else 1,
           "kfkb_k": 1, "recompute": "none", "zero_stage": 0, "layers_per_stage": [], "precision": "f32"}
    return shardwise.Plan.from_json(json.dumps(doc))


_MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul")
_COLLECTIVES = ("c10d::", "shardwise::", "_c10d_functional", "gloo:", "record_param_comms")


def profile_summary(prof) -> str:
    """One step's self CPU time by kind (torch.profiler key averages): matmuls, attention,
    collectives (the c10d / shardwise ops and their waits), DTensor's Python dispatch, the
    optimizer step (its total) and the rest."""
    rows = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in rows)
    kinds = {"matmul": 0.0, "attention": 0.0, "collectives": 0.0, "DTensor dispatch": 0.0}
    optimizer = 0.0
    for e in rows:
        name = e.key
        if name in _MATMULS:
            kinds["matmul"] += e.self_cpu_time_total
        elif "scaled_dot_product" in name:
            kinds["attention"] += e.self_cpu_time_total
        elif name.startswith(_COLLECTIVES) or "wait" in name:
            kinds["collectives"] += e.self_cpu_time_total
        elif name == "PythonSubclass":
            kinds["DTensor dispatch"] += e.self_cpu_time_total
        elif name.startswith("Optimizer.step"):
            optimizer = max(optimizer, e.cpu_time_total)
    kinds["optimizer step (total)"] = optimizer
    kinds["rest"] = total - sum(kinds.values())
    return f"self CPU {total / 1e3:.1f} ms: " + ", ".join(f"{k} {v / 1e3:.1f}" for k, v in kinds.items())


def add_size_arguments(parser, *, worlds: str = "2,4", layers: int, hidden: int, heads: int, seq: int,
                       batch: int, steps: int | None = 10, warmup: int | None = 3, vocab: int | None = None) -> None:
    """The TinyGPT size and run-length arguments (steps / warmup None: the benchmark has none;
    vocab None: TinyGPT's own 256 rows, no argument)."""
    parser.add_argument("--worlds", default=worlds)
    parser.add_argument("--layers", type=int, default=layers)
    parser.add_argument("--hidden", type=int, default=hidden)
    parser.add_argument("--heads", type=int, default=heads)
    parser.add_argument("--seq", type=int, default=seq)
    parser.add_argument("--batch", type=int, default=batch)
    if vocab is not None:
        parser.add_argument("--vocab", type=int, default=vocab, help="token table rows (GPT-2: 50257)")
    if steps is not None:
        parser.add_argument("--steps", type=int, default=steps)
    if warmup is not None:
        parser.add_argument("--warmup", type=int, default=warmup)


def tiny_gpt_arguments(description: str, extra=None):
    """The parsed arguments of a side-by-side TinyGPT benchmark at the DDP / FSDP2 size (2
    layers, hidden 256, seq 64, global batch 16), with --record; `extra(parser)` adds its own."""
    import argparse

    from _results import add_record_argument

    parser = argparse.ArgumentParser(description=description)
    add_size_arguments(parser, layers=2, hidden=256, heads=4, seq=64, batch=16)
    if extra is not None:
        extra(parser)
    add_record_argument(parser)
    return parser.parse_args()


def join_gloo(rank: int, world: int, store: str) -> None:
    """Joins the Gloo group over the file store, one torch thread per process."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)


def token_batch(args, vocab: int):
    """The global batch of `args` (ids, next ids), the same on every rank."""
    import torch

    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, vocab, (args.batch, args.seq), generator=g)
    return idx, torch.roll(idx, -1, dims=1)


def gpt2_token_table(model) -> None:
    """At a vocabulary other than TinyGPT's own (256 rows), its token table initialised as GPT-2's
    (normal, std 0.02). TinyGPT's N(0, 1) default puts its tied head's logits tens apart; at
    GPT-2's 50,257 rows the softmax then underflows into denormals, which made every matmul
    reading its gradient 10-40x slower on this CPU (both sides alike: a benchmark of denormals)."""
    import torch

    from shardwise.models.tiny_gpt import TinyGPTConfig

    if model.cfg.vocab != TinyGPTConfig.vocab:
        with torch.no_grad():
            model.wte.weight.normal_(0.0, 0.02)


def tiny_gpt_twins(args):
    """Two TinyGPTs of `args`' size with the same weights (seed 0)."""
    import torch

    from shardwise.models.tiny_gpt import TinyGPT, TinyGPTConfig

    cfg = TinyGPTConfig(layers=args.layers, hidden=args.hidden, heads=args.heads, seq=args.seq,
                        vocab=getattr(args, "vocab", TinyGPTConfig.vocab))
    torch.manual_seed(0)
    model, twin = TinyGPT(cfg), TinyGPT(cfg)
    gpt2_token_table(model)
    twin.load_state_dict(model.state_dict())
    return model, twin


def twin_tiny_gpts(rank: int, world: int, store: str, args):
    """Joins the Gloo group (one thread per process); two TinyGPTs of `args`' size with the
    same weights, and the global batch (ids, next ids)."""
    join_gloo(rank, world, store)
    model, twin = tiny_gpt_twins(args)
    return model, twin, token_batch(args, model.cfg.vocab)


def size_line(args) -> str:
    """What a side-by-side TinyGPT benchmark ran: sizes, batch and steps."""
    vocab = f", vocab {args.vocab}" if hasattr(args, "vocab") else ""
    return (f"TinyGPT layers {args.layers}, hidden {args.hidden}, seq {args.seq}{vocab}, global batch {args.batch}; "
            f"median of {args.steps} steps after {args.warmup} of warm-up, one thread per process")


# What every rank of a benchmark imports before its first line: a spawned interpreter imports
# torch, shardwise and transformers again in each rank (4.6 s of CPU each on a 2-core Xeon, so
# 9 s of wall time for 4 ranks, at every spawn: fidelity.py spawns 3 times). Ranks are forks of a
# forkserver that imported them once (tests/python/conftest.py's run_ranks does the same).
RANK_PRELOAD = ["torch", "torch.distributed", "torch.export._trace", "shardwise", "transformers",
                "transformers.models.gpt2.modeling_gpt2"]


def spawn_ranks(fn: Callable, args: tuple, nprocs: int) -> None:
    """``torch.multiprocessing.spawn(fn, args, nprocs, join=True)``, its ranks forked from a
    forkserver that has imported RANK_PRELOAD (started at the first call, kept for the next)."""
    import multiprocessing

    import torch.multiprocessing as mp

    multiprocessing.get_context("forkserver").set_forkserver_preload(RANK_PRELOAD)
    mp.start_processes(fn, args=args, nprocs=nprocs, join=True, start_method="forkserver")


def run_world(worker: Callable, world: int, args) -> dict:
    """`worker(rank, world, store, args, out)` in `world` ranks (spawn_ranks); rank 0's JSON from `out`."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out")
        spawn_ranks(worker, (world, os.path.join(tmp, "store"), args, out), world)
        with open(out) as f:
            return json.load(f)


def eager_step(model, optimizer, batch: tuple, losses: list) -> None:
    """One plain torch training step (the side being compared against), its loss recorded."""
    optimizer.zero_grad()
    loss = model(*batch)
    loss.backward()
    optimizer.step()
    losses.append(loss.detach())


def training_steps(engines: dict, optimizers: dict, batch: tuple, losses: dict) -> dict[str, Callable]:
    """Per engine name, one training step of it (zero_grad, train_step on `batch` with its loss
    recorded in losses[name], the optimizer's step): what timed_rounds takes."""
    def step(name):
        def run():
            optimizers[name].zero_grad()
            losses[name].append(float(engines[name].train_step(*batch)))
            optimizers[name].step()
        return run

    return {name: step(name) for name in engines}


def timed_rounds(steps: dict[str, Callable], warmup: int, count: int) -> tuple[dict, dict]:
    """Each step once per round, in turn, between barriers (so every rank times the same
    step): `warmup` rounds, then `count` timed ones. Returns the wall seconds and this
    process's CPU seconds (all its threads) of each step, per name, timed rounds only."""
    import torch.distributed as dist

    wall = {name: [] for name in steps}
    cpu = {name: [] for name in steps}
    for round_ in range(warmup + count):
        for name, fn in steps.items():
            dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            dist.barrier()
            if round_ >= warmup:
                wall[name].append(time.perf_counter() - t0)
                cpu[name].append(time.process_time() - c0)
    return wall, cpu


def profile_steps(steps: dict[str, Callable], profiled: bool, row_limit: int = 15,
                  width: int = 48) -> dict[str, str]:
    """One more run of each step, between barriers; where `profiled` (this rank), under
    torch.profiler. Returns name -> profile_summary and the key-average table (empty elsewhere)."""
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    tables = {}
    for name, fn in steps.items():
        dist.barrier()
        if profiled:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                fn()
            tables[name] = profile_summary(prof) + "\n" + prof.key_averages().table(
                sort_by="self_cpu_time_total", row_limit=row_limit, max_name_column_width=width)
        else:
            fn()
    return tables


def finish_worker() -> None:
    """Ends a benchmark worker once its results are on disk: every rank at a barrier, the
    process groups destroyed, then os._exit(0).

    Why not return: tensor_parallel.py's ranks aborted ("terminate called without an active
    exception", SIGABRT) in 2 of 33 runs on the 2-core dev box, after their work, during the
    interpreter's finalization (faulthandler showed no Python frame), where torch tears down
    its Gloo and DTensor state in no set order (torch PR 179291 describes the same crash).
    Skipping finalization keeps the exit code about the results.
    """
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def timed_steps_and_peak(engine, optimizer, batch: tuple, steps: int, before: dict) -> tuple[float, float]:
    """A warm-up step, `steps` timed (between barriers), then one more under the peak tensor
    counter (benchmarks/_tensor_memory.py), `before` (the storages alive before the engine was
    made) excluded: the median step's seconds and the largest rank's peak tensor bytes. Every
    rank calls it."""
    import statistics
    import time

    import torch
    import torch.distributed as dist

    from _tensor_memory import PeakTensorBytes

    times = []
    for step in range(1 + steps):
        dist.barrier()
        start = time.perf_counter()
        optimizer.zero_grad()
        engine.train_step(*batch)
        optimizer.step()
        dist.barrier()
        if step:
            times.append(time.perf_counter() - start)
    optimizer.zero_grad()
    with PeakTensorBytes(exclude=before) as tensors:
        engine.train_step(*batch)
        optimizer.step()
    peak = torch.tensor([float(tensors.peak)])
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    return statistics.median(times), float(peak[0])
