"""Compiled rank programs (issue 49, item 4): shardwise eager and compiled against DDP eager and
DDP and FSDP2 under torch.compile, and a pipeline eager against compiled, side by side.

    python benchmarks/compile.py            # GPT-like and LLaMA-like, 2 and 4 Gloo processes
    python benchmarks/compile.py --record   # + the table into results/compile.json and the README

The same model, global batch and Gloo world for every side, each rank training in turn
between barriers:
- data parallel: ``shardwise.parallelize(..., mesh=(world, 1))`` eagerly and with
  ``compile=True`` (inductor), ``DistributedDataParallel`` eagerly and over
  ``torch.compile(model)`` (torch's documented order), and FSDP2 (``fully_shard`` on each block
  and the root) over ``torch.compile`` of each block (torchtitan's per-block compile);
- pipeline: ``Plan.manual(pipeline=world, schedule="1f1b")`` in ``2 x world`` micro-batches,
  eagerly and compiled (each stage's program; torch's own pipelining is not compiled here: its
  schedules run the stage modules eagerly).
Models: "gpt", TinyGPT (``shardwise.models.tiny_gpt``), and "llama", transformers'
LlamaForCausalLM (RMSNorm, rotary positions, SwiGLU, grouped-query attention) built from a
config at the same hidden size, both in float32 with ``--layers`` layers (at least the world,
for the pipeline). Reported: the median step time of each side (forward, backward, gradient
reduction, AdamW step), ours compiled / ours eager, ours compiled / the faster compiled peer,
the pipeline's compiled / eager, what the planner predicts for those two ratios (each side's
plan priced as it runs, eager or compiled: ``plan.compile``, docs/cost-model.md, "Compiled
programs"), and each compiled side's first step (its compile, on the CPU).
The issue's targets: ours compiled <= 0.87x ours eager and <= 1.0x the compiled peer. Timing
never fails anything.
"""
from __future__ import annotations

import os
import statistics
import time

import torch
import torch.distributed as dist

from _machine import cpu_model
from _workers import (eager_step, finish_worker, join_gloo, run_world, size_line, timed_rounds, tiny_gpt_arguments,
                      token_batch)

DATA_SIDES = ("ours eager", "ours compiled", "DDP eager", "DDP compiled", "FSDP2 compiled")
PIPELINE_SIDES = ("pipeline eager", "pipeline compiled")
SIDES = DATA_SIDES + PIPELINE_SIDES


def _model(kind: str, args, vocab: int) -> torch.nn.Module:
    """A fresh model of `kind` (seed 0: every side starts from the same weights), with
    ``.blocks``, the repeated layers FSDP2 shards and compiles one by one."""
    torch.manual_seed(0)
    if kind == "gpt":
        from shardwise.models.tiny_gpt import TinyGPT, TinyGPTConfig

        model = TinyGPT(TinyGPTConfig(layers=args.layers, hidden=args.hidden, heads=args.heads, seq=args.seq))
        model.blocks_list = list(model.blocks)
        return model
    import transformers

    from shardwise.models.with_loss import CausalLMWithLoss

    cfg = transformers.LlamaConfig(hidden_size=args.hidden, num_hidden_layers=args.layers,
                                   num_attention_heads=args.heads, num_key_value_heads=max(1, args.heads // 2),
                                   intermediate_size=int(args.hidden * 8 / 3) // 64 * 64, vocab_size=vocab,
                                   max_position_embeddings=args.seq, use_cache=False, attn_implementation="sdpa")
    model = CausalLMWithLoss(transformers.LlamaForCausalLM(cfg))
    model.blocks_list = list(model.m.model.layers)
    return model


def _fsdp_compiled(model: torch.nn.Module) -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks_list:
        block.compile()  # in place (torchtitan's per-block compile), then sharded
        fully_shard(block)
    fully_shard(model)
    return model


def _engines(kind: str, args, world: int, batch: tuple) -> dict:
    import shardwise

    cluster = shardwise.Cluster.preset("cpu", world)
    vocab = 256
    graph = shardwise.capture(_model(kind, args, vocab), tuple(t[:args.batch // (2 * world)] for t in batch))
    pipeline = {compiled: shardwise.Plan.manual(graph, cluster, pipeline=world, data=1, tensor=1,
                                                global_batch=args.batch, micro_batch=args.batch // (2 * world),
                                                schedule="1f1b", recompute=False, compile=compiled)
                for compiled in (False, True)}  # priced eager and compiled (plan.compile)
    sides = {}
    for name in SIDES:
        model = _model(kind, args, vocab)
        if name.startswith("ours"):
            sides[name] = shardwise.parallelize(model, batch, mesh=(world, 1), cluster=cluster,
                                                compile=name == "ours compiled")
        elif name.startswith("pipeline"):
            compiled = name == "pipeline compiled"
            sides[name] = shardwise.parallelize(model, batch, plan=pipeline[compiled], compile=compiled)
        elif name == "DDP eager":
            sides[name] = torch.nn.parallel.DistributedDataParallel(model)
        elif name == "DDP compiled":
            sides[name] = torch.nn.parallel.DistributedDataParallel(torch.compile(model))
        else:
            sides[name] = _fsdp_compiled(model)
    return sides


def _worker(rank: int, world: int, store: str, args, out: str) -> None:
    import json

    join_gloo(rank, world, store)
    results = {}
    for kind in args.models.split(","):
        batch = token_batch(args, 256)
        sides = _engines(kind, args, world, batch)
        optimizers = {name: torch.optim.AdamW(side.parameters(), lr=1e-3) for name, side in sides.items()}
        share = args.batch // world
        local = tuple(t[rank * share:(rank + 1) * share] for t in batch)
        losses = {name: [] for name in SIDES}

        def ours(name):
            def run():
                optimizers[name].zero_grad()
                losses[name].append(sides[name].train_step(*batch).detach())
                optimizers[name].step()
            return run

        def theirs(name):
            return lambda: eager_step(sides[name], optimizers[name], local, losses[name])

        steps = {name: (ours if name.startswith(("ours", "pipeline")) else theirs)(name) for name in SIDES}
        first = {}
        for name, step in steps.items():  # the first step of each: the compiled sides compile here
            dist.barrier()
            start = time.perf_counter()
            step()
            first[name] = time.perf_counter() - start
        times, _ = timed_rounds(steps, args.warmup, args.steps)
        # The same work: each side's losses over the global batch (a peer's: its rank's share, averaged).
        stacked = {name: torch.stack(v) for name, v in losses.items()}
        for name in ("DDP eager", "DDP compiled", "FSDP2 compiled"):
            dist.all_reduce(stacked[name])
            stacked[name] /= world
        base = stacked["ours eager"]
        diff = max(((v - base).abs() / base.abs()).max().item() for v in stacked.values())
        # What the planner predicts for each of our sides (their plans: searched, or the pipeline's
        # Plan.manual, each priced eager or compiled as it runs; the cpu preset's device).
        predicted = {name: sides[name].plan.predicted_step_time() for name in SIDES
                     if name.startswith(("ours", "pipeline"))}
        results[kind] = {"median": {k: statistics.median(v) for k, v in times.items()}, "first": first,
                         "loss_diff": diff, "predicted": predicted}
        del sides, optimizers
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    finish_worker()


COLUMNS = ["model", "world", *(f"{s} ms" for s in SIDES), "compiled / eager", "compiled / best compiled peer",
           "pipeline compiled / eager", "predicted compiled / eager", "predicted pipeline compiled / eager",
           "ours first s", "pipeline first s", "DDP first s", "loss diff"]


def _row(kind: str, world: int, r: dict) -> list:
    m, first = r["median"], r["first"]
    peer = min(m["DDP compiled"], m["FSDP2 compiled"])
    return [kind, world, *(m[s] * 1e3 for s in SIDES), m["ours compiled"] / m["ours eager"], m["ours compiled"] / peer,
            m["pipeline compiled"] / m["pipeline eager"],
            r["predicted"]["ours compiled"] / r["predicted"]["ours eager"],
            r["predicted"]["pipeline compiled"] / r["predicted"]["pipeline eager"], first["ours compiled"], first["pipeline compiled"],
            first["DDP compiled"], r["loss_diff"]]


def main() -> None:
    from _results import record

    def extra(parser):
        parser.add_argument("--models", default="gpt,llama", help="gpt (TinyGPT), llama (transformers' Llama)")

    args = tiny_gpt_arguments(__doc__.splitlines()[0], extra)
    args.layers = max(args.layers, max(int(w) for w in args.worlds.split(",")))  # a layer per pipeline stage
    load_before = os.getloadavg()[0]
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, load average {load_before:.2f}, torch "
          f"{torch.__version__}, Gloo; {size_line(args)}")
    print("ms: median step time (rank 0); first s: the first step (compiling, for the compiled sides); loss diff: "
          "the largest relative difference of any side's losses from ours eager's (the same work)")
    print("  ".join(f"{c:>10}" for c in COLUMNS))
    rows = []
    for world in (int(w) for w in args.worlds.split(",")):
        results = run_world(_worker, world, args)
        for kind, r in results.items():
            row = _row(kind, world, r)
            print("  ".join(f"{v:>10.3g}" if isinstance(v, float) else f"{v:>10}" for v in row))
            rows.append(row)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    if args.record:
        record("compile", rows, {
            "machine": f"{cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}, Gloo",
            "columns": COLUMNS,
            "formats": {**{f"{s} ms": ".1f" for s in SIDES}, "compiled / eager": ".2f",
                        "compiled / best compiled peer": ".2f", "pipeline compiled / eager": ".2f",
                        "predicted compiled / eager": ".3f", "predicted pipeline compiled / eager": ".3f",
                        "ours first s": ".1f", "pipeline first s": ".1f", "DDP first s": ".1f", "loss diff": ".1e"},
            "notes": f"{size_line(args)}; models {args.models}, float32; load average {load_before:.2f} before, "
                     f"{os.getloadavg()[0]:.2f} after."})


if __name__ == "__main__":
    main()
