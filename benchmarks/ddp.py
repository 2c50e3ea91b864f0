"""shardwise's data parallelism against torch's DistributedDataParallel, side by side.

    python benchmarks/ddp.py            # spawns 2 and 4 Gloo processes on this machine
    python benchmarks/ddp.py --profile  # + where one step of rank 0 goes, for each
    python benchmarks/ddp.py --record   # + the table into results/ddp.json and the README

The same model (TinyGPT), the same global batch, the same Gloo world: each rank trains with
``shardwise.parallelize(..., mesh=(world, 1))`` (a pure data-parallel plan) and with
``DistributedDataParallel`` over its share of the batch, alternating, and reports the median
step time (forward + backward + gradient all-reduce + AdamW step) of each and their ratio
ours / DDP (the issue's target: <= 1.05), the median over steps of the two's ratio in the
same round (robust to load that drifts), and the CPU time of a step per process (less
sensitive to other load when processes outnumber cores). Timing never fails anything.

Where shardwise's step differs from DDP's: the global batch is given to every rank and
sliced (DDP gets its share directly); the loss is a mean over the global batch, reduced
across ranks (one extra all-reduce of a scalar); gradients are summed, not averaged.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
import torch.distributed as dist

from _machine import cpu_model
from _workers import (add_size_arguments, eager_step, finish_worker, profile_steps, run_world, size_line, timed_rounds,
                      twin_tiny_gpts)


def _worker(rank: int, world: int, store: str, args, out: str) -> None:
    import shardwise

    model, ddp_model, batch = twin_tiny_gpts(rank, world, store, args)
    engine = shardwise.parallelize(model, batch, mesh=(world, 1), cluster=shardwise.Cluster.preset("cpu", world))
    opt = torch.optim.AdamW(engine.parameters(), lr=1e-3)
    ddp = torch.nn.parallel.DistributedDataParallel(ddp_model)
    ddp_opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    share = args.batch // world
    local = tuple(t[rank * share:(rank + 1) * share] for t in batch)

    losses = {"shardwise": [], "ddp": []}  # each step's loss over the global batch

    def ours():
        opt.zero_grad()
        losses["shardwise"].append(engine.train_step(*batch).detach())
        opt.step()

    def theirs():
        eager_step(ddp, ddp_opt, local, losses["ddp"])

    steps = {"shardwise": ours, "ddp": theirs}
    times, cpu = timed_rounds(steps, args.warmup, args.steps)
    # The same weights, batch and steps: the same losses (float32 rounding apart), or the two
    # are not timing the same work. DDP's loss is its rank's share's mean: averaged here.
    ddp_losses = torch.stack(losses["ddp"])
    dist.all_reduce(ddp_losses)
    loss_diff = ((torch.stack(losses["shardwise"]) - ddp_losses / world).abs() / (ddp_losses / world).abs()).max().item()
    everyone = [None] * world
    dist.all_gather_object(everyone, {k: statistics.median(v) for k, v in cpu.items()})
    profiles = profile_steps(steps, rank == 0) if args.profile else {}
    if rank == 0:
        paired = statistics.median(o / d for o, d in zip(times["shardwise"], times["ddp"]))
        with open(out, "w") as f:
            json.dump({"ours": statistics.median(times["shardwise"]), "ddp": statistics.median(times["ddp"]),
                       "paired": paired, "loss_diff": loss_diff, "ours_cpu": sum(c["shardwise"] for c in everyone) / world,
                       "ddp_cpu": sum(c["ddp"] for c in everyone) / world, "profiles": profiles}, f)
    finish_worker()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_size_arguments(parser, layers=2, hidden=256, heads=4, seq=64, batch=16)
    parser.add_argument("--profile", action="store_true", help="torch.profiler table of one step of rank 0")
    from _results import add_record_argument, record

    add_record_argument(parser)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    rows = []
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}, torch "
          f"{torch.__version__}, Gloo; {size_line(args)}")
    print("ms: median step time (rank 0); paired: median over steps of our step time / DDP's in the same round; "
          "CPU ms: median CPU time of a step per process (mean over ranks); loss diff: the largest relative "
          "difference between the two's losses over the global batch at any step (the same work)")
    print(f"{'world':>5}  {'shardwise ms':>12}  {'DDP ms':>8}  {'ours / DDP':>10}  {'paired':>6}  {'CPU ours ms':>11}  "
          f"{'CPU DDP ms':>10}  {'CPU ratio':>9}  {'loss diff':>9}")
    for world in (int(w) for w in args.worlds.split(",")):
        r = run_world(_worker, world, args)
        print(f"{world:>5}  {r['ours'] * 1e3:>12.1f}  {r['ddp'] * 1e3:>8.1f}  {r['ours'] / r['ddp']:>10.2f}  "
              f"{r['paired']:>6.2f}  {r['ours_cpu'] * 1e3:>11.1f}  {r['ddp_cpu'] * 1e3:>10.1f}  "
              f"{r['ours_cpu'] / r['ddp_cpu']:>9.2f}  {r['loss_diff']:>9.1e}")
        rows.append([world, r["ours"] * 1e3, r["ddp"] * 1e3, r["ours"] / r["ddp"], r["paired"], r["ours_cpu"] * 1e3,
                     r["ddp_cpu"] * 1e3, r["ours_cpu"] / r["ddp_cpu"], r["loss_diff"]])
        for name, table in r["profiles"].items():
            print(f"--- profile of rank 0, one step, {name}, world {world} ---\n{table}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    if args.record:
        record("ddp", rows, {
            "machine": f"{cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}, Gloo",
            "columns": ["world", "shardwise ms", "DDP ms", "ours / DDP", "paired", "CPU ours ms", "CPU DDP ms",
                        "CPU ratio", "loss diff"],
            "formats": {"shardwise ms": ".1f", "DDP ms": ".1f", "ours / DDP": ".2f", "paired": ".2f",
                        "CPU ours ms": ".1f", "CPU DDP ms": ".1f", "CPU ratio": ".2f", "loss diff": ".1e"},
            "notes": f"{size_line(args)}; load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after."})


if __name__ == "__main__":
    main()
