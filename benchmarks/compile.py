"""Compiled rank programs (issue 49, item 4, in part): shardwise eager and compiled against DDP
eager and DDP under torch.compile, side by side.

    python benchmarks/compile.py            # spawns 2 and 4 Gloo processes on this machine
    python benchmarks/compile.py --record   # + the table into results/compile.json and the README

The same model (TinyGPT), global batch and Gloo world: each rank trains with
``shardwise.parallelize(..., mesh=(world, 1))`` eagerly and with ``compile=True`` (inductor),
and with ``DistributedDataParallel`` eagerly and under ``torch.compile`` (inductor, the
model compiled inside DDP as torch's docs do it), in turn between barriers, and reports the
median step time of each (forward, backward, gradient all-reduce, AdamW step), the ratios
ours compiled / ours eager and ours compiled / DDP compiled, and each compiled side's first
step (the compile, on the CPU). The issue's targets: ours compiled <= 0.87x ours eager and
<= 1.0x the compiled peer. FSDP2 under torch.compile and a LLaMA-like model are not here yet.
Timing never fails anything.
"""
from __future__ import annotations

import json
import os
import statistics
import time

import torch
import torch.distributed as dist

from _machine import cpu_model
from _workers import (eager_step, finish_worker, join_gloo, run_world, size_line, timed_rounds, tiny_gpt_arguments,
                      tiny_gpt_twins, token_batch)

SIDES = ("ours eager", "ours compiled", "DDP eager", "DDP compiled")


def _worker(rank: int, world: int, store: str, args, out: str) -> None:
    import shardwise

    join_gloo(rank, world, store)
    eager_model, compiled_model = tiny_gpt_twins(args)
    ddp_eager_model, ddp_compiled_model = tiny_gpt_twins(args)
    batch = token_batch(args, eager_model.cfg.vocab)
    cluster = shardwise.Cluster.preset("cpu", world)
    engines = {"ours eager": shardwise.parallelize(eager_model, batch, mesh=(world, 1), cluster=cluster),
               "ours compiled": shardwise.parallelize(compiled_model, batch, mesh=(world, 1), cluster=cluster,
                                                      compile=True)}
    ddps = {"DDP eager": torch.nn.parallel.DistributedDataParallel(ddp_eager_model),
            "DDP compiled": torch.nn.parallel.DistributedDataParallel(torch.compile(ddp_compiled_model))}
    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=1e-3) for name, m in {**engines, **ddps}.items()}
    share = args.batch // world
    local = tuple(t[rank * share:(rank + 1) * share] for t in batch)
    losses = {name: [] for name in SIDES}
    first = {}

    def ours(name):
        def run():
            optimizers[name].zero_grad()
            losses[name].append(engines[name].train_step(*batch).detach())
            optimizers[name].step()
        return run

    def theirs(name):
        return lambda: eager_step(ddps[name], optimizers[name], local, losses[name])

    steps = {name: (ours if name.startswith("ours") else theirs)(name) for name in SIDES}
    for name, step in steps.items():  # the first step of each: the compiled sides compile here
        dist.barrier()
        start = time.perf_counter()
        step()
        first[name] = time.perf_counter() - start
    times, _ = timed_rounds(steps, args.warmup, args.steps)
    # The same work: each side's losses over the global batch (DDP's: its rank's share, averaged).
    stacked = {name: torch.stack(v) for name, v in losses.items()}
    for name in ("DDP eager", "DDP compiled"):
        dist.all_reduce(stacked[name])
        stacked[name] /= world
    base = stacked["ours eager"]
    loss_diff = max(((v - base).abs() / base.abs()).max().item() for v in stacked.values())
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"median": {k: statistics.median(v) for k, v in times.items()}, "first": first,
                       "loss_diff": loss_diff}, f)
    finish_worker()


def main() -> None:
    from _results import record

    args = tiny_gpt_arguments(__doc__.splitlines()[0])
    load_before = os.getloadavg()[0]
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, load average {load_before:.2f}, torch "
          f"{torch.__version__}, Gloo; {size_line(args)}")
    print("ms: median step time (rank 0); first s: the first step (compiling, for the compiled sides); loss diff: "
          "the largest relative difference of any side's losses from ours eager's (the same work)")
    columns = ["world", *(f"{s} ms" for s in SIDES), "compiled / eager", "compiled / DDP compiled",
               "ours first s", "DDP first s", "loss diff"]
    print("  ".join(f"{c:>14}" for c in columns))
    rows = []
    for world in (int(w) for w in args.worlds.split(",")):
        r = run_world(_worker, world, args)
        m, first = r["median"], r["first"]
        row = [world, *(m[s] * 1e3 for s in SIDES), m["ours compiled"] / m["ours eager"],
               m["ours compiled"] / m["DDP compiled"], first["ours compiled"], first["DDP compiled"], r["loss_diff"]]
        print("  ".join(f"{v:>14.3g}" if isinstance(v, float) else f"{v:>14}" for v in row))
        rows.append(row)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    if args.record:
        record("compile", rows, {
            "machine": f"{cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}, Gloo",
            "columns": columns,
            "formats": {**{f"{s} ms": ".1f" for s in SIDES}, "compiled / eager": ".2f",
                        "compiled / DDP compiled": ".2f", "ours first s": ".1f", "DDP first s": ".1f",
                        "loss diff": ".1e"},
            "notes": f"{size_line(args)}; load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after."})


if __name__ == "__main__":
    main()
