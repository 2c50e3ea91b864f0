"""The asynchronous tensor-parallel all-reduce, measured: the same Megatron plan with each
column-parallel linear's backward split (its input gradient's all-reduce beside its weight
gradient: runtime/async_gradients.py) and not split (the all-reduce after the fused
backward), side by side.

    python benchmarks/async_tp.py            # spawns 2 and 4 Gloo processes on this machine
    python benchmarks/async_tp.py --record   # + the table into results/async_tp.json and the README

A stack of pre-norm MLP blocks (x + fc2(gelu(fc1(layer_norm(x))))), fc1 column-parallel and
fc2 row-parallel on a (1, world) mesh, the norm's output replicated: each fc1's input gradient
is Partial, all-reduced at the read (Megatron's f). Both engines hold the same weights and
train on the same batches with AdamW, alternating step by step; each rank reports the median
step time of each, the ratio split / fused, and the largest relative difference between the
two's losses (the same products in the same order: 0 expected). The search prices the split
all-reduce at the overlap interference instead of in full (search/parameter_collectives.h).
Timing never fails anything.
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from _machine import cpu_model
from _workers import finish_worker, run_world, timed_rounds, training_steps


class Blocks(nn.Module):
    def __init__(self, layers: int, hidden: int, ffn: int):
        super().__init__()
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(layers))
        self.up = nn.ModuleList(nn.Linear(hidden, ffn) for _ in range(layers))
        self.down = nn.ModuleList(nn.Linear(ffn, hidden) for _ in range(layers))

    def forward(self, x, y):
        for norm, up, down in zip(self.norms, self.up, self.down):
            x = x + down(F.gelu(up(norm(x))))
        return F.mse_loss(x, y)


def megatron_plan(model, batch, world: int):
    """The searched plan with every up projection column-parallel and every down projection
    row-parallel on the tensor axis (the weights held replicated, sliced per rank)."""
    import shardwise

    graph = shardwise.capture(model, batch)
    plan = shardwise.Plan.search(graph, shardwise.Cluster.preset("cpu", world), mesh=(1, world),
                                 global_batch=int(batch[0].shape[0]), precision="f32")
    doc = json.loads(plan.to_json())
    doc.pop("predicted", None)
    doc.pop("programs", None)
    strategies = doc["sharding"]["strategies"]
    linears = sorted((n for n in strategies if n == "linear" or n.startswith("linear_")),
                     key=lambda n: int(n.split("_")[1]) if "_" in n else 0)
    gelus = sorted((n for n in strategies if n == "gelu" or n.startswith("gelu_")),
                   key=lambda n: int(n.split("_")[1]) if "_" in n else 0)
    for up, down, gelu in zip(linears[0::2], linears[1::2], gelus):
        strategies[up] = ["replicate", "split n"]
        strategies[gelu] = ["replicate", "split d1"]
        strategies[down] = ["replicate", "split k"]
    return shardwise.Plan.from_json(json.dumps(doc))


def _engine(plan, model, batch, split: bool):
    """An engine of `plan`; split=False: the plan's ``sharding.async_gradients`` off, so the
    core's async-gradient pass does not run and the all-reduce runs in the operand's reshard
    after the fused backward."""
    import shardwise

    if not split:
        doc = json.loads(plan.to_json())
        doc["sharding"]["async_gradients"] = False
        plan = shardwise.Plan.from_json(json.dumps(doc))
    return shardwise.parallelize(model, batch, plan=plan)


def _worker(rank: int, world: int, store: str, args, out: str) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    batch = (torch.randn(args.rows, args.hidden, generator=g), torch.randn(args.rows, args.hidden, generator=g))

    def model():
        torch.manual_seed(0)
        return Blocks(args.layers, args.hidden, args.ffn)

    plan = megatron_plan(model(), batch, world)
    engines = {"split": _engine(plan, model(), batch, True), "fused": _engine(plan, model(), batch, False)}
    assert "self.async_gradient(" in engines["split"].code and "self.async_gradient(" not in engines["fused"].code
    optimizers = {k: e.optimizer(torch.optim.AdamW, lr=1e-3) for k, e in engines.items()}
    losses = {k: [] for k in engines}
    wall, _ = timed_rounds(training_steps(engines, optimizers, batch, losses), args.warmup, args.steps)
    if rank == 0:
        median = {k: statistics.median(v) for k, v in wall.items()}
        difference = max(abs(a - b) / abs(b) for a, b in zip(losses["split"], losses["fused"]))
        with open(out, "w") as f:
            json.dump({"median_ms": {k: 1e3 * v for k, v in median.items()},
                       "ratio": median["split"] / median["fused"], "loss_difference": difference,
                       "marked": engines["split"].rank_ir.count("shardwise.async_gradient")}, f)
    finish_worker()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worlds", default="2,4")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--ffn", type=int, default=2048)
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    from _results import add_record_argument, record

    add_record_argument(parser)
    args = parser.parse_args()
    rows = []
    print(f"{cpu_model()}; torch {torch.__version__}; {args.layers} pre-norm MLP blocks, hidden {args.hidden}, "
          f"ffn {args.ffn}, {args.rows} rows; median of {args.steps} steps after {args.warmup} of warm-up, "
          "one thread per process")
    for world in (int(w) for w in args.worlds.split(",")):
        r = run_world(_worker, world, args)
        ms = r["median_ms"]
        print(f"world {world}: split {ms['split']:.1f} ms, fused {ms['fused']:.1f} ms, ratio split / fused "
              f"{r['ratio']:.3f}; {r['marked']} linears split; losses differ by {r['loss_difference']:.1e}")
        rows.append([world, ms["split"], ms["fused"], r["ratio"], r["marked"], r["loss_difference"]])
    if args.record:
        import os

        record("async_tp", rows, {
            "machine": f"{cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}, Gloo",
            "columns": ["world", "split ms", "fused ms", "split / fused", "linears split", "losses differ by"],
            "formats": {"split ms": ".1f", "fused ms": ".1f", "split / fused": ".3f", "losses differ by": ".1e"},
            "notes": f"{args.layers} pre-norm MLP blocks, hidden {args.hidden}, ffn {args.ffn}, {args.rows} rows, "
                     f"float32; median of {args.steps} steps after {args.warmup}, one thread per process."})


if __name__ == "__main__":
    main()
