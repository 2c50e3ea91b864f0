"""shardwise's data parallelism against torch's DistributedDataParallel, side by side.

    python benchmarks/ddp.py            # spawns 2 and 4 Gloo processes on this machine

The same model (TinyGPT), the same global batch, the same Gloo world: each rank trains with
``shardwise.parallelize(..., mesh=(world, 1))`` (a pure data-parallel plan) and with
``DistributedDataParallel`` over its share of the batch, alternating, and reports the median
step time (forward + backward + gradient all-reduce + AdamW step) of each and their ratio
ours / DDP (the issue's target: <= 1.05). Timing never fails anything.

Where shardwise's step differs from DDP's: the global batch is given to every rank and
sliced (DDP gets its share directly); the loss is a mean over the global batch, reduced
across ranks (one extra all-reduce of a scalar); gradients are summed, not averaged.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _worker(rank: int, world: int, store: str, args, out: str) -> None:
    import shardwise
    from shardwise.models.tiny_gpt import TinyGPT, TinyGPTConfig

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    cfg = TinyGPTConfig(layers=args.layers, hidden=args.hidden, heads=args.heads, seq=args.seq)
    torch.manual_seed(0)
    model = TinyGPT(cfg)
    ddp_model = TinyGPT(cfg)
    ddp_model.load_state_dict(model.state_dict())
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, cfg.vocab, (args.batch, cfg.seq), generator=g)
    batch = (idx, torch.roll(idx, -1, dims=1))
    engine = shardwise.parallelize(model, batch, mesh=(world, 1), cluster=shardwise.Cluster.preset("cpu", world))
    opt = torch.optim.AdamW(engine.parameters(), lr=1e-3)
    ddp = torch.nn.parallel.DistributedDataParallel(ddp_model)
    ddp_opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    share = args.batch // world
    local = tuple(t[rank * share:(rank + 1) * share] for t in batch)

    def ours():
        opt.zero_grad()
        engine.train_step(*batch)
        opt.step()

    def theirs():
        ddp_opt.zero_grad()
        ddp(*local).backward()
        ddp_opt.step()

    times = {"shardwise": [], "ddp": []}
    for step in range(args.warmup + args.steps):
        for name, fn in (("shardwise", ours), ("ddp", theirs)):
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            dist.barrier()
            if step >= args.warmup:
                times[name].append(time.perf_counter() - t0)
    if rank == 0:
        with open(out, "w") as f:
            f.write(f"{statistics.median(times['shardwise'])} {statistics.median(times['ddp'])}\n")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", default="2,4")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    print(f"machine: {os.uname().machine}, {os.cpu_count()} cores, torch {torch.__version__}; TinyGPT layers "
          f"{args.layers}, hidden {args.hidden}, seq {args.seq}, global batch {args.batch}; median of {args.steps} "
          "steps after warm-up, one thread per process")
    print(f"{'world':>5}  {'shardwise ms':>12}  {'DDP ms':>8}  {'ours / DDP':>10}")
    for world in (int(w) for w in args.worlds.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "out")
            mp.spawn(_worker, args=(world, os.path.join(tmp, "store"), args, out), nprocs=world, join=True)
            ours, ddp = (float(x) for x in open(out).read().split())
        print(f"{world:>5}  {ours * 1e3:>12.1f}  {ddp * 1e3:>8.1f}  {ours / ddp:>10.2f}")


if __name__ == "__main__":
    main()
