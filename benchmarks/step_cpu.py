"""Where a step's CPU goes, per plan of a saved fidelity run (issue 46: the 4-process pipelines).

On this 2-core box 4 Gloo processes share the cores, so a step is bound by the CPU its ranks
spend together, not by one rank's path. fidelity.py compares a plan's predicted step with its
measured one; this runs the same plans (the saved ``plan_json`` of a ``fidelity.py --json``
run) in fresh Gloo processes and says, per rank and step (medians of the timed steps):

- step: wall clock between barriers;
- process CPU (every thread: the main one and Gloo's) and the main thread's, user and system
  (``resource.getrusage(RUSAGE_THREAD)``), with its voluntary and involuntary context switches
  (a rank that waits for a peer sleeps; one that wakes preempts another, whose caches go cold);
- for a pipeline, the engine's time in each kind of action (forward, full backward, weight
  gradient, waits): wall clock and the main thread's CPU.

Beside the ranks, "pool" is the process CPU of all ranks over the cores: the least a step can
take when every rank's work shares them. The plan's prediction (the saved run's) is beside it.

    python benchmarks/step_cpu.py --from-json run.json [--world 4] [--steps 5] [--warmup 3] "gpt2 data 4" ...

The plans must be the saved run's (by name); the model and batch are fidelity.py's.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _workers import finish_worker, run_world  # noqa: E402

_ACTIONS = {"full_backward": "B", "backward_weight": "W"}
_ENGINE_METHODS = {"_backward_input": "B input", "_wait": "wait", "_broadcast_loss": "loss broadcast"}


def _timed(table: dict, name: str, fn):
    def wrapper(*args, **kwargs):
        start, cpu = time.perf_counter(), time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            wall, used = table[name]
            table[name] = (wall + time.perf_counter() - start, used + time.thread_time() - cpu)
    return wrapper


def _instrument(table: dict) -> None:
    """Wall clock and main-thread CPU of the pipeline engine's actions into ``table`` (the module's own
    functions, wrapped in place)."""
    import shardwise.runtime.pipeline_engine as engine

    for fn, name in _ACTIONS.items():
        setattr(engine, fn, _timed(table, name, getattr(engine, fn)))
    for method, name in _ENGINE_METHODS.items():
        setattr(engine.PipelineEngine, method, _timed(table, name, getattr(engine.PipelineEngine, method)))
    engine.PipelineEngine._call = staticmethod(_timed(table, "F", engine.PipelineEngine._call))


def _rank(rank: int, world: int, store: str, args: tuple, out: str) -> None:
    import fidelity
    import shardwise

    rows, steps, warmup = args
    torch.set_num_threads(fidelity.threads(world))
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    actions = collections.defaultdict(lambda: (0.0, 0.0))
    _instrument(actions)
    report = []
    for row in rows:
        model = fidelity.build(row["plan"].split()[0])
        ids, y = fidelity.batch()
        engine = shardwise.parallelize(model, (ids, y), plan=shardwise.Plan.from_json(row["plan_json"]),
                                       verify=False)
        optimizer = engine.optimizer(torch.optim.AdamW, lr=1e-4)

        def step():
            optimizer.zero_grad()
            engine.train_step(ids, y)
            optimizer.step()

        for _ in range(warmup):
            step()
        actions.clear()
        samples = []
        for _ in range(steps):
            dist.barrier()
            before, cpu, wall = resource.getrusage(resource.RUSAGE_THREAD), time.process_time(), time.perf_counter()
            step()
            after, cpu = resource.getrusage(resource.RUSAGE_THREAD), time.process_time() - cpu
            dist.barrier()
            samples.append((time.perf_counter() - wall, cpu, after.ru_utime - before.ru_utime,
                            after.ru_stime - before.ru_stime, after.ru_nvcsw - before.ru_nvcsw,
                            after.ru_nivcsw - before.ru_nivcsw))
        mine = [statistics.median(s[i] for s in samples) for i in range(6)]
        mine.append({k: (w / steps, c / steps) for k, (w, c) in actions.items()})
        everyone = [None] * world
        dist.all_gather_object(everyone, mine)
        report.append(everyone)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(report, f)
    finish_worker()


def profiled_stage_times(path: str, rows: list[dict], world: int) -> dict[str, list[float]]:
    """Each saved pipeline plan's stage times as fidelity.py predicted it: priced with the op
    times its run measured (fidelity.py --reprice's pricing), not the analytic model's."""
    import fidelity
    import shardwise

    with open(path) as f:
        cluster = shardwise.Cluster.from_json(json.dumps(json.load(f)["cluster"]))
    out = {}
    for row, (plan, graph) in zip(rows, fidelity.saved_plans(shardwise, rows, fidelity.TABLES[world])):
        priced = plan.price(graph, cluster, profile=fidelity.load_profile(shardwise, row["profile"]))
        out[row["plan"]] = json.loads(priced.to_json()).get("predicted", {}).get("stage_times") or []
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--from-json", required=True, help="a fidelity.py --json run (its plans and predictions)")
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("plans", nargs="+")
    args = parser.parse_args()
    with open(args.from_json) as f:
        saved = {r["plan"]: r for r in json.load(f)["rows"]}
    missing = [p for p in args.plans if p not in saved or "plan_json" not in saved[p]]
    if missing:
        raise SystemExit(f"not in {args.from_json} (with its plan): {', '.join(missing)}")
    rows = [saved[p] for p in args.plans]
    stage_times = profiled_stage_times(args.from_json, rows, args.world)
    report = run_world(_rank, args.world, (rows, args.steps, args.warmup))
    cores = os.cpu_count() or 1
    print("| plan | rank | step (s) | process CPU | main user | main system | switches vol / invol | "
          "actions: wall / main-thread CPU (ms) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for row, ranks in zip(rows, report):
        for r, (wall, cpu, user, system, vol, invol, acts) in enumerate(ranks):
            parts = ", ".join(f"{k} {w * 1e3:.0f} / {c * 1e3:.0f}" for k, (w, c) in sorted(acts.items()))
            print(f"| {row['plan']} | {r} | {wall:.3f} | {cpu:.3f} | {user:.3f} | {system:.3f} | "
                  f"{vol:.0f} / {invol:.0f} | {parts} |")
        pool = sum(x[1] for x in ranks) / min(cores, len(ranks))
        step = statistics.median(x[0] for x in ranks)
        # A pipeline's stages as the run's prediction priced them (its own op times; seconds a
        # micro-batch at the ranks' shared rate, before the pool): beside each rank's F and B
        # actions above. Not the saved plan's own stage_times: those are the analytic model's.
        stages = stage_times[row["plan"]]
        priced = ("; stages priced " + ", ".join(f"{t * 1e3:.1f}" for t in stages) + " ms a micro-batch"
                  if stages else "")
        print(f"| {row['plan']} | pool | {step:.3f} | {pool:.3f} s over {min(cores, len(ranks))} cores "
              f"({pool / step:.0%} of the step) | predicted {row['predicted_step']:.3f} s, fidelity run measured "
              f"{row['step']:.3f}{priced} | | | |")


if __name__ == "__main__":
    main()
