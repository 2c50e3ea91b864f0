"""shardwise's ZeRO-3 (every weight sharded over the data axis) against PyTorch's FSDP2
(``fully_shard``), side by side.

    python benchmarks/fsdp.py            # spawns 2 and 4 Gloo processes on this machine
    python benchmarks/fsdp.py --record   # + the table into results/fsdp.json and the README

The same model (TinyGPT), the same global batch, the same Gloo world. Ours: the searched
data-parallel plan with every parameter's placement edited to a shard over the data axis
(dim 0 where the world divides it, else dim 1), so each weight is gathered for its read
(prefetched one read ahead), released after it, gathered again for backward, and its
gradient reduce-scattered: ZeRO-3 as the plan prices it (search/parameter_collectives.h).
FSDP2: ``fully_shard`` on each block, then on the root (reshard after forward, its default
forward prefetch). Both train with AdamW on the rank's shards; each rank reports the median
step time (forward + backward + gradient reduction + AdamW step), the ratio ours / FSDP2, the
bytes our collectives moved in a step, and the largest relative difference between the two's
losses over the global batch (the same work: float32 rounding apart). Timing never fails
anything.
"""
from __future__ import annotations

import json
import os
import statistics

import torch
import torch.distributed as dist

from _machine import cpu_model
from _workers import (eager_step, finish_worker, run_world, size_line, timed_rounds, tiny_gpt_arguments,
                      twin_tiny_gpts)


def zero3_plan(plan, parameters: dict[str, torch.Tensor], world: int):
    """`plan` (data parallel on a (world, 1) mesh) with every parameter sharded over the data axis."""
    import shardwise

    doc = json.loads(plan.to_json())
    for key in ("predicted", "programs"):
        doc.pop(key, None)
    placements = doc["sharding"]["placements"]
    sharded = 0
    for name, tensor in parameters.items():
        if name not in placements:
            continue
        dims = [d for d in range(tensor.dim()) if tensor.shape[d] % world == 0]
        if dims:
            placements[name] = [f"S({dims[0]})", "R"]
            sharded += 1
    doc["sharding"]["zero"] = {}
    return shardwise.Plan.from_json(json.dumps(doc)), sharded


def _worker(rank: int, world: int, store: str, args, out: str) -> None:
    import shardwise
    from shardwise.runtime import traffic
    from torch.distributed.fsdp import fully_shard

    model, theirs_model, batch = twin_tiny_gpts(rank, world, store, args)
    searched = shardwise.plan(shardwise.capture(model, batch), shardwise.Cluster.preset("cpu", world),
                              global_batch=args.batch, mesh=(world, 1), zero=False, recompute=False)
    plan, sharded = zero3_plan(searched, dict(model.named_parameters()), world)
    engine = shardwise.parallelize(model, batch, plan=plan, verify=False)
    opt = engine.optimizer(torch.optim.AdamW, lr=1e-3)
    for block in theirs_model.blocks:
        fully_shard(block)
    fully_shard(theirs_model)
    theirs_opt = torch.optim.AdamW(theirs_model.parameters(), lr=1e-3)
    share = args.batch // world
    local = tuple(t[rank * share:(rank + 1) * share] for t in batch)

    losses = {"shardwise": [], "fsdp2": []}  # each step's loss over the global batch
    moved = {}

    def ours():
        opt.zero_grad()
        traffic.reset()
        losses["shardwise"].append(engine.train_step(*batch).detach())
        opt.step()
        moved.update(traffic.snapshot())

    def fsdp2():
        eager_step(theirs_model, theirs_opt, local, losses["fsdp2"])

    times, _ = timed_rounds({"shardwise": ours, "fsdp2": fsdp2}, args.warmup, args.steps)
    theirs = torch.stack(losses["fsdp2"])
    dist.all_reduce(theirs)  # each rank's share's mean, averaged over the ranks
    theirs = theirs / world
    loss_diff = ((torch.stack(losses["shardwise"]) - theirs).abs() / theirs.abs()).max().item()
    if rank == 0:
        paired = statistics.median(o / t for o, t in zip(times["shardwise"], times["fsdp2"]))
        marks = engine.rank_ir.count('overlap="forward"')
        groups = {line.split("unit_group=")[1].split("}")[0] for line in engine.rank_ir.splitlines()
                  if "unit_group=" in line and "shardwise::all_gather" in line}
        with open(out, "w") as f:
            json.dump({"ours": statistics.median(times["shardwise"]), "fsdp2": statistics.median(times["fsdp2"]),
                       "paired": paired, "loss_diff": loss_diff, "sharded": sharded, "prefetched": marks,
                       "units": len(groups), "moved": moved}, f)
    finish_worker()


def main() -> None:
    from _results import record

    args = tiny_gpt_arguments(__doc__.splitlines()[0])
    rows = []
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}, torch "
          f"{torch.__version__}, Gloo; {size_line(args)}")
    print("ms: median step time (rank 0); paired: median over steps of our step time / FSDP2's in the same round; "
          "sharded: parameters our plan shards; prefetched: its gathers marked prefetched; units: the unit groups "
          "they are gathered in (one flattened all-gather each); collectives: our collective calls in a step "
          "(rank 0); MB moved: what they moved; loss diff: the largest relative difference between the two's "
          "losses over the global batch at any step")
    print(f"{'world':>5}  {'shardwise ms':>12}  {'FSDP2 ms':>8}  {'ours / FSDP2':>12}  {'paired':>6}  {'sharded':>7}  "
          f"{'prefetched':>10}  {'units':>5}  {'collectives':>11}  {'MB moved':>8}  {'loss diff':>9}")
    for world in (int(w) for w in args.worlds.split(",")):
        r = run_world(_worker, world, args)
        megabytes = sum(v["bytes"] for v in r["moved"].values()) / 1e6
        calls = sum(v["calls"] for v in r["moved"].values())
        print(f"{world:>5}  {r['ours'] * 1e3:>12.1f}  {r['fsdp2'] * 1e3:>8.1f}  {r['ours'] / r['fsdp2']:>12.2f}  "
              f"{r['paired']:>6.2f}  {r['sharded']:>7}  {r['prefetched']:>10}  {r['units']:>5}  {calls:>11}  "
              f"{megabytes:>8.2f}  {r['loss_diff']:>9.1e}")
        rows.append([world, r["ours"] * 1e3, r["fsdp2"] * 1e3, r["ours"] / r["fsdp2"], r["paired"], r["sharded"],
                     r["prefetched"], r["units"], calls, megabytes, r["loss_diff"]])
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    if args.record:
        record("fsdp", rows, {
            "machine": f"{cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}, Gloo",
            "columns": ["world", "shardwise ms", "FSDP2 ms", "ours / FSDP2", "paired", "sharded", "prefetched",
                        "units", "collectives", "MB moved", "loss diff"],
            "formats": {"shardwise ms": ".1f", "FSDP2 ms": ".1f", "ours / FSDP2": ".2f", "paired": ".2f",
                        "MB moved": ".2f", "loss diff": ".1e"},
            "notes": f"{size_line(args)}."})


if __name__ == "__main__":
    main()
