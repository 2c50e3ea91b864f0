"""How long shardwise.parallelize takes, model against model: RWKV (its per-timestep
recurrence, unrolled by torch.export, makes ~1,000 nodes where GPT-2 and Llama of the same
size make ~100-150; issue 45) against GPT-2 and Llama, on 4 Gloo ranks of this machine.

    python benchmarks/parallelize_time.py                # rwkv gpt2 llama
    python benchmarks/parallelize_time.py rwkv gpt2      # some (model_zoo.py's names)
    python benchmarks/parallelize_time.py --record       # + its rows into results/ and the README

Each model is model_zoo.py's tiny configuration in float64 training mode, dropout off
(`ZooModel.build_for_training`), at its batch of 4 sequences of 16 with labels. Per model:
 - capture: `shardwise.capture` alone, on this process (graph nodes beside it);
 - search: the SPMD search alone (`Plan.search` on `Cluster.preset("cpu", 4)`), on this
   process, and the axis problems its fast solver solved and met again (FastSolveMemo,
   csrc/search/spmd_problem.h);
 - parallelize: `shardwise.parallelize(model, batch, cluster=...)` on 4 Gloo ranks, the slowest
   rank's wall and CPU seconds, on the preset and on the preset with 1 byte of device memory
   (nothing fits: the search, the joint planner's micro-batch fallback, then the refusal).
On a 2-core machine the 4 ranks share the cores (each runs the same capture and search), so
a rank's wall time is about twice its CPU time; CPU seconds are the fairer figure on a shared
machine. Prints; asserts nothing about timing.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import sys
import tempfile
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from _machine import Timer, machine_line  # noqa: E402

WORLD = 4
MODELS = ("rwkv", "gpt2", "llama")


def _spec(name: str):
    from model_zoo import ZOO

    return next(z for z in ZOO if z.name == name)


def _cluster(tiny: bool):
    import shardwise

    cluster = shardwise.Cluster.preset("cpu", WORLD)
    if not tiny:
        return cluster
    doc = json.loads(cluster.to_json())
    for device in doc["device_types"]:
        device["memory_bytes"] = 1
    return shardwise.Cluster.from_json(json.dumps(doc))


def _rank(rank: int, world: int, store: str, name: str, tiny: bool, out: str) -> None:
    import torch.distributed as dist

    import shardwise

    torch.set_num_threads(1)
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    spec = _spec(name)
    model, batch = spec.build_for_training(), spec.batch(0)
    outcome = "plan"
    with Timer() as t:
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                shardwise.parallelize(model, batch, cluster=_cluster(tiny))
        except shardwise.ValidationError as e:
            outcome = "refused" if "fits in memory under no plan" in str(e) else f"error: {str(e)[:60]}"
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"wall": t.wall, "cpu": t.cpu, "outcome": outcome}, f)
    dist.barrier()
    dist.destroy_process_group()


def _parallelize(name: str, tiny: bool) -> tuple[float, float, str]:
    """The slowest rank's wall and CPU seconds of parallelize, and what it ended in."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rank")
        mp.spawn(_rank, args=(WORLD, os.path.join(tmp, "store"), name, tiny, out), nprocs=WORLD, join=True)
        ranks = [json.load(open(f"{out}.{r}")) for r in range(WORLD)]
    return max(r["wall"] for r in ranks), max(r["cpu"] for r in ranks), ranks[0]["outcome"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", default=list(MODELS))
    from _results import add_record_argument, record

    add_record_argument(parser)
    args = parser.parse_args(argv)
    rows = []

    import shardwise

    torch.set_num_threads(1)
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    print(machine_line())
    print(f"{'model':8s} {'nodes':>6s} {'capture s':>10s} {'search s':>9s} {'solved/reused':>14s} "
          f"{'parallelize wall/cpu s':>23s} {'refusal (1 B) wall/cpu s':>26s}")
    for name in args.models:
        spec = _spec(name)
        model, batch = spec.build_for_training(), spec.batch(0)
        with Timer() as capture, contextlib.redirect_stdout(io.StringIO()):
            graph = shardwise.capture(model, batch)
        with Timer() as search:
            plan = shardwise.Plan.search(graph, _cluster(False), global_batch=int(batch["input_ids"].shape[0]))
        result = plan._result or {}
        counts = f"{result.get('axis_problems_solved', '?')}/{result.get('axis_problems_reused', '?')}"
        wall, cpu, outcome = _parallelize(name, tiny=False)
        tiny_wall, tiny_cpu, tiny_outcome = _parallelize(name, tiny=True)
        print(f"{name:8s} {graph.num_nodes():6d} {capture.cpu:10.2f} {search.cpu:9.2f} {counts:>14s} "
              f"{wall:11.1f} / {cpu:5.1f}{'' if outcome == 'plan' else ' ' + outcome:>5s} "
              f"{tiny_wall:13.1f} / {tiny_cpu:5.1f} {tiny_outcome}", flush=True)
        rows.append([name, graph.num_nodes(), capture.cpu, search.cpu, counts, wall, cpu,
                     outcome, tiny_wall, tiny_cpu, tiny_outcome])
    if args.record:
        # A run of some models replaces only their rows.
        record("parallelize_time", rows, {
            "columns": ["model", "nodes", "capture s", "search s", "solved/reused", "parallelize wall s",
                        "parallelize cpu s", "outcome", "refusal (1 B) wall s", "refusal cpu s", "refusal outcome"],
            "formats": {"capture s": ".2f", "search s": ".2f", "parallelize wall s": ".1f",
                        "parallelize cpu s": ".1f", "refusal (1 B) wall s": ".1f", "refusal cpu s": ".1f"},
            "notes": f"model_zoo.py's tiny configurations in float64, {WORLD} Gloo ranks; capture and search CPU "
                     "seconds on this process; parallelize: the slowest rank; refusal: the same with 1 byte of "
                     "device memory (nothing fits)."},
            key=("model",))


if __name__ == "__main__":
    main()
