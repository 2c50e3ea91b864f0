"""Weight gradients accumulated by their products, measured: pipeline stages whose linears add
each micro-batch's weight gradient into ``.grad`` inside the ``addmm_`` that makes it
(runtime/fused_accumulation.py), against the same plan built without it (autograd makes each
micro-batch's weight gradient in a fresh tensor and AccumulateGrad adds it in), side by side.

    python benchmarks/fused_accumulation.py                     # 2 Gloo processes, 5 schedules
    python benchmarks/fused_accumulation.py --schedules 1f1b,zb-h1
    python benchmarks/fused_accumulation.py --record            # + its rows into results/ and the README

pipeline.py's TinyGPT (4 layers of 512, seq 128), global batch 16 in micro-batches of 2, a
pipeline of ``--worlds`` stages, one engine of each kind per schedule with the same weights,
AdamW, the two alternating step by step. Rank 0 prints, per schedule, the median step time
of each, the paired ratio plain / fused (the median over rounds of the two steps' ratio: above
1 the fused steps are faster), the contractions fused per step on rank 0 and the largest
relative difference between their losses. Timing never fails anything.
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch

from _machine import cpu_model
from _workers import (add_size_arguments, finish_worker, pipeline_plan, run_world, size_line, timed_rounds,
                      tiny_gpt_twins, training_steps, twin_tiny_gpts)

SCHEDULES = ("gpipe", "1f1b", "zb-h1", "zb-v", "dualpipe-v")


def _worker(rank: int, world: int, store: str, args, out: str) -> None:
    import shardwise

    results = {}
    model, twin, batch = twin_tiny_gpts(rank, world, store, args)
    for i, schedule in enumerate(args.schedules.split(",")):
        if i:  # fresh twins of the same weights for each schedule
            model, twin = tiny_gpt_twins(args)
        plan = pipeline_plan(args.batch, args.micro_batch, schedule, world)
        engines = {"fused": shardwise.parallelize(model, batch, plan=plan),
                   "plain": shardwise.parallelize(twin, batch, plan=plan.with_fused_accumulation(False))}
        fused = sum(s["module"].code.count("self.fused_accumulation(") for s in engines["fused"]._stages.values())
        assert fused > 0 and all("self.fused_accumulation(" not in s["module"].code
                                 for s in engines["plain"]._stages.values())
        optimizers = {k: torch.optim.AdamW(e.parameters(), lr=1e-3) for k, e in engines.items()}
        losses = {k: [] for k in engines}
        wall, _ = timed_rounds(training_steps(engines, optimizers, batch, losses), args.warmup, args.steps)
        results[schedule] = {
            "median_ms": {k: 1e3 * statistics.median(v) for k, v in wall.items()},
            "paired": statistics.median(p / f for f, p in zip(wall["fused"], wall["plain"])),
            "fused": fused * engines["fused"]._m,
            "loss_difference": max(abs(a - b) / abs(b) for a, b in zip(losses["fused"], losses["plain"]))}
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    finish_worker()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_size_arguments(parser, worlds="2", layers=4, hidden=512, heads=8, seq=128, batch=16, steps=12, warmup=2,
                       vocab=256)
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--schedules", default=",".join(SCHEDULES))
    from _results import add_record_argument, record

    add_record_argument(parser)
    args = parser.parse_args()
    rows = []
    print(f"{cpu_model()}; torch {torch.__version__}; {size_line(args)}; micro-batches of {args.micro_batch}")
    for world in (int(w) for w in args.worlds.split(",")):
        for schedule, r in run_world(_worker, world, args).items():
            ms = r["median_ms"]
            print(f"{world} stages, {schedule:>10}: fused {ms['fused']:.1f} ms, plain {ms['plain']:.1f} ms, paired "
                  f"plain / fused {r['paired']:.3f}; {r['fused']} weight gradients accumulated in place per step "
                  f"on rank 0; losses differ by {r['loss_difference']:.1e}")
            rows.append({"stages": world, "schedule": schedule, "fused ms": ms["fused"], "plain ms": ms["plain"],
                         "paired plain / fused": r["paired"], "accumulated in place": r["fused"],
                         "losses differ by": r["loss_difference"]})
    if args.record:
        import os

        record("fused_accumulation", rows, {
            "machine": f"{cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}, Gloo",
            "formats": {"fused ms": ".1f", "plain ms": ".1f", "paired plain / fused": ".3f",
                        "losses differ by": ".1e"},
            "notes": f"{size_line(args)}; micro-batches of {args.micro_batch}. accumulated in place: weight "
                     "gradients added into .grad by their products per step on rank 0."},
            key=("stages", "schedule"))


if __name__ == "__main__":
    main()
