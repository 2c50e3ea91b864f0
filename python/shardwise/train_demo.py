"""``python -m shardwise train``: the README's main job, run under torchrun.

    torchrun --nproc-per-node 4 -m shardwise train            # the built-in TinyGPT
    torchrun --nproc-per-node 4 -m shardwise train --mesh 2,2 # data x tensor, fixed
    torchrun --nproc-per-node 4 -m shardwise train --save ckpt   # then --resume ckpt, under any plan

Every rank builds the same TinyGPT (seed 0), ``shardwise.parallelize`` captures it, searches
a plan for the job's cluster (``Cluster.detect()``: the CPU processes), rewrites it for the
rank and trains it with AdamW. Rank 0 prints the plan, then each step's loss next to the loss
of the same model trained on one device, and at the end the largest relative difference of
the parameters.
"""
from __future__ import annotations

import argparse
import copy
import os
import time

import torch
import torch.distributed as dist


def _init() -> None:
    if dist.is_initialized():
        return
    if "RANK" not in os.environ:  # plain `python -m shardwise train`: a job of one process
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29512")
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    dist.init_process_group("gloo")


def run(args: argparse.Namespace) -> int:
    import shardwise
    from shardwise.models.tiny_gpt import TinyGPT, TinyGPTConfig

    _init()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    cfg = TinyGPTConfig(layers=args.layers, hidden=args.hidden, heads=args.heads)
    model = TinyGPT(cfg).to(getattr(torch, args.dtype))
    reference = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(1)

    def batch():
        idx = torch.randint(0, cfg.vocab, (args.batch, cfg.seq), generator=generator, device="cpu")
        return idx, torch.roll(idx, -1, dims=1)

    mesh = tuple(int(x) for x in args.mesh.split(",")) if args.mesh else None
    t0 = time.perf_counter()
    engine = shardwise.parallelize(model, batch(), mesh=mesh, level=args.level)
    setup = time.perf_counter() - t0
    if rank == 0:
        print(f"shardwise: TinyGPT ({sum(p.numel() for p in reference.parameters()):,} parameters, {args.dtype}) on "
              f"{world} Gloo processes; capture + plan + rewrite took {setup:.1f} s")
        print(engine.plan.report())
        if args.code:
            print(engine.code)
        print(f"{'step':>4}  {'loss (shardwise)':>17}  {'loss (one device)':>17}  {'rel. diff':>9}")
    optimizer = engine.optimizer(torch.optim.AdamW, lr=args.lr)  # the plan's ZeRO sharding applied
    ref_optimizer = torch.optim.AdamW(reference.parameters(), lr=args.lr)
    start = 0
    if args.resume:  # both runs go on from the checkpoint, resharded for this job's plan
        start = shardwise.load_checkpoint(args.resume, engine, optimizer)["step"]
        shardwise.load_checkpoint(args.resume, reference, ref_optimizer)
        for _ in range(start):  # the batches of the steps already trained
            batch()
        if rank == 0:
            print(f"resumed from {args.resume} at step {start}")
    worst = 0.0
    for step in range(start, start + args.steps):
        data = batch()
        optimizer.zero_grad()
        loss = engine.train_step(*data)
        optimizer.step()
        ref_optimizer.zero_grad()
        ref_loss = reference(*data)
        ref_loss.backward()
        ref_optimizer.step()
        diff = abs(loss.item() - ref_loss.item()) / max(abs(ref_loss.item()), 1e-30)
        worst = max(worst, diff)
        if rank == 0:
            print(f"{step:>4}  {loss.item():>17.6f}  {ref_loss.item():>17.6f}  {diff:>9.1e}")
    if args.save:
        shardwise.save_checkpoint(args.save, engine, optimizer, extra={"step": start + args.steps})
        if rank == 0:
            print(f"saved the model and optimizer state after step {start + args.steps - 1} to {args.save}")
    full = engine.full_state_dict()
    ref_state = dict(reference.named_parameters())
    param_diff = max(((full[k] - p).abs().max() / p.abs().max().clamp_min(1e-30)).item()
                     for k, p in ref_state.items() if k in full)
    if rank == 0:
        print(f"largest relative difference: losses {worst:.1e}, parameters after {args.steps} steps {param_diff:.1e}")
    dist.destroy_process_group()
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("train", help="train the built-in TinyGPT with shardwise (run it under torchrun)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch", type=int, default=8, help="global batch")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--mesh", help="data,tensor degrees (default: searched)")
    p.add_argument("--level", choices=("fast", "thorough"), default="fast")
    p.add_argument("--save", metavar="DIR", help="save a checkpoint (DCP) after the last step")
    p.add_argument("--resume", metavar="DIR", help="go on from a checkpoint (saved under any plan)")
    p.add_argument("--code", action="store_true", help="also print rank 0's program (torch.fx code)")
    # float64 by default so the comparison shows the rewrite, not rounding: in float32, AdamW
    # turns rounding noise on a gradient that is exactly zero in theory (attention's key bias)
    # into lr-sized steps, so such parameters drift apart by ~1e-3 relative.
    p.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    p.set_defaults(run=run)
