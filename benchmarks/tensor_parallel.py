"""shardwise's tensor parallelism against torch's DTensor tensor parallelism, side by side.

    python benchmarks/tensor_parallel.py                 # spawns 2 and 4 Gloo processes
    python benchmarks/tensor_parallel.py --worlds 2 --profile   # + where one rank's step goes
    python benchmarks/tensor_parallel.py --record        # + the table into results/ and the README

The same TinyGPT blocks, the same global batch on every rank, the same Gloo world, the same
optimizer (AdamW over each side's local parameters), alternating step by step:

- ours: ``shardwise.parallelize(model, batch, mesh=(1, world))``: the SPMD search's plan on a
  pure tensor mesh (it picks the placements: printed once per run);
- torch: ``torch.distributed.tensor.parallel.parallelize_module`` on every block with
  Megatron's layout: ``qkv`` and ``fc`` ColwiseParallel, ``proj`` and ``out`` RowwiseParallel
  (the embedding, the final norm and the tied LM head replicated).

TinyGPT fuses Q, K and V in one Linear; a column-wise shard of it would hold Q and half of
K, so for torch the fused weight's rows are reordered per rank ([q_r; k_r; v_r], as
Megatron-LM stores them) and the attention reads the local head count (``view(b, s, -1,
d)``): the same arithmetic, so both compute the same loss (the difference is printed).
Printed: median step time (forward + backward + gradient reductions + AdamW step) of each and
the ratio ours / DTensor (the issue's target: <= 1.0). Timing never fails anything.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import types

import torch
import torch.distributed as dist
import torch.nn.functional as F

from _machine import cpu_model
from _workers import add_size_arguments, finish_worker, profile_steps, spawn_ranks, timed_rounds


def _tp_block_forward(self, x: torch.Tensor) -> torch.Tensor:
    """TinyGPT's Block.forward on this rank's heads: the fused QKV output holds [q_r; k_r; v_r]."""
    b, s, _ = x.shape
    q, k, v = self.qkv(self.ln_1(x)).chunk(3, dim=-1)
    d = self.head_dim
    q, k, v = (t.view(b, s, -1, d).transpose(1, 2) for t in (q, k, v))
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    x = x + self.proj(a.transpose(1, 2).reshape(b, s, -1))
    return x + self.out(F.gelu(self.fc(self.ln_2(x))))


def _interleave_qkv(linear: torch.nn.Linear, world: int) -> None:
    """Rows [q; k; v] -> [q_0; k_0; v_0; q_1; ...] so rank r's column-wise shard is its heads."""
    with torch.no_grad():
        for t in (linear.weight, linear.bias):
            q, k, v = t.chunk(3, dim=0)
            parts = [torch.cat([x.chunk(world, dim=0)[r] for x in (q, k, v)]) for r in range(world)]
            t.copy_(torch.cat(parts))


def dtensor_model(model: torch.nn.Module, world: int) -> torch.nn.Module:
    """`model` (a TinyGPT) tensor-parallel with DTensor, Megatron's layout, in place."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (world,))
    for block in model.blocks:
        block.head_dim = model.cfg.hidden // model.cfg.heads
        _interleave_qkv(block.qkv, world)
        block.forward = types.MethodType(_tp_block_forward, block)
        parallelize_module(block, mesh, {"qkv": ColwiseParallel(), "proj": RowwiseParallel(),
                                         "fc": ColwiseParallel(), "out": RowwiseParallel()})
    return model


def _worker(rank: int, world: int, store: str, args, out: str) -> None:
    import shardwise
    from shardwise.models.tiny_gpt import TinyGPT, TinyGPTConfig

    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    cfg = TinyGPTConfig(layers=args.layers, hidden=args.hidden, heads=args.heads, seq=args.seq)
    torch.manual_seed(0)
    model = TinyGPT(cfg)
    theirs_model = TinyGPT(cfg)
    theirs_model.load_state_dict(model.state_dict())
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, cfg.vocab, (args.batch, cfg.seq), generator=g)
    batch = (idx, torch.roll(idx, -1, dims=1))
    engine = shardwise.parallelize(model, batch, mesh=(1, world), cluster=shardwise.Cluster.preset("cpu", world))
    opt = torch.optim.AdamW(engine.parameters(), lr=1e-3)
    tp = dtensor_model(theirs_model, world)
    tp_opt = torch.optim.AdamW(tp.parameters(), lr=1e-3)

    losses = {"shardwise": [], "dtensor": []}

    def ours():
        opt.zero_grad()
        losses["shardwise"].append(engine.train_step(*batch).item())
        opt.step()

    def theirs():
        tp_opt.zero_grad()
        loss = tp(*batch)
        loss.backward()
        tp_opt.step()
        losses["dtensor"].append(loss.item())

    steps = {"shardwise": ours, "dtensor": theirs}
    times, cpu = timed_rounds(steps, args.warmup, args.steps)
    everyone = [None] * world
    dist.all_gather_object(everyone, {k: statistics.median(v) for k, v in cpu.items()})
    profiles = profile_steps(steps, rank == 0, row_limit=18) if args.profile else {}
    diffs = [abs(a - b) / abs(b) for a, b in zip(losses["shardwise"], losses["dtensor"])]
    if rank == 0:
        placements = engine.plan.placements()
        shown = ", ".join(f"{k.split('.', 2)[-1]} {v[1]}" for k, v in placements.items()
                          if k.startswith("blocks.0.") and k.endswith("weight") and "ln" not in k)
        with open(out, "w") as f:
            f.write(f"{statistics.median(times['shardwise'])} {statistics.median(times['dtensor'])} {diffs[0]} "
                    f"{max(diffs)} {sum(c['shardwise'] for c in everyone) / world} "
                    f"{sum(c['dtensor'] for c in everyone) / world} "
                    f"{statistics.median(o / t for o, t in zip(times['shardwise'], times['dtensor']))}\n{shown}\n")
            for name, table in profiles.items():
                f.write(f"--- profile of rank 0, one step, {name} ---\n{table}\n")
    finish_worker()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_size_arguments(parser, layers=4, hidden=512, heads=8, seq=128, batch=8)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--profile", action="store_true", help="torch.profiler table of one step of rank 0")
    from _results import add_record_argument, record

    add_record_argument(parser)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    placements = {}
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}, torch "
          f"{torch.__version__}, Gloo")
    print(f"TinyGPT layers {args.layers}, hidden {args.hidden}, heads {args.heads}, seq {args.seq}, batch "
          f"{args.batch} (whole on every rank), AdamW; median of {args.steps} steps after {args.warmup} of "
          f"warm-up, {args.threads} thread(s) per process")
    rows = []
    for world in (int(w) for w in args.worlds.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "out")
            spawn_ranks(_worker, (world, os.path.join(tmp, "store"), args, out), world)
            first, shown, *rest = open(out).read().split("\n", 2)
            ours, theirs, first_diff, max_diff, ours_cpu, theirs_cpu, paired = (float(x) for x in first.split())
        print(f"world {world}: shardwise's placements (tensor axis) of blocks.0: {shown}")
        placements[world] = shown
        rows.append((world, ours, theirs, paired, first_diff, max_diff, ours_cpu, theirs_cpu))
        if rest and rest[0].strip():
            print(rest[0])
    print("ms: median step time (rank 0); paired: median over steps of our step time / DTensor's in the same round "
          "(robust to load that drifts); CPU: median CPU seconds of a step per process (mean over ranks; less "
          "sensitive to other load); loss diff: |ours - DTensor| / |DTensor| at the first step (same weights) and "
          "the largest over all steps")
    print(f"{'world':>5}  {'shardwise ms':>12}  {'DTensor ms':>10}  {'ours / DTensor':>14}  {'paired':>6}  "
          f"{'CPU ours ms':>11}  {'CPU DTensor ms':>14}  {'CPU ratio':>9}  {'loss diff 1st':>13}  {'loss diff max':>13}")
    for world, ours, theirs, paired, first_diff, max_diff, ours_cpu, theirs_cpu in rows:
        print(f"{world:>5}  {ours * 1e3:>12.1f}  {theirs * 1e3:>10.1f}  {ours / theirs:>14.2f}  {paired:>6.2f}  "
              f"{ours_cpu * 1e3:>11.1f}  {theirs_cpu * 1e3:>14.1f}  {ours_cpu / theirs_cpu:>9.2f}  {first_diff:>13.1e}  "
              f"{max_diff:>13.1e}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    if args.record:
        shown = "; ".join(f"world {w}: {p}" for w, p in placements.items())
        if len(set(placements.values())) == 1:
            shown = f"world {', '.join(map(str, placements))}: {next(iter(placements.values()))}"
        record("tensor_parallel", [
            [world, ours * 1e3, theirs * 1e3, ours / theirs, paired, ours_cpu * 1e3, theirs_cpu * 1e3,
             ours_cpu / theirs_cpu, first_diff, max_diff]
            for world, ours, theirs, paired, first_diff, max_diff, ours_cpu, theirs_cpu in rows], {
            "machine": f"{cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}, Gloo",
            "columns": ["world", "shardwise ms", "DTensor ms", "ours / DTensor", "paired", "CPU ours ms",
                        "CPU DTensor ms", "CPU ratio", "loss diff 1st", "loss diff max"],
            "formats": {"shardwise ms": ".1f", "DTensor ms": ".1f", "ours / DTensor": ".2f", "paired": ".2f",
                        "CPU ours ms": ".1f", "CPU DTensor ms": ".1f", "CPU ratio": ".2f", "loss diff 1st": ".1e",
                        "loss diff max": ".1e"},
            "notes": f"TinyGPT layers {args.layers}, hidden {args.hidden}, heads {args.heads}, seq {args.seq}, batch "
                     f"{args.batch} (whole on every rank); median of {args.steps} steps after {args.warmup}; "
                     f"shardwise's placements of blocks.0 ({shown}); load average {load_before:.2f} before, "
                     f"{os.getloadavg()[0]:.2f} after."})


if __name__ == "__main__":
    main()
